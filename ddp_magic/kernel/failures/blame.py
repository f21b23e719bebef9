"""Which of a failed cell's failures explains the others: the root cause, and the ranks stopped because of it.

The one rule the failure policy orders failures by and the cell's view, the panel and the status bar colour ranks by,
and which broken collectives were released (by our abort, or by a node gone silent) rather than failed on their own.
Pure: failures in, order and labels out.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ...errors import RankFailure
from ...states import FailureKind
from ...words import ranks_phrase
from .forensics import released_by_death_text

PEER_ERRORS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "connection closed")  # a collective broke: a peer went away
STOPPED_BY_US = (FailureKind.KILLED, FailureKind.INTERRUPTED)


def causes(failures: Sequence[RankFailure]) -> Dict[int, Tuple[str, str]]:
    """rank -> (kind, "root" | "stopped"): the failures that explain the cell, and the ranks stopped (or released)
    because of them. The one rule the cell's view, the panel and the status bar colour ranks by."""
    own = [f for f in failures if f.kind not in STOPPED_BY_US]
    best = min((root_cause_rank(f) for f in own), default=None)
    out: Dict[int, Tuple[str, str]] = {}
    for f in failures:
        root = best is not None and f.kind not in STOPPED_BY_US and root_cause_rank(f) == best
        out.setdefault(f.rank, (str(f.kind), "root" if root else "stopped"))
    return out


def root_cause_rank(f: RankFailure) -> int:
    """Which failure explains the others: a node that went silent (wire/liveness.py), then a rank that died or that a
    timeout waited for (the policy gives TIMEOUT only to the hung ranks, and only when no failure came first), then a
    real error, then the collectives that broke because a peer went away, then ranks we interrupted or stopped.

    A silent node comes first even when a rank elsewhere went before it: the check needs its window (8 s) to call a
    node silent, and a rank on a healthy node whose collective with that node broke (gloo: a connection error, raised
    or fatal) can fail within it. What happened to the ranks elsewhere in that cell follows from the node."""
    if f.kind == FailureKind.DIED and f.node:
        return 0
    if f.kind in (FailureKind.DIED, FailureKind.TIMEOUT):
        return 1
    if f.kind == FailureKind.ERROR:
        return 3 if any(e in f.message for e in PEER_ERRORS) else 2
    return 4


def peer_error(done: Optional[dict]) -> bool:
    """Whether a rank's DONE reports a collective that broke on a peer's connection (gloo's reset, closed, broken pipe)."""
    error = (done or {}).get("error") or {}
    return any(e in str(error.get("message", "")) for e in PEER_ERRORS)


def released_why(message: str, after_abort: bool, node_silent: bool, died: Sequence[int] = ()) -> Optional[str]:
    """Why a collective that broke (a peer's connection error) was released, not a failure of its own: our abort came
    first (``after_abort``), a node of the cell went silent (gloo's connections to it broke before the check named
    it: the node is the root cause), or ranks of the cell died (``died``: their connections closed as they went).
    None: a failure of its own."""
    if not any(e in message for e in PEER_ERRORS):
        return None
    if after_abort:
        return "the process group was aborted"
    if node_silent:
        return "a peer's node went silent"
    return f"{ranks_phrase(died)} died" if died else None


def released_by_death(failures: List[RankFailure], done: Mapping[int, dict], died: Sequence[int], notes: Sequence[str]) -> List[str]:
    """The collectives that broke because ranks of the cell died (``died``): those failures become ranks released (in
    place), and the note says where they were in our words, not the backend's (gloo's "Connection closed by peer …
    GLHF!"): "rank 0 was in all_reduce #1 when rank 1 died, and was released". Returns the note unless ``notes`` has it."""
    released: Dict[int, Tuple[Optional[Mapping[str, object]], str]] = {}
    for i, f in enumerate(failures):
        why = released_why(f.message, False, False, died) if f.kind == FailureKind.ERROR else None
        if why:
            released[f.rank] = (((done.get(f.rank) or {}).get("error") or {}).get("collective"), f.traceback)  # rank_collectives.on_error
            failures[i] = dataclasses.replace(f, kind=FailureKind.INTERRUPTED, message=f"released: {why}")
    said = released_by_death_text(released, died) if released else ""
    return [said] if said and said not in notes else []
