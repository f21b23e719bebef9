"""``%%ddp --save-on-preempt DIR``: when the ranks are told to go (Slurm's warning or preemption, SIGTERM to a template), a snapshot in DIR first.

The cell arms the pool (ARM to every rank, procs/rank_preempt.py); the ranks then report SIGTERM or
SIGUSR1 instead of dying. A watcher thread, in the arming cell's context, waits for the reports (it
pumps the hub itself while no cell does), then saves: at the running cell's next safe point
(ui/snapshots.py ``at_safe_point``), or between cells as ``%ddp save`` does. It then ends the pool
(the ranks exit, their template with them; the next cell starts a new one) and says, in that cell:
``preempted: saved step 4210 to ckpt/step-… (3.1 s); %ddp load ckpt/ on the next allocation``. The JupyterLab panel
and status bar say it too while no pool runs (``ended``: the snapshot's field, ui/labsnap.py ``pool_ended``), as a cell's words
are not on screen when the page was closed or scrolled away.
"""
from __future__ import annotations

import contextvars
import threading
import time
import weakref
from typing import Any, Optional

from ..kernel import snapshots
from ..kernel.jobs import safe_save
from ..kernel.jobs.turns import Ticket
from ..kernel.keep import keeping
from ..logs import log
from ..session import Session
from ..wire import protocol as P
from ..wire.safe_point import Say
from . import labcomm, labsnap
from .snapshots import at_safe_point, save

SLICE_S = 0.2  # while no cell pumps the hub: how long the watcher pumps it at a time
ALL_WITHIN_S = 1.0  # after the first report, the others get this long: a signal every node gets (Slurm's) is one event; one spot
# host preempted alone saves at once (its notice may be 30 s), not after waiting for hosts that never get a signal
SETTLE_S = 2.0  # at most this long for a queued cell to take the turn we gave back (its thread: milliseconds)
_ARMED: "weakref.WeakKeyDictionary[Any, Watcher]" = weakref.WeakKeyDictionary()  # pool -> its watcher


class Watcher:
    """One armed pool: the desk id its ranks report under, the folder, and the thread that waits for them."""

    def __init__(self, session: Session, pool: Any, parent: str) -> None:
        self.session, self.pool, self.parent = session, pool, parent
        self.desk = pool.hub.peeks.open()
        self.text = ""  # what it said, once preempted
        self.stopped = False  # another folder armed the pool since: that watcher answers
        self.thread = threading.Thread(target=contextvars.copy_context().run, args=(self._watch,), name="ddp-preempt", daemon=True)

    def arm(self) -> None:
        """Every rank reports under our desk id (again: a rank started since has not heard it)."""
        self.pool.hub.broadcast(P.message(P.SAFE_POINT, what=Say.ARM.value, id=self.desk))

    def _watch(self) -> None:
        try:
            signal_name = self._await_reports()
            if signal_name:
                self._save(signal_name)
        except Exception as e:  # the watcher's failure must not touch the pool: said once
            log.debug("--save-on-preempt's watcher stopped", exc_info=True)
            print(f"ddp_magic: --save-on-preempt stopped: {type(e).__name__}: {e}", flush=True)

    def _holder(self) -> Optional[Ticket]:
        """The cell that holds the turn, once a cell queued behind our own moment of pumping has taken it: its thread
        may not have run yet when we gave the turn back, and a save between cells would then wait behind it."""
        return self.session.turns.settled(SETTLE_S)

    def _await_reports(self) -> Optional[str]:
        """The signal's name once every connected rank reported it (or ALL_WITHIN_S after the first); None if the pool ended."""
        hub, turns, me, first = self.pool.hub, self.session.turns, Ticket("--save-on-preempt", passing=True), 0.0
        while self.pool.alive and self.session.pool is self.pool and not self.stopped:
            got = hub.peeks.answers(self.desk)
            live = [r for r in hub.conns]
            first = first or (time.monotonic() if got else 0.0)
            if got and (all(r in got for r in live) or time.monotonic() > first + ALL_WITHIN_S):
                return str(next(iter(got.values())).get("signal", "a signal"))
            if turns.try_take(me):  # no cell pumps the hub: read the ranks' reports ourselves
                try:
                    hub.pump(lambda: False, time.monotonic() + SLICE_S)
                finally:
                    turns.give_back(me)
            else:
                hub.peeks.wait(self.desk, live, time.monotonic() + SLICE_S)
        return None

    def _save(self, signal_name: str) -> None:
        t0 = time.monotonic()
        holder, saved, why = self._holder(), None, ""
        if holder is not None:
            out, saved = at_safe_point(self.session, holder, self.parent, (), lambda: None, "")
            why = "" if out.outcome == safe_save.Outcome.ENDED else out.why
        if saved is None and not why:
            result, saved = save(self.session, self.parent)
            why = "; ".join(f.message for f in result.outcome.failures[:1]) if saved is None else ""
        took = time.monotonic() - t0
        if saved is not None:
            step = f"step {saved.report['step']}" if saved.report.get("step") is not None else "a snapshot"
            self.text = (f"preempted: saved {step} to {snapshots.shown(self.parent, saved.report['path'])} ({took:.1f} s); "
                         f"%ddp load {self.parent} on the next allocation")
        else:
            self.text = f"preempted ({signal_name}): nothing was saved: {why}"
        log.info("preempted (%s): %s", signal_name, self.text)
        print(self.text, flush=True)
        self.pool.hub.broadcast(P.message(P.SHUTDOWN))  # the scheduler ends them anyway: now, not after its grace
        with self.session.turns.turn(Ticket("--save-on-preempt")):  # once the running cell has seen its ranks go
            if self.session.pool is self.pool:
                self.session.stop(force=True)  # the next cell starts a new pool (and template): %ddp load goes on there
            labsnap.pool_ended(self.session, {
                "why": "preempted", "text": self.text, "step": saved.report.get("step") if saved is not None else None,
                "folder": self.parent, "seconds": round(took, 3), "saved": saved is not None})
        labcomm.changed()  # the panel says it (a snapshot with ``ended``)


def arm(session: Session, parent: str) -> Optional[Watcher]:
    """Arm the session's running pool: its ranks' SIGTERM or SIGUSR1 saves to ``parent`` first (from the cell that asked)."""
    pool = session.pool
    if pool is None or not pool.alive:
        return None
    watcher = _ARMED.get(pool)
    if watcher is None or watcher.parent != parent or not watcher.thread.is_alive():
        if watcher is not None:
            watcher.stopped = True
        watcher = _ARMED[pool] = Watcher(session, pool, parent)
        watcher.thread.start()
    watcher.arm()
    if pool.kept is not None:  # the kernel that attaches it next arms it again (ui/keep.py)
        keeping.record_saves(pool.kept, armed=parent)
    return watcher


def armed_folder(pool: Any) -> str:
    """The folder ``pool`` is armed to save to (its watcher's), or "" when none watches it."""
    watcher = _ARMED.get(pool)
    return watcher.parent if watcher is not None and watcher.thread.is_alive() and not watcher.stopped else ""

