"""The failure policy while a cell runs: who failed first, when to interrupt, when to stop ranks.

A rank that raises or dies makes the cell fail; the others get ``grace``
seconds to finish, then are asked where they are (their stacks and the
collective each is in: forensics.py) and interrupted. The grace ends early
when every rank still running waits in a collective that cannot complete
(probe.py: asked at the first failure, and again while the grace lasts). When some wait in a
collective, the process group is aborted on every live rank as well, which
releases them (a gloo or NCCL wait cannot be interrupted), and the pool re-forms
the group after the cell in the same processes (recovery.py). Ranks that still do
not finish get one more grace with the group aborted, then are stopped with
SIGTERM, then SIGKILL, and the pool restarts on the next cell. Ctrl-C and
``--timeout`` take the same path. Failures are ordered so the one that explains
the others comes first.

Pure on purpose: no I/O, no signals, no sockets, no clock. It is given the
ranks' states and the time, and returns actions; ``kernel/cell.py`` carries
them out from inside the poll loop, so rank output keeps flowing while ranks
are being stopped, and tests drive it with a fake clock.
"""
from __future__ import annotations

import dataclasses
import signal
from dataclasses import dataclass
from enum import Enum
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

from ...errors import RankFailure
from ...states import FailureKind, RankState
from ...wire.execution import group_places
from ...wire.liveness import INTERVAL_S, SILENCE_S
from ...wire.protocol import CellStatus
from ...words import ranks_phrase
from . import forensics
from .probe import Probe, grace_after_failure
from .blame import released_by_death, released_why, root_cause_rank

States = Mapping[int, Tuple[RankState, Optional[float]]]  # rank -> (state, when it finished)

TERM_WAIT_S = 1.0  # after SIGTERM, how long before SIGKILL
KILL_WAIT_S = 3.0  # after SIGKILL, how long before the ranks are given up as dead
REMOTE_KILL_WAIT_S = float(SILENCE_S + INTERVAL_S)  # a KILL message reaches no one on a silent node: the check names it first


class StackReason(str, Enum):
    """Why the ranks' stacks are captured: what the policy does with the replies depends on it."""

    TIMEOUT = "timeout"  # the cell ran past --timeout: show where every rank was, then interrupt
    FAILURE = "failure"  # a rank failed and others still run: name where they wait, then interrupt
    USER = "user"  # Ctrl-C: show where the ranks were, then interrupt
    PROBE = "probe"  # a rank failed just now: if every other waits in a collective it cannot finish, FAILURE at once


TIMEOUT, FAILURE, USER, PROBE = StackReason.TIMEOUT, StackReason.FAILURE, StackReason.USER, StackReason.PROBE


@dataclass(frozen=True)
class CaptureStacks:
    """Ask these ranks where they are; hand the replies to ``FailurePolicy.stacks_taken``."""

    ranks: Tuple[int, ...]
    reason: StackReason


@dataclass(frozen=True)
class Interrupt:
    """Raise KeyboardInterrupt in these ranks' cells."""

    ranks: Tuple[int, ...]


@dataclass(frozen=True)
class Abort:
    """Abort the process group on these live ranks: their collective waits raise; the pool re-forms it after the cell."""

    ranks: Tuple[int, ...]
    why: str


@dataclass(frozen=True)
class Signal:
    """Send ``sig`` to these ranks (those whose process is ours to signal; others by message)."""

    ranks: Tuple[int, ...]
    sig: int


@dataclass(frozen=True)
class GiveUp:
    """Count these ranks as dead; the pool is broken (``why``) and its state is lost."""

    ranks: Tuple[int, ...]
    why: str


Action = Union[CaptureStacks, Interrupt, Abort, Signal, GiveUp]
Collectives = Mapping[int, Optional[Mapping[str, object]]]  # rank -> the collective its STACK reply named


def running(states: States) -> List[int]:
    """The ranks still executing the cell."""
    return [r for r, (state, _) in states.items() if state == RankState.RUNNING]


