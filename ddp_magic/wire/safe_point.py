"""Both ends of a save taken at a safe point while a cell runs: the messages' kinds, and the fields each carries.

One op on the control channel (``protocol.SAFE_POINT``), its ``what`` one of ``Say``. The kernel
(kernel/jobs/safe_save.py) sends ASK, TARGET, GO or CANCEL; a rank (procs/rank_safepoint.py)
answers REPORT (from its reader thread, at once), ARRIVED (from its main thread, at the safe point
where it would save, or as its cell ends) and RESULT (its share written, or why not). Every message
names the request by its three desk ids (``ids``: report, arrive, result), so an answer to an
older request is never taken for a newer one's.
"""
from __future__ import annotations

import enum


class Say(str, enum.Enum):
    """The ``what`` of a SAFE_POINT message."""

    ASK = "ask"  # kernel -> rank: save at your next agreed safe point (ids, args: the save's partial folder, names, time)
    REPORT = "report"  # rank -> kernel: the step of the last safe point passed (``last``), or ``idle``: no cell runs here
    TARGET = "target"  # kernel -> rank: save at the first safe point whose step is above ``after`` (None: the next one)
    ARRIVED = "arrived"  # rank -> kernel: at that safe point (``step``, ``interval``), waiting; or ``ended``: the cell ended first
    GO = "go"  # kernel -> rank: every rank arrived at the same step: write
    CANCEL = "cancel"  # kernel -> rank: no save this time (``why``); the cell goes on
    RESULT = "result"  # rank -> kernel: ``report`` (rank 0's names the snapshot) or ``error`` (error data)
    ARM = "arm"  # kernel -> rank: --save-on-preempt: report SIGTERM or SIGUSR1 under desk ``id`` (procs/rank_preempt.py)
    PREEMPTED = "preempted"  # rank -> kernel: this rank got ``signal`` (its name); it goes on until the kernel ends the pool

    def __str__(self) -> str:
        return self.value


IDS = ("report", "arrive", "result")  # the three answers' desk ids, in the order the kernel waits for them
