"""Which torch.distributed collective a rank is in: its calls, recorded as they enter, for the hang forensics.

When a cell hangs, the kernel asks every rank where it is (STACK); the reply
names the collective the main thread waits in: op, the group's sequence number,
the first tensor's shape and dtype, the group. That is what tells "rank 3 never
arrived" from "rank 3 is in broadcast #12 while the others are in all_reduce #12".

torch 2.13's Flight Recorder (``TORCH_FR_BUFFER_SIZE``, ``_dump_fr_trace``) does
record gloo collectives, but it marks them only "scheduled" (no start or end for
gloo), and it captures a Python stack per call when enabled. So each rank records
for itself: the public collective functions are wrapped once at rank start, and a
call costs one tuple stored and restored (measured in bench/bench_core.py's
training benchmark: within noise). The record is read lazily, by the reader
thread, only when the kernel asks: shapes and the sequence number are worked out then.

A thread can be refused collectives altogether (``refuse``): a ``%%ddp --peek`` runs on
the peek thread beside the training cell (procs/rank_peek.py), and a collective there
would wait for ranks that are busy in the cell: it raises ``CollectiveRefused`` instead.
Three fences, each asking only "is this thread refused?", so the training thread's calls
go through untouched: the public functions above (and the group functions, ``new_group``
and the like), the c10d ``Backend``'s own methods, and, for the routes below the Python
wrappers (a ProcessGroup's methods, ``torch.ops.c10d.*``, the functional collectives,
DDP's buffer broadcast), a TorchDispatchMode entered on the refused thread only
(``guard``): dispatch modes are thread-local, so the training thread never sees it.
``DistributedDataParallel.forward`` is refused outright on such a thread (it prepares the
reducer the training's backward uses, even when it broadcasts nothing).

Not recorded: ``async_op=True`` waits (the call returns at once; ``work.wait()`` is
not wrapped), and collectives torch calls from C++ (DDP's gradient buckets): their
place shows in the rank's stack instead.
"""
from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time
from typing import Any, Callable, ContextManager, Dict, List, Optional

from ..logs import log

NAMES = (
    "all_reduce", "broadcast", "barrier", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
    "all_to_all", "all_to_all_single", "reduce", "gather", "scatter", "send", "recv", "all_gather_object",
    "broadcast_object_list", "gather_object", "scatter_object_list", "monitored_barrier", "batch_isend_irecv",
)


GROUP_FUNCTIONS = ("new_group", "new_subgroups", "new_subgroups_by_enumeration", "split_group", "init_process_group", "destroy_process_group")
BACKEND_METHODS = (
    "allreduce", "allreduce_coalesced", "allgather", "allgather_coalesced", "_allgather_base", "alltoall", "alltoall_base", "barrier",
    "broadcast", "gather", "monitored_barrier", "recv", "recv_anysource", "reduce", "reduce_scatter", "_reduce_scatter_base", "scatter", "send",
)
OP_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd", "symm_mem"})  # torch.ops.<ns>: collectives
DDP_FORWARD = (
    "DistributedDataParallel.forward (the DDP wrapper's forward prepares the gradient reducer the training uses and may broadcast "
    "buffers; call the inner module, model.module(x), under torch.no_grad())"
)


class CollectiveRefused(RuntimeError):
    """A collective called on a thread that may not enter one (a peek's)."""


class _State:
    current: Optional[tuple] = None  # (op, args, kwargs, monotonic time entered) of the innermost call in progress
    refused: Dict[int, str] = {}  # thread ident -> why a collective there raises (a format string with {op})
    fenced = False  # the Backend methods, group functions and DDP's forward check the thread (from the first refuse on)
    mode: Any = None  # the TorchDispatchMode class of guard(), made at its first use
    raised: Optional[tuple] = None  # (the exception, describe()) of the last collective that raised: on_error says which it was


STATE = _State()


def refuse(ident: int, why: str) -> None:
    """From now on a collective called on thread ``ident`` raises CollectiveRefused(why.format(op=...))."""
    STATE.refused = {**STATE.refused, ident: why}
    if not STATE.fenced:
        STATE.fenced = True
        _fence()


def check(name: str) -> None:
    """Raise CollectiveRefused when this thread may not enter a collective (``name``: what it called)."""
    if STATE.refused:
        why = STATE.refused.get(threading.get_ident())
        if why is not None:
            raise CollectiveRefused(why.format(op=name))