class FailurePolicy:
    """Decides, from the ranks' states and the time, what to do about a failing or overdue cell."""

    def __init__(self, timeout: Optional[float], grace: float, t0: float, remote: bool = False) -> None:
        self.timeout, self.grace, self.t0 = timeout, grace, t0
        self.kill_wait = REMOTE_KILL_WAIT_S if remote else KILL_WAIT_S  # ``remote``: ranks on other hosts (killed by message)
        self.window = REMOTE_KILL_WAIT_S if remote else 0.0  # the liveness check's, for a grace_after_failure
        self.peer_failed: Set[int] = set()  # ranks whose cell raised a peer's connection error (kernel/cell.py keeps it)
        self.order: List[int] = []  # ranks in the order they failed
        self._place: Dict[int, int] = {}  # rank -> its index in order (O(1) "failed yet?" at a thousand ranks)
        self.first_failure: Optional[float] = None
        self.interrupt_sent: Optional[float] = None
        self.killed: List[int] = []  # ranks we signalled
        self.notes: List[str] = []
        self.stacks: Dict[int, str] = {}
        self.collectives: Dict[int, Optional[Mapping[str, object]]] = {}  # where the ranks were (forensics.py)
        self.aborted = False  # the process group was aborted: the pool re-forms it after the cell
        self._interrupted: Set[int] = set()  # ranks sent an interrupt this cell
        self._abort_at: Optional[int] = None  # len(order) when it was: later peer errors are released ranks, not failures
        self._states: States = {}
        self.unreachable: Set[int] = set()  # dead ranks whose node went silent (wire/liveness.py): "unreachable", not "died"
        self.cancelled = False  # results are not collected
        self.user_interrupted = False
        self.timed_out = False
        self.state_lost = False
        self._timed_out_on: Tuple[int, ...] = ()  # the ranks still running when the timeout expired
        self._awaiting: Optional[CaptureStacks] = None  # stacks asked for, not yet handed back
        self._probe = Probe()  # asks, while the grace lasts, whether every rank still running is stuck (probe.py)
        self._stopping: Optional[List[int]] = None  # the ranks being stopped by signal
        self._sig: int = signal.SIGTERM  # the last signal sent to them
        self._sig_at = 0.0
        self._ctrl_c = 0

    @property
    def stopping(self) -> bool:
        """Ranks are being stopped by signal: the cell is not over until they are given up."""
        return self._stopping is not None

    def _note_failures(self, states: States, now: float) -> None:
        self._states = states
        counts = self.interrupt_sent is None and not self.user_interrupted  # an interruption is a failure only before we interrupted
        new = [(r, finished) for r, (state, finished) in states.items() if r not in self._place and (
            state in (RankState.FAILED, RankState.DEAD) or (state == RankState.INTERRUPTED and counts))]
        for r, _ in sorted(new, key=lambda rf: rf[1] or 0):  # only the new ones sorted: asked after every failure, at 1,024 ranks
            self._place[r] = len(self.order)
            self.order.append(r)
            if self.first_failure is None:
                self.first_failure = now
                self._probe.begin(now)

    def pause(self, seconds: float) -> None:
        """A rank sat in the debugger (or at input()) this long: no clock of the policy counts that time."""
        self.t0 += seconds
        self.first_failure = None if self.first_failure is None else self.first_failure + seconds
        self.interrupt_sent = None if self.interrupt_sent is None else self.interrupt_sent + seconds
        self._sig_at += seconds
        self._probe.pause(seconds)

    def next_due(self) -> Optional[float]:
        """When ``decide`` next has something to decide (the timeout, a grace period's end, an
        escalation step); None: only on events.

        Cheap on purpose (no pass over the ranks): the poll loop asks after every event."""
        times = []
        if self.timeout is not None and not self.timed_out:
            times.append(self.t0 + self.timeout)
        if self._stopping is not None:
            times.append(self._next_step())
        elif self.interrupt_sent is not None:
            times.append(self.interrupt_sent + self.grace)
        elif self.first_failure is not None:
            times += [self.first_failure + self._grace()] + ([self._probe.at] if self._probe.at is not None else [])
        return min(times) if times else None

    def _next_step(self) -> float:
        """When the stopping escalation takes its next step (due times and checks use the same sum)."""
        return self._sig_at + (TERM_WAIT_S if self._sig == signal.SIGTERM else self.kill_wait)

    def decide(self, states: States, now: float) -> List[Action]:
        """What to do now, given every rank's state."""
        self._note_failures(states, now)
        if self._stopping is not None:
            return self._escalate(states, now)
        live = running(states)
        if not live or self._awaiting is not None:
            return []
        if self.timeout is not None and not self.timed_out and now >= self.t0 + self.timeout:
            self.timed_out = self.cancelled = True
            self._timed_out_on = tuple(live)
            return self._ask_stacks(live, TIMEOUT)
        if self.first_failure is not None and self.interrupt_sent is None and now >= self.first_failure + self._grace():
            self.cancelled = True
            return self._ask_stacks(live, FAILURE)
        ask = self._probe.due(now, live) if self.first_failure is not None and self.interrupt_sent is None else None
        if ask is not None:
            self._awaiting = CaptureStacks(tuple(ask), PROBE)
            return [self._awaiting] if ask else self.stacks_taken({}, now, {})  # every one known stuck already: no need to ask
        if self.interrupt_sent is not None and now >= self.interrupt_sent + self.grace:
            if any(r not in self._interrupted for r in live):  # released by the abort, yet still running: interrupt them
                return self._interrupt(live, now)
            if not self.aborted:  # deaf to the interrupt: perhaps in a collective we could not see (DDP's buckets)
                them = "it" if len(live) == 1 else "them"
                self.notes.append(f"{ranks_phrase(live)} did not respond to the interrupt; aborted the process group to release {them}")
                self.interrupt_sent = now
                return [self._abort("did not respond to the interrupt")]
            return self._stop(live, now)
        return []

    def _grace(self) -> float:
        return grace_after_failure(self.grace, self.window, self.order, self.peer_failed)

    def _abort(self, why: str) -> Abort:
        self.aborted = True
        self._abort_at = len(self.order) if self._abort_at is None else self._abort_at
        live = [r for r, (state, _) in self._states.items() if state not in (RankState.DEAD, RankState.STOPPED)]
        return Abort(tuple(sorted(live)), why)

    def _where(self, ranks: Sequence[int]) -> Dict[int, str]:
        """Each rank's place for the forensics: its cell line, or why it is not in the cell any more."""
        words = {RankState.FAILED: "raised", RankState.DEAD: "died", RankState.DONE: "finished the cell", RankState.INTERRUPTED: "was interrupted"}
        out = {r: f"at {forensics.last_cell_line(self.stacks[r])}" for r in ranks if r in self.stacks}
        for r, (state, _) in self._states.items():
            if r not in out and state in words:
                out[r] = "unreachable" if state == RankState.DEAD and r in self.unreachable else words[state]
        out.update({r: "released" for r in self._broke_on_silence()})
        return out

    def _broke_on_silence(self) -> Set[int]:
        """Ranks whose collective broke on a peer's connection while a node of the cell went silent: released by it."""
        return {r for r in self.peer_failed if r not in self.unreachable} if self.unreachable else set()

    def _ask_stacks(self, ranks: Sequence[int], reason: StackReason) -> List[Action]:
        self._awaiting = CaptureStacks(tuple(ranks), reason)
        return [self._awaiting]

    def stacks_taken(self, replies: Mapping[int, str], now: float, collectives: Optional[Collectives] = None,
                     states: Optional[States] = None, seqs: Optional[Mapping[int, Optional[int]]] = None) -> List[Action]:
        """The stacks (and collectives) that came back for a ``CaptureStacks``: note where ranks were,
        abort the group if some wait in a collective, interrupt them. ``states``: the ranks' states now, ``seqs``:
        the default group's seq in the DONE of each rank that left the cell (what a PROBE's answer is judged by)."""
        asked, self._awaiting = self._awaiting, None
        if states is not None:
            self._note_failures(states, now)
        if asked is None:
            return []
        if asked.reason == PROBE:
            live = self._probe.taken(replies, collectives or {}, self._states, now, (self.first_failure or now) + self._grace(), seqs or {})
            if live is None:
                return []  # some rank may still finish: the grace runs on
            self.cancelled, asked = True, CaptureStacks(tuple(live), FAILURE)
            replies, collectives = self._probe.texts, self._probe.collectives
        self.stacks.update({r: replies[r] for r in asked.ranks if r in replies})
        self.collectives.update({r: (collectives or {}).get(r) for r in asked.ranks})
        ranks, where = asked.ranks, self._where(asked.ranks)
        waiting = [r for r in ranks if self.collectives.get(r)]
        everyone, released = sorted(self._states) or sorted(ranks), self._broke_on_silence()
        self.notes += forensics.verdicts([r for r in everyone if r not in released], self.collectives, where) if waiting else []
        if asked.reason == TIMEOUT:
            self.notes += ["where each rank was when the timeout expired:"] + ["  " + ln for ln in forensics.table(everyone, self.collectives, where)]
            self.notes += forensics.stacks_text(self.stacks)  # each distinct stack once, with the ranks that share it
        elif waiting:
            self.notes += ["where each rank was:"] + ["  " + ln for ln in forensics.table(everyone, self.collectives, where)]
        elif asked.reason == FAILURE:
            places = group_places({r: where.get(r, "at an unknown place") for r in ranks})
            self.notes.append(f"after rank {self.order[0]} failed, {_who(ranks)} still running ({places}); interrupted")
        if not waiting:
            return self._interrupt(ranks, now)
        self.notes.append(forensics.released_text(waiting, self.collectives, where))
        self.interrupt_sent = now  # the abort releases the waiting ranks; an interrupt, the others
        others = [r for r in ranks if r not in waiting]
        self._interrupted.update(others)
        actions: List[Action] = [self._abort(f"{ranks_phrase(waiting)} waited in a collective")]
        return actions + ([Interrupt(tuple(others))] if others else [])

    def _interrupt(self, ranks: Sequence[int], now: float) -> List[Action]:
        self.interrupt_sent = now
        self._interrupted.update(ranks)
        return [Interrupt(tuple(ranks))]

    def _stop(self, ranks: Sequence[int], now: float) -> List[Action]:
        """Escalation starts: SIGTERM now, SIGKILL for whoever is still there a moment later."""
        self._stopping = list(ranks)
        return self._signal(ranks, signal.SIGTERM, now)

    def _signal(self, ranks: Sequence[int], sig: int, now: float) -> List[Action]:
        self._sig, self._sig_at = sig, now
        self.killed += [r for r in ranks if r not in self.killed]
        return [Signal(tuple(ranks), sig)]

    def _escalate(self, states: States, now: float) -> List[Action]:
        assert self._stopping is not None
        alive = [r for r in self._stopping if states[r][0] == RankState.RUNNING]
        if not alive:
            self._stopping = [r for r in self._stopping if r not in self.unreachable]  # the others: the check named their node
            if not self._stopping:  # nobody was stopped: the pool starts them again as any lost rank
                self._stopping = None
                return []
            return self._give_up([r for r in self._stopping if states[r][0] == RankState.DEAD])
        if now < self._next_step():
            return []
        if self._sig == signal.SIGTERM:
            return self._signal(alive, signal.SIGKILL, now)
        return self._give_up([r for r in self._stopping if states[r][0] in (RankState.RUNNING, RankState.DEAD)])

    def _give_up(self, dead: Sequence[int]) -> List[Action]:
        """The stopped ranks count as dead, whether or not their exit was seen; the pool is broken."""
        ranks, self._stopping = self._stopping or [], None
        self.state_lost = True
        who, verb = ranks_phrase(ranks), ("was" if len(ranks) == 1 else "were")
        self.notes.append(
            f"{who} did not respond to the interrupt (stuck in a collective or native code) and {verb} stopped; "
            "the pool restarts on the next cell and variables defined in earlier %%ddp cells are lost"
        )
        return [GiveUp(tuple(dead), f"{who} did not respond to the interrupt and {verb} stopped")]

    def user_interrupt(self, now: float, ranks: Sequence[int], job: bool = False) -> List[Action]:
        """Ctrl-C in the kernel (``job``: a background job's cancel(), whose headline says so), ``ranks`` being those
        still running. The first interrupts them (stragglers are stopped after the grace); each further one skips a
        step of the escalation."""
        self._ctrl_c += 1
        if self._ctrl_c == 1:
            self.user_interrupted = self.cancelled = True
            self._awaiting = None  # a stack capture the Ctrl-C cut short
            if not job:
                self.notes.append("interrupted by the user (Ctrl-C / kernel interrupt)")
            return self._ask_stacks(ranks, USER) if ranks else []
        self._awaiting = None
        if self._stopping is None:
            return self._stop(ranks, now) if ranks else []
        alive = [r for r in self._stopping if r in ranks]
        if alive and self._sig == signal.SIGTERM:
            return self._signal(alive, signal.SIGKILL, now)
        return self._give_up(alive)

    def failures(
        self, states: States, done: Mapping[int, dict], deaths: Mapping[int, RankFailure], pids: Mapping[int, Optional[int]], now: float
    ) -> List[RankFailure]:
        """The cell's failures, root cause first, from the ranks' states, their DONE messages and
        the failures of the dead ranks (``deaths``)."""
        self._note_failures(states, now)
        out: List[RankFailure] = []
        broke = self._broke_on_silence()
        late = [r for r, (state, _) in states.items() if state == RankState.INTERRUPTED and r not in self._place]
        for r in self.order + late:
            msg = done.get(r)
            if states[r][0] == RankState.DEAD:
                f = deaths[r]
                out.append(dataclasses.replace(f, kind=FailureKind.KILLED) if r in self.killed and r not in self.unreachable else f)
            elif msg is not None and msg["status"] != CellStatus.OK:
                err = dict(msg["error"] or {})
                kind = FailureKind.INTERRUPTED if msg["status"] == CellStatus.INTERRUPTED else FailureKind.ERROR
                after = self._abort_at is not None and self._place.get(r, -1) >= self._abort_at
                why = released_why(err.get("message", ""), after, r in broke) if kind == FailureKind.ERROR else None
                if why:  # a peer's abort reached it before its own, or its collective lost a peer on a silent node
                    kind, err["message"] = FailureKind.INTERRUPTED, f"released: {why}"
                out.append(RankFailure(
                    rank=r, kind=kind, type=err.get("type", ""), message=err.get("message", ""), traceback=err.get("traceback", ""), pid=pids.get(r)
                ))
        died = [r for r, (state, _) in states.items() if state == RankState.DEAD and r not in self.unreachable and r not in self.killed]
        self.notes += released_by_death(out, done, died, self.notes)  # in place: the ranks a death released, in our words (not gloo's)
        out.sort(key=root_cause_rank)  # stable: arrival order within each kind
        if self.user_interrupted and not out:
            out.append(RankFailure(rank=0, kind=FailureKind.INTERRUPTED))
        if self.timed_out and not self.order[: self._abort_at]:
            out = self._timeouts(out, pids)
        return out

    def _timeouts(self, out: List[RankFailure], pids: Mapping[int, Optional[int]]) -> List[RankFailure]:
        """A timeout no failure came before: the hung ranks are its root cause, one TIMEOUT failure each, first,
        in place of what they did when we interrupted them; the others were released because of them."""
        assert self.timeout is not None
        hung, waited_for = self._hung()
        head = f"the cell ran past --timeout {self.timeout:g}s"
        who = ranks_phrase(hung)
        message = f"{head}, waiting for {who}" if waited_for else f"{head}: {who} {'was' if len(hung) == 1 else 'were'} still running"
        codes = {f.rank: f.exit_code for f in out}  # a hung rank we had to stop keeps how it ended
        timeouts = [RankFailure(r, FailureKind.TIMEOUT, "TimeoutError", message, pid=pids.get(r), exit_code=codes.get(r)) for r in hung]
        return timeouts + [f for f in out if f.rank not in hung]

    def _hung(self) -> Tuple[List[int], bool]:
        """Who a timeout is blamed on, and whether others waited for them in a collective: the ranks the forensics
        say never arrived or called another collective; else those running outside any collective; else every
        rank still running when it expired."""
        everyone = sorted(self._states) or sorted(self._timed_out_on)
        blamed = forensics.culprits(everyone, self.collectives)
        if blamed:
            return blamed, True
        outside = [r for r in self._timed_out_on if not self.collectives.get(r)]
        return outside or list(self._timed_out_on) or everyone[:1] or [0], False


def _who(ranks: Sequence[int]) -> str:
    """"rank 0 was" / "ranks 0, 2 were"."""
    return f"{ranks_phrase(ranks)} {'was' if len(ranks) == 1 else 'were'}"
