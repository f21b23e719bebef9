"""A kept pool's output marks (kernel/output/kept_output.py) and what a front end says it holds (kernel/keep/front.py).

The real path (ipykernel's IOPub thread, the metadata a front end reads) is tests/kernel/test_keep.py's; here the
parts that need no kernel: the staging, the shown file's count, the front end's word and where attach replays from.
"""
from __future__ import annotations

import io
import sys

from ddp_magic.kernel.keep import front
from ddp_magic.kernel.keep.attach import replay_from
from ddp_magic.kernel.output.kept_output import KeptOutput, _messages, stream
from ddp_magic.wire import kept


def test_staged_lines_and_their_count(tmp_path, monkeypatch) -> None:
    """Without ipykernel the lines go to sys.stdout as they come, and the file counts how far they go."""
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    ko = KeptOutput("p1", kept.ShownOffsets(str(tmp_path / "shown"), 2))
    ko.start(1, {"stdout": 100, "stderr": 7})
    assert stream("stdout") is out
    with ko.capture() as staged:
        stream("stdout").write("[rank 1] tick 0\n")
        assert out.getvalue() == ""  # staged until the hub says how far it read
    ko.commit(staged, 1, "stdout", 7)
    assert out.getvalue() == "[rank 1] tick 0\n"
    assert ko.shown.all() == {0: (0, 0), 1: (107, 7)}
    stream("stdout").write("late\n")  # outside a read: straight on
    staged.writers["stdout"].write("a fold's timer\n")  # a timer started during the read: after its commit, straight on
    assert out.getvalue().endswith("late\na fold's timer\n")


def test_the_front_ends_word_and_where_attach_replays_from(tmp_path) -> None:
    path = str(tmp_path / "shown")
    shown = kept.ShownOffsets(path, 3)
    for rank in range(3):
        shown.set(rank, {"stdout": 50 + rank, "stderr": 5})
    shown.close()
    for bad in ({"pool": "p2"}, {"pool": "p2", "upto": {"0": [1]}}, {"pool": "p2", "upto": {"x": [1, 2]}}, {"pool": "p2", "upto": {"0": [-1, 0]}}, "no"):
        assert not front.heard(bad)
    assert front.heard({"type": "shown", "pool": "p2", "upto": {}}) and front.held("p2") is None  # nothing held: the file's
    file = kept.ShownOffsets(path, 3)
    assert replay_from("p2", file) == {"0": [50, 5], "1": [51, 5], "2": [52, 5]}  # nothing said: the file's
    assert front.heard({"type": "shown", "pool": "p2", "upto": {"1": [40, 5], "7": [1, 1]}})
    assert replay_from("p2", file) == {"0": [50, 5], "1": [40, 5], "2": [52, 5]}
    assert file.get(1, "stdout") == 51  # the file is the attached kernel's until the attach is accepted
    front.forget("p2")
    assert front.held("p2") is None


def test_a_mark_goes_with_the_message_that_holds_its_lines() -> None:
    """A message never claims a line that it, and the ones before it, do not hold (a SIGKILL may fall between two)."""
    cell = {"msg_id": "c"}
    parts = [("stdout", cell, "[rank 0] a\n"), ("", None, (0, [10, 0])), ("stderr", cell, "[rank 1] oops\n"), ("", None, (1, [0, 14])),
             ("stderr", cell, "[rank 1] more\n"), ("", None, (1, [0, 28])), ("stdout", cell, "ddp_magic: a fold's timer\n")]
    msgs, left = _messages(parts, {"0": [4, 0], "1": [0, 0]})
    assert _messages(parts[:1], {"2": [4, 0]})[0][0][3] == {"2": [4, 0]}
    assert [(m[0], m[2], m[3]) for m in msgs] == [
        ("stdout", "[rank 0] a\n", {"0": [10, 0]}),
        ("stderr", "[rank 1] oops\n[rank 1] more\n", {"1": [0, 28]}),
        ("stdout", "ddp_magic: a fold's timer\n", {}),  # the waiting marks: with the last, unless a later one said more
    ] and left == {}
    assert _messages([("", None, (0, [12, 0]))], {"1": [3, 3]}) == ([], {"1": [3, 3], "0": [12, 0]})  # no line to go with: they wait


