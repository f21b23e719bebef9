"""A cell's wakes cost O(1) however many ranks: the policy is asked only when a rank's state changed or a deadline is due.

A fake pool on a fake clock wakes the loop every 10 ms (as streaming output does)
while 64 ranks run; the same failure is played with and without ``state_version``,
and what the cell decides must be the same, with far fewer passes over the ranks.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ddp_magic.errors import RankFailure
from ddp_magic.kernel.cell import CellRun
from ddp_magic.kernel.failures.policy import FailurePolicy
from ddp_magic.kernel.ranks import RankInfo
from ddp_magic.states import FailureKind, RankState

N = 64
WAKE_S = 0.01
STACK = '(running the cell)\n  File "<ddp-cell-1>", line 2, in <module>\n    dist.all_reduce(x)\n'


class Ops:
    """The pool's side of RankOps: rank 5 raises at 0.1 s, the others wait in all_reduce until the group is aborted."""

    def __init__(self, versioned: bool, fails: bool = True) -> None:
        self.now = 0.0
        self.grace = 0.3
        self.ranks: Dict[int, RankInfo] = {r: RankInfo(rank=r, state=RankState.RUNNING, pid=100 + r, started=0.0) for r in range(N)}
        self.done: Dict[int, dict] = {}
        self.events: List[Tuple[float, Callable[[], None]]] = [(0.1, lambda: self._finish(5, "error", "ValueError", "boom"))]
        if not fails:  # every rank finishes, one per wake
            self.events = [(round(WAKE_S * (r + 1), 6), lambda r=r: self._finish(r, "ok", "", "")) for r in range(N)]
        self.version = 0
        self.failed = 0
        self.log: List[Tuple[str, float]] = []
        if versioned:
            self.state_version = lambda: (self.failed, self.version)  # what the real pool has (hub.failed, hub.version)

    def _finish(self, rank: int, status: str, type_name: str, message: str) -> None:
        info = self.ranks[rank]
        if info.state == RankState.RUNNING:
            info.state = {"ok": RankState.DONE, "error": RankState.FAILED}.get(status, RankState.INTERRUPTED)
            info.finished = self.now
            self.done[rank] = {"status": status, "error": {"type": type_name, "message": message, "traceback": ""}, "seq": 2}  # before all_reduce #3
            self.version += 1
            self.failed += status != "ok"

    def pump(self, until: Callable[[], bool], deadline: Optional[float], tick: Optional[Callable[[], None]] = None, due: object = None) -> bool:
        for _ in range(100_000):
            if until():
                return True
            self.now = round(self.now + WAKE_S, 6)
            for _, what in [e for e in self.events if e[0] <= self.now]:
                what()
            self.events = [e for e in self.events if e[0] > self.now]
            if tick is not None:
                tick()
        raise AssertionError("the cell never ended")

    def ask(self, op: str, timeout: float, *, ranks: Optional[Sequence[int]] = None) -> Dict[int, dict]:
        self.log.append(("ask", self.now))
        coll = {"op": "all_reduce", "seq": 3, "shape": [1], "dtype": "float32", "group": "default", "ranks": None}
        return {r: {"text": STACK, "collective": coll} for r, i in self.ranks.items() if i.state == RankState.RUNNING}

    def abort(self, ranks: Sequence[int], why: str) -> None:
        self.log.append(("abort", self.now))
        for r in ranks:
            self.events.append((self.now + 0.05, lambda r=r: self._finish(r, "interrupted", "RuntimeError", "released")))

    def interrupt(self, ranks: Sequence[int]) -> None:
        self.log.append(("interrupt", self.now))

    def signal_ranks(self, ranks: Sequence[int], sig: int) -> None:
        self.log.append(("signal", self.now))

    def done_message(self, rank: int) -> Optional[dict]:
        return self.done.get(rank)

    def death_failure(self, rank: int) -> RankFailure:
        return RankFailure(rank=rank, kind=FailureKind.DIED)

    def mark_dead(self, rank: int) -> None:
        self.ranks[rank].state = RankState.DEAD
        self.version += 1
        self.failed += 1

    def mark_broken(self, why: str) -> None:
        pass

    def answer_input(self, ask: object, cancelled: bool) -> None:
        pass

    def holding(self) -> bool:
        return False


def _play(versioned: bool, fails: bool = True, sent: bool = False) -> Tuple[CellRun, Ops, int]:
    ops = Ops(versioned, fails)
    policy = FailurePolicy(timeout=None, grace=ops.grace, t0=0.0)
    calls = [0]
    decide = policy.decide

    def counted(states, now):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return decide(states, now)

    policy.decide = counted  # type: ignore[method-assign]
    run = CellRun(ops, policy, clock=lambda: ops.now, sent=sent)  # type: ignore[arg-type]
    run.drive()
    return run, ops, calls[0]


def test_the_policy_is_asked_on_changes_and_deadlines_only_with_the_same_outcome() -> None:
    for _ in range(2):
        plain, plain_ops, every_wake = _play(versioned=False)
        fast, fast_ops, on_change = _play(versioned=True)
        assert fast_ops.log == plain_ops.log and [a for a, _ in fast_ops.log] == ["ask", "abort"]
        assert fast.notes == plain.notes
        assert [(f.rank, f.kind, f.message) for f in fast.failures()] == [(f.rank, f.kind, f.message) for f in plain.failures()]
        assert fast.failures()[0].rank == 5 and fast.failures()[0].kind == FailureKind.ERROR
        wakes = round(fast_ops.now / WAKE_S)
        assert every_wake >= wakes - 1  # without a version: a pass over every rank at every wake
        assert on_change <= fast_ops.version + 3  # with one: once per change (the raise, 63 releases), plus the grace's end
        assert on_change < every_wake / 2


def test_ranks_that_just_finish_give_the_policy_nothing_to_decide() -> None:
    for _ in range(2):
        plain, plain_ops, every_wake = _play(versioned=False, fails=False)
        fast, fast_ops, on_change = _play(versioned=True, fails=False)
        assert fast_ops.log == plain_ops.log == [] and fast.notes == plain.notes == [] and fast.failures() == plain.failures() == []
        assert all(info.state == RankState.DONE for info in fast_ops.ranks.values())
        assert every_wake >= N - 1 and on_change <= 2  # one pass at the first wake; none for the 64 ranks that finished after it


def test_a_cell_just_sent_that_nobody_fails_needs_no_pass_for_its_outcome_and_one_that_fails_is_told_the_same() -> None:
    """Pool.run's cell (``sent``: every rank RUNNING at the start): with nothing failed since, the first wake does not
    ask the policy and its failures are none without a DONE read; a failure is decided and reported as before."""
    for _ in range(2):
        clean, clean_ops, asked = _play(versioned=True, fails=False, sent=True)
        reads: List[int] = []
        clean_ops.done_message = reads.append  # type: ignore[assignment]  # a read would be seen
        assert asked == 0 and clean.failures() == [] and reads == [] and clean_ops.log == []
        plain, plain_ops, _ = _play(versioned=True)
        fast, fast_ops, _ = _play(versioned=True, sent=True)
        assert fast_ops.log == plain_ops.log and fast.notes == plain.notes
        assert [(f.rank, f.kind, f.message) for f in fast.failures()] == [(f.rank, f.kind, f.message) for f in plain.failures()]
        assert fast.failures()[0].rank == 5
