"""``%%ddp --save-every 10m ckpt/``: while the cell runs, a snapshot at the first safe point after each interval (``--save-on-preempt``: armed here too).

A timer thread beside the cell's run, in the cell's context (its lines land in that cell, a
background job's included), asks for each save as ``%ddp save`` does during a job
(ui/snapshots.py ``at_safe_point``, kernel/jobs/safe_save.py); the next interval counts from the
end of the last save. It ends with the run; a cell with no safe points gets none.
"""
from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
from typing import Any, Iterator, List, Optional

from ..errors import UsageError
from ..kernel.jobs import safe_save
from ..kernel.jobs.turns import Ticket
from ..kernel.keep import keeping
from ..kernel.keep.terms import TermsError, duration
from ..logs import log
from ..session import Session
from . import preempt as preempting
from .snapshots import at_safe_point

SLICE_S = 0.2  # how often the timer looks whether the run has ended
ARM_WAIT_S = 5.0  # at a cell's end, how long it waits for --save-on-preempt's arming (a broadcast: milliseconds)


@contextlib.contextmanager
def saving(session: Session, args: Any, ticket: Optional[Ticket]) -> Iterator[None]:
    """Around a cell's run: with ``--save-every DURATION DIR`` a timer thread saves at safe points until the run ends;
    with ``--save-on-preempt DIR`` the pool is armed once the cell reaches the ranks (ui/preempt.py)."""
    every, preempt = getattr(args, "save_every", None), getattr(args, "save_on_preempt", None)
    pool = session.pool
    if pool is not None and pool.kept is not None:  # a kernel that attaches the kept pool takes this cell's saves on (ui/keep.py)
        keeping.record_saves(pool.kept, every=list(every) if every else [])
    if not (every or preempt) or ticket is None:
        yield
        return
    session.import_later()  # ranks forked from now on have DCP already: a preemption's save has no import to wait for
    try:
        seconds = duration(every[0], "--save-every") if every else 0.0
    except TermsError as e:
        raise UsageError(f"%%ddp {e}, then the folder, e.g. --save-every 10m ckpt/") from None
    stop = threading.Event()
    ctx = contextvars.copy_context()
    timer = threading.Thread(target=ctx.run, args=(_loop, session, ticket, seconds, every, preempt, stop), name="ddp-save-every", daemon=True)
    timer.start()
    try:
        yield
    finally:
        stop.set()
        if not every:
            timer.join(ARM_WAIT_S)  # armed before the next cell: it runs no save, only the arming's broadcast


def _loop(session: Session, ticket: Ticket, seconds: float, every: Optional[List[str]], preempt: Optional[str], stop: threading.Event) -> None:
    """Wait for the cell to reach the ranks, arm the pool (--save-on-preempt), then save after each interval until it ends."""
    try:
        while ticket.ran is None and not stop.wait(SLICE_S):
            pass
        if preempt and ticket.ran is not None:  # a cell over before the first look (a setup cell) arms the pool all the same
            preempting.arm(session, preempt)
        if stop.is_set():
            return
        while every and not stop.wait(seconds):
            out, saved = at_safe_point(session, ticket, every[1], (), lambda: None, f" at a safe point (--save-every {every[0]})",
                                       background=True)  # the training waits only while each rank copies its share
            if saved is not None:
                print(saved.text().splitlines()[0], flush=True)
            elif out.outcome == safe_save.Outcome.ENDED:
                return
            else:
                print(f"ddp_magic: --save-every: no snapshot this time: {out.why}; {ticket.name} goes on", file=sys.stderr, flush=True)
    except Exception as e:  # the saves' failure must not touch the cell: said once, the timer stops
        log.debug("--save-every stopped", exc_info=True)
        print(f"ddp_magic: --save-every stopped: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
