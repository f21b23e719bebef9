"""How failures read: exit codes and signals, each kind's headline, a cell's report."""
from __future__ import annotations

import signal

import pytest

import ddp_magic.errors as errors
from ddp_magic.errors import CellError, PlanError, RankFailure, describe_exit, signal_name
from ddp_magic.states import FailureKind


def test_signal_names_have_one_home():
    assert signal_name(-signal.SIGKILL) == "SIGKILL" and signal_name(-signal.SIGTERM) == "SIGTERM"
    assert signal_name(3) is None and signal_name(None) is None and signal_name(0) is None
    assert signal_name(-999) == "signal 999"


def test_describe_exit_says_what_to_suspect():
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-9) == "was killed by SIGKILL"  # no guess: kernel/failures/deaths.py says OOM or not, with evidence
    assert describe_exit(-11) == "was killed by SIGSEGV (a crash in native code)"
    assert describe_exit(-15) == "was killed by SIGTERM"
    assert "lost its connection" in describe_exit(None)


@pytest.mark.parametrize(
    "failure, headline",
    [
        (RankFailure(rank=1, kind=FailureKind.DIED, pid=7, exit_code=4), "rank 1 (pid 7) exited with code 4"),
        (RankFailure(rank=1, kind=FailureKind.KILLED, pid=7, exit_code=-15), "rank 1 (pid 7) did not respond to the interrupt and was stopped (SIGTERM)"),
        (RankFailure(rank=1, kind=FailureKind.KILLED, pid=7, exit_code=-9), "rank 1 (pid 7) did not respond to the interrupt and was stopped (SIGKILL)"),
        (RankFailure(rank=1, kind=FailureKind.KILLED, pid=7, exit_code=2), "rank 1 (pid 7) did not respond to the interrupt and was stopped (exited with code 2)"),  # noqa: E501
        (RankFailure(rank=0, kind=FailureKind.TIMEOUT, message="the cell ran past --timeout 1s"), "the cell ran past --timeout 1s"),
        (RankFailure(rank=2, kind=FailureKind.INTERRUPTED), "rank 2 was interrupted"),
        (RankFailure(rank=3, kind=FailureKind.ERROR, type="ValueError", message="bad"), "rank 3 raised ValueError: bad"),
        (RankFailure(rank=3, kind=FailureKind.INIT, type="RuntimeError"), "rank 3 raised RuntimeError"),
    ],
)
def test_headline_per_kind(failure, headline):
    assert failure.headline() == headline


def test_a_cell_error_puts_the_root_cause_first_and_sums_up_the_stopped():
    err = CellError(
        [
            RankFailure(rank=1, kind=FailureKind.DIED, pid=9, exit_code=-11, last_lines=["a", "b"]),
            RankFailure(rank=0, kind=FailureKind.ERROR, type="RuntimeError", message="Connection reset by peer"),
            RankFailure(rank=2, kind=FailureKind.KILLED, pid=8, exit_code=-9),
        ],
        notes=["rank 2 did not respond to the interrupt and was stopped"],
    )
    lines = str(err).splitlines()
    assert lines[0] == "rank 1 (pid 9) was killed by SIGSEGV (a crash in native code)"
    assert "--- last lines rank 1 printed ---" in lines and "rank 0 raised RuntimeError: Connection reset by peer" in lines
    assert not any("(pid 8)" in ln for ln in lines)  # the stopped rank is in the notes only
    assert lines[-1] == "rank 2 did not respond to the interrupt and was stopped"
    assert err.ranks == [1, 0, 2] and err._render_traceback_()[0].startswith("\x1b[91mCellError\x1b[39m: rank 1")  # IPython's colour


def test_a_cell_error_without_failures_shows_its_notes():
    assert str(CellError([], notes=["interrupted by the user"])) == "interrupted by the user"
    assert str(CellError([])) == "the cell failed"


def test_plan_error_is_a_value_error_and_lives_here():
    assert issubclass(PlanError, ValueError)
    assert not hasattr(errors, "CellTimeout")  # a --timeout is a CellError with a TIMEOUT failure


