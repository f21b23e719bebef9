"""Whose turn it is on the pool: one cell runs on the ranks at a time, the next ones wait in line, first come first served.

A background cell (``%%ddp --bg``) holds the turn on its job's thread for as long as it
runs; a ``%%ddp`` cell that comes meanwhile waits here (its view says whom it waits
behind) unless it asked not to (``--no-queue``: a clear error at once). Ctrl-C on a
waiting cell, or ``cancel()`` of a waiting job, takes it out of the line: it never ran.
Peeks (kernel/jobs/peek.py) do not wait in line: they run beside whoever holds the turn, and
take the turn for a moment only when nobody holds it (to pump the hub themselves).
"""
from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, FrozenSet, Iterator, List, Optional, Sequence, Tuple

from ...errors import Dequeued, UsageError
from ...states import RankState
from ..ranks import Listener, RankInfo
from .. import interrupts

ANSWERS = "%ddp_debug answers"  # how a background cell's question is answered (docs/background.md)
WAIT_SLICE_S = 0.1  # a waiting cell looks at its cancel flag this often (a Ctrl-C lands at once anyway)
PASSING_WAIT_S = 2.0  # how long check_idle waits for a passing holder (a watcher's slice of pumping) to give the turn back
PASSING_PAUSE_S = 30.0  # then passing takers stay away this long, or until a cell's turn comes and goes


