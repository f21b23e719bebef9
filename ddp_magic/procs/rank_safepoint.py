"""A rank's safe points (``ddp_magic.safe_point()``, ``ddp_magic.log(step=…)``): where a save asked for while a cell runs is taken.

A save runs collectives, so every rank must take it at the same point of the user's code, or its
collectives would meet the training's. The ranks agree with no collective of their own:

1. The kernel asks (ASK). Each rank's reader thread answers at once with the step of the last safe
   point its main thread passed. It never waits on the main thread, so the agreement cannot hang
   on a training collective that some rank has not joined yet.
2. The main thread stops at its next safe point until the kernel names M, the largest step
   reported (TARGET), and saves at the first safe point whose step is above M. No rank can have
   passed it: a rank stops at the first safe point after its report, and ranks in lockstep (a
   collective each step) are at most one safe point apart.
3. There it says so (ARRIVED) and waits. The kernel says GO only when every rank arrived at the
   same step, else CANCEL: a rank that logs alone (``if rank == 0: log(...)``) or a cell that ended
   first costs the save, never a deadlock. GO runs procs/rank_snapshot.py's writer right there.

The lock makes the step a rank reports and the safe points its main thread passes one order;
without a pending request a safe point costs a lock and an assignment.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from ..logs import log
from ..wire import protocol as P
from ..wire.execution import error_data
from ..wire.safe_point import Say
from . import rank_preempt


@dataclass
class _Request:
    """One save the kernel asked for: its desk ids, the writer's arguments, and what the kernel has said since."""

    ids: Dict[str, int]
    args: Dict[str, Any]
    after: Optional[int] = None
    told: bool = False  # TARGET came (``after`` holds)
    verdict: Optional[Say] = None  # GO or CANCEL
    arrived: bool = False


class _State:
    def __init__(self) -> None:
        self.send: Optional[Callable[..., None]] = None
        self.rank = 0
        self.pid = 0
        self.ident = 0  # the main thread's: only it runs the cell, so only its calls are safe points
        self.ns: Dict[str, Any] = {}
        self.cond = threading.Condition()
        self.in_cell = False
        self.last: Optional[int] = None  # the step of the last safe point passed in this cell
        self.next_step = 0
        self.passed_at = 0.0
        self.interval = 0.0  # seconds between the last two safe points: how long the kernel waits for a late rank
        self.pending: Optional[_Request] = None


STATE = _State()


def install(send: Callable[..., None], rank: int) -> None:
    """From the main thread, before the first cell: where answers go; the cells' globals are ``__main__``'s (worker.py)."""
    STATE.send, STATE.rank, STATE.pid, STATE.ident = send, rank, os.getpid(), threading.get_ident()
    STATE.ns = sys.modules["__main__"].__dict__
    rank_preempt.install(send, rank)


def begin_cell() -> None:
    with STATE.cond:
        STATE.in_cell, STATE.last, STATE.next_step, STATE.pending = True, None, 0, None


def end_cell() -> None:
    """The cell ended here: a request still waiting for a safe point is answered ``ended`` (the kernel then saves after the cell)."""
    s = STATE
    with s.cond:
        s.in_cell = False
        req, s.pending = s.pending, None
        if req is not None and not req.arrived:
            _send(req, Say.ARRIVED, ended=True)
        elif req is not None:  # it arrived, then an interrupt ended the cell before it could write
            _send(req, Say.RESULT, error={"type": "KeyboardInterrupt", "message": "the cell ended before this rank wrote", "traceback": ""})
        s.cond.notify_all()


def on_message(msg: dict) -> None:
    """The reader thread's part: ASK is answered at once; TARGET, GO and CANCEL wake the main thread."""
    s, what = STATE, Say(msg["what"])
    if what == Say.ARM:  # --save-on-preempt (procs/rank_preempt.py)
        return rank_preempt.arm(msg)
    with s.cond:
        if what == Say.ASK:
            req = _Request(ids=dict(msg["ids"]), args=dict(msg["args"]))
            if not s.in_cell or s.pending is not None:
                _send(req, Say.REPORT, idle=True)
                return
            s.pending = req
            _send(req, Say.REPORT, last=s.last)
            return
        current = s.pending
        if current is None or current.ids != msg["ids"]:
            return  # an older request's, or one this rank's cell outlived
        req = current
        if what == Say.TARGET:
            req.after, req.told = msg.get("after"), True
        else:
            req.verdict = what
            if what == Say.CANCEL:
                s.pending = None
        s.cond.notify_all()


def safe_point(step: Optional[int] = None) -> None:
    """Mark a point where this rank may be saved: call it on every rank at the same step (``step``: the previous + 1 by default).

    A save asked for while the cell runs (``%ddp save``, ``--save-every``) is taken at the first safe
    point every rank reaches at the same step, never inside a collective. Outside a %%ddp cell it does nothing.
    """
    s = STATE
    if s.send is None or os.getpid() != s.pid:
        return
    reached(s.next_step if step is None else int(step))


def reached(step: int) -> None:
    """The main thread is at a safe point with this step (``ddp_magic.log`` calls it too)."""
    s = STATE
    if threading.get_ident() != s.ident:
        return  # another thread's log() is no safe point: the main thread may be inside a collective
    with s.cond:
        req = s.pending
        if req is not None:
            while not req.told and req.verdict is None:
                s.cond.wait()
            if req.verdict is None and (req.after is None or step > req.after):
                req.arrived = True
                _send(req, Say.ARRIVED, step=step, interval=s.interval)
                while req.verdict is None:
                    s.cond.wait()
                s.pending = None
            else:
                req = None  # cancelled, or not yet: the agreed step is a later one
        now = time.monotonic()
        s.interval, s.passed_at, s.last, s.next_step = now - s.passed_at if s.last is not None else 0.0, now, step, step + 1
    if req is not None and req.verdict == Say.GO:
        _save(req, step)


def _save(req: _Request, step: int) -> None:
    """The snapshot writer (procs/rank_snapshot.py), here, at the agreed safe point; its report or its error to the kernel."""
    from . import rank_snapshot  # torch and DCP: loaded only by a rank that saves

    try:
        # names the running cell has not set yet are not there; one the user typed that no rank has refuses (rank_snapshot.py)
        names = [n for n in req.args["names"] if n in STATE.ns or req.args.get("user_named")]
        report = rank_snapshot.save(STATE.ns, dict(req.args, names=names, at=step))
        _send(req, Say.RESULT, report=report)
    except BaseException as e:  # the save's failure is the save's: the kernel says it, the cell goes on (a Ctrl-C still stops it)
        log.debug("rank %d: the save at step %d failed (reported to the kernel)", STATE.rank, step, exc_info=True)
        _send(req, Say.RESULT, error=error_data(e, traceback.format_exc()))
        if isinstance(e, KeyboardInterrupt):
            raise


def _send(req: _Request, what: Say, **fields: Any) -> None:
    desk = {Say.REPORT: "report", Say.ARRIVED: "arrive", Say.RESULT: "result"}[what]
    try:
        assert STATE.send is not None, "rank_safepoint.install runs before any cell"
        STATE.send(P.SAFE_POINT, id=req.ids[desk], what=what.value, rank=STATE.rank, **fields)
    except Exception:  # the kernel is gone: the reader sees it too and the rank ends
        log.debug("rank %d: a safe point's %s was not sent", STATE.rank, what, exc_info=True)
