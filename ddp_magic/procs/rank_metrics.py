"""A rank's ``ddp_magic.log(step=None, **scalars)``: numbers for the notebook's live chart, with no collective.

A call only appends a row to a buffer (a lock, a clock read, an append: about a
microsecond); one flusher thread sends the rows on the control channel at most
``INTERVAL`` apart, and the worker sends what is left when the cell ends, before
its DONE. So the kernel gets every row, in the order the rank logged them, before
it hears that the cell ended. The main thread never writes to the socket here: an
interrupt (KeyboardInterrupt raised in user code) cannot cut a frame in half.

A CUDA tensor is cloned (an asynchronous copy, no sync) and read at the flush, so
``log(loss=loss)`` does not stall the GPU every step; a CPU tensor or a number is
read at once. Outside a %%ddp cell (a script under torchrun, an exported notebook)
``log`` does nothing, so the same code runs everywhere.
"""
from __future__ import annotations

import math
import operator
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..logs import log as logger
from ..wire import protocol as P
from . import rank_safepoint

INTERVAL = 0.25  # seconds between two sends of one rank: at most four a second
Row = Tuple[int, float, Dict[str, Any]]  # (step, wall time in s, {name: value})


class _State:
    """One rank's buffer; module-level because a cell calls ``ddp_magic.log`` from anywhere."""

    def __init__(self) -> None:
        self.send: Optional[Callable[..., None]] = None
        self.rank = 0
        self.pid = 0
        self.cell = 0
        self.next_step = 0
        self.rows: List[Row] = []
        self.marks: Optional[List[Tuple[int, float]]] = None  # (step, wall time) while a profiled cell runs
        self.last_flush = -math.inf
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.thread: Optional[threading.Thread] = None


STATE = _State()


def install(send: Callable[..., None], rank: int) -> None:
    """The worker's channel (``Channel.send``): from now on ``log`` sends rows to the kernel."""
    STATE.send, STATE.rank, STATE.pid = send, rank, os.getpid()
    rank_safepoint.install(send, rank)  # log(step=…) is a safe point: from the same (main) thread


def begin_cell(cell: int) -> None:
    """A new cell: steps count from 0 again, rows belong to this cell."""
    with STATE.lock:
        STATE.cell, STATE.next_step, STATE.rows = cell, 0, []
    rank_safepoint.begin_cell()


def end_cell() -> None:
    """Send what is left (the worker calls it before DONE, outside user code)."""
    rank_safepoint.end_cell()  # a save still waiting for a safe point: the kernel takes it after the cell
    with STATE.lock:
        _flush_locked()


def log(step: Optional[int] = None, **scalars: Any) -> None:
    """Record numbers for this step on this rank: ``ddp_magic.log(step=i, loss=loss, lr=lr)``.

    ``step`` defaults to the previous step + 1 (0 first, per cell). Values are numbers
    or one-element tensors. The notebook shows them live, one line per rank, and gives
    them back as data (``%ddp metrics``). No collective; outside a %%ddp cell it does nothing.
    It is a safe point (``ddp_magic.safe_point``): a save asked for while the cell runs may be taken here.
    """
    s = STATE
    if s.send is None or os.getpid() != s.pid:  # not a rank, or a DataLoader worker forked from one
        return
    if not scalars:
        raise TypeError("ddp_magic.log needs at least one named value, e.g. ddp_magic.log(step=i, loss=loss)")
    values = {name: _number(name, v) for name, v in scalars.items()}
    now = time.time()
    with s.lock:
        n = s.next_step if step is None else _step(step)
        s.next_step = n + 1
        s.rows.append((n, now, values))
        if s.marks is not None:
            s.marks.append((n, now))
    if not s.wake.is_set():
        if s.thread is None:
            s.thread = threading.Thread(target=_flusher, name="ddp-metrics", daemon=True)
            s.thread.start()
        s.wake.set()
    rank_safepoint.reached(n)  # every rank's log at a step is a safe point: a save asked for meanwhile is taken here


def _step(step: Any) -> int:
    try:
        return operator.index(step)  # ints, numpy ints, one-element integer tensors
    except TypeError:
        raise TypeError(f"ddp_magic.log: step={step!r} is not a whole number; give the step as an int, or leave it out") from None


def _number(name: str, value: Any) -> Any:
    """A float now, or a CUDA tensor's clone to be read at the flush."""
    if hasattr(value, "detach") and hasattr(value, "numel"):
        if value.numel() != 1:
            raise TypeError(f"ddp_magic.log: {name} is a tensor of {value.numel()} elements; log one number, e.g. {name}={name}.mean()")
        if value.device.type != "cpu":
            return value.detach().reshape(()).clone()
        return float(value.item())
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"ddp_magic.log: {name}={value!r} is not a number; log numbers or one-element tensors") from None


def _flusher() -> None:
    """The one thread that sends rows while a cell runs: at most one send per ``INTERVAL``."""
    s = STATE
    while True:
        s.wake.wait()
        delay = s.last_flush + INTERVAL - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        with s.lock:
            s.wake.clear()
            _flush_locked()


def _flush_locked() -> None:
    s = STATE
    s.last_flush = time.monotonic()
    if not s.rows or s.send is None:
        return
    rows, s.rows = s.rows, []
    try:
        sent = [(step, t, {k: (v if isinstance(v, float) else float(v)) for k, v in vals.items()}) for step, t, vals in rows]
        s.send(P.METRICS, rank=s.rank, cell=s.cell, rows=sent)
    except Exception:  # the kernel is gone or a tensor could not be read: the chart misses these rows, the cell goes on
        logger.debug("rank %d: metrics rows not sent", s.rank, exc_info=True)
