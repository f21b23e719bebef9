"""Folding the same line from many ranks, and a cell's output budget (ddp_magic.kernel.output.fold), on a fake clock.

The folder and the budget are pure: the tests give the time. The printer tests
(ui/output.py) check what reaches the cell: ``[ranks 0-1023] …`` above FOLD_ABOVE
ranks, each rank's own lines at 8 or fewer, and the held-back notice.
"""
from __future__ import annotations

import io
from typing import List, Set, Tuple

import pytest

from ddp_magic.kernel.output.fold import FOLD_ABOVE, FOLD_WINDOW, HOLD_WINDOWS, LineFolder, OutputBudget, line_cost
from ddp_magic.ui import output
from ddp_magic.ui.output import RankPrinter
from ddp_magic.words import rank_list

N = 1024


def _folder(n: int = N) -> LineFolder:
    f = LineFolder(FOLD_WINDOW)
    f.expected = set(range(n))
    return f


def _shown(out: List[Tuple[Set[int], str]]) -> List[str]:
    return [f"[{rank_list(ranks)}] {line}" for ranks, line in out]


def test_the_same_line_from_every_rank_goes_out_once_at_once():
    f = _folder()
    for r in range(N):
        f.add(r, "epoch 3 loss 0.41\n", 0.0)
        if r < N - 1:
            assert f.ready(0.0) == [], "it waits for the other ranks"
    assert _shown(f.ready(0.0)) == ["[0-1023] epoch 3 loss 0.41\n"], "the last rank's copy lets it out, no waiting"
    assert len(f) == 0 and f.next_due() is None


def test_a_line_from_half_the_ranks_goes_out_at_the_deadline_with_their_ranks():
    f = _folder()
    for r in range(0, N, 2):
        f.add(r, "even\n", 10.0)
    assert f.ready(10.0 + FOLD_WINDOW - 0.01) == []
    assert f.next_due() == pytest.approx(10.0 + FOLD_WINDOW)
    (ranks, line), = f.ready(10.0 + FOLD_WINDOW)
    assert ranks == set(range(0, N, 2)) and line == "even\n"


def test_a_line_all_ranks_print_50_ms_apart_is_one_line_not_two():
    """12 ranks print "epoch 3 done" 50 ms apart (0.55 s from the first to the last, past the 0.3 s window): while copies
    keep coming the line waits for the rest, so it reads [ranks 0-11], not [ranks 0-6] and [ranks 7-11]."""
    f, out = _folder(12), []
    for r in range(12):
        now = 5.0 + 0.05 * r
        out += f.ready(now)  # the printer asks at every wake
        f.add(r, "epoch 3 done\n", now)
        out += f.ready(now)
    assert _shown(out) == ["[0-11] epoch 3 done\n"]


def test_a_line_some_ranks_never_print_waits_a_window_after_its_last_copy_and_never_past_the_cap():
    f = _folder(12)
    for r in range(6):  # ranks 6-11 never print it
        f.add(r, "half\n", 0.05 * r)
    assert f.next_due() == pytest.approx(0.25 + FOLD_WINDOW) and f.ready(0.25 + FOLD_WINDOW - 0.01) == []
    assert _shown(f.ready(0.25 + FOLD_WINDOW)) == ["[0-5] half\n"]
    f = _folder(1024)
    for r in range(1000):  # a copy every 10 ms for 10 s: the line still goes out after HOLD_WINDOWS windows
        f.add(r, "slow\n", 0.01 * r)
        if 0.01 * r >= HOLD_WINDOWS * FOLD_WINDOW:
            break
    assert f.next_due() == pytest.approx(HOLD_WINDOWS * FOLD_WINDOW)
    (ranks, _), = f.ready(HOLD_WINDOWS * FOLD_WINDOW)
    assert len(ranks) == 91


def test_lines_that_differ_keep_their_rank_in_arrival_order():
    f = _folder(4)
    for r in (2, 0, 3, 1):
        f.add(r, f"rank {r} ready\n", 0.0)
    assert _shown(f.ready(FOLD_WINDOW)) == ["[2] rank 2 ready\n", "[0] rank 0 ready\n", "[3] rank 3 ready\n", "[1] rank 1 ready\n"]


def test_interleaved_ranks_fold_line_by_line_and_keep_each_rank_s_order():
    f = _folder(3)
    f.add(0, "a\n", 0.0)
    f.add(0, "b\n", 0.0)
    f.add(1, "b\n", 0.1)  # rank 1 is ahead of rank 0's copy of "a": it joins "b"
    f.add(1, "a\n", 0.1)  # ... so its "a" comes after its "b": a copy of its own, not rank 0's "a"
    f.add(2, "a\n", 0.2)
    f.add(2, "b\n", 0.2)
    assert _shown(f.ready(0.0, final=True)) == ["[0, 2] a\n", "[0-2] b\n", "[1] a\n"], "rank 0: a b, rank 1: b a, rank 2: a b"


