"""One cell's run from the failure policy's side: the pool's poll loop, with the policy's decisions carried out.

``FailurePolicy`` (policy.py) decides; ``CellRun`` asks it after every event
of the poll loop and does what it says through ``RankOps``, the narrow part
of the pool it needs. Nothing here blocks the loop: stopping ranks is a
sequence of policy states, so rank output keeps flowing meanwhile.

A wake costs O(1) however many ranks there are: "is any rank still running"
is a cursor over the ranks (none starts running again mid-cell), and the
policy, which looks at every rank, is asked only when one of its deadlines is
due or a change it acts on happened (``RankOps.state_version``): a rank failed,
was interrupted or died; or, while it stops ranks, any change. A rank that
just finishes gives the policy nothing to do.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Dict, List, Optional, Protocol, Sequence, Tuple

from ..errors import RankFailure
from ..states import RankState
from ..wire import protocol as P
from .failures.blame import peer_error
from .failures.policy import PROBE, Abort, Action, CaptureStacks, FailurePolicy, GiveUp, Interrupt, Signal, States, running
from .ranks import Due, RankInfo, Tick
from .jobs.stdin import Ask

STACK_TIMEOUT_S = 1.0  # how long to wait for the ranks' stacks before interrupting them


class RankOps(Protocol):
    """What a cell's failure handling needs from the pool, and nothing more."""

    ranks: Dict[int, RankInfo]
    grace: float

    def pump(self, until: Callable[[], bool], deadline: Optional[float], tick: Optional[Tick] = None, due: Optional[Due] = None) -> bool:
        """Run the poll loop (output, messages, exits) until ``until()`` or the deadline; ``tick``
        after each wake, and no later than ``due()``."""
        ...

    def ask(self, op: str, timeout: float, *, ranks: Optional[Sequence[int]] = None) -> Dict[int, dict]:
        """Send ``op`` (STACK) to these live ranks (default: every one); the replies that came within ``timeout``."""
        ...

    def interrupt(self, ranks: Sequence[int]) -> None:
        """Ask these ranks to raise KeyboardInterrupt in their cell."""
        ...

    def abort(self, ranks: Sequence[int], why: str) -> None:
        """Abort the process group on these ranks (their collective waits raise); re-form it after the cell."""
        ...

    def signal_ranks(self, ranks: Sequence[int], sig: int) -> None:
        """Stop these ranks: ``sig`` to those whose process is ours, a KILL message to remote ones."""
        ...

    def done_message(self, rank: int) -> Optional[dict]:
        """The rank's DONE message for this cell, if it sent one."""
        ...

    def death_failure(self, rank: int) -> RankFailure:
        """How a dead rank died (exit code, last lines), as a failure."""
        ...

    def mark_dead(self, rank: int) -> None:
        """Count the rank as dead even though its exit was not seen."""
        ...

    def mark_broken(self, why: str) -> None:
        """The next cell must restart the pool, because ``why``."""
        ...

    def state_version(self) -> Tuple[int, int]:
        """(changes to FAILED, INTERRUPTED or DEAD, all changes of a rank's state) so far; a RankOps without it is asked every wake."""
        ...

    def answer_input(self, ask: Optional[Ask], cancelled: bool) -> None:
        """Answer the ranks' pending input requests (EOF for all when ``cancelled``)."""
        ...

    def holding(self) -> bool:
        """Some rank is in the debugger or waits for input."""
        ...


