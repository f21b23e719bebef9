"""Rank-attributed output (ddp_magic.ui.output): prefixes, partial lines, progress bars, --ranks."""
from __future__ import annotations

import io

import pytest

from ddp_magic.ui.output import RankPrinter, parse_ranks


def _printer(**kw):
    out, err = io.StringIO(), io.StringIO()
    kw.setdefault("colour", False)
    return RankPrinter(streams={"stdout": lambda: out, "stderr": lambda: err}, **kw), out, err


def test_lines_are_prefixed_and_partials_wait_for_their_end():
    p, out, _ = _printer()
    p.feed(0, "stdout", "hel")
    p.feed(1, "stdout", "world\n")
    p.feed(0, "stdout", "lo\nnext")
    assert out.getvalue() == "[rank 1] world\n[rank 0] hello\n"
    p.flush()
    assert out.getvalue().endswith("[rank 0] next\n")


def test_carriage_return_redraws_leave_only_the_final_state():
    p, out, _ = _printer()
    for i in range(3):
        p.feed(0, "stdout", f"\r{i}/3")
    assert out.getvalue() == "", "a line being redrawn is not written while it changes"
    p.feed(0, "stdout", "\r3/3\n")
    assert out.getvalue() == "[rank 0] 3/3\n"
    p.feed(0, "stdout", "\r1/9")  # a bar the cell leaves unfinished: its last state, once the cell ends
    p.flush()
    assert out.getvalue() == "[rank 0] 3/3\n[rank 0] 1/9\n"


def test_other_rank_lines_are_not_garbled_by_a_redraw():
    p, out, _ = _printer()
    p.feed(0, "stdout", "\r50%\r")
    p.feed(1, "stdout", "log line\n")
    p.feed(0, "stdout", "       \r")  # tqdm(leave=False) clears its line: nothing is left of it
    p.flush()
    assert out.getvalue() == "[rank 1] log line\n"


def test_tqdm_on_four_ranks_leaves_one_line_per_rank_per_bar():
    """tqdm writes to stderr; its final line is progress, so it joins each rank's stdout (never merged across ranks)."""
    tqdm = pytest.importorskip("tqdm")
    p, out, err = _printer()
    p.world = 4
    streams = {r: io.StringIO() for r in range(4)}
    bars = {r: tqdm.tqdm(total=10, file=streams[r], mininterval=0, desc=f"epoch {r}", ascii=True, position=0) for r in range(4)}  # each rank: its own bar
    for _step in range(10):
        for r, bar in bars.items():
            before = streams[r].tell()
            bar.update(1)
            p.feed(r, "stderr", streams[r].getvalue()[before:])
    for r, bar in bars.items():
        before = streams[r].tell()
        bar.close()
        p.feed(r, "stderr", streams[r].getvalue()[before:])
    p.flush()
    assert err.getvalue() == ""
    lines = out.getvalue().splitlines()
    assert len(lines) == 4 and "\r" not in out.getvalue()
    assert sorted(ln.split("]")[0] for ln in lines) == [f"[rank {r}" for r in range(4)]
    assert all("10/10" in ln for ln in lines)


def test_prefixes_are_coloured_per_rank():
    from ddp_magic.ui.output import use_colour

    p, out, _ = _printer(colour=True)
    p.feed(0, "stdout", "a\n")
    p.feed(1, "stdout", "b\n")
    assert out.getvalue() == "[\x1b[34mrank 0\x1b[0m] a\n[\x1b[35mrank 1\x1b[0m] b\n"
    assert use_colour({}) and not use_colour({"NO_COLOR": ""}) and not use_colour({"DDP_MAGIC_COLOR": "0"})


def test_rank_filter_and_ordered_mode():
    p, out, _ = _printer(ranks={1})
    p.feed(0, "stdout", "zero\n")
    p.feed(1, "stdout", "one\n")
    assert out.getvalue() == "[rank 1] one\n"
    p, out, _ = _printer(ordered=True)
    p.feed(1, "stdout", "b\n")
    p.feed(0, "stdout", "a\n")
    assert out.getvalue() == ""
    p.flush()
    assert out.getvalue() == "[rank 0] a\n[rank 1] b\n"


