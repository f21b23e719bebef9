"""The failure policy, case by case, without processes: a fake pool (RankOps) and a fake clock.

FailurePolicy is pure (states and time in, actions out); CellRun carries its
actions out through the pool's narrow interface. The fake pool below plays
ranks that finish, raise, die, honour or ignore an interrupt, and survive or
not a SIGTERM, on a clock that only moves when the loop waits.
"""
from __future__ import annotations

import signal
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

import pytest

from ddp_magic.errors import CellError, RankFailure
from ddp_magic.kernel.failures.blame import causes, root_cause_rank
from ddp_magic.kernel.cell import CellRun, RankOps
from ddp_magic.kernel.failures.forensics import last_cell_line
from ddp_magic.kernel.failures.policy import (
    FAILURE,
    PROBE,
    Abort,
    CaptureStacks,
    FailurePolicy,
    GiveUp,
    Interrupt,
    Signal,
)
from ddp_magic.kernel.ranks import RankInfo
from ddp_magic.states import FailureKind, RankState

STUCK = (
    "Traceback (most recent call last):\n"
    '  File "<ddp-cell-3>", line 5, in <module>\n'
    "    dist.all_reduce(x)\n"
    '  File "/torch/distributed/c10d.py", line 2050, in all_reduce\n'
    "    work.wait()\n"
)
ERROR = {"type": "ValueError", "message": "rank 1 cannot go on", "traceback": "Traceback ...\nValueError: rank 1 cannot go on\n"}
PEER = {"type": "RuntimeError", "message": "[gloo] Connection closed by peer [127.0.0.1]:1234", "traceback": ""}
REACT_S = 0.05  # how long a fake rank takes to react to an interrupt or a signal


