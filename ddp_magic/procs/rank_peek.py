"""A rank's side of ``%%ddp --peek``: a short read-only cell run on the rank's peek thread, beside the cell its main thread runs.

The reader thread (worker.py) hands every PEEK to one peek thread, started at the first,
so the reader stays free for interrupts and stack requests whatever a peek does, and
peeks on one rank run one after another. A peek reads the rank's globals, the namespace
the running cell writes (``step``, ``model``, ``optimizer``), through a shallow copy:
what the peek assigns stays in the peek, the objects it reads are the cell's own (a
peek that mutates them mutates the training's). What it prints through ``sys.stdout``
and ``sys.stderr`` is kept for its thread alone and sent back with the answer, so it
shows in the peek's own cell; bytes written to fds 1 and 2 directly (C code) go to the
running cell's output. The peek shares the GIL with the training loop: the milliseconds
it computes are milliseconds the loop waits (docs/background.md measures it).

A collective from the peek thread raises at once (rank_collectives.refuse and guard: the
public functions, a ProcessGroup's and a Backend's methods, torch.ops.c10d, DDP's forward):
the other ranks are busy in the running cell and would never join it, so the training
would deadlock.
"""
from __future__ import annotations

import io
import linecache
import queue
import sys
import threading
from typing import Any, Callable, Dict, Optional

from ..logs import log
from ..wire import protocol as P
from ..wire import transfer
from ..wire.execution import error_data, format_user_traceback, run_source
from . import rank_collectives

REFUSED = (
    "a peek may not call {op}: the other ranks are busy in the running cell and would never join it, "
    "so the training would deadlock. A peek reads values; run collectives in a %%ddp cell once the job has ended (job.wait())"
)


class _Local(threading.local):
    bufs: Optional[Dict[str, io.StringIO]] = None  # the peek thread's own stdout and stderr while a peek runs


_LOCAL = _Local()


class _Split:
    """``sys.stdout`` or ``sys.stderr`` for every thread, except that a running peek's writes go to its own buffer."""

    def __init__(self, inner: Any, name: str) -> None:
        self._inner = inner
        self._name = name

    def write(self, text: str) -> int:
        bufs = _LOCAL.bufs
        return bufs[self._name].write(text) if bufs is not None else self._inner.write(text)

    def flush(self) -> None:
        if _LOCAL.bufs is None:
            self._inner.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _State:
    def __init__(self) -> None:
        self.send: Optional[Callable[..., None]] = None
        self.rank = 0
        self.ns: Dict[str, Any] = {}
        self.todo: "queue.Queue[dict]" = queue.Queue()
        self.thread: Optional[threading.Thread] = None


STATE = _State()


def install(send: Callable[..., None], rank: int, namespace: Dict[str, Any]) -> None:
    """Before the first cell: where answers go and whose globals a peek reads."""
    STATE.send, STATE.rank, STATE.ns = send, rank, namespace


def submit(msg: dict) -> None:
    """The reader thread got a PEEK: queue it for the peek thread (started, with the split streams, at the first)."""
    if STATE.thread is None:
        for name in ("stdout", "stderr"):
            if not isinstance(getattr(sys, name), _Split):
                setattr(sys, name, _Split(getattr(sys, name), name))
        STATE.thread = threading.Thread(target=_loop, name="ddp-peek", daemon=True)
        STATE.thread.start()
    STATE.todo.put(msg)


def _loop() -> None:
    rank_collectives.refuse(threading.get_ident(), REFUSED)
    while True:
        msg = STATE.todo.get()
        try:
            _answer(msg)
        except Exception:  # the answer could not be sent (the kernel is going away): the next peek tries again
            log.debug("rank %d: a peek's answer failed", STATE.rank, exc_info=True)


def _answer(msg: dict) -> None:
    bufs = {"stdout": io.StringIO(), "stderr": io.StringIO()}
    _LOCAL.bufs = bufs
    try:
        fields = _run(msg)
    finally:
        _LOCAL.bufs = None
    assert STATE.send is not None, "rank_peek.install runs before any peek"
    STATE.send(P.PEEK, id=msg["id"], rank=STATE.rank, stdout=bufs["stdout"].getvalue(), stderr=bufs["stderr"].getvalue(), **fields)


def _run(msg: dict) -> Dict[str, Any]:
    """The peek itself, in a shallow copy of the rank's globals: its value packed, or its error as data."""
    filename = msg["filename"]
    try:
        with rank_collectives.guard():  # below the Python wrappers too: a ProcessGroup's methods, torch.ops.c10d, DDP
            value = run_source(msg["source"], filename, dict(STATE.ns))
    except BaseException as e:  # a peek's failure is the peek's alone: sent back, the rank goes on
        log.debug("rank %d: a peek raised (reported to the kernel)", STATE.rank, exc_info=True)
        return {"error": error_data(e, format_user_traceback(e, filename))}
    finally:
        linecache.cache.pop(filename, None)  # a peek a second for hours keeps no source lines
    if value is None:
        return {"result": None}
    try:
        return {"result": transfer.pack(value, shm_dir=None)}  # inline: a peek leaves no file behind
    except BaseException as e:
        log.debug("rank %d: a peek's value could not be pickled", STATE.rank, exc_info=True)
        return {"error": error_data(e, f"the peek's value ({type(value).__name__}) could not be sent to the kernel: {type(e).__name__}: {e}\n")}