def test_endless_line_is_cut_not_held():
    """200,000 characters and no newline: shown at once in prefixed pieces of 65,536 (64 KiB), the rest at the cell's end."""
    p, out, _ = _printer()
    p.feed(0, "stdout", "x" * 200_000)

    def pieces() -> list:  # (prefix, length) of each line written; nothing but the x's after the prefixes
        lines = out.getvalue().splitlines()
        assert all(set(ln[9:]) == {"x"} for ln in lines), [ln.replace("x" * 65_536, "x * 65536") for ln in lines]
        return [(ln[:9], len(ln) - 9) for ln in lines]

    assert pieces() == [("[rank 0] ", 65_536)] * 3
    p.flush()
    assert pieces() == [("[rank 0] ", 65_536)] * 3 + [("[rank 0] ", 3_392)]


@pytest.mark.parametrize("spec, want", [("0", {0}), ("0,2", {0, 2}), ("1-3", {1, 2, 3}), ("0, 2-3", {0, 2, 3})])
def test_parse_ranks(spec, want):
    assert parse_ranks(spec) == want


@pytest.mark.parametrize("spec", ["a", "3-1", "-1"])
def test_parse_ranks_rejects(spec):
    with pytest.raises(ValueError):
        parse_ranks(spec)


def test_identical_stderr_lines_from_every_rank_become_one_line():
    p, out, err = _printer()
    p.world = 4
    for run in (1, 2):  # the second run of a cell merges the same way
        for r in (2, 0, 3, 1):
            p.feed(r, "stderr", "train.py:3: UserWarning: pin_memory is on\n")
            p.feed(r, "stdout", "step 1\n")
        assert err.getvalue().count("UserWarning") == run  # out at once: every rank has sent it
        p.flush()
    assert err.getvalue() == "[ranks 0-3] train.py:3: UserWarning: pin_memory is on\n" * 2
    assert out.getvalue().count("step 1") == 8  # stdout is never merged: users read it per rank


def test_stderr_lines_that_differ_or_come_from_some_ranks_keep_their_order():
    p, _, err = _printer(ranks={0, 2, 3})
    p.world = 4
    p.feed(0, "stderr", "rank-only note\nsame\n")
    p.feed(2, "stderr", "same\n")
    p.feed(1, "stderr", "same\n")  # hidden by --ranks: not waited for, not counted
    assert err.getvalue() == ""
    p.feed(3, "stderr", "same\nlast\n")
    p.flush()
    assert err.getvalue() == "[rank 0] rank-only note\n[ranks 0, 2-3] same\n[rank 3] last\n"


def test_a_held_line_goes_out_after_the_window(monkeypatch):
    from ddp_magic.ui import output

    clock = [100.0]
    monkeypatch.setattr(output.time, "monotonic", lambda: clock[0])
    p, _, err = _printer()
    p.world = 2
    p.feed(0, "stderr", "only rank 0 warns\n")
    assert err.getvalue() == ""
    clock[0] += output.MERGE_WINDOW + 0.01
    p.feed(1, "stdout", "x\n")  # any output after the window lets it out (and so does the timer)
    assert err.getvalue() == "[rank 0] only rank 0 warns\n"
    p.flush()


def test_progress_on_stderr_keeps_its_final_state_only():
    p, out, err = _printer()
    p.world = 2
    p.feed(0, "stderr", "loading\n\r 10%")
    p.feed(0, "stderr", "\r 20%")
    p.flush()
    assert err.getvalue() == "[rank 0] loading\n" and out.getvalue() == "[rank 0]  20%\n", "a bar's last state is progress: stdout"


def test_a_bar_s_final_line_sits_among_its_rank_s_stdout_lines_in_order():
    """One order per rank: what the rank printed, its bar's final state, what it printed next; real stderr stays stderr."""
    p, out, err = _printer()
    p.world = 2
    for _run in (1, 2):  # a notebook user re-runs the cell
        p.feed(0, "stdout", "before\n")
        p.feed(0, "stderr", "\r  0%|   | 0/3 [00:00<?, ?it/s]")
        p.feed(0, "stderr", "\r 33%|#  | 1/3 [00:00<00:00, 9.9it/s]\r100%|###| 3/3 [00:00<00:00, 9.9it/s]\n")
        p.feed(1, "stderr", "a real warning\n")
        p.feed(0, "stdout", "after\n")
        p.feed(0, "stderr", "\r 50%|#  |\r" + " " * 12 + "\r")  # tqdm(leave=False): cleared, nothing left of it
        p.feed(0, "stderr", "Traceback (most recent call last):\n")  # ... and the next stderr line is stderr again
        p.flush()
    assert out.getvalue() == "[rank 0] before\n[rank 0] 100%|###| 3/3 [00:00<00:00, 9.9it/s]\n[rank 0] after\n" * 2
    assert err.getvalue() == "[rank 1] a real warning\n[rank 0] Traceback (most recent call last):\n" * 2