class CellRun:
    """Drives one cell to its end: pumps the pool's loop and carries out the failure policy."""

    def __init__(self, ops: RankOps, policy: FailurePolicy, clock: Callable[[], float] = time.monotonic, stdin: Optional[Ask] = None,
                 cancel: Optional[threading.Event] = None, sent: bool = False) -> None:
        self.ops = ops
        self.cancel = cancel  # a background job's cancel(): a Ctrl-C for a cell that runs off the main thread
        self.job_cancelled = False  # that cancel() came: the outcome says "cancelled by job.cancel()", not Ctrl-C
        self.stdin = stdin  # answers the ranks' input() and pdb (kernel/jobs/stdin.py)
        self._held_since: Optional[float] = None  # a rank debugs: the policy's clocks stand still
        self.policy = policy
        self.clock = clock  # the policy's time; tests pass a fake one
        self.notes: List[str] = policy.notes  # for the user, in the order they arose
        self.stacks: Dict[int, str] = policy.stacks  # where ranks were when asked (timeout, failure)
        self._order = sorted(ops.ranks)
        self._cursor = 0  # ranks before it have finished the cell (_any_running)
        version = getattr(ops, "state_version", None)  # ``sent``: the cell was sent just now, every rank RUNNING (not a resumed one)
        self._start = version() if version is not None and sent else None  # the state version as the cell was sent (``_clean``)
        self._decided: Optional[Tuple[int, int]] = self._start  # the state version the policy last decided on (at the start: nothing to decide)

    # ------------------------------------------------------------ what the pool reads afterwards
    # (the policy's findings; notes and stacks are the policy's own list and dict, filled as it goes)
    cancelled = property(lambda self: self.policy.cancelled, doc="Results are not collected: interrupted, timed out, or a rank failed.")
    state_lost = property(lambda self: self.policy.state_lost, doc="Ranks were stopped: the pool restarts on the next cell.")
    timed_out = property(lambda self: self.policy.timed_out, doc="The cell ran past its --timeout.")
    user_interrupt = property(lambda self: self.policy.user_interrupted, doc="Ctrl-C interrupted the cell.")
    aborted = property(lambda self: self.policy.aborted, doc="The process group was aborted: the pool re-forms it.")

    def failures(self) -> List[RankFailure]:
        """The cell's failures, root cause first."""
        if self._clean():
            return []
        ranks = self.ops.ranks
        done = {r: m for r, m in ((r, self.ops.done_message(r)) for r in ranks) if m is not None}
        deaths = {r: self.ops.death_failure(r) for r, info in ranks.items() if info.state == RankState.DEAD}
        pids = {r: info.pid for r, info in ranks.items()}
        self._seen()
        return self.policy.failures(self._states(), done, deaths, pids, self.clock())

    def _clean(self) -> bool:
        """No rank failed, was interrupted or died in this cell, and the policy noted no failure, Ctrl-C nor timeout: the
        cell has no failures, and 1,024 ranks need no pass to say so."""
        version = getattr(self.ops, "state_version", None)
        policy = self.policy
        if self._start is None or version is None or policy.order or policy.user_interrupted or policy.timed_out:
            return False
        return bool(version()[0] == self._start[0])

    # ------------------------------------------------------------ the run
    def drive(self) -> None:
        """Pump until every rank has finished (or been given up). Ctrl-C is the policy's to handle:
        the first asks where the ranks are and interrupts them, a further one stops them, and the loop goes on."""
        pending: List[Action] = []
        while True:
            try:
                actions, pending = pending, []
                self._carry_out(actions)  # a Ctrl-C's, outside the handler, so a further Ctrl-C lands here too
                self.ops.pump(self._finished, None, tick=self._tick, due=self._due)
                return
            except KeyboardInterrupt:
                self._decided = None
                pending = self.policy.user_interrupt(self.clock(), running(self._states()), job=self.job_cancelled)

    def _due(self) -> Optional[float]:
        """The policy's next step; none while a rank debugs (its clocks stand still, ``_tick``)."""
        return None if self._held_since is not None else self.policy.next_due()

    def _seen(self) -> None:
        """What the policy reads besides the states (O(n): only when it decides): whose node went silent (liveness),
        and whose cell raised a peer's connection error (a collective that broke, perhaps on that node)."""
        ranks, done = self.ops.ranks, self.ops.done_message
        self.policy.unreachable = {r for r, info in ranks.items() if info.silent}
        self.policy.peer_failed = {r for r, info in ranks.items() if info.state == RankState.FAILED and peer_error(done(r))}

    def _states(self) -> States:
        return {r: (info.state, info.finished) for r, info in self.ops.ranks.items()}

    def _seqs(self) -> Dict[int, Optional[int]]:
        """The default group's seq in the DONE of each rank that left the cell (kernel/failures/probe.py)."""
        return {r: (self.ops.done_message(r) or {}).get("seq") for r, info in self.ops.ranks.items() if info.state != RankState.RUNNING}

    def _any_running(self) -> bool:
        ranks = self.ops.ranks
        while self._cursor < len(self._order):
            info = ranks.get(self._order[self._cursor])
            if info is not None and info.state == RankState.RUNNING:
                return True
            self._cursor += 1
        return any(info.state == RankState.RUNNING for info in ranks.values())  # once, at the end (or while stopping)

    def _finished(self) -> bool:
        if self._any_running():
            return False
        if self.policy.stopping:  # the last stopped rank just went: let the policy give up now
            self._tick()
        return not self.policy.stopping

    def _tick(self) -> None:
        if self.cancel is not None and self.cancel.is_set():  # drive() takes it as the Ctrl-C it stands for
            self.cancel.clear()
            self.job_cancelled = True
            raise KeyboardInterrupt
        self.ops.answer_input(self.stdin, self.policy.cancelled)
        now = self.clock()
        if self.ops.holding():  # a rank in pdb or at input() is not hung, and its peers wait for it
            self._held_since = self._held_since if self._held_since is not None else now
            return
        if self._held_since is not None:
            self.policy.pause(now - self._held_since)
            self._held_since, self._decided = None, None
        version = getattr(self.ops, "state_version", None)
        seen, self._decided = self._decided, version() if version is not None else None
        due = self.policy.next_due()
        if seen is not None and self._decided is not None and self._same(seen, self._decided) and (due is None or now < due):
            return  # nothing failed and nothing is due: decide would return nothing
        self._seen()
        self._carry_out(self.policy.decide(self._states(), now))

    def _same(self, before: Tuple[int, int], now: Tuple[int, int]) -> bool:
        """No change the policy acts on: no new failure, and (while it stops ranks) no change at all."""
        return before[0] == now[0] and (not self.policy.stopping or before[1] == now[1])

    def _carry_out(self, actions: List[Action]) -> None:
        if actions:
            self._decided = None  # the policy moved on: it decides again at the next wake
        for action in actions:
            if isinstance(action, CaptureStacks):
                replies = self.ops.ask(P.STACK, STACK_TIMEOUT_S, ranks=action.ranks)
                texts = {r: str(m.get("text", "")) for r, m in replies.items()}
                collectives = {r: m.get("collective") for r, m in replies.items()}
                self._seen()
                self._carry_out(self.policy.stacks_taken(texts, self.clock(), collectives, self._states(), self._seqs() if action.reason == PROBE else None))
            elif isinstance(action, Interrupt):
                self.ops.interrupt(action.ranks)
            elif isinstance(action, Abort):
                self.ops.abort(action.ranks, action.why)
            elif isinstance(action, Signal):
                self.ops.signal_ranks(action.ranks, action.sig)
            elif isinstance(action, GiveUp):
                for rank in action.ranks:
                    self.ops.mark_dead(rank)
                self.ops.mark_broken(action.why)