class FakePool:
    """Plays the pool's side of RankOps on a fake clock, with ranks that behave as told."""

    def __init__(
        self,
        n: int,
        interruptible: Sequence[int] = (),
        term_ok: Sequence[int] = (),
        kill_ok: Sequence[int] = (),
        grace: float = 1.0,
        collective: Optional[Dict[int, dict]] = None,
        abortable: Sequence[int] = (),
        silent: Sequence[int] = (),
    ) -> None:
        self.now = 0.0
        self.grace = grace
        self.ranks: Dict[int, RankInfo] = {r: RankInfo(rank=r, state=RankState.RUNNING, pid=1000 + r, started=0.0) for r in range(n)}
        self.interruptible: Set[int] = set(interruptible)
        self.term_ok, self.kill_ok = set(term_ok), set(kill_ok)
        self.events: List[Tuple[float, Callable[[], None]]] = []
        self.done: Dict[int, dict] = {}
        self.log: List[tuple] = []  # what the policy had the pool do, with the time
        self.broken: Optional[str] = None
        self.pump_calls = 0
        self.ticks = 0
        self.debugging: Set[int] = set()  # ranks in the debugger (holding)
        self.collective: Dict[int, dict] = collective or {}  # what a rank's STACK reply says it waits in
        self.abortable: Set[int] = set(abortable)  # ranks an aborted process group releases
        self.silent: Set[int] = set(silent)  # ranks on a node gone silent: nothing reaches them, they answer nothing

    # ------------------------------------------------------------ scripting
    def at(self, t: float, what: Callable[[], None]) -> None:
        self.events.append((t, what))

    def finish(self, rank: int, status: str, error: Optional[dict] = None, seq: Optional[int] = None) -> Callable[[], None]:
        """``seq``: the default group's sequence number its DONE reports (collectives issued so far)."""
        def go() -> None:
            info = self.ranks[rank]
            if info.state != RankState.RUNNING:
                return
            self.done[rank] = {"op": "done", "status": status, "error": error, "seq": seq}
            info.state = {"ok": RankState.DONE, "interrupted": RankState.INTERRUPTED}.get(status, RankState.FAILED)
            info.finished = self.now

        return go

    def die(self, rank: int, code: int) -> Callable[[], None]:
        def go() -> None:
            info = self.ranks[rank]
            if info.state == RankState.RUNNING:
                info.state, info.exit_code, info.finished = RankState.DEAD, code, self.now

        return go

    def unreachable(self, *ranks: int) -> Callable[[], None]:
        """The liveness check's verdict on a silent node: its ranks are DEAD, as unreachable (kernel/hub.py ``_lost``)."""
        def go() -> None:
            for r in ranks:
                info = self.ranks[r]
                if info.state == RankState.RUNNING:
                    info.state, info.silent, info.finished = RankState.DEAD, True, self.now

        return go

    def ctrl_c(self) -> None:
        raise KeyboardInterrupt

    # ------------------------------------------------------------ RankOps
    def pump(self, until, deadline, tick=None, due=None) -> bool:
        self.pump_calls += 1
        for _ in range(10_000):
            if until():
                return True
            wake = [t for t, _ in self.events] + [self.now + 0.5]
            d = due() if due is not None else None
            self.now = max(self.now, min(wake + ([d] if d is not None else [])))
            if deadline is not None and self.now >= deadline:
                return False
            ready = sorted((e for e in self.events if e[0] <= self.now), key=lambda e: e[0])
            self.events = [e for e in self.events if e[0] > self.now]
            for _, what in ready:
                what()
            if tick is not None:
                self.ticks += 1
                tick()
        raise AssertionError("the loop never ended")

    def ask(self, op: str, timeout: float, *, ranks: Optional[Sequence[int]] = None) -> Dict[int, dict]:
        self.log.append(("ask", op, self.now))
        self.now += 0.01
        asked = self.ranks if ranks is None else ranks
        return {r: {"op": op, "text": STUCK, "collective": self.collective.get(r)} for r in asked
                if self.ranks[r].state == RankState.RUNNING and r not in self.silent}

    def abort(self, ranks: Sequence[int], why: str) -> None:
        self.log.append(("abort", tuple(ranks), self.now))
        for r in ranks:
            if r in self.abortable:
                self.at(self.now + REACT_S, self.finish(r, "interrupted", {"type": "RuntimeError", "message": "released", "traceback": ""}))

    def interrupt(self, ranks: Sequence[int]) -> None:
        self.log.append(("interrupt", tuple(ranks), self.now))
        for r in ranks:
            if r in self.interruptible:
                self.at(self.now + REACT_S, self.finish(r, "interrupted", {"type": "KeyboardInterrupt", "message": "", "traceback": ""}))

    def signal_ranks(self, ranks: Sequence[int], sig: int) -> None:
        self.log.append(("signal", tuple(ranks), sig, self.now))
        for r in ranks:
            if r in (self.term_ok if sig == signal.SIGTERM else self.kill_ok) and r not in self.silent:
                self.at(self.now + REACT_S, self.die(r, -sig))

    def done_message(self, rank: int) -> Optional[dict]:
        return self.done.get(rank)

    def death_failure(self, rank: int) -> RankFailure:
        info = self.ranks[rank]
        if info.silent:
            return RankFailure(rank=rank, kind=FailureKind.DIED, pid=info.pid, message="no answer", node="n2")
        return RankFailure(rank=rank, kind=FailureKind.DIED, pid=info.pid, exit_code=info.exit_code)

    def answer_input(self, ask, cancelled) -> None:
        pass

    def holding(self) -> bool:
        return bool(self.debugging)  # ranks in the debugger: the policy's clocks stand still

    def mark_dead(self, rank: int) -> None:
        self.log.append(("dead", rank, self.now))
        info = self.ranks[rank]
        info.state, info.finished = RankState.DEAD, info.finished or self.now

    def mark_broken(self, why: str) -> None:
        self.broken = why

    # ------------------------------------------------------------ helpers
    def did(self, what: str) -> List[tuple]:
        return [e for e in self.log if e[0] == what]


def _run(pool: FakePool, timeout: Optional[float] = None, remote: bool = False) -> CellRun:
    ops: RankOps = pool  # the fake satisfies the pool's narrow interface
    run = CellRun(ops, FailurePolicy(timeout, pool.grace, 0.0, remote=remote), clock=lambda: pool.now)
    run.drive()
    return run


# ------------------------------------------------------------------ a rank raises while the others wait
AR = {"op": "all_reduce", "seq": 5, "shape": [4], "dtype": "float32", "group": "default", "ranks": None, "waited": 1.0}


def test_a_rank_raises_while_others_wait_in_a_collective_and_the_group_is_aborted():
    pool = FakePool(4, collective={0: AR, 2: AR, 3: AR}, abortable=[0, 2, 3])
    pool.at(0.1, pool.finish(1, "error", ERROR, seq=4))  # it issued 4 collectives: it never reached #5
    run = _run(pool)

    # stacks at once (every other rank waits in all_reduce, which rank 1 left: the grace cannot help) -> abort on every live rank -> released
    assert pool.did("ask") == [("ask", "stack", pytest.approx(0.1))]
    assert pool.did("abort") == [("abort", (0, 1, 2, 3), pytest.approx(0.11))]
    assert not pool.did("interrupt"), "the abort releases them; an interrupt could not"
    assert not pool.did("signal") and pool.broken is None
    assert run.notes[0] == "rank 1 never arrived at all_reduce #5 (rank 1 raised)"
    assert run.notes[1] == "where each rank was:"
    assert "all_reduce #5  [4] float32  default  at cell line 5: dist.all_reduce(x)" in run.notes[3]
    assert run.notes[-1] == "ranks 0, 2-3 were in all_reduce #5 (at cell line 5: dist.all_reduce(x)) and were released"
    assert run.aborted and run.cancelled and not run.state_lost
    failures = run.failures()
    assert [(f.rank, f.kind) for f in failures] == [(1, "error"), (0, "interrupted"), (2, "interrupted"), (3, "interrupted")]
    assert failures[0].headline() == "rank 1 raised ValueError: rank 1 cannot go on"
    assert pool.pump_calls == 1, "stopping ranks happens inside the one poll loop, not in a loop of its own"