def test_a_transcript_says_how_far_the_kept_lines_it_holds_go() -> None:
    """A page that shows a background cell again (a reload) holds what the kernel's copy holds (ui/transcripts.py):
    the follow reply says it as the extension's ``shown``, each later message carries its own marks."""
    from ddp_magic.ui.transcripts import Transcript

    cell = Transcript("m1", "c1", "page", "cell [3]", lambda: False)
    meta = lambda upto: {"ddp_magic": {"pool": "3fa9", "upto": upto}}  # noqa: E731
    cell.add("stream", {"name": "stdout", "text": "[rank 0] tick 0\n"}, meta({"0": [8, 0]}))
    cell.add("stream", {"name": "stdout", "text": "[rank 1] tick 0\n"}, meta({"1": [8, 0]}))
    cell.add("display_data", {"data": {"text/plain": "view"}}, {"ddp_magic": {"pool": "x", "upto": {"0": [99, 0]}}})  # not a stream
    cell.add("stream", {"name": "stdout", "text": "plain\n"}, {})
    sent = []
    reply = cell.follow("comm", sent.append)
    assert reply["shown"] == [{"type": "shown", "pool": "3fa9", "upto": {"0": [8, 0], "1": [8, 0]}}]
    assert [o["msg_type"] for o in reply["outputs"]] == ["stream", "display_data", "stream"]
    cell.add("stream", {"name": "stdout", "text": "[rank 0] tick 1\n"}, meta({"0": [16, 0]}))
    cell.add("stream", {"name": "stdout", "text": "more\n"}, None)
    assert sent[0]["metadata"] == meta({"0": [16, 0]}) and "metadata" not in sent[1]
    assert cell.follow("again", lambda d: None)["shown"][0]["upto"] == {"0": [16, 0], "1": [8, 0]}


def test_what_a_rank_wrote_before_its_spool_began_counts_for_no_spool_byte(tmp_path) -> None:
    """A rank writes straight to its output socket until KEEP starts its spool; the hub may read those bytes before or
    after the KEEP reply. Its spool's marker says where on the socket the spool's bytes begin: the hub's marks never
    claim more of the spool than the rank spooled, and end where the spool ends, however the reads cut the stream.
    Twice: the first spool of a rank, then one started again over the same file (a rank forked again) at its offset."""
    import os
    import socket

    from ddp_magic.kernel.conns import OutConn
    from ddp_magic.kernel.output.hub_output import OutputStreams
    from ddp_magic.procs.rank_keep import Spool

    class Hub(OutputStreams):
        def __init__(self) -> None:
            self.shown = KeptOutput("p3", kept.ShownOffsets(str(tmp_path / "shown"), 1))
            self.outs = {}

    hub = Hub()
    path = str(tmp_path / "r0.out")
    for round_ in range(2):
        rank, kernel = socket.socketpair()
        fd = os.dup(rank.fileno())  # the rank's fd 1, straight to the kernel's socket
        rank.close()
        os.write(fd, f"direct {round_}: written before KEEP\nand a half".encode())
        out = hub.outs[(0, "stdout")] = OutConn(0, "stdout", kernel)
        hub.expect_spools([0])  # as keeping.keep does before KEEP goes out (a rank joining a kept pool: register does)
        spool = Spool(fd, path)
        start = spool.written
        os.write(fd, b" line, spooled\n" + b"".join(f"spooled {round_} {i}\n".encode() for i in range(50)) + b"partial")
        want = start + len(b" line, spooled\n") + sum(len(f"spooled {round_} {i}\n") for i in range(50))
        kernel.settimeout(10)
        data = b""
        while len(data) < want - start + 40:
            data += kernel.recv(65536)
        marks = []
        for i in range(0, len(data), 7):  # the reads cut it anywhere, the marker too
            chunk = data[i:i + 7]
            out.scanner.feed(chunk)
            with hub.shown.capture() as staged:
                pass
            hub.shown.commit(staged, 0, "stdout", hub._counted(out, chunk))
            marks.append(hub.shown.upto.get((0, "stdout"), 0))
        assert max(marks) <= want and marks[-1] == want, (start, want, marks[-5:])
        assert not out.awaiting_spool and spool.written == want + len(b"partial")
        os.close(fd)
        kernel.close()


