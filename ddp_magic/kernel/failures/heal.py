"""A rank started again alone comes back whole: before the next cell it gets the others' imports and every name they agree on.

Recovery (recovery.py) forks the new process and re-forms the group; then, before the user's cell, every rank runs
procs/rank_heal.py's ``heal`` as ddp_magic's own cell: the healthy ranks compare what they hold, the lowest of them
sends what they agree on to each new rank over the process group, and each new rank rebuilds it. Its notice says
what came and what did not, in one line: ``rank 1 (pid 4121) was killed by SIGKILL: started it again in 42 ms (rank 1
is pid 4188); healed in 0.31 s: 14 names copied from rank 0 (model, opt, step, …), 1 lost (loss: it differs by
rank)``. ``%%ddp --no-heal`` keeps the rank empty (the notice then says its variables are gone).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from ...words import fmt_bytes, fmt_seconds, ranks_phrase
from ..ranks import Listener

if TYPE_CHECKING:
    from ..pool import Pool
    from ..ranks import CellOutcome

NAMES_SHOWN = 8  # names a heal notice lists; the others are counted


class OutputOnly(Listener):
    """The heal's cell is ours: its states and notices are not the user's cell's. What a rank prints meanwhile is the
    user's (a thread of theirs, a background save's writer failing as the group is re-formed): it is said."""

    def __init__(self, inner: Listener) -> None:
        self.inner = inner

    def on_output(self, rank: int, stream: str, text: str) -> None:
        self.inner.on_output(rank, stream, text)


def source(fresh: Sequence[int], names: Sequence[str], snapshot: Optional[str] = None) -> str:
    """The cell every rank runs to heal ``fresh`` (``snapshot``: where a new rank finds its own names that differ by rank)."""
    args = {"fresh": sorted(fresh), "names": sorted(names), "snapshot": snapshot}
    return f"__import__('ddp_magic.procs.rank_heal', fromlist=['heal']).heal(globals(), {args!r})"


def after_start(pool: "Pool", listener: Listener, owned: Sequence[str], notice: Optional[str], on: bool = True) -> Optional["CellOutcome"]:
    """Heal the ranks the recovery just started again, and say so; or pass the start's notice on as it is. Returns the
    heal's outcome when a Ctrl-C stopped it: the user's cell is then not run (it would run on a rank left empty)."""
    fresh, pool.recovery.fresh = pool.recovery.fresh, []
    if not (fresh and on and owned and pool.alive) or len(fresh) >= pool.nproc:  # every rank new: no one to copy from
        if notice:
            listener.on_notice(notice)
        return None
    t0 = time.monotonic()
    outcome = pool.run(source(fresh, owned, pool.recovery.snapshot), listener=OutputOnly(listener), owned=owned, label="heal", heal=False)
    if outcome.failures:
        listener.on_notice(f"{notice}\ncould not heal {ranks_phrase(fresh)} ({outcome.failures[0].headline()}): its variables are gone")
        if outcome.interrupted:
            outcome.notes.append(f"the heal of {ranks_phrase(fresh)} was interrupted: the cell did not run; run it again")
            return outcome
        return None
    reports = [v for v in outcome.values if isinstance(v, dict) and "names" in v]
    for report in reports:
        pool.recovery.assigned(report["names"], but=set())  # the rank has them again (Recovery.restarted, the views)
    rest = (notice or "").split("\n", 1)[1:]  # what the re-form said of the survivors' objects
    listener.on_notice("\n".join([healed_line(pool.recovery.started_line, reports, time.monotonic() - t0)] + rest))
    return None


def _some(names: Sequence[str]) -> str:
    shown = ", ".join(names[:NAMES_SHOWN])
    return shown + (f", … {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else "")


def healed_line(started: str, reports: List[Dict[str, Any]], seconds: float) -> str:
    """``started``, then what the new ranks got and what they lack (the first new rank's words; they get the same)."""
    if not reports:
        return f"{started}; nothing to heal"
    first = reports[0]
    names, lost = list(first["names"]), dict(first["lost"])
    copied = f"{len(names)} name{'s' if len(names) != 1 else ''} copied from rank {first['donor']}" + (f" ({_some(names)})" if names else "")
    restored = first.get("restored") or {}
    if restored:
        copied += f", {len(restored['names'])} from the snapshot of {restored['when']} ({_some(restored['names'])})"
    missing = "; ".join(f"{n}: {why}" for n, why in sorted(lost.items())[:NAMES_SHOWN])
    more = f", … {len(lost) - NAMES_SHOWN} more" if len(lost) > NAMES_SHOWN else ""
    tail = f", {len(lost)} lost ({missing}{more}); run the cells that set {'it' if len(lost) == 1 else 'them'}" if lost else "; nothing lost"
    moved = first.get("moved") or {}
    way = f" ({fmt_bytes(moved['bytes'])} of state {moved['via']})" if moved.get("bytes") else ""
    return f"{started}; healed in {fmt_seconds(seconds)}{way}: {copied}{tail}"