def test_ranks_that_not_even_the_abort_releases_are_stopped():
    pool = FakePool(4, term_ok=[0, 2, 3], collective={0: AR, 2: AR, 3: AR})  # deaf to the abort, not to SIGTERM
    pool.at(0.1, pool.finish(1, "error", ERROR, seq=4))
    run = _run(pool)
    # abort at once (0.11) -> a grace -> still running: the interrupt they were spared (1.11) -> a grace -> SIGTERM
    assert pool.did("interrupt") == [("interrupt", (0, 2, 3), pytest.approx(1.11))]
    assert pool.did("signal") == [("signal", (0, 2, 3), signal.SIGTERM, pytest.approx(2.11))]
    assert pool.now < 2.5, "no SIGKILL wait once every stopped rank has exited"
    assert run.notes[-1] == (
        "ranks 0, 2-3 did not respond to the interrupt (stuck in a collective or native code) and were stopped; "
        "the pool restarts on the next cell and variables defined in earlier %%ddp cells are lost"
    )
    assert pool.broken == "ranks 0, 2-3 did not respond to the interrupt and were stopped"
    assert run.state_lost
    failures = run.failures()
    assert [(f.rank, f.kind) for f in failures] == [(1, "error"), (0, "killed"), (2, "killed"), (3, "killed")]
    assert failures[1].kind is FailureKind.KILLED and failures[1].exit_code == -signal.SIGTERM


def test_a_rank_deaf_to_the_interrupt_gets_the_group_aborted_before_it_is_stopped():
    """Not seen in a collective (DDP's buckets wait in C++), yet deaf: abort first, then the signals."""
    pool = FakePool(2, abortable=[0])
    pool.at(0.1, pool.finish(1, "error", ERROR))
    run = _run(pool)
    # rank 0 is in no collective: asked at once and again after 0.05, 0.1, 0.2, 0.4 s (each ask takes the fake 0.01 s), then the grace runs out
    assert [t for _, _, t in pool.did("ask")] == pytest.approx([0.1, 0.16, 0.27, 0.48, 0.89, 1.1])
    assert pool.did("interrupt") == [("interrupt", (0,), pytest.approx(1.11))]
    assert pool.did("abort") == [("abort", (0, 1), pytest.approx(2.11))]
    assert not pool.did("signal") and pool.broken is None and run.aborted and not run.state_lost
    assert run.notes == [
        "after rank 1 failed, rank 0 was still running (rank 0 at cell line 5: dist.all_reduce(x)); interrupted",
        "rank 0 did not respond to the interrupt; aborted the process group to release it",
    ]


def test_a_rank_in_the_debugger_pauses_the_grace_and_the_timeout():
    """Time a rank spends in pdb (or at input()) is not counted against the peers or the cell."""
    pool = FakePool(3, interruptible=[0, 2])
    pool.at(0.1, pool.finish(1, "error", ERROR))
    pool.at(0.2, lambda: pool.debugging.add(2))  # rank 2 stops in pdb; rank 0 waits for it
    pool.at(30.0, lambda: pool.debugging.discard(2))  # ... for 30 s, far past the grace and the timeout
    run = _run(pool, timeout=10.0)
    assert [e[2] for e in pool.did("interrupt")] == [pytest.approx(30.0 + 0.9 + 0.01, abs=0.6)]
    assert not run.timed_out


def test_sigkill_follows_sigterm_after_a_second_and_then_the_ranks_are_given_up():
    pool = FakePool(2)  # rank 0 survives everything (a process in uninterruptible sleep)
    pool.at(0.2, pool.finish(1, "error", ERROR))
    run = _run(pool)
    signals = pool.did("signal")
    assert [(s[1], s[2]) for s in signals] == [((0,), signal.SIGTERM), ((0,), signal.SIGKILL)]
    assert signals[1][3] - signals[0][3] == pytest.approx(1.0)
    assert pool.did("dead") == [("dead", 0, pytest.approx(signals[1][3] + 3.0))]
    assert run.notes[-1].startswith("rank 0 did not respond to the interrupt (stuck in a collective or native code) and was stopped;")
    assert pool.broken == "rank 0 did not respond to the interrupt and was stopped"
    assert [(f.rank, f.kind) for f in run.failures()] == [(1, "error"), (0, "killed")]


