"""The ranks' stdin in the kernel: their INPUT requests, answered one at a time in rank order, each prompt naming its rank.

The pool knows no IPython: the line comes from an ``Ask`` callback the front
end supplies (the magics: the kernel's own ``input``/``getpass``, which a
notebook shows as an input box). Without one, or when the front end has no
stdin, the rank gets EOF with the reason at once. Which ranks are in the
debugger or wait for input is also kept here: the status view shows it, the
failure policy's clocks pause for it, and every rank hears it (HOLD) so its
collective watchdog pauses too.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, Mapping, Optional, Protocol, Sequence, Set

from ..states import RankState, Waiting
from ..wire import protocol as P
from .ranks import RankInfo

Ask = Callable[[str, bool], str]  # (prompt, password) -> the line; EOFError: the front end has none to give

NO_STDIN = (
    "this front end does not allow input (e.g. nbval, or allow_stdin=False): "
    "a rank's input(), getpass and pdb read EOF; run the cell in a notebook or console that allows stdin"
)
NO_ASKER = "this pool was run without a way to ask for input (Pool.run(stdin=...)); the rank reads EOF"
CANCELLED = "the cell was interrupted while this rank waited for input"


class InputDesk:
    """The ranks' open questions and who sits in pdb, for one pool."""

    def __init__(self) -> None:
        self.pending: Dict[int, dict] = {}  # rank -> its INPUT request (one per rank: a rank asks one at a time)
        self.in_pdb: Set[int] = set()
        self.held = False  # what the ranks were last told (HOLD)

    def reset(self) -> None:
        self.pending.clear()
        self.in_pdb.clear()

    def request(self, rank: int, msg: dict) -> None:
        self.pending[rank] = msg

    def debugger(self, rank: int, on: bool) -> None:
        (self.in_pdb.add if on else self.in_pdb.discard)(rank)

    def forget(self, rank: int) -> None:
        """The rank finished its cell (or died): it asks nothing any more."""
        self.pending.pop(rank, None)
        self.in_pdb.discard(rank)

    def what(self, rank: int) -> Waiting:
        """What the rank waits on the notebook for, if anything (the status view says it)."""
        if rank in self.in_pdb:
            return Waiting.DEBUGGER
        return Waiting.INPUT if rank in self.pending else Waiting.NO

    def holding(self, ranks: Optional[Mapping[int, RankInfo]] = None) -> bool:
        """Some rank (of ``ranks``, still running) debugs or waits for a line: the others' waits are not hangs."""
        if not self.pending and not self.in_pdb:  # the usual case, asked after every rank's DONE: O(1)
            return False
        asking = set(self.pending) | self.in_pdb
        if ranks is None:
            return bool(asking)
        return any(r in ranks and ranks[r].state == RankState.RUNNING for r in asking)

    def hold_change(self) -> Optional[dict]:
        """The HOLD message to send every rank when holding() changed since the last one; else None."""
        now = self.holding()
        if now == self.held:
            return None
        self.held = now
        return P.message(P.HOLD, on=now)

    def answer(self, rank: int, ask: Optional[Ask], cancelled: bool) -> dict:
        """The reply to ``rank``'s request (it is taken off the desk). KeyboardInterrupt from ``ask`` propagates:
        the cell is interrupted, and the rank's wait with it."""
        msg = self.pending.pop(rank)
        eof: Optional[str] = None
        text = ""
        if cancelled:
            eof = CANCELLED
        elif ask is None:
            eof = NO_ASKER
        else:
            try:
                text = ask(f"[rank {rank}] {msg.get('prompt', '')}", bool(msg.get("password")))
            except EOFError as e:
                eof = str(e) or NO_STDIN
        no_stdin = eof is not None and not cancelled  # pdb then continues instead of quitting (rank_debug.py)
        return P.message(P.INPUT, id=msg.get("id"), text=text, eof=eof, no_stdin=no_stdin)


class _Hub(Protocol):
    """The part of the control hub (hub.py) that answering needs."""

    stdin: InputDesk

    def pump(self, until: Callable[[], bool], deadline: Optional[float]) -> bool: ...

    def drain_outs(self, rank: int, timeout: float = 0.5) -> None: ...

    def broadcast(self, msg: dict, ranks: Optional[Sequence[int]] = None) -> None: ...

    def debug_changed(self, rank: int) -> None: ...


SETTLE_S = 0.1  # a question sent at the same moment by a lower rank arrives first


def answer_all(hub: _Hub, ranks: Mapping[int, RankInfo], ask: Optional[Ask], cancelled: bool) -> None:
    """Answer the ranks' questions, lowest rank first, one at a time; what a rank printed before asking shows first."""
    desk = hub.stdin
    if desk.pending:
        hub.pump(lambda: False, time.monotonic() + SETTLE_S)
    while desk.pending:
        rank = min(desk.pending)
        if ranks[rank].state != RankState.RUNNING:
            desk.forget(rank)
        else:
            hub.drain_outs(rank, 0.2)
            hub.broadcast(desk.answer(rank, ask, cancelled), [rank])
        hub.debug_changed(rank)
