"""A rank's part in ``--save-on-preempt``: SIGUSR1 (Slurm's warning, or its template's word of a SIGTERM) told to the kernel.

Armed by the kernel (ARM: the desk id its report goes to; kernel side ui/preempt.py). Then the
first SIGUSR1 is reported once, by a thread (the handler runs between two bytecodes of the main
thread, which may hold the channel), and the rank goes on: the kernel saves at the next safe point
(or between cells) and then ends the pool, or the scheduler's SIGKILL (Slurm's KillWait) does.
SIGTERM is ignored while armed: Slurm sends it to every process of the step, and the template, which
gets it too, passes it on as SIGUSR1 once (procs/template_preempt.py ``terminated``; a marker file in
/dev/shm tells it that its ranks are armed). So the failure policy's SIGTERM to a rank that ignores
an interrupt is no preemption either; its SIGKILL follows as before. Unarmed, SIGTERM ends the rank as
before and SIGUSR1 is ignored. SIGTERM's disposition is set from the main thread (the reader asks it
with a SIGUSR1 of its own): signal.signal works there only. The marker is written once the main thread has done so:
before, the template's SIGUSR1 could merge with that poke (two pending signals are one) and the rank's preemption
would go untold.
"""
from __future__ import annotations

import os
import signal
import threading
from typing import Any, Callable, Optional

from ..logs import log
from ..wire import protocol as P
from ..wire import shm
from ..wire.safe_point import Say


class _State:
    def __init__(self) -> None:
        self.send: Optional[Callable[..., None]] = None
        self.rank = 0
        self.ident = 0
        self.armed: Optional[int] = None  # the desk id the kernel files reports under
        self.arming = False  # the reader asked the main thread to set the SIGTERM handler
        self.set = threading.Event()  # the main thread set it: the marker may tell the template
        self.reported = False


STATE = _State()


def install(send: Callable[..., None], rank: int) -> None:
    """From the main thread, before the first cell: SIGUSR1 is ours from now on (ignored until armed)."""
    STATE.send, STATE.rank, STATE.ident = send, rank, threading.get_ident()
    signal.signal(signal.SIGUSR1, _on_signal)


def arm(msg: dict) -> None:
    """The reader thread got ARM: reports go under ``msg['id']``; the main thread sets the SIGTERM handler at its next bytecode."""
    if STATE.set.is_set():  # armed before (a later cell's ARM): SIGTERM is ignored already, and a poke could swallow a preemption
        STATE.armed, STATE.reported = int(msg["id"]), False
        return
    STATE.armed, STATE.reported, STATE.arming = int(msg["id"]), False, True
    signal.pthread_kill(STATE.ident, signal.SIGUSR1)
    threading.Thread(target=_mark, name="ddp-preempt-arm", daemon=True).start()  # the reader reads on meanwhile


def _mark() -> None:
    """Once the main thread ignores SIGTERM, the marker: from then on the template's SIGUSR1 is a preemption's."""
    STATE.set.wait()  # a main thread inside a long C call sets it when the call returns
    prefix = os.environ.get(shm.ENV)
    if prefix:
        try:
            shm.create_private(shm.armed_file(prefix))
        except OSError:
            log.debug("rank %d: the preemption marker could not be written", STATE.rank, exc_info=True)


def _on_signal(signum: int, frame: Any) -> None:
    s = STATE
    if s.arming:  # our own poke: SIGTERM is the template's to pass on from now on
        s.arming = False
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        s.set.set()
        return
    if s.armed is not None and not s.reported:
        s.reported = True
        threading.Thread(target=_report, args=(signal.Signals(signum).name, s.armed), name="ddp-preempt", daemon=True).start()


def _report(name: str, desk: int) -> None:
    try:
        assert STATE.send is not None, "rank_preempt.install runs before any signal"
        STATE.send(P.SAFE_POINT, id=desk, what=Say.PREEMPTED.value, rank=STATE.rank, signal=name)
    except Exception:  # the kernel is gone: nothing to save for
        log.debug("rank %d: the preemption was not reported", STATE.rank, exc_info=True)