def test_output_keeps_flowing_while_ranks_are_stopped():
    """Between SIGTERM and SIGKILL the one loop goes on: a line rank 0 writes at 3.8 s is read at 3.8 s (not when the
    stop is over), and the loop ticked (the policy's turn) between the SIGTERM and the line, and between the line and the SIGKILL."""
    pool = FakePool(2, kill_ok=[0])
    pool.at(0.1, pool.finish(1, "error", ERROR))
    read: List[Tuple[float, int]] = []  # (when the line was read, the loop's ticks then)
    pool.at(3.8, lambda: read.append((pool.now, pool.ticks)))  # rank 0 writes a line, between SIGTERM (3.11) and SIGKILL (4.11)
    ticks_at: List[int] = []
    signal_ranks = pool.signal_ranks
    pool.signal_ranks = lambda ranks, sig: (ticks_at.append(pool.ticks), signal_ranks(ranks, sig))[-1]  # type: ignore[method-assign]
    _run(pool)
    assert [(s[2], s[3]) for s in pool.did("signal")] == [(signal.SIGTERM, pytest.approx(3.11)), (signal.SIGKILL, pytest.approx(4.11))]
    assert [when for when, _ in read] == [3.8], "the line was read when it was written, not once the ranks were stopped"
    (term, kill), (_, line) = ticks_at, read[0]
    assert term < line < kill, f"the loop's ticks at SIGTERM {term}, at the line {line}, at SIGKILL {kill}"


# ------------------------------------------------------------------ a rank dies
def test_a_dead_rank_is_the_root_cause_before_the_peer_errors_it_caused():
    pool = FakePool(4)
    pool.at(0.2, pool.finish(0, "error", PEER))  # arrives first
    pool.at(0.3, pool.die(2, -signal.SIGKILL))
    pool.at(0.4, pool.finish(1, "error", PEER))
    pool.at(0.4, pool.finish(3, "error", PEER))
    run = _run(pool)
    failures = run.failures()
    assert [(f.rank, f.kind) for f in failures] == [(2, "died"), (0, "interrupted"), (1, "interrupted"), (3, "interrupted")]
    assert failures[0].headline().startswith("rank 2 (pid 1002) was killed by SIGKILL")
    assert [f.message for f in failures[1:]] == ["released: rank 2 died"] * 3  # the backend's words are not the cell's
    assert pool.log and {e[0] for e in pool.log} == {"ask"}, "every rank finished on its own: asked where they were, nothing interrupted or stopped"
    assert run.notes == ["ranks 0-1, 3 were in a collective when rank 2 died, and were released"] and not run.state_lost


def test_a_rank_that_has_only_just_called_the_collective_counts_at_the_next_ask():
    """An abort that lands before the backend's wait starts does not release it: a rank counts once it has waited a moment."""
    p = FailurePolicy(None, 1.0, 0.0)
    states = _states(r0=RankState.RUNNING, r1=RankState.FAILED)
    assert p.decide(states, 0.1) == [CaptureStacks((0,), PROBE)]
    assert p.stacks_taken({0: STUCK}, 0.11, {0: dict(AR, waited=0.001)}, states, {1: 4}) == [], "only just called: not yet"
    assert p.decide(states, p.next_due()) == [CaptureStacks((0,), PROBE)]
    assert p.stacks_taken({0: STUCK}, 0.17, {0: dict(AR, waited=0.06)}, states, {1: 4}) == [Abort((0, 1), "rank 0 waited in a collective")]


def test_a_rank_still_inside_the_collective_its_peers_finished_with_is_not_stuck():
    """Every rank finished all_reduce #5 and then raised; rank 0 is still seen inside it, about to return: no abort."""
    pool = FakePool(4, collective={0: AR})
    for r in (1, 2, 3):
        pool.at(0.1, pool.finish(r, "error", ERROR, seq=5))
    pool.at(0.2, lambda: pool.collective.pop(0))
    pool.at(0.2, pool.finish(0, "error", ERROR, seq=5))
    run = _run(pool)
    assert pool.did("ask") and not pool.did("abort") and not pool.did("interrupt") and run.notes == []
    assert not run.aborted


def test_without_a_seq_from_the_rank_that_left_the_grace_runs_out():
    """A rank that died (or an older worker) reports no seq: nothing proves the others stuck."""
    pool = FakePool(4, collective={0: AR, 2: AR, 3: AR}, abortable=[0, 2, 3])
    pool.at(0.1, pool.finish(1, "error", ERROR))
    _run(pool)
    assert pool.did("abort") == [("abort", (0, 1, 2, 3), pytest.approx(1.11))]


