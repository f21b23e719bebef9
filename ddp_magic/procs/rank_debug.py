"""A rank's debugger: ``breakpoint()``, ``pdb.set_trace()``, ``dist.breakpoint(rank=…)`` and post-mortem, driven from the notebook.

pdb reads its commands through the rank's stdin (rank_stdin.py), so each
``(Pdb)`` prompt is an input box in the notebook, named by rank, and its
output is the rank's own. The cell's source is in linecache under
``<ddp-cell-N>`` (wire/execution.py), so ``list`` shows the cell with its own
line numbers. ``quit`` raises KeyboardInterrupt in the cell: it ends as an
interrupt would. While a rank is in pdb the kernel tells every rank (HOLD), and
the collective watchdog below stops counting: see docs/debugging.md.

A failing cell's traceback is kept (``keep``) for ``%ddp_debug`` until the next
cell or until the post-mortem ends, then released, so its frames (and the GPU
memory they hold) go.
"""
from __future__ import annotations

import bdb
import os
import pdb
import sys
import threading
import time
from types import FrameType, TracebackType
from typing import Any, Callable, Dict, Optional, Tuple

from ..logs import log
from ..wire import protocol as P
from . import rank_stdin

HOLD_S = float(os.environ.get("DDP_MAGIC_PG_HOLD", str(24 * 3600)))  # the default group's own timeout (see group_timeout)
STEP_S = 0.25  # the watchdog's sampling period


class _State:
    rank = 0
    send: Any = None  # Channel.send
    kept: Optional[TracebackType] = None  # the last failure's traceback, from the cell's first frame
    kept_what = ""  # "ValueError: ..." for the post-mortem's header
    skips: Dict[Tuple[str, int], int] = {}


STATE = _State()


def _tell(on: bool) -> None:
    """The kernel shows this rank as in the debugger (and holds the others' hang clocks) while ``on``."""
    if STATE.send is not None:
        try:
            STATE.send(P.DEBUG, rank=STATE.rank, on=on)
        except OSError:
            log.debug("could not tell the kernel about the debugger", exc_info=True)


class RankPdb(pdb.Pdb):
    """pdb on a rank: prompts go to the notebook; ``quit`` interrupts the cell instead of raising BdbQuit into it."""

    def __init__(self) -> None:
        super().__init__(nosigint=True)  # the worker's SIGINT handler (the kernel's interrupt) stays ours
        self.prompt = "(Pdb) "

    def interaction(self, frame: Optional[FrameType], tb: Any) -> None:
        _tell(True)
        try:
            super().interaction(frame, tb)
        finally:
            _tell(False)

    def do_EOF(self, arg: str) -> Any:
        """No stdin in this front end (nbval, allow_stdin=False): the cell goes on rather than stopping."""
        if rank_stdin.ASKER is not None and rank_stdin.ASKER.no_stdin:
            self.message("ddp_magic: no stdin in this front end, so pdb cannot ask; continuing")
            return self.do_continue(arg)
        return super().do_EOF(arg)

    def trace_dispatch(self, frame: FrameType, event: str, arg: Any) -> Any:
        try:
            return super().trace_dispatch(frame, event, arg)
        except bdb.BdbQuit:
            raise KeyboardInterrupt("quit in the debugger") from None


def set_trace(*, header: Optional[str] = None) -> None:
    """``pdb.set_trace()`` on a rank: stop in the caller."""
    debugger = RankPdb()
    if header is not None:
        debugger.message(header)
    debugger.set_trace(sys._getframe(1))


def _hook(*args: Any, **kwargs: Any) -> None:
    """``breakpoint()`` on a rank (sys.breakpointhook)."""
    RankPdb().set_trace(sys._getframe(1))


def breakpoint(rank: int = 0, skip: int = 0, timeout_s: Any = None) -> None:
    """Stop only ``rank`` in the debugger (``dist.breakpoint`` too); the other ranks go on, and wait
    for it at their next collective with it, without timing out while it is debugged.

    ``skip``: let the first ``skip`` calls from this line pass (as torch's). ``timeout_s`` is accepted
    for torch's signature; the pool's hold replaces it."""
    caller = sys._getframe(1)
    if skip > 0:
        where = (caller.f_code.co_filename, caller.f_lineno)
        STATE.skips[where] = STATE.skips.get(where, 0) + 1
        if STATE.skips[where] <= skip:
            return
    if STATE.rank == rank:
        RankPdb().set_trace(caller)


