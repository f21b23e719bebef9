"""Parent-death signal: each program of ours goes when the process that started it goes.

Used by the rank (``worker``), the template (``forkserver``) and the rendezvous
store, so a SIGKILLed kernel leaves no orphan behind.
"""
from __future__ import annotations

import ctypes
import os
import signal
from typing import Optional

PR_SET_PDEATHSIG = 1  # prctl option, from <linux/prctl.h>


def die_with_parent(expected_parent: Optional[int] = None, sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send us sig (SIGKILL) when our parent dies; exit now if it already has.

    The check against expected_parent closes the race where the parent died
    before prctl ran: we were then already re-parented and no signal would come.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        return  # not Linux (no prctl): the stdin-EOF and socket-EOF paths still end us
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)