def test_the_grace_runs_out_for_a_rank_in_a_collective_that_the_failed_rank_is_not_in():
    """A subgroup's all_reduce without rank 1 can still complete: rank 1's failure does not end the grace for it."""
    sub = dict(AR, group="group [0, 2]", ranks=[0, 2])
    pool = FakePool(4, collective={0: sub, 2: sub, 3: AR}, abortable=[0, 2, 3])
    pool.at(0.1, pool.finish(1, "error", ERROR, seq=4))
    _run(pool)
    assert [t for _, _, t in pool.did("ask")] == pytest.approx([0.1, 0.16, 0.27, 0.48, 0.89, 1.1]), "ranks 0 and 2 may finish: the grace runs out"
    assert pool.did("abort") == [("abort", (0, 1, 2, 3), pytest.approx(1.11))]


def test_a_rank_that_reaches_the_collective_a_moment_after_the_failure_ends_the_grace_at_the_next_ask():
    pool = FakePool(3, collective={0: AR}, abortable=[0, 2])
    pool.at(0.1, pool.finish(1, "error", ERROR, seq=4))
    pool.at(0.13, lambda: pool.collective.__setitem__(2, AR))  # rank 2 was still computing at the first ask
    _run(pool)
    assert [t for _, _, t in pool.did("ask")] == pytest.approx([0.1, 0.16])
    assert pool.did("abort") == [("abort", (0, 1, 2), pytest.approx(0.17))]


def test_a_probe_that_finds_every_rank_stuck_ends_the_grace_and_counts_only_the_ranks_still_running():
    p = FailurePolicy(None, 1.0, 0.0)
    states = _states(r0=RankState.RUNNING, r1=RankState.FAILED, r2=RankState.RUNNING)
    assert p.decide(states, 0.1) == [CaptureStacks((0, 2), PROBE)]
    later = _states(r0=RankState.RUNNING, r1=RankState.FAILED, r2=RankState.DONE)  # rank 2 finished while the stacks came
    actions = p.stacks_taken({0: STUCK, 2: "(idle)"}, 0.12, {0: AR, 2: None}, later, {1: 4, 2: 5})
    assert actions == [Abort((0, 1, 2), "rank 0 waited in a collective")]
    assert p.cancelled and p.interrupt_sent == 0.12 and p.notes[-1].startswith("rank 0 was in all_reduce #5")


def test_a_real_error_ranks_before_a_peer_connection_error_that_came_first():
    pool = FakePool(2)
    pool.at(0.1, pool.finish(0, "error", PEER))
    pool.at(0.2, pool.finish(1, "error", ERROR))
    failures = _run(pool).failures()
    assert [f.rank for f in failures] == [1, 0]
    assert [root_cause_rank(f) for f in failures] == [2, 3]


# ------------------------------------------------------------------ a node goes silent
def test_a_silent_node_is_the_root_cause_even_when_a_rank_on_a_healthy_node_died_first():
    """n2 (ranks 2-3) goes silent at 0; gloo ends rank 0 on the healthy node at 0.5 (its connection closes, no exit code:
    a rank on another host), long before the liveness check names n2 (8.5). Rank 0's death must not be the root cause,
    and ranks 2-3, which no interrupt, abort or KILL reaches, must not be given up as 'stopped' before the check speaks
    (that would lose every rank's state): the KILL to ranks on other hosts waits the check's window."""
    pool = FakePool(4, collective={1: AR}, abortable=[1], silent=[2, 3])
    pool.at(0.5, pool.die(0, None))  # type: ignore[arg-type]
    pool.at(8.5, pool.unreachable(2, 3))
    run = _run(pool, remote=True)
    assert not pool.did("dead") and pool.broken is None and not run.state_lost, pool.log
    failures = run.failures()
    assert [(f.rank, str(f.kind), f.node) for f in failures] == [(2, "died", "n2"), (3, "died", "n2"), (0, "died", ""), (1, "interrupted", "")]
    assert causes(failures) == {2: ("died", "root"), 3: ("died", "root"), 0: ("died", "stopped"), 1: ("interrupted", "stopped")}
    assert str(CellError(failures, run.notes)).startswith("ranks 2-3 on n2 are unreachable: no answer\n")