def clock_text(seconds: float) -> str:
    """A run time as a clock, ``H:MM:SS`` (``0:00:07``, ``1:02:11``): one form whatever the length."""
    s = max(0, int(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


@dataclass(eq=False)
class Ticket:
    """One cell's place in line, and what ``%ddp status`` and the panel say about it while it holds the turn."""

    name: str  # what the user calls the cell: "cell [12]"
    background: bool = False
    since: Optional[float] = None  # when it got the turn (time.monotonic())
    ran: Optional[float] = None  # when the cell reached the ranks (the cell view's run clock starts there: RankInfo.started)
    ran_for: Optional[float] = None  # once it ended: its seconds on the ranks, the cell's own figure (CellOutcome.elapsed)
    progress: Callable[[], Optional[int]] = field(default=lambda: None)  # the last step its ranks logged (ddp_magic.log)
    waiting: Callable[[], Optional[str]] = field(default=lambda: None)  # what its ranks wait on the notebook for (kernel/stdin.Mailbox)
    assigns: FrozenSet[str] = frozenset()  # the names its cell assigns: a save at its safe point takes them too (kernel/jobs/safe_save.py)
    passing: bool = False  # no cell: a watcher's moment of pumping the hub between cells (ui/preempt.py), which yields

    def text(self, now: Optional[float] = None) -> str:
        """``background: cell [12] running 1:02:11, step 4,120`` (the step once one was logged), and what a rank waits
        for: ``…; rank 0 waits for input: 'lr? ' (%ddp_debug answers)``."""
        head = f"{'background: ' if self.background else ''}{self.name}"
        if self.since is None:
            return f"{head} queued"
        if self.ran is None:  # it holds the turn, the pool starts (or the notebook's names are shipped): no run time yet
            return f"{head} starting{self.tail()}"
        return f"{head} running {clock_text(self.on_ranks(now))}{self.tail()}"

    @property
    def phase(self) -> str:
        """``queued`` (waits for the turn), ``starting`` (holds it, the cell has not reached the ranks), ``running``."""
        return "queued" if self.since is None else "starting" if self.ran is None else "running"

    def on_ranks(self, now: Optional[float] = None) -> float:
        """Seconds the cell has run on the ranks (0 before it reached them), up to its end: the one run time of a job,
        the same as its cell's view counts (a pool's start is the start clock's, not the run's: docs/background.md)."""
        if self.ran_for is not None:
            return self.ran_for
        if self.ran is None:
            return 0.0
        return max(0.0, (time.monotonic() if now is None else now) - self.ran)

    def tail(self) -> str:
        """``, step 4,120`` and ``; rank 0 waits for input: 'lr? ' (%ddp_debug answers)``, each when it holds."""
        step, waiting = self.progress(), self.waiting()
        return (f", step {step:,}" if step is not None else "") + (f"; {waiting} ({ANSWERS})" if waiting else "")


class TicketClock(Listener):
    """Passes a cell's events on to ``inner``, and starts its ticket's run clock when the cell reaches the ranks."""

    def __init__(self, ticket: Ticket, inner: Listener) -> None:
        self.ticket, self.inner = ticket, inner

    def on_output(self, rank: int, stream: str, text: str) -> None:
        self.inner.on_output(rank, stream, text)

    def on_state(self, info: RankInfo) -> None:
        self._ran(info)
        self.inner.on_state(info)

    def on_states(self, infos: Sequence[RankInfo]) -> None:
        for info in infos if self.ticket.ran is None else ():
            self._ran(info)
            if self.ticket.ran is not None:
                break
        self.inner.on_states(infos)

    def _ran(self, info: RankInfo) -> None:
        if info.state == RankState.RUNNING and self.ticket.ran is None:
            self.ticket.ran = info.started  # the pool's t0 of the cell (Pool._send_cell), the cell view's too

    def on_notice(self, text: str) -> None:
        self.inner.on_notice(text)

    def on_metrics(self, rank: int, rows: List[Tuple[int, float, Dict[str, float]]]) -> None:
        self.inner.on_metrics(rank, rows)


def busy_text(holder: Ticket, what: str) -> str:
    """Why ``what`` cannot happen now, and the ways out."""
    how = "job.wait() or %ddp wait, or job.cancel() to stop it" if holder.background else "wait for it to end"
    return f"{what}: {holder.name} runs on the pool now ({holder.text()}); {how}, then try again"


class Turns:
    """The pool's line of cells; safe from any thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.holder: Optional[Ticket] = None
        self.line: List[Ticket] = []
        self.paused_until = 0.0  # passing tickets (check_idle) are refused until then

    def take(self, ticket: Ticket, wait: bool = True, on_queued: Optional[Callable[[Ticket], None]] = None,
             cancelled: Optional[threading.Event] = None) -> float:
        """Wait for ``ticket``'s turn and take it; returns the seconds waited.

        ``wait=False`` (``--no-queue``) raises UsageError at once when another cell holds the turn;
        ``on_queued(holder)`` is told once when the ticket has to wait. A Ctrl-C, or ``cancelled``
        being set, takes the ticket out of the line and raises ``Dequeued``."""
        with self._cond:
            reserved = ticket in self.line  # its place was kept when its cell ran (``reserve``)
            if self.holder is None and (not self.line or self.line[0] is ticket):
                if reserved:
                    self.line.pop(0)
                self._grant(ticket)
                return 0.0
            ahead = self.holder or (self.line[self.line.index(ticket) - 1] if reserved else self.line[-1])
            if not wait:
                if reserved:
                    self.line.remove(ticket)
                raise UsageError(busy_text(ahead, f"%%ddp --no-queue: {ticket.name} did not run"))
            if not reserved:
                self.line.append(ticket)
        t0 = time.monotonic()
        try:
            if on_queued is not None:
                on_queued(ahead)
            self._wait(ticket, cancelled)
        except KeyboardInterrupt:
            self._leave(ticket)
            raise Dequeued(f"{ticket.name} was taken out of the queue {interrupts.how()} before it ran; {ahead.name} goes on") from None
        except BaseException:
            self._leave(ticket)
            raise
        return time.monotonic() - t0

    def reserve(self, ticket: Ticket) -> None:
        """Keep ``ticket``'s place in line now, for a thread that takes its turn later (a --bg job): a cell run right after
        its cell waits behind it, as the notebook's order says, however late that thread runs. ``withdraw`` gives it up."""
        with self._cond:
            if ticket not in self.line and self.holder is not ticket:
                self.line.append(ticket)

    def settled(self, seconds: float) -> Optional[Ticket]:
        """The cell that holds the turn, once one next in line while nobody holds it has taken it (up to ``seconds``): its
        thread may not have run yet (a --bg job's reserved turn, a cell queued behind a moment of pumping)."""
        deadline = time.monotonic() + seconds
        with self._cond:
            while self.holder is None and self.line and time.monotonic() < deadline:
                self._cond.wait(0.01)
            return self.holder

    def withdraw(self, ticket: Ticket) -> None:
        """``ticket`` out of the line if it is still there (a job that ended before it took its reserved turn)."""
        self._leave(ticket)

    def _wait(self, ticket: Ticket, cancelled: Optional[threading.Event]) -> None:
        with self._cond:
            while not (self.holder is None and self.line and self.line[0] is ticket):
                if cancelled is not None and cancelled.is_set():
                    raise Dequeued(f"{ticket.name} was cancelled while it waited in the queue; it never ran")
                self._cond.wait(WAIT_SLICE_S)
            self.line.pop(0)
            self._grant(ticket)

    def _grant(self, ticket: Ticket) -> None:
        self.holder = ticket
        ticket.since = time.monotonic()

    def _leave(self, ticket: Ticket) -> None:
        with self._cond:
            if ticket in self.line:
                self.line.remove(ticket)
            self._cond.notify_all()

    def try_take(self, ticket: Ticket) -> bool:
        """Take the turn only if nobody holds it and nobody waits (a peek that pumps the hub itself)."""
        with self._cond:
            if self.holder is None and not self.line and not (ticket.passing and time.monotonic() < self.paused_until):
                self._grant(ticket)
                return True
            return False

    def give_back(self, ticket: Ticket) -> None:
        with self._cond:
            if self.holder is ticket:
                self.holder = None
            if not ticket.passing:
                self.paused_until = 0.0  # a cell came and went: the watchers may pump between cells again
            self._cond.notify_all()

    @contextlib.contextmanager
    def turn(self, ticket: Ticket, wait: bool = True, on_queued: Optional[Callable[[Ticket], None]] = None,
             cancelled: Optional[threading.Event] = None) -> Iterator[float]:
        """``take`` for the duration of a with block (the seconds waited), given back however it ends (a Ctrl-C
        landing just as the turn was granted included: ``give_back`` lets go only of a turn the ticket holds)."""
        try:
            yield self.take(ticket, wait, on_queued, cancelled)
        finally:
            self.give_back(ticket)

    def check_idle(self, what: str) -> None:
        """Raise UsageError (naming the running cell) when a cell holds the turn: ``what`` needs the pool to itself. A
        passing holder (an armed pool's watcher, between cells) is no cell: we wait for its slice to end, and passing
        takers stay away while ``what`` runs (until a cell's turn ends, or PASSING_PAUSE_S)."""
        self.settled(PASSING_WAIT_S)  # a --bg cell run just before: its job holds the pool, once its thread took its turn
        with self._cond:
            deadline = time.monotonic() + PASSING_WAIT_S
            if self.holder is not None and self.holder.passing:
                self.paused_until = time.monotonic() + PASSING_PAUSE_S
            while self.holder is not None and self.holder.passing and time.monotonic() < deadline:
                self._cond.wait(WAIT_SLICE_S)
            holder = self.holder
        if holder is not None:
            raise UsageError(busy_text(holder, what))

    def waiting(self) -> List[str]:
        """The names of the cells in line, first first."""
        with self._cond:
            return [t.name for t in self.line]