def test_a_line_a_later_rank_joins_moves_after_that_rank_s_own_lines_when_nothing_else_moved_on():
    """Every rank prints "line 0", its own line, "line 0"; rank 0's came whole before rank 1's: both copies still fold."""
    f = _folder(2)
    for r in (0, 1):
        for line in ("line 0\n", f"rank {r} line 0\n", "line 0\n"):
            f.add(r, line, 0.0)
    assert _shown(f.ready(0.0)) == ["[0-1] line 0\n"], "complete, first in line: out at once"
    assert _shown(f.ready(0.0, final=True)) == ["[0] rank 0 line 0\n", "[1] rank 1 line 0\n", "[0-1] line 0\n"]
    f = _folder(2)
    for r, line in ((0, "a\n"), (0, "b\n"), (1, "x\n"), (1, "a\n")):  # rank 0 wrote on after "a": moving it would put b first
        f.add(r, line, 0.0)
    assert _shown(f.ready(0.0, final=True)) == ["[0] a\n", "[0] b\n", "[1] x\n", "[1] a\n"]


def test_a_rank_s_repeated_line_is_two_lines_not_one():
    f = _folder(2)
    for _ in range(2):
        f.add(0, "step\n", 0.0)
    f.add(1, "step\n", 0.0)
    f.add(1, "step\n", 0.0)
    assert f.ready(0.0) == [({0, 1}, "step\n"), ({0, 1}, "step\n")]


def test_a_line_held_past_the_deadline_goes_out_and_a_late_copy_is_a_new_line():
    f = _folder(2)
    f.add(0, "x\n", 0.0)
    assert f.ready(FOLD_WINDOW) == [({0}, "x\n")], "no line waits longer than the window"
    f.add(1, "x\n", 0.5)
    assert f.ready(0.5) == [] and f.ready(0.5 + FOLD_WINDOW) == [({1}, "x\n")]


def test_a_held_line_holds_the_lines_behind_it_only_until_its_own_deadline():
    f = _folder(2)
    f.add(0, "only rank 0\n", 0.0)
    f.add(0, "both\n", 0.1)
    f.add(1, "both\n", 0.1)  # complete, but behind an older line: arrival order is kept
    assert f.ready(0.1) == []
    assert f.ready(FOLD_WINDOW) == [({0}, "only rank 0\n"), ({0, 1}, "both\n")]


def test_the_budget_lets_a_burst_through_then_a_rate_and_counts_what_it_held():
    b = OutputBudget(lines=10, rate=2.0, resume=4)
    assert b.allow({0}, 10, 10, 0.0) and not b.holding
    assert not b.allow({1}, 1, 1, 0.0) and b.holding
    assert not b.allow({2}, 3, 3, 1.0), "2 lines of budget back: under the 4 it needs to resume"
    assert b.allow({3}, 1, 1, 2.0) and not b.holding, "4 back: it shows lines again"
    assert b.gap() == (4, {1, 2}) and b.gap() is None and b.held == 4
    assert not b.allow({0}, 1, 100, 100.0), "a line longer than the whole budget is held back, never shown cut"
    assert line_cost(["short\n", "x" * 256 + "\n", "y" * 600]) == 1 + 2 + 3


def _printer(n: int, **kw):
    out, err = io.StringIO(), io.StringIO()
    p = RankPrinter(streams={"stdout": lambda: out, "stderr": lambda: err}, colour=False, **kw)
    p.world = n
    return p, out, err


def test_above_eight_ranks_stdout_folds_and_at_eight_it_shows_each_rank():
    """Both forms, as the cell shows them."""
    for _run in (1, 2):  # a notebook user re-runs the cell
        p, out, _ = _printer(FOLD_ABOVE + 1)
        for r in range(FOLD_ABOVE + 1):
            p.feed(r, "stdout", "epoch 3 loss 0.41\n")
        assert out.getvalue() == "[ranks 0-8] epoch 3 loss 0.41\n", "every rank sent it: out at once"
        p.flush()
        p, out, _ = _printer(FOLD_ABOVE)
        for r in range(FOLD_ABOVE):
            p.feed(r, "stdout", "epoch 3 loss 0.41\n")
        assert out.getvalue() == "".join(f"[rank {r}] epoch 3 loss 0.41\n" for r in range(FOLD_ABOVE)), "8 ranks: as today"
        p.flush()