def test_a_healthy_ranks_collective_that_broke_on_a_silent_node_is_released_not_blamed():
    """gloo's connection to n2 resets on rank 0 at 0.1 (a firewall's reset, a peer host's RST): it raises a peer error
    long before the check names n2 (7.5). That error is n2's doing: rank 0 reads as released, as after an abort."""
    pool = FakePool(4, collective={1: AR}, abortable=[1], silent=[2, 3])
    pool.at(0.1, pool.finish(0, "error", PEER))
    pool.at(7.5, pool.unreachable(2, 3))
    run = _run(pool, remote=True)
    failures = run.failures()
    assert [(f.rank, str(f.kind)) for f in failures] == [(2, "died"), (3, "died"), (0, "interrupted"), (1, "interrupted")]
    assert failures[2].message == "released: a peer's node went silent" and not run.state_lost
    text = str(CellError(failures, run.notes))
    assert text.startswith("ranks 2-3 on n2 are unreachable: no answer\n") and "rank 0 raised" not in text, text
    alone = FakePool(2, interruptible=[1])  # no node went silent: the same error is rank 0's own failure, as before
    alone.at(0.1, alone.finish(0, "error", PEER))
    assert [(f.rank, str(f.kind)) for f in _run(alone, remote=True).failures()] == [(0, "error"), (1, "interrupted")]
    assert alone.did("interrupt")[0][2] == pytest.approx(9.1, abs=0.1), "the check's window first, then the grace's end"


def test_ranks_on_other_hosts_that_ignore_the_kill_are_given_up_after_the_checks_window():
    pool = FakePool(2, silent=[1])  # rank 1's node never answers, and the check never names it (a process that hangs)
    pool.at(0.1, pool.finish(0, "error", ERROR))
    run = _run(pool, remote=True)
    (kill,) = [e for e in pool.did("signal") if e[2] == signal.SIGKILL]
    (dead,) = pool.did("dead")
    assert dead[2] - kill[3] == pytest.approx(9.0), pool.log  # liveness' 8 s window and a probe, not KILL_WAIT_S's 3 s
    assert run.state_lost and [(f.rank, str(f.kind)) for f in run.failures()] == [(0, "error"), (1, "killed")]


# ------------------------------------------------------------------ a rank ignores the interrupt
def test_a_rank_ignoring_the_user_interrupt_is_stopped_after_the_grace():
    pool = FakePool(2, interruptible=[0], term_ok=[1])
    pool.at(1.0, pool.ctrl_c)
    run = _run(pool)
    assert pool.did("ask") == [("ask", "stack", 1.0)]  # where they were, for the message
    assert pool.did("interrupt") == [("interrupt", (0, 1), pytest.approx(1.01))]
    assert pool.did("abort") == [("abort", (0, 1), pytest.approx(2.01))]  # rank 0 is done; rank 1 is deaf: abort first
    assert pool.did("signal") == [("signal", (1,), signal.SIGTERM, pytest.approx(3.01))]
    assert run.notes[0] == "interrupted by the user (Ctrl-C / kernel interrupt)"
    assert run.notes[1] == "rank 1 did not respond to the interrupt; aborted the process group to release it"
    assert run.notes[2].startswith("rank 1 did not respond to the interrupt (stuck in a collective or native code) and was stopped;")
    assert [(f.rank, f.kind) for f in run.failures()] == [(1, "killed"), (0, "interrupted")]
    assert run.user_interrupt and run.cancelled and run.state_lost


# ------------------------------------------------------------------ the timeout
def test_the_timeout_captures_every_stack_and_interrupts():
    pool = FakePool(3, interruptible=[0, 1, 2])
    run = _run(pool, timeout=2.0)
    assert pool.did("ask") == [("ask", "stack", 2.0)]
    assert pool.did("interrupt") == [("interrupt", (0, 1, 2), pytest.approx(2.01))]
    assert not pool.did("signal") and pool.broken is None and not run.state_lost
    assert run.notes[0] == "where each rank was when the timeout expired:"
    assert run.notes[1].split() == ["ranks", "collective", "tensor", "group", "where"]  # one row per place, its ranks compact
    assert run.notes[2].split()[:4] == ["0-2", "-", "-", "-"] and run.notes[2].endswith("at cell line 5: dist.all_reduce(x)")
    assert run.notes[3:] == [f"--- ranks 0-2 ---\n{STUCK.rstrip()}"]  # the same stack on every rank: said once
    failures = run.failures()
    # nobody waited in a collective: every rank still running is what the timeout waited for, and is named
    assert [(f.rank, f.kind) for f in failures] == [(0, "timeout"), (1, "timeout"), (2, "timeout")]
    assert failures[0].headline() == "the cell ran past --timeout 2s: ranks 0-2 were still running"
    assert causes(failures) == {r: ("timeout", "root") for r in range(3)}
    text = str(CellError(failures, run.notes))
    assert text.startswith("the cell ran past --timeout 2s: ranks 0-2 were still running\n") and "the same way" not in text
    assert run.timed_out and run.cancelled


