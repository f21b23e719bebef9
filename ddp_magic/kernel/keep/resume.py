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
from .clocks import RankClocks, Settled

if TYPE_CHECKING:
    from ..pool import Pool


def resume(pool: "Pool", listener: Listener, cancel: Optional[threading.Event] = None, clocks: Optional[RankClocks] = None) -> CellOutcome:
    """Wait for the resumed cell's end on every rank; its outcome, as ``Pool.run`` gives one. Its run time is the ranks'
    (``clocks``): from when the cell reached them, to its end here or, when it ended while no kernel was attached, there."""
    clocks = clocks or RankClocks()
    guarded = GuardedListener(Settled(clocks, listener))
    ranks = sorted(pool.hub.hellos)  # the ranks that joined this kernel (one that died meanwhile has no clock)
    with pool._bound(guarded):
        t0 = clocks.start(ranks) or time.monotonic()
        cell = CellRun(pool, FailurePolicy(timeout=None, grace=pool.grace, t0=t0, remote=pool.launcher.remote_ranks), cancel=cancel)
        cell.drive()
        outcome = pool._outcome(cell, guarded, t0)
    ended = clocks.end(ranks)
    if ended is not None:  # every rank had ended it before this kernel came: its run time ends there, not at the attach
        outcome.elapsed = max(0.0, ended - t0)
    return outcome