def _checked(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(real)
    def call(*args: Any, **kwargs: Any) -> Any:
        check(name)
        return real(*args, **kwargs)

    call._ddp_magic = True  # type: ignore[attr-defined]
    return call


def _fence() -> None:
    """Make the routes that bypass the public functions check the thread: c10d Backend methods, group functions, DDP's forward."""
    if "torch" not in sys.modules:
        return
    import torch.distributed as dist

    if not dist.is_available():
        return
    import torch._C._distributed_c10d as C
    import torch.distributed.distributed_c10d as c10d

    for name in BACKEND_METHODS:
        real = getattr(C.Backend, name, None)
        if real is not None and not getattr(real, "_ddp_magic", False):
            setattr(C.Backend, name, _checked(f"a c10d Backend's {name}", real))
    for name in GROUP_FUNCTIONS:
        real = getattr(c10d, name, None)
        if real is not None and not getattr(real, "_ddp_magic", False):
            wrapped = _checked(f"torch.distributed.{name}", real)
            setattr(c10d, name, wrapped)
            if getattr(dist, name, None) is real:
                setattr(dist, name, wrapped)
    ddp = sys.modules.get("torch.nn.parallel.distributed")
    cls = getattr(ddp, "DistributedDataParallel", None)
    if cls is not None and not getattr(cls.forward, "_ddp_magic", False):
        cls.forward = _checked(DDP_FORWARD, cls.forward)


def guard() -> ContextManager[Any]:
    """On a refused thread, for the duration of a with block: every c10d op the dispatcher runs raises CollectiveRefused.

    That is what a ProcessGroup's methods, ``torch.ops.c10d.*``, the functional collectives and
    DDP's or FSDP's own collectives come down to. The mode is thread-local: other threads never see it. A few µs
    a peek; but the first op under a dispatch mode imports ``torch._dynamo`` (about 1 s of CPU, once per rank,
    unless DDP, FSDP or torch.compile imported it before: docs/bench/background.md)."""
    if "torch" not in sys.modules:
        return contextlib.nullcontext()
    if STATE.mode is None:
        from torch.utils._python_dispatch import TorchDispatchMode

        class RefuseCollectives(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
                if func.namespace in OP_NAMESPACES:
                    check(f"torch.ops.{func.name().replace('::', '.')} (what a ProcessGroup's methods and DDP's collectives run)")
                return func(*args, **(kwargs or {}))

        STATE.mode = RefuseCollectives
    return STATE.mode()


def _wrap(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(real)
    def call(*args: Any, **kwargs: Any) -> Any:
        check(f"torch.distributed.{name}")  # before the record: the main thread's stays true
        outer = STATE.current
        STATE.current = (name, args, kwargs, time.monotonic())
        try:
            return real(*args, **kwargs)
        except BaseException as e:  # a peer that died breaks it: the kernel says which collective (on_error)
            STATE.raised = (e, describe())
            raise
        finally:
            STATE.current = outer

    call._ddp_magic = True  # type: ignore[attr-defined]
    return call


def install() -> None:
    """Wrap the collectives in torch.distributed and its c10d module (once, before any cell)."""
    if "torch" not in sys.modules:
        return
    import torch.distributed as dist

    if not dist.is_available():
        return
    import torch.distributed.distributed_c10d as c10d

    for name in NAMES:
        real = getattr(c10d, name, None)
        if real is None or getattr(real, "_ddp_magic", False):
            continue
        wrapped = _wrap(name, real)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is real:
            setattr(dist, name, wrapped)


def _first_tensor(args: tuple, kwargs: dict) -> Any:
    import torch

    for value in list(args) + list(kwargs.values()):
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            value = value[0]
        if isinstance(value, torch.Tensor):
            return value
    return None


def _group(args: tuple, kwargs: dict) -> Any:
    import torch.distributed as dist

    group = kwargs.get("group")
    if group is None:
        group = next((a for a in args if isinstance(a, dist.ProcessGroup)), None)
    return group


def group_ranks(group: Any) -> Optional[List[int]]:
    """The global ranks of a sub-group; None for the default group (every rank)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if group is None or group is c10d._get_default_group():
        return None
    return list(dist.get_process_group_ranks(group))


def describe() -> Optional[Dict[str, Any]]:
    """The collective the main thread is in now, as plain data (None: none)."""
    current = STATE.current
    if current is None:
        return None
    op, args, kwargs, since = current
    out: Dict[str, Any] = {"op": op, "seq": None, "shape": None, "dtype": None, "group": "default", "ranks": None, "waited": time.monotonic() - since}
    try:
        import torch.distributed.distributed_c10d as c10d

        group = _group(args, kwargs)
        ranks = group_ranks(group)
        out["group"], out["ranks"] = ("default", None) if ranks is None else (f"group {ranks}", ranks)
        pg = group if group is not None else c10d._get_default_group()
        out["seq"] = int(pg._get_sequence_number_for_group())  # type: ignore[union-attr]
        tensor = _first_tensor(args, kwargs)
        if tensor is not None:
            out["shape"], out["dtype"] = list(tensor.shape), str(tensor.dtype).replace("torch.", "")
    except Exception:  # a description is best effort: the op alone still helps
        log.debug("could not describe the collective in progress", exc_info=True)
    return out


def on_error(e: BaseException) -> Dict[str, Any]:
    """A cell raised: the collective it raised in, if it did ({"collective": describe()'s}; {} otherwise), so that the
    kernel can say "rank 0 was in all_reduce #1 when rank 1 died" (kernel/failures/forensics.py)."""
    raised, STATE.raised = STATE.raised, None
    seen: List[BaseException] = []
    while e is not None and raised is not None and all(e is not s for s in seen):
        if e is raised[0]:
            return {"collective": raised[1]} if raised[1] is not None else {}
        seen.append(e)
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return {}


def default_seq() -> Optional[int]:
    """How many collectives this rank has issued on the default group (None: no group): its DONE carries it, so the kernel
    can tell a peer that waits in collective #N from one that left the cell before it (kernel/failures/probe.py)."""
    try:
        if "torch.distributed" not in sys.modules:
            return None
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        if not dist.is_available() or not dist.is_initialized():
            return None
        return int(c10d._get_default_group()._get_sequence_number_for_group())  # type: ignore[attr-defined]
    except Exception:  # best effort: without it the kernel waits the grace out, as before
        log.debug("could not read the default group's sequence number", exc_info=True)
        return None