def test_merger_and_labels():
    from ddp_magic.kernel.output.fold import LineFolder
    from ddp_magic.ui.output import ranks_label

    assert ranks_label([3]) == "[rank 3] " and ranks_label([0, 1, 2, 3]) == "[ranks 0-3] " and ranks_label([0, 2, 3]) == "[ranks 0, 2-3] "
    assert ranks_label([2, 0]) == "[ranks 0, 2] " and ranks_label([0, 2, 3], colour=True) == "[ranks 0, 2-3] "
    m = LineFolder(window=1.0)
    m.add(0, "a\n", 0.0)
    m.add(0, "a\n", 0.1)  # the same rank again: a second line, not a merge
    m.add(1, "a\n", 0.2)
    assert m.ready(0.5) == [] and m.next_due() == 1.0
    assert m.ready(1.05) == [({0, 1}, "a\n")]
    assert m.ready(0.0, final=True) == [({0}, "a\n")]


def test_a_line_that_overtakes_its_rank_s_bar_end_waits_for_it(monkeypatch):
    """The rank wrote its bar's last state, then 'after'; the two sockets delivered 'after' first (the bar's newline
    was still on the stderr socket). The cell shows them in the rank's order; a line never waits past BAR_WAIT."""
    from ddp_magic.ui import output

    clock = [100.0]
    monkeypatch.setattr(output.time, "monotonic", lambda: clock[0])
    p, out, err = _printer()
    p.world = 2
    for _run in (1, 2):
        p.feed(0, "stderr", "\r 50%|#  | 10/20 [00:01<00:01, 9.9it/s]\r100%|###| 20/20 [00:02<00:00, 9.9it/s]")
        p.feed(1, "stdout", "rank 1 is not held\n")
        p.feed(0, "stdout", "after\n")  # overtook the bar's "\n"
        assert out.getvalue().endswith("[rank 1] rank 1 is not held\n")
        p.feed(0, "stderr", "\n")
        p.flush()
    assert out.getvalue() == ("[rank 1] rank 1 is not held\n[rank 0] 100%|###| 20/20 [00:02<00:00, 9.9it/s]\n[rank 0] after\n") * 2
    assert err.getvalue() == ""
    p, out, _ = _printer()
    p.feed(0, "stderr", "\r 10%|   | 2/20 [00:00<00:09, 2.0it/s]")  # a bar that runs on while the rank prints
    p.feed(0, "stdout", "epoch 1\n")
    assert out.getvalue() == ""
    clock[0] += output.BAR_WAIT + 0.01
    p.feed(0, "stdout", "epoch 2\n")  # after the wait the waiting lines go out, in order (the timer does it too)
    assert out.getvalue() == "[rank 0] epoch 1\n[rank 0] epoch 2\n"
    p.flush()
    assert out.getvalue() == "[rank 0] epoch 1\n[rank 0] epoch 2\n[rank 0]  10%|   | 2/20 [00:00<00:09, 2.0it/s]\n"


def test_a_cpp_warning_every_rank_prints_shows_once():
    """torch's C++ log lines carry each rank's own time; without it they fold, and a rank's repeat (c10d's reverse
    lookup warning, once per peer) is not shown again in the same cell."""
    for _run in (1, 2):
        p, _, err = _printer()
        p.world = 4
        for r in range(4):
            p.feed(r, "stderr", f"[W1201 20:17:46.18{r}958604 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3\n")
        p.feed(0, "stderr", "[W1201 20:17:47.000000001 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3\n")
        p.flush()  # out: a node's ranks that print it seconds later add nothing
        p.feed(2, "stderr", "[W1201 20:17:49.000000001 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3\n")
        p.feed(1, "stderr", "[E1201 20:17:47.000000001 other.cpp:1] a different line\n")
        p.flush()
        assert err.getvalue() == ("[ranks 0-3] [W socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3\n"
                                  "[rank 1] [E other.cpp:1] a different line\n")


def test_a_cpp_warning_from_a_later_node_is_not_shown_again():
    p, _, err = _printer()
    p.world = 4
    warn = "[W1201 20:17:4{}.1 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3\n"
    for r in (0, 1):
        p.feed(r, "stderr", warn.format(5))
    p.flush()  # n1's ranks' copy is out before n2's ranks print theirs, a second later
    for r in (2, 3):
        p.feed(r, "stderr", warn.format(6))
    p.feed(3, "stderr", "a rank's own line\n")
    p.flush()
    assert err.getvalue() == ("[ranks 0-1] [W socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3\n"
                              "[rank 3] a rank's own line\n")
