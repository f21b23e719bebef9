"""A cell that ran on while no kernel was attached, driven to its end by the kernel that attached.

Its ranks are RUNNING (or their DONE waits in their queue): the cell is not sent again; the same
``CellRun`` a sent cell gets (kernel/cell.py) waits for it, with the failure policy, the forensics
and the results of any cell.
"""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Optional

from ..cell import CellRun
from ..failures.policy import FailurePolicy
from ..ranks import CellOutcome, GuardedListener, Listener

if TYPE_CHECKING:
    from ..pool import Pool


def resume(pool: "Pool", listener: Listener, cancel: Optional[threading.Event] = None) -> CellOutcome:
    """Wait for the resumed cell's end on every rank; its outcome, as ``Pool.run`` gives one."""
    guarded = GuardedListener(listener)
    with pool._bound(guarded):
        t0 = time.monotonic()
        cell = CellRun(pool, FailurePolicy(timeout=None, grace=pool.grace, t0=t0, remote=pool.launcher.remote_ranks), cancel=cancel)
        cell.drive()
        return pool._outcome(cell, guarded, t0)
