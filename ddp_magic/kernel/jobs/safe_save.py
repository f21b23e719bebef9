"""A save asked for while a cell runs (``%ddp save`` beside a ``--bg`` job, ``--save-every``): taken at the ranks' next safe point.

The kernel's half of procs/rank_safepoint.py's agreement, run on the thread that asked (the
notebook's, or a ``--save-every`` timer's): ASK every rank, take the largest step their reader
threads report, name it (TARGET), wait until every rank ARRIVED at the safe point above it, and
say GO when all are at the same step (CANCEL otherwise). The answers are filed in the hub's
``PeekDesk`` by whichever thread pumps (the running cell's); when nobody does, the waiting thread
pumps itself, as a peek does (kernel/jobs/peek.py ``await_answers``). One save at a time.
"""
from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Sequence

from ...wire import protocol as P
from ...wire.safe_point import IDS, Say
from ...words import ranks_phrase
from .peek import await_answers
from .turns import Turns

REPORT_S = 10.0  # the readers answer an ASK at once; one that does not within this long is lost
PATIENCE_S = 10.0  # after the first rank arrived, the others get this long (or 5 of its steps, if longer)
NOTICE_S = 2.0  # nothing arrived this long: say that the save waits for the next safe point
SLICE_S = 0.2
_ONE = threading.Lock()
HOW = "call ddp_magic.log(step=…) or ddp_magic.safe_point() on every rank at the same steps"


class Outcome(str, enum.Enum):
    SAVED = "saved"
    ENDED = "ended"  # the cell ended (or was not running) on every rank before a safe point: save after it
    CANCELLED = "cancelled"  # the ranks did not meet at one safe point: nothing written, the cell goes on
    FAILED = "failed"  # the writer failed on a rank

    def __str__(self) -> str:
        return self.value


@dataclass
class SafeSave:
    """What a save at a safe point came to: rank 0's report when SAVED, else why not."""

    outcome: Outcome
    report: Optional[Dict[str, Any]] = None
    why: str = ""
    waited: float = 0.0  # seconds from the ask to the verdict
    errors: Dict[int, dict] = field(default_factory=dict)


def save_at_safe_point(pool: Any, turns: Turns, args: Dict[str, Any], on_wait: Callable[[], None] = lambda: None) -> SafeSave:
    """Ask the running cell's ranks to save (``args``: the writer's partial folder, names, time) at their next common safe point."""
    hub = pool.hub
    with _ONE:
        ranks = sorted(hub.conns)
        if not ranks:
            return SafeSave(Outcome.ENDED, why="no rank is connected")
        ids = {k: hub.peeks.open() for k in IDS}
        t0 = time.monotonic()
        try:
            hub.broadcast(P.message(P.SAFE_POINT, what=Say.ASK.value, ids=ids, args=args), ranks)
            reports = _gather(hub, turns, ids["report"], ranks, t0 + REPORT_S)
            if any(m.get("idle") for m in reports.values()) or len(reports) < len(ranks):
                _tell(hub, ids, Say.CANCEL, ranks, why="no cell runs")
                return SafeSave(Outcome.ENDED, why="no cell was running on every rank")
            lasts = [m["last"] for m in reports.values() if m.get("last") is not None]
            hub.broadcast(P.message(P.SAFE_POINT, what=Say.TARGET.value, ids=ids, after=max(lasts) if lasts else None), ranks)
            arrivals = _arrivals(hub, turns, ids["arrive"], ranks, t0, on_wait)
            verdict = _verdict(ranks, arrivals)
            _tell(hub, ids, Say.GO if verdict is None else Say.CANCEL, ranks, why=verdict.why if verdict is not None else None)
            if verdict is not None:
                verdict.waited = time.monotonic() - t0
                return verdict
            waited = time.monotonic() - t0
            return _results(_gather(hub, turns, ids["result"], [r for r in ranks if r in arrivals], None), waited)
        finally:
            for pid in ids.values():
                hub.peeks.close(pid)


def _tell(hub: Any, ids: Dict[str, int], what: Say, ranks: Sequence[int], why: Optional[str] = None) -> None:
    hub.broadcast(P.message(P.SAFE_POINT, what=what.value, ids=ids, why=why or ""), ranks)


def _gather(hub: Any, turns: Turns, pid: int, ranks: Sequence[int], deadline: Optional[float]) -> Dict[int, dict]:
    """Every connected rank's answer filed under ``pid`` (a rank that left is waited for no more), or those by the deadline."""
    while True:
        live = [r for r in ranks if r in hub.conns]
        got = hub.peeks.answers(pid)
        now = time.monotonic()
        if all(r in got for r in live) or (deadline is not None and now >= deadline):
            return got
        await_answers(hub, turns, pid, live, min(now + SLICE_S, deadline if deadline is not None else now + SLICE_S))


def _arrivals(hub: Any, turns: Turns, pid: int, ranks: Sequence[int], t0: float, on_wait: Callable[[], None]) -> Dict[int, dict]:
    """Each rank at its safe point (or its cell's end): as long as that takes, but a rank late behind the first gets PATIENCE_S."""
    told, first = False, None
    while True:
        live = [r for r in ranks if r in hub.conns]
        got = hub.peeks.answers(pid)
        now = time.monotonic()
        if all(r in got for r in live):
            return got
        if got and first is None:
            first = now  # within a slice of the first arrival
        if first is not None and now > first + max(PATIENCE_S, 5 * max(float(m.get("interval") or 0) for m in got.values())):
            return got
        if not told and now - t0 > NOTICE_S:
            told = True
            on_wait()
        await_answers(hub, turns, pid, live, now + SLICE_S)


def _verdict(ranks: Sequence[int], arrivals: Dict[int, dict]) -> Optional[SafeSave]:
    """None when every rank is at one safe point (GO); else why not, in words that name the ranks."""
    ended = [r for r in ranks if arrivals.get(r, {}).get("ended")]
    missing = [r for r in ranks if r not in arrivals]
    steps = {r: m["step"] for r, m in arrivals.items() if not m.get("ended")}
    if ended and len(ended) == len(arrivals) and not missing:
        return SafeSave(Outcome.ENDED, why="the cell ended before a safe point")
    if ended or missing:
        at = ", ".join(f"rank {r} at step {s}" for r, s in sorted(steps.items()))
        gone = "; ".join(t for t in (f"{ranks_phrase(ended)} ended the cell" if ended else "",
                                     f"{ranks_phrase(missing)} never reached one" if missing else "") if t)
        return SafeSave(Outcome.CANCELLED, why=f"the ranks did not meet at one safe point ({at or 'none'} reached one; {gone}): {HOW}")
    if len(set(steps.values())) > 1:
        at = ", ".join(f"rank {r} at step {s}" for r, s in sorted(steps.items()))
        return SafeSave(Outcome.CANCELLED, why=f"the ranks reached safe points at different steps ({at}): {HOW}")
    return None


def _results(results: Dict[int, dict], waited: float) -> SafeSave:
    errors = {r: m["error"] for r, m in results.items() if m.get("error")}
    if errors or 0 not in results:
        first = min(errors) if errors else 0
        why = f"rank {first}: {errors[first]['type']}: {errors[first]['message']}" if errors else "rank 0 did not report"
        return SafeSave(Outcome.FAILED, why=why, waited=waited, errors=errors)
    return SafeSave(Outcome.SAVED, report=results[0]["report"], waited=waited)