# ---------------------------------------------------------------- at scale: one line per group of ranks
def test_a_thousand_failures_read_as_one_line_per_group():
    n = 1024
    root = RankFailure(517, FailureKind.ERROR, "ValueError", "boom", traceback="Traceback ...\nValueError: boom")
    interrupted = [RankFailure(r, FailureKind.INTERRUPTED, "KeyboardInterrupt") for r in range(n) if r not in (517, 3, 4, 700)]
    died = [RankFailure(r, FailureKind.DIED, pid=100 + r, exit_code=1) for r in (3, 4)]
    lone = RankFailure(700, FailureKind.DIED, pid=800, exit_code=-signal.SIGSEGV, last_lines=["a", "b"])
    text = CellError([root, *died, *interrupted, lone], notes=["ranks 0-516, 518-1023 were in all_reduce #3 and were released"]).render()
    lines = [ln for ln in text.splitlines() if ln]
    assert lines[0] == "rank 517 raised ValueError: boom"
    assert "ranks 3-4 exited with code 1" in lines
    assert "ranks 0-2, 5-516, 518-699, 701-1023 were interrupted" in lines  # 1,019 ranks, one line
    assert "rank 700 (pid 800) was killed by SIGSEGV (a crash in native code)" in lines and "  last lines: b" in lines  # one rank: as today
    assert lines[-1] == "ranks 0-516, 518-1023 were in all_reduce #3 and were released"
    assert len(lines) < 12


def test_many_ways_of_failing_are_capped_and_counted():
    root = RankFailure(0, FailureKind.ERROR, "ValueError", "boom")
    each_own = [RankFailure(r, FailureKind.ERROR, "RuntimeError", f"rank {r} broke") for r in range(1, 1024)]
    text = CellError([root, *each_own]).render()
    assert text.count("raised RuntimeError") == errors.GROUPS_SHOWN
    assert text.splitlines()[-1] == f"ranks {errors.GROUPS_SHOWN + 1}-1023 failed in {1023 - errors.GROUPS_SHOWN} other ways (each one: the error's .failures)"
    same = CellError([root, *(RankFailure(r, FailureKind.ERROR, "ValueError", "boom") for r in range(1, 1024))]).render()
    assert same.splitlines() == ["rank 0 raised ValueError: boom", "", "ranks 1-1023 failed the same way"]


def test_groups_of_dead_ranks_speak_in_the_plural():
    group = [RankFailure(r, FailureKind.DIED, exit_code=-signal.SIGKILL) for r in (1, 2)]
    assert errors.group_headline(group).startswith("ranks 1-2 were killed by SIGKILL")
    lost = [RankFailure(r, FailureKind.DIED) for r in (1, 2)]
    assert errors.group_headline(lost).startswith("ranks 1-2 lost their connections to the kernel")


def test_a_dead_rank_of_a_pool_with_named_nodes_says_its_node():
    """A Ray node's raylet killed: its ranks' connections drop; the line names the machine to look at, one group a node."""
    lost = [RankFailure(r, FailureKind.DIED, pid=100 + r, on="n2") for r in (2, 3)] + [RankFailure(4, FailureKind.DIED, pid=104, on="n3")]
    said = CellError(lost).render()
    assert said.splitlines()[:3] == ["rank 2 (pid 102) on n2 lost its connection to the kernel (the rank, or its whole node, went away)", "",
                                     "rank 3 failed the same way"], said
    assert "rank 4 (pid 104) on n3 lost its connection to the kernel" in said, said  # another node: another group
    assert errors.group_headline(lost[:2]) == "ranks 2-3 on n2 lost their connections to the kernel (the rank, or its whole node, went away)"
    assert RankFailure(1, FailureKind.DIED, pid=7, exit_code=-signal.SIGKILL).headline() == "rank 1 (pid 7) was killed by SIGKILL"  # one host


def test_scattered_ranks_are_cut_after_a_few_runs():
    root = RankFailure(1, FailureKind.ERROR, "ValueError", "boom")
    every_other = [RankFailure(r, FailureKind.INTERRUPTED, "KeyboardInterrupt") for r in range(0, 1024, 2)]
    assert "ranks 0, 2, 4, 6, 8, 10, 12, 14 and 504 more were interrupted" in CellError([root, *every_other]).render().splitlines()