BARRIER = {"op": "barrier", "seq": 1, "shape": None, "dtype": None, "group": "default", "ranks": None, "waited": 2.0}


def _blamed(run: CellRun) -> Tuple[List[Tuple[int, str]], Dict[int, Tuple[str, str]]]:
    failures = run.failures()
    return [(f.rank, str(f.kind)) for f in failures], causes(failures)


def test_a_timeout_blames_the_rank_that_never_arrived_not_the_one_waiting_for_it():
    """Rank 1 sleeps, rank 0 waits in dist.barrier(): the message, the cell view and the panel all name rank 1."""
    pool = FakePool(2, interruptible=[1], collective={0: BARRIER}, abortable=[0])
    run = _run(pool, timeout=2.0)
    assert run.notes[0] == "rank 1 never arrived at barrier #1 (rank 1 at cell line 5: dist.all_reduce(x))"
    order, found = _blamed(run)
    assert order == [(1, "timeout"), (0, "interrupted")]
    assert found == {1: ("timeout", "root"), 0: ("interrupted", "stopped")}
    failures = run.failures()
    assert failures[0].headline() == "the cell ran past --timeout 2s, waiting for rank 1"
    assert str(CellError(failures, run.notes)).startswith("the cell ran past --timeout 2s, waiting for rank 1\n")


def test_a_timeout_blames_the_rank_in_a_mismatched_collective():
    bcast = dict(AR, op="broadcast")
    pool = FakePool(4, collective={0: AR, 1: bcast, 2: AR, 3: AR}, abortable=[0, 1, 2, 3])
    order, found = _blamed(_run(pool, timeout=3.0))
    assert order[0] == (1, "timeout") and found[1] == ("timeout", "root")
    assert {r: found[r] for r in (0, 2, 3)} == {r: ("interrupted", "stopped") for r in (0, 2, 3)}


def test_a_timeout_blames_a_rank_that_left_the_cell_without_the_collective():
    pool = FakePool(3, collective={0: BARRIER, 2: BARRIER}, abortable=[0, 2])
    pool.at(0.1, pool.finish(1, "ok"))  # rank 1 skipped the barrier and finished: the others wait for it
    run = _run(pool, timeout=2.0)
    assert run.notes[0] == "rank 1 never arrived at barrier #1 (rank 1 finished the cell)"
    order, found = _blamed(run)
    assert order == [(1, "timeout"), (0, "interrupted"), (2, "interrupted")]
    assert found == {1: ("timeout", "root"), 0: ("interrupted", "stopped"), 2: ("interrupted", "stopped")}


def test_a_timeout_where_every_rank_waits_alike_blames_every_rank():
    recv = dict(AR, op="recv")
    pool = FakePool(2, collective={0: recv, 1: recv}, abortable=[0, 1])  # both in recv, nobody sends
    order, found = _blamed(_run(pool, timeout=2.0))
    assert order == [(0, "timeout"), (1, "timeout")] and found == {0: ("timeout", "root"), 1: ("timeout", "root")}


def test_a_hung_rank_that_had_to_be_killed_is_still_the_root_cause():
    pool = FakePool(2, collective={0: BARRIER}, abortable=[0], term_ok=[1])  # rank 1 ignores the interrupt
    run = _run(pool, timeout=2.0)
    assert pool.did("signal") and run.state_lost
    failures = run.failures()
    assert [(f.rank, f.kind) for f in failures] == [(1, "timeout"), (0, "interrupted")]
    assert failures[0].exit_code == -signal.SIGTERM and causes(failures)[1] == ("timeout", "root")


def test_a_timeout_after_a_real_error_reports_the_error_first():
    pool = FakePool(2, interruptible=[0], grace=5.0)
    pool.at(0.5, pool.finish(1, "error", ERROR))
    run = _run(pool, timeout=1.0)
    assert run.timed_out
    assert [(f.rank, f.kind) for f in run.failures()] == [(1, "error"), (0, "interrupted")]


# ------------------------------------------------------------------ Ctrl-C
def test_ctrl_c_once_interrupts_every_rank_and_keeps_the_pool():
    pool = FakePool(3, interruptible=[0, 1, 2])
    pool.at(0.7, pool.ctrl_c)
    run = _run(pool)
    assert pool.did("ask") == [("ask", "stack", 0.7)]
    assert pool.did("interrupt") == [("interrupt", (0, 1, 2), pytest.approx(0.71))]
    assert not pool.did("signal") and not pool.did("abort") and pool.broken is None
    assert run.notes == ["interrupted by the user (Ctrl-C / kernel interrupt)"]
    assert [(f.rank, f.kind) for f in run.failures()] == [(0, "interrupted"), (1, "interrupted"), (2, "interrupted")]
    assert run.user_interrupt and run.cancelled and not run.state_lost


