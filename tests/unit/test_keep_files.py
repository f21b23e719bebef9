"""A kept pool's pure parts: the lease's durations and line, the shown offsets, the lock, the discovery files (docs/keep.md)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from ddp_magic.kernel.keep.terms import Terms, TermsError, duration, span
from ddp_magic.wire import kept


@pytest.mark.parametrize("text,seconds", [("5s", 5), ("30m", 1800), ("24h", 86400), ("90", 90), ("1.5h", 5400), ("2d", 172800), ("10 min", 600)])
def test_durations(text: str, seconds: float) -> None:
    assert duration(text, "--idle") == seconds


@pytest.mark.parametrize("text", ["", "soon", "-5m", "0", "5x"])
def test_bad_durations_say_what_to_write(text: str) -> None:
    with pytest.raises(TermsError, match="give a duration such as 5s, 30m, 24h or 2d"):
        duration(text, "--max")


def test_the_lease_line() -> None:
    since = time.mktime((2026, 1, 1, 5, 0, 0, 0, 0, -1))
    terms = Terms(1800, 3600 + 14 * 60, since)
    assert terms.text().startswith("kept: ends 30 min after its kernel leaves, at most at ")
    assert terms.text().endswith("06:14")
    left = terms.text(attached=False, left_at=since + 60)
    assert "no kernel attached since" in left and "unless a kernel attaches or a job runs" in left
    assert [span(s) for s in (5, 90, 1800, 5400, 86400)] == ["5 s", "1 min 30 s", "30 min", "1 h 30 min", "24 h"]
    assert Terms.parse(None, None).idle == 1800 and Terms.parse("5s", "1h").max == 3600


def test_the_kept_line_says_kept_once_and_is_short() -> None:
    """The cell's notice (``%%ddp --keep``) and %ddp keep's first line: an output area wraps anywhere, mid-time too."""
    from ddp_magic.kernel.keep.keeping import KeptState
    from ddp_magic.ui.keep import kept_line

    since = time.mktime((2026, 1, 1, 5, 0, 0, 0, 0, -1))
    line = kept_line(KeptState("53f7d1a3", "/tmp/x", "local", Terms(1800, 3600 + 14 * 60, since)))
    assert re.fullmatch(r"kept pool 53f7d1a3: ends 30 min after its kernel leaves, at most at (\w{3} )?06:14", line), line
    assert len("ddp_magic: " + line) <= 90, line


def test_shown_offsets_survive_their_writer(tmp_path) -> None:
    """A kernel SIGKILLed right after counting: the next one reads the count (the file is an mmap'd array)."""
    path = str(tmp_path / "shown")
    code = ("import sys, os; from ddp_magic.wire.kept import ShownOffsets; s = ShownOffsets(sys.argv[1], 3);"
            "s.add(2, 'stderr', 17); s.add(2, 'stderr', 5); s.set(1, {'stdout': 40}); os._exit(9)")
    for _ in range(2):
        subprocess.run([sys.executable, "-c", code, path], check=False)
    shown = kept.ShownOffsets(path, 3)
    assert shown.all() == {0: (0, 0), 1: (40, 0), 2: (0, 44)}
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"


def test_the_lock_is_the_liveness(tmp_path) -> None:
    path = str(tmp_path / "x.lock")
    assert not kept.is_held(path)
    proc = subprocess.Popen([sys.executable, "-c", f"from ddp_magic.wire import kept; kept.hold_lock({path!r}); import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 30
        while not kept.is_held(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert kept.is_held(path)
        with pytest.raises(BlockingIOError):
            kept.hold_lock(path)
    finally:
        proc.kill()
        proc.wait()
    assert not kept.is_held(path)  # a SIGKILLed holder releases it: no pid to be fooled by


def test_discovery_files_are_private_and_ours(tmp_path) -> None:
    where = str(tmp_path)
    kept.write_private(kept.discovery_path("abc", where), {"id": "abc", "secret": "00"})
    assert oct(os.stat(kept.discovery_path("abc", where)).st_mode & 0o777) == "0o600"
    assert [(d["id"], alive) for _, d, alive in kept.listing(where)] == [("abc", False)]
    with open(os.path.join(where, "ddp-kept-bad.json"), "w") as f:
        f.write("[]")
    assert [d["id"] for _, d, _ in kept.listing(where)] == ["abc"]  # not one: skipped, logged



def _pool_file(where: str, pool_id: str, **data: object) -> None:
    kept.write_private(kept.discovery_path(pool_id, where), {"id": pool_id, "secret": "00", "nproc": 2, "notebook": "other.ipynb",
                                                             "idle": 1800.0, "max": 86400.0, "since": time.time(), **data})


def _hold(where: str, pool_id: str) -> "subprocess.Popen[bytes]":
    """A process that holds the pool's liveness lock, as its template does: the pool lives until it is killed."""
    path = kept.lock_path(pool_id, where)
    proc = subprocess.Popen([sys.executable, "-c", f"from ddp_magic.wire import kept; kept.hold_lock({path!r}); import time; time.sleep(120)"])
    deadline = time.monotonic() + 30
    while not kept.is_held(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kept.is_held(path)
    return proc


def test_attach_never_asks_to_choose_an_ended_pool(tmp_path, monkeypatch) -> None:
    """One live kept pool and one whose lease ended: attach takes the live one (the ended one is history, in the list);
    two live ones: name one; none live: the one that ended (attach says why), or, of several, the list."""
    from ddp_magic.kernel.keep.attach import AttachError, choose, found_pools, list_text

    where = str(tmp_path)
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", where)
    _pool_file(where, "e0ded000", state="ended", why="its lease's --idle 5s ran out")
    _pool_file(where, "11fe1111")
    holders = [_hold(where, "11fe1111")]
    try:
        for _ in range(2):
            assert choose(None, notebook="").id == "11fe1111"
            assert choose(None, notebook="keep.ipynb").id == "11fe1111"
            assert "e0ded000" in list_text(found_pools())  # listed, as history
        assert choose("e0d", notebook="").id == "e0ded000"  # named: the user asks for its end
        _pool_file(where, "22fe2222", notebook="keep.ipynb")
        holders.append(_hold(where, "22fe2222"))
        with pytest.raises(AttachError, match="this user has 2 kept pools running; name one: %ddp attach ID"):
            choose(None, notebook="")
        assert choose(None, notebook="keep.ipynb").id == "22fe2222"  # this notebook's
    finally:
        for proc in holders:
            proc.kill()
            proc.wait()
    os.unlink(kept.discovery_path("22fe2222", where))
    with pytest.raises(AttachError, match="no kept pool of this user is running"):  # two ended: neither is chosen for the user
        choose(None, notebook="")
    os.unlink(kept.discovery_path("11fe1111", where))
    assert choose(None, notebook="").id == "e0ded000"  # the one that ended: attach says why


def test_a_spool_says_when_the_lines_of_a_replay_were_printed(tmp_path) -> None:
    """Per read of its pipe, how many lines and how long ago (procs/rank_keep.py): what a replay from an offset holds,
    its first read counted from the offset on; a rank started again on the file (no stamps) says its lines unstamped."""
    from ddp_magic.procs.rank_keep import Spool

    fd = os.open(os.devnull, os.O_WRONLY)  # the rank's fd 1, here a scratch one
    path = str(tmp_path / "r0.out")
    spool = Spool(fd, path)
    try:
        for text in (b"a\nb\n", b"c\n", b"d\ne\nf\n"):
            before = spool.written
            os.write(fd, text)
            deadline = time.monotonic() + 30
            while spool.written < before + len(text) and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.05)
        stamps = spool.replay_stamps(0)
        assert [n for n, _ in stamps] == [2, 1, 3] and stamps[0][1] > stamps[1][1] > stamps[2][1] >= 0, stamps
        assert [n for n, _ in spool.replay_stamps(2)] == [1, 1, 3]  # from "b\n" on: its read's other line is not replayed
        assert spool.replay_stamps(spool.written) == []
        fd2 = os.open(os.devnull, os.O_WRONLY)
        again = Spool(fd2, path)  # a rank started again on the file: nothing stamped yet
        assert again.replay_stamps(2) == [[5, None]]
        os.close(fd2)  # the pipe's last writer: its pump ends
    finally:
        os.close(fd)


def test_the_saves_a_kept_pool_records_are_merged_and_written_only_when_they_change(tmp_path) -> None:
    """``saves.json`` beside a kept pool's lease (what an attaching kernel takes on): a value given replaces its own, None
    leaves it, and the same values again (every cell on a kept pool records its --save-every) write nothing."""
    from ddp_magic.kernel.keep.keeping import SAVES, KeptState, record_saves, recorded_saves

    state = KeptState("ab12cd34", str(tmp_path), "here", Terms(60, 600, time.time()))
    assert recorded_saves(state) == {}
    record_saves(state, every=None)
    assert not (tmp_path / SAVES).exists(), "nothing to record: no file"
    record_saves(state, armed="ckpt/")
    record_saves(state, every=[600.0, "ckpt/"])
    assert recorded_saves(state) == {"armed": "ckpt/", "every": [600.0, "ckpt/"]}
    assert oct((tmp_path / SAVES).stat().st_mode & 0o777) == "0o600"
    inode = (tmp_path / SAVES).stat().st_ino  # a write replaces the file (a new inode)
    record_saves(state, armed="ckpt/", every=[600.0, "ckpt/"])
    record_saves(state, armed=None, every=None)
    assert (tmp_path / SAVES).stat().st_ino == inode, "the same values: not written again"
    record_saves(state, every=[])
    assert recorded_saves(state) == {"armed": "ckpt/", "every": []} and (tmp_path / SAVES).stat().st_ino != inode