# ---------------------------------------------------------------- post-mortem
def keep(exc: BaseException, cell_filename: str) -> None:
    """The cell raised: keep its traceback, from the cell's first frame, for ``%ddp_debug``."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != cell_filename:
        tb = tb.tb_next
    STATE.kept = tb or exc.__traceback__
    STATE.kept_what = f"{type(exc).__name__}: {exc}"


def release() -> None:
    STATE.kept, STATE.kept_what = None, ""


def begin_cell(source: str) -> None:
    """A new cell releases the kept frames, unless it is the post-mortem itself."""
    if not source.startswith(P.POST_MORTEM_SOURCE.split("{", 1)[0]):
        release()


def post_mortem(rank: int) -> None:
    """pdb on the kept traceback, on ``rank`` only; the frames go when it ends."""
    if STATE.rank != rank:
        return None
    tb = STATE.kept
    if tb is None:
        print(f"ddp_magic: rank {rank} has no failure to debug (its last cell did not raise, or a later cell ran)", file=sys.stderr)
        return None
    try:
        debugger = RankPdb()
        debugger.message(f"post-mortem of rank {rank}: {STATE.kept_what}")
        debugger.reset()
        debugger.interaction(None, tb)
    finally:
        release()
    return None


# ---------------------------------------------------------------- the collective watchdog
def group_timeout(pg_timeout: float) -> float:
    """The pool's default group waits this long itself; --pg-timeout is the watchdog's, which pauses while a rank debugs."""
    return max(pg_timeout, HOLD_S)


class Watchdog:
    """--pg-timeout for the pool's default group, counted only while no rank debugs or waits for input.

    The group's own timeout is long (``group_timeout``): a peer already waiting in a
    collective when another rank stops in pdb keeps waiting. This thread samples the
    main thread: the same collective call (same frame, same group sequence number) for
    longer than --pg-timeout, not counting held time, aborts the rank's process group
    (``EXPIRED``, set by rank_recover.py: a gloo or NCCL wait cannot be interrupted, but an
    aborted group releases it); the cell fails with the message and the kernel re-forms
    the group in the same processes. Without that hook the rank exits, as it used to.
    """

    def __init__(self, main_ident: int, limit: float) -> None:
        self.main_ident = main_ident
        self.limit = limit
        self.held = False

    def start(self) -> None:
        threading.Thread(target=self._run, name="ddp-watchdog", daemon=True).start()

    def _run(self) -> None:
        key: Optional[tuple] = None
        waited = 0.0
        while True:
            time.sleep(STEP_S)
            now = _collective(sys._current_frames().get(self.main_ident))
            if now is None or now != key:
                key, waited = now, 0.0
                continue
            if not self.held:
                waited += STEP_S
            if waited >= self.limit:
                self._expire(str(now[2]))
                waited = float("-inf")  # once per wait

    def _expire(self, name: str) -> None:
        why = f"rank {STATE.rank} waited {self.limit:g}s (--pg-timeout) in torch.distributed.{name} for a peer that never joined it"
        if EXPIRED is not None:
            print(f"\nddp_magic: {why}; aborting its process group (re-formed after the cell)", file=sys.stderr, flush=True)
            EXPIRED(why)
            return
        print(f"\nddp_magic: {why}; ending this rank (the pool restarts on the next cell)", file=sys.stderr, flush=True)
        os._exit(1)


def _collective(frame: Optional[FrameType]) -> Optional[tuple]:
    """(frame id, group sequence number, name) of the collective the main thread waits in, or None."""
    while frame is not None:
        code = frame.f_code
        if code.co_filename.endswith("distributed_c10d.py") and not code.co_name.lstrip("_").startswith(("init", "new", "destroy", "store")):
            try:
                import torch.distributed.distributed_c10d as c10d

                default = c10d._get_default_group()
                group = frame.f_locals.get("group")
                if group is not None and group is not default:
                    return None  # a sub-group keeps --pg-timeout as its own timeout (rank_group.py)
                seq = default._get_sequence_number_for_group()  # type: ignore[attr-defined]  # one more per collective: a new call, not the same wait
            except Exception:  # no group, or a torch without sequence numbers: count by frame only
                log.debug("no sequence number for the watchdog", exc_info=True)
                seq = None
            return (id(frame), seq, code.co_name)
        frame = frame.f_back
    return None


WATCHDOG: Optional[Watchdog] = None
EXPIRED: Optional[Callable[[str], None]] = None  # abort this rank's group (rank_recover.abort_local), given why


# ---------------------------------------------------------------- wiring
OPS = (P.INPUT, P.HOLD)  # kernel -> rank messages handled here (on the reader thread)


def on_message(msg: dict) -> None:
    if msg["op"] == P.INPUT and rank_stdin.ASKER is not None:
        rank_stdin.ASKER.on_reply(msg)
    elif msg["op"] == P.HOLD and WATCHDOG is not None:
        WATCHDOG.held = bool(msg.get("on"))


def install(send: Any, rank: int, main_ident: int) -> None:
    """The rank's stdin, debugger hooks and (with the pool's group up) the collective watchdog."""
    global WATCHDOG
    STATE.send, STATE.rank = send, rank
    rank_stdin.install(send, rank)
    sys.breakpointhook = _hook
    pdb.set_trace = set_trace
    if "torch" not in sys.modules:
        return
    import torch.distributed as dist

    dist.breakpoint = breakpoint  # torch's own reads /dev/stdin, which a rank does not have
    limit = os.environ.get("DDP_MAGIC_PG_TIMEOUT")
    if limit and dist.is_available() and dist.is_initialized():
        WATCHDOG = Watchdog(main_ident, float(limit))
        WATCHDOG.start()
