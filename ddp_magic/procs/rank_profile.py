"""A rank's share of ``%%ddp --profile``: the cell under torch.profiler, its Chrome trace in a private file.

The kernel sends PROFILE just before the cell's RUN, on the same socket, so the
reader thread has armed this module when the main thread takes the cell. The
worker runs the cell inside ``profiled(...)``: the profiler (CPU, and CUDA on a
GPU rank) starts before the cell's code and stops after it; the trace goes to a
0600 file under the pool's /dev/shm prefix (the pool sweeps it if the kernel
cannot), or, for a rank on another host, into the DONE message itself.

The clock. Kineto stamps events in microseconds of its own steady clock, not the
wall clock, and every rank's base differs. Right after the profiler starts, the
rank reads ``time.time_ns()``, opens and closes a ``ddp_magic.clock`` annotation
and reads the wall clock again. That event's ``ts`` and the first wall reading
give the rank's offset (wall µs − trace µs); the two readings bound its error
(``clock_error_us``, a few µs). kernel/results/profile_merge.py shifts each rank's
events by its offset, so every rank is on one wall clock (one host: exact to
that bound; several hosts: up to their NTP error as well).
"""
from __future__ import annotations

import contextlib
import os
import secrets
import sys
import tempfile
import time
import zlib
from typing import Any, Dict, Iterator, Optional

from ..logs import log
from ..wire import shm
from . import rank_metrics

CLOCK_EVENT = "ddp_magic.clock"

_armed: Optional[Dict[str, Any]] = None
_result: Optional[Dict[str, Any]] = None


def arm(msg: Dict[str, Any]) -> None:
    """The kernel's PROFILE: profile the next cell (read by the reader thread, before that cell's RUN)."""
    global _armed
    _armed = dict(msg)


def take() -> Dict[str, Any]:
    """The DONE fields of a profiled cell (``{"profile": {...}}``), once; ``{}`` for any other cell."""
    global _result
    result, _result = _result, None
    return {"profile": result} if result is not None else {}


@contextlib.contextmanager
def profiled(rank: int, device: str, local: bool) -> Iterator[None]:
    """Run the body under torch.profiler if PROFILE armed it; otherwise a no-op."""
    global _armed, _result
    armed, _armed = _armed, None
    if armed is None:
        yield
        return
    try:
        prof, clock = _start(device)
    except Exception as e:  # no profiler here: the cell runs anyway, the kernel says why there is no trace
        log.debug("rank %d: torch.profiler did not start", rank, exc_info=True)
        _result = {"error": f"torch.profiler did not start: {type(e).__name__}: {e}"}
        yield
        return
    rank_metrics.STATE.marks = []
    try:
        yield
    finally:
        t_end = time.time_ns()
        marks, rank_metrics.STATE.marks = rank_metrics.STATE.marks or [], None
        _result = dict(clock, end_ns=t_end, steps=marks, device=device)
        try:
            _result.update(_stop(prof, rank, local))
        except Exception as e:
            log.debug("rank %d: the profile could not be written", rank, exc_info=True)
            _result["error"] = f"the trace could not be written: {type(e).__name__}: {e}"


def _start(device: str) -> Any:
    """Start the profiler and measure this rank's clock offset (see the module's docstring)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    prof = profile(activities=activities)
    with _quiet_stderr():  # Kineto prints "profiler_start" lines on fd 2
        prof.start()
    t0 = time.time_ns()
    with record_function(CLOCK_EVENT):
        pass
    t1 = time.time_ns()
    return prof, {"start_ns": t0, "clock_error_us": (t1 - t0) / 1000.0}


def _stop(prof: Any, rank: int, local: bool) -> Dict[str, Any]:
    """Stop the profiler; the trace's path (this host) or its compressed bytes (another host)."""
    with _quiet_stderr():
        prof.stop()
    path = _private_path(rank)
    try:
        prof.export_chrome_trace(path)  # into the 0600 file made above: torch truncates it, the mode stays
        if local:
            return {"path": path, "bytes": os.path.getsize(path)}
        with open(path, "rb") as f:
            return {"data": zlib.compress(f.read(), 3)}
    finally:
        if not local:
            shm.remove(path)


def _private_path(rank: int) -> str:
    """A new 0600 file for the trace: under the pool's /dev/shm prefix, else in the temp dir."""
    if os.path.isdir(shm.SHM_DIR):
        path = os.path.join(shm.SHM_DIR, os.environ.get(shm.ENV, shm.SHM_PREFIX) + f"p{rank}-{secrets.token_hex(4)}.json")
        shm.create_private(path, fresh=True)
        return path
    fd, path = tempfile.mkstemp(prefix=f"ddp_magic-p{rank}-", suffix=".json")  # 0600
    os.close(fd)
    return path


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """fd 2 to /dev/null for a moment: the profiler's own chatter is not the cell's output."""
    try:
        sys.stderr.flush()
    except Exception:
        log.debug("stderr flush failed", exc_info=True)
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)
