"""Ending a failed cell's grace early: when every rank still running waits in a collective that cannot complete, the grace has nothing to wait for.

A collective on the default group cannot complete once a rank has left the cell
(raised or finished) before it: the rank's DONE says how many collectives it issued
on the default group (``seq``, procs/rank_collectives.py), and a peer waiting in
collective #N, N past that, waits for a rank that will never come. (A peer still
inside the collective a rank finished with it, seq equal, is about to return.)
So after the first failure the failure policy (policy.py) asks the ranks still
running where they are (STACK: the collective each is in), at once and again after
0.05, 0.1, 0.2 ... s while the grace lasts (a rank may reach its collective a
moment after its peer failed), each time only the ranks not yet known to be
stuck (and only once it has waited ``SETTLED_S`` in its collective): a rank stuck so
stays stuck until the group is aborted. When every rank
still running is stuck, the policy goes on as if the grace had run out, with these
stacks. A rank in a subgroup's collective, or a cell whose ranks left without a
``seq`` (a rank that died), gets the grace as before.

The other way round, on ranks across hosts: while every failure is a collective that broke on a
peer's connection, the peer's node may have gone silent, which the liveness check names only
within its window; the grace lasts that window then (``grace_after_failure``), so the node is
named the root cause before anyone is interrupted.

Pure, like the policy that holds it: replies and states in, a decision out.
"""
from __future__ import annotations

from typing import Collection, Dict, List, Mapping, Optional, Sequence, Tuple

from ...states import RankState

FIRST_GAP_S = 0.05  # the wait before the second ask; it doubles after each
SETTLED_S = 0.05  # how long a rank must have waited in its collective to count: one that has only just called it may not
# be in the backend's wait yet, and an abort that lands before the wait starts does not release it (it hangs until stopped)

States = Mapping[int, Tuple[RankState, Optional[float]]]  # as policy.States: rank -> (state, when it finished)
Collective = Mapping[str, object]


def stuck(collective: Optional[Collective], behind: Optional[int]) -> bool:
    """The rank waits in a collective on the default group that a rank which left the cell never issued: ``behind``, the
    lowest ``seq`` the ranks that left reported, is below the collective's (the seq it shows may lag by one: equal is not proof),
    and it has waited there ``SETTLED_S`` at least."""
    if not collective or behind is None or collective.get("ranks") is not None:
        return False
    seq, waited = collective.get("seq"), collective.get("waited")
    settled = not isinstance(waited, (int, float)) or waited >= SETTLED_S
    return isinstance(seq, int) and behind < seq and settled


class Probe:
    """The asks of one failed cell's grace, and what they found: the stuck ranks' stacks and collectives."""

    def __init__(self) -> None:
        self.at: Optional[float] = None  # when to ask next; None: not now (before the first failure, or no time left in the grace)
        self._gap = FIRST_GAP_S
        self._begun = False
        self.texts: Dict[int, str] = {}  # the stuck ranks' stack texts
        self.collectives: Dict[int, Collective] = {}  # the collective each stuck rank waits in

    def begin(self, now: float) -> None:
        """The cell's first failure: ask at once."""
        if not self._begun:
            self._begun, self.at = True, now

    def due(self, now: float, live: Sequence[int]) -> Optional[List[int]]:
        """The ranks to ask now (those running, not known stuck), or None when no ask is due."""
        if self.at is None or now < self.at:
            return None
        self.at = None
        return [r for r in live if r not in self.collectives]

    def taken(self, replies: Mapping[int, str], collectives: Mapping[int, Optional[Collective]], states: States, now: float,
              grace_end: float, seqs: Mapping[int, Optional[int]]) -> Optional[List[int]]:
        """The answers to an ask, with the ``seq`` of each rank that left the cell (from its DONE). Returns the ranks still
        running when every one is stuck (the grace ends now); else None, and the next ask is set, if it falls inside the grace."""
        known = [s for r, s in seqs.items() if isinstance(s, int) and states.get(r, (RankState.RUNNING, None))[0] != RankState.RUNNING]
        behind = min(known) if known else None
        for r, c in collectives.items():
            if c and stuck(c, behind):
                self.texts[r], self.collectives[r] = replies.get(r, ""), c
        live = [r for r, (state, _) in states.items() if state == RankState.RUNNING]
        if live and all(r in self.collectives for r in live):
            return live
        if now + self._gap < grace_end:
            self.at, self._gap = now + self._gap, self._gap * 2
        return None

    def pause(self, seconds: float) -> None:
        """A rank sat in the debugger: the next ask moves with the policy's clocks."""
        self.at = None if self.at is None else self.at + seconds


def grace_after_failure(grace: float, window: float, order: Sequence[int], peer_failed: Collection[int]) -> float:
    """The grace after a cell's first failure. On ranks across hosts (``window``: the liveness check's, 0 on one host),
    a collective that broke with a peer's connection error may have lost that peer to a node gone silent, which the
    check names only within its window: while every failure is such an error, nothing is decided (no forensics, no
    interrupt) until the window has passed, or until another failure (a death, an unreachable node) explains them."""
    if window and order and all(r in peer_failed for r in order):
        return max(grace, window)
    return grace