def test_ctrl_c_twice_stops_the_ranks_without_waiting_for_the_grace():
    pool = FakePool(2, term_ok=[0, 1])
    pool.at(0.5, pool.ctrl_c)
    pool.at(0.6, pool.ctrl_c)
    run = _run(pool)
    assert pool.did("signal") == [("signal", (0, 1), signal.SIGTERM, 0.6)]
    assert pool.broken == "ranks 0-1 did not respond to the interrupt and were stopped"
    assert run.state_lost
    assert [(f.rank, f.kind) for f in run.failures()] == [(0, "killed"), (1, "killed")]


def test_ctrl_c_when_nothing_answered_still_reports_an_interrupt():
    pool = FakePool(1, interruptible=[])
    pool.at(0.5, pool.ctrl_c)
    pool.at(0.6, pool.finish(0, "ok"))  # finished before the interrupt reached it
    run = _run(pool)
    failures = run.failures()
    assert [(f.rank, f.kind) for f in failures] == [(0, "interrupted")]


# ------------------------------------------------------------------ nothing goes wrong
def test_nothing_happens_when_every_rank_finishes():
    pool = FakePool(4)
    for r in range(4):
        pool.at(0.1 * (r + 1), pool.finish(r, "ok"))
    run = _run(pool, timeout=10.0)
    assert pool.log == [] and run.notes == [] and run.failures() == []
    assert not (run.cancelled or run.state_lost or run.timed_out or run.user_interrupt)
    assert pool.now == pytest.approx(0.4)


# ------------------------------------------------------------------ the policy alone, with a clock in hand
def _states(**ranks: RankState) -> Dict[int, Tuple[RankState, Optional[float]]]:
    return {int(k[1:]): (v, 0.5 if v != RankState.RUNNING else None) for k, v in ranks.items()}


def test_the_escalation_is_a_sequence_of_policy_states():
    p = FailurePolicy(None, 1.0, 0.0)
    assert p.next_due() is None
    states = _states(r0=RankState.RUNNING, r1=RankState.FAILED)
    assert p.decide(states, 0.5) == [CaptureStacks((0,), PROBE)], "at once: is every other rank stuck in a collective?"
    assert p.stacks_taken({0: STUCK}, 0.51, {0: None}, states) == [] and p.notes == [], "no: rank 0 may still finish"
    assert p.next_due() == pytest.approx(0.56), "asked again after 0.05 s"
    assert p.decide(states, 0.56) == [CaptureStacks((0,), PROBE)] and p.stacks_taken({}, 0.57, {}, states) == []
    assert p.next_due() == pytest.approx(0.67)
    assert p.decide(states, 1.5) == [CaptureStacks((0,), FAILURE)]
    assert p.decide(states, 1.6) == [], "nothing more until the stacks are in"
    assert p.stacks_taken({0: STUCK}, 1.6) == [Interrupt((0,))]
    assert p.notes == ["after rank 1 failed, rank 0 was still running (rank 0 at cell line 5: dist.all_reduce(x)); interrupted"]
    assert p.next_due() == pytest.approx(2.6)
    assert p.decide(states, 2.6) == [Abort((0, 1), "did not respond to the interrupt")]
    assert p.aborted and p.next_due() == pytest.approx(3.6)
    assert p.decide(states, 3.6) == [Signal((0,), signal.SIGTERM)]
    assert p.stopping and p.next_due() == pytest.approx(4.6)
    assert p.decide(states, 4.0) == []
    assert p.decide(states, 4.6) == [Signal((0,), signal.SIGKILL)]
    assert p.next_due() == pytest.approx(7.6)
    assert p.decide(states, 7.6) == [GiveUp((0,), "rank 0 did not respond to the interrupt and was stopped")]
    assert not p.stopping and p.state_lost


def test_an_interrupted_rank_counts_as_a_failure_only_before_we_interrupted_anyone():
    p = FailurePolicy(None, 1.0, 0.0)
    p.decide(_states(r0=RankState.INTERRUPTED, r1=RankState.RUNNING), 0.2)
    assert p.order == [0] and p.first_failure == 0.2
    q = FailurePolicy(None, 1.0, 0.0)
    q.user_interrupt(0.1, [0, 1])
    q.decide(_states(r0=RankState.INTERRUPTED, r1=RankState.RUNNING), 0.2)
    assert q.order == []


def test_where_a_stack_stands_in_the_cell():
    assert last_cell_line(STUCK) == "cell line 5: dist.all_reduce(x)"
    assert last_cell_line('  File "<ddp-cell-1>", line 2, in <module>') == "cell line 2"
    assert last_cell_line("no cell frame here") == "an unknown place"