def test_folded_output_keeps_stdout_and_stderr_apart_and_finishes_partial_lines(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(output.time, "monotonic", lambda: clock[0])
    p, out, err = _printer(256)
    for r in range(256):
        p.feed(r, "stdout", "loss 0.4")  # a partial line: it waits for its end
        p.feed(r, "stderr", "loss 0.41\n")
    assert out.getvalue() == "" and err.getvalue() == "[ranks 0-255] loss 0.41\n"
    for r in range(128):
        p.feed(r, "stdout", "1\n")
    assert out.getvalue() == ""
    clock[0] += FOLD_WINDOW + 0.01
    p.feed(200, "stdout", "2\n")  # any output after the deadline lets the held line out (and so does the timer)
    assert out.getvalue() == "[ranks 0-127] loss 0.41\n"
    p.flush()  # the cell ends: the other ranks' partial lines, folded
    assert out.getvalue() == "[ranks 0-127] loss 0.41\n[rank 200] loss 0.42\n[ranks 128-199, 201-255] loss 0.4\n"


def test_a_flood_is_held_back_and_the_cell_says_how_much_and_how_to_read_it(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(output.time, "monotonic", lambda: clock[0])
    for _run in (1, 2):
        p, out, _ = _printer(4, budget=OutputBudget(lines=100, rate=10.0, resume=20), read_back="job.output({rank})")
        for i in range(50):
            for r in range(4):
                p.feed(r, "stdout", f"step {i}\n")
        shown = out.getvalue().splitlines()
        assert shown[:100] == [f"[rank {r}] step {i}" for i in range(25) for r in range(4)]
        assert shown[100].startswith("ddp_magic: this cell's output is over its budget (100 lines, then 10 a second)")
        assert "job.output(N) shows rank N's whole output" in shown[100] and len(shown) == 101
        clock[0] += 2.0  # 20 lines of budget back: the next line shows, after the count of what was held
        p.feed(3, "stdout", "later\n")
        p.flush()
        assert out.getvalue().splitlines()[101:] == [
            "ddp_magic: 100 lines from ranks 0-3 held back; job.output(0) shows rank 0's whole output", "[rank 3] later"]
        assert p.budget.held == 100


def test_the_window_and_the_budget_read_the_kernel_s_env_and_a_bad_value_keeps_the_default(monkeypatch, caplog):
    from ddp_magic.kernel.output.fold import BUDGET_LINES, setting

    assert setting("DDP_MAGIC_FOLD_WINDOW", FOLD_WINDOW, {"DDP_MAGIC_FOLD_WINDOW": "2.5"}) == 2.5
    assert setting("DDP_MAGIC_FOLD_WINDOW", FOLD_WINDOW, {"DDP_MAGIC_FOLD_WINDOW": "soon"}) == FOLD_WINDOW
    assert "DDP_MAGIC_FOLD_WINDOW='soon' is not a positive number" in caplog.text
    assert setting("DDP_MAGIC_OUTPUT_LINES", BUDGET_LINES, {}) == BUDGET_LINES
    monkeypatch.setenv("DDP_MAGIC_OUTPUT_LINES", "1000")
    monkeypatch.setenv("DDP_MAGIC_FOLD_WINDOW", "4")
    assert OutputBudget().lines == 1000 and LineFolder().window == 4.0


def test_ordered_output_of_many_ranks_folds_at_the_cell_s_end():
    for _run in (1, 2):
        p, out, _ = _printer(16, ordered=True)
        for r in reversed(range(16)):
            p.feed(r, "stdout", f"start\nrank {r} loss {r / 10}\nend\n")
        assert out.getvalue() == "", "--ordered: everything at the end"
        p.flush()
        assert out.getvalue() == "[ranks 0-15] start\n" + "".join(f"[rank {r}] rank {r} loss {r / 10}\n" for r in range(16)) + "[ranks 0-15] end\n"


def test_without_log_time_drops_only_a_cpp_log_lines_time():
    from ddp_magic.kernel.output.fold import without_log_time

    assert without_log_time("[W1201 20:17:46.189958604 socket.cpp:207] [c10d] err=-3\n") == "[W socket.cpp:207] [c10d] err=-3\n"
    assert without_log_time("[I0102 01:02:03.4 ProcessGroupGloo.cpp:1] x") == "[I ProcessGroupGloo.cpp:1] x"
    for line in ("[rank 0] [W1201 20:17:46.1 a.cpp:1] x", "[W1201 not a time] x", "plain line\n", ""):
        assert without_log_time(line) == line