def test_a_replay_merges_the_ranks_lines_in_the_order_they_were_printed() -> None:
    """Each rank's replay comes as one block (rank 1's first here); the stamps its HELLO gives (lines, seconds before
    it) put the lines back in the order they were printed; a line printed after the replay keeps when it was heard,
    lines older than the stamps go first, and a line not ended yet goes last."""
    from ddp_magic.kernel.keep.replay import expected, merged

    hellos = {0: {"replay": {"stdout": [[1, None], [2, 3.0], [1, 1.0]]}}, 1: {"replay": {"stdout": [[2, 2.5], [1, 0.5]], "stderr": []}}}
    heard_at = {0: 100.0, 1: 100.2}  # rank 0's line k at 97.0, 97.0, 99.0; rank 1's at 97.7, 97.7, 99.7
    assert expected(hellos) == {(0, "stdout"): 4, (1, "stdout"): 3}
    calls = [
        ("on_output", (1, "stdout", "r1 a\nr1 b\nr1"), 100.3),  # a line cut in two reads
        ("on_output", (1, "stdout", " c\n"), 100.4),
        ("on_metrics", (1, [(1, 0.0, {"loss": 1.0})]), 100.4),
        ("on_output", (0, "stdout", "r0 old\nr0 a\nr0 b\nr0 c\nr0 live\nr0 part"), 100.5),
    ]
    said = merged(calls, hellos, heard_at)
    assert said[0] == ("on_metrics", (1, [(1, 0.0, {"loss": 1.0})]))
    assert said[1:] == [
        ("on_output", (0, "stdout", "r0 old\nr0 a\nr0 b\n")),  # older than rank 0's stamps; then 97.0, 97.0
        ("on_output", (1, "stdout", "r1 a\nr1 b\n")),  # 97.7
        ("on_output", (0, "stdout", "r0 c\n")),  # 99.0
        ("on_output", (1, "stdout", "r1 c\n")),  # 99.7
        ("on_output", (0, "stdout", "r0 live\nr0 part")),  # heard at 100.5, past its stamps; then the line not ended yet
    ]
    assert merged([("on_output", (0, "stdout", "x\n"), 1.0)], {}, {}) == [("on_output", (0, "stdout", "x\n"))]  # no stamps: as heard


def test_an_attached_cell_counts_on_the_ranks_clock() -> None:
    """Each rank's HELLO says how long ago its cell reached it and ended (its own clock); the attaching kernel counts
    back from when it heard each: rows, the job's start and its end (kernel/keep/clocks.py)."""
    from ddp_magic.kernel.keep.clocks import RankClocks
    from ddp_magic.kernel.ranks import RankInfo
    from ddp_magic.states import RankState

    hellos = {0: {"clock": {"ran": 40.0, "ended": 2.0}}, 1: {"clock": {"ran": 39.5, "ended": None}}, 2: {}}
    clocks = RankClocks.heard(hellos, {0: 1000.0, 1: 1000.5, 2: 1000.0})
    assert clocks.ran == {0: 960.0, 1: 961.0} and clocks.ended == {0: 998.0}
    assert clocks.start([0, 1]) == 960.0 and clocks.end([0, 1]) is None and clocks.end([0]) == 998.0
    infos = {0: RankInfo(0, RankState.DONE), 1: RankInfo(1, RankState.RUNNING), 2: RankInfo(2, RankState.READY, started=999.0)}
    clocks.apply(infos)
    assert (infos[0].started, infos[0].finished) == (960.0, 998.0) and infos[0].elapsed == 38.0
    assert (infos[1].started, infos[1].finished) == (961.0, None)
    assert infos[2].started == 999.0  # no clock said: as it was
    infos[1].state, infos[1].finished = RankState.DONE, 1234.0  # its DONE came later: when the hub read it
    clocks.ended[1] = 1001.0
    clocks.settle(infos[1])
    assert infos[1].finished == 1001.0
