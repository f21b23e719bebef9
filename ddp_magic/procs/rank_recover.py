"""A rank's side of recovery: release a collective wait from another thread, then re-form the process group in place.

A failed cell leaves the ranks healthy and only their process group wedged: some
wait in a collective for a peer that raised, was interrupted, or died. The
kernel then sends ABORT to every live rank; the reader thread (the main thread
sits in C++) releases the waits:

- gloo: ``ProcessGroupGloo.abort()`` does not wake a wait, and the group lives on
  while DDP or a user variable holds it. So the rank shuts down the group's
  connected TCP sockets (recorded when each group was made, by wrapping
  ``_new_process_group_helper``; listening sockets are left alone, gloo's
  listener thread would terminate the process). Both ends of each pair see
  "Connection closed" at once, so a peer that is busy elsewhere releases us too.
- nccl: ``_abort_process_group`` (ncclCommAbort), which is what torchft builds on.

After the cell the kernel sends REFORM: the main thread destroys the old groups
and forms a new default group in a fresh store (a new FileStore file, or a
PrefixStore over the old TCP store), same backend, same ranks. DDP modules in
the namespace get the new group (``_update_process_group``); objects that cannot
(FSDP2 modules, DeviceMeshes, sub-groups) are named in the reply so the kernel
can say what to re-create. See docs/recovery.md.
"""
from __future__ import annotations

import os
import socket
import stat
import sys
import threading
import time
import traceback
from typing import Any, Dict, List, Optional, Set, Tuple

from ..logs import log
from ..wire.protocol import CellStatus
from . import mesh, rank_collectives, rank_debug, rank_group, rank_torch


class _State:
    sockets: Set[Tuple[int, int]] = set()  # (fd, inode) of every group's connected sockets
    released: Optional[str] = None  # this cell: why the group was aborted under it (None: it was not)
    own = False  # this rank aborted it itself (the --pg-timeout watchdog): its cell failed, not released
    broken = False  # the group was aborted (or lost a peer) and must be re-formed before it is used
    gen = 0  # the kernel's generation of the last group re-formed here (REFORM)
    lock = threading.Lock()


STATE = _State()
PEER_ERRORS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL communicator was aborted", "aborted")


def _socket_fds() -> Set[int]:
    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if stat.S_ISSOCK(os.stat(f"/proc/self/fd/{name}").st_mode):
                out.add(int(name))
        except OSError:  # an fd that closed while we listed
            continue
    return out


def _connected(fd: int) -> bool:
    """A connected TCP socket of the group's, not one of rank 0's TCP store (a peer that joined during the group's
    creation connects to the store then: cutting that would cut the peer off the store)."""
    s = socket.socket(fileno=os.dup(fd))
    try:
        if s.family not in (socket.AF_INET, socket.AF_INET6) or s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            return False
        return str(s.getsockname()[1]) != os.environ.get("MASTER_PORT")
    finally:
        s.close()


def _track_sockets() -> None:
    """Record the connected sockets each new group opens (the default group, new_group, device meshes)."""
    import torch.distributed.distributed_c10d as c10d

    real = c10d._new_process_group_helper
    if getattr(real, "_ddp_magic", False):
        return

    def helper(*args: Any, **kwargs: Any) -> Any:
        backend = str(args[3] if len(args) > 3 else kwargs.get("backend", "")).lower()
        if "gloo" not in backend or "nccl" in backend:  # NCCL's own sockets are never ours to cut: it has abort
            return real(*args, **kwargs)
        before = _socket_fds()
        out = real(*args, **kwargs)
        for fd in _socket_fds() - before:
            try:
                if _connected(fd):
                    STATE.sockets.add((fd, os.fstat(fd).st_ino))
            except OSError:
                log.debug("socket %d of a new group vanished", fd, exc_info=True)
        return out

    helper._ddp_magic = True  # type: ignore[attr-defined]
    c10d._new_process_group_helper = helper


def install() -> None:
    """Before the pool's group forms: record its sockets, wrap the collectives, let the watchdog abort."""
    if "torch" not in sys.modules:
        return
    import torch.distributed as dist

    if not dist.is_available():
        return
    _track_sockets()
    rank_collectives.install()
    rank_debug.EXPIRED = abort_local


# ---------------------------------------------------------------- abort (reader or watchdog thread)
def _cut_sockets() -> int:
    """Shut down every recorded group socket still open (the same inode: an fd reused since is not ours)."""
    with STATE.lock:
        owned, STATE.sockets = STATE.sockets, set()
    cut = 0
    for fd, inode in sorted(owned):
        try:
            if os.fstat(fd).st_ino != inode:
                continue
            s = socket.socket(fileno=os.dup(fd))
            try:
                s.shutdown(socket.SHUT_RDWR)
                cut += 1
            finally:
                s.close()
        except OSError:  # gloo closed it already (its peer went first)
            continue
    return cut


def _abort_groups() -> None:
    """nccl (and any backend with a real abort): abort every group's communicators."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if not dist.is_initialized() or str(dist.get_backend()) == "gloo":
        return
    try:
        c10d._abort_process_group()
    except Exception:  # an abort that fails leaves the kernel's escalation to act
        log.debug("could not abort the process group", exc_info=True)


def abort_local(why: str, own: bool = True) -> None:
    """Release this rank's waits on every group (from any thread); the group must be re-formed.

    ``own``: this rank's decision (the watchdog), so its cell fails with ``why``; else the kernel's ABORT."""
    if "torch" not in sys.modules:
        return
    if STATE.released is None:
        STATE.released, STATE.own = why, own
    STATE.broken = True
    _cut_sockets()
    _abort_groups()


def on_abort(msg: dict) -> None:
    """ABORT from the kernel (reader thread)."""
    op = (rank_collectives.describe() or {}).get("op")
    abort_local(str(msg.get("why") or "the kernel aborted the process group") + (f" (this rank was in {op})" if op else ""), own=False)


# ---------------------------------------------------------------- the cell's end (main thread)
def begin_cell() -> None:
    STATE.released, STATE.own = None, False


def cell_status(status: CellStatus, error: Optional[dict]) -> Tuple[CellStatus, Optional[dict]]:
    """A cell whose collective was aborted under it ended as released ("interrupted"), not as a failure of its own.

    A collective error while a peer died (connection closed) marks the group broken too."""
    if error is not None and any(e in str(error.get("message", "")) for e in PEER_ERRORS):
        STATE.broken = True
    if STATE.released is None or status == CellStatus.OK:
        return status, error
    err = dict(error or {})
    if STATE.own:  # the watchdog's --pg-timeout: this rank's failure, in its words
        err.update(type="TimeoutError", message=STATE.released)
        return CellStatus.ERROR, err
    err["message"] = f"released: {STATE.released}"
    return CellStatus.INTERRUPTED, err


def done_fields() -> Dict[str, Any]:
    """What DONE adds for the kernel: whether this rank's group must be re-formed."""
    return {"group_broken": True} if STATE.broken else {}


# ---------------------------------------------------------------- re-form (main thread, between cells)
def _destroy_all() -> None:
    """End every group, the pool's included (the real destroy, not the deferral scripts get)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    real = getattr(c10d.destroy_process_group, "__wrapped__", c10d.destroy_process_group)
    if dist.is_initialized():
        try:
            real(None)
        except Exception:  # a group that half went: the world maps are reset below either way
            log.debug("destroy_process_group after an abort failed", exc_info=True)


def _reform_store(msg: dict) -> Optional[Any]:
    """The store of the new group: None (the env's FileStore, re-pointed) or a PrefixStore over the old TCP store."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if msg.get("store"):
        os.environ["DDP_MAGIC_STORE"] = str(msg["store"])
        return None
    old = c10d._get_default_store() if dist.is_initialized() else None
    while isinstance(old, dist.PrefixStore):  # the TCP store itself: a rank started again alone finds it the same way
        old = old.underlying_store
    return None if old is None else dist.PrefixStore(rank_torch.reform_prefix(msg["gen"]), old)


def _stale(user_ns: Dict[str, Any], old: List[Any], new: Any, fresh: Any) -> Tuple[List[str], List[List[str]]]:
    """DDP modules moved onto the new group (names), and objects still on an old one ([name, kind])."""
    swapped: List[str] = []
    stale: List[List[str]] = []
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.nn.parallel import DistributedDataParallel as DDP

    for name, value in list(user_ns.items()):
        if name.startswith("_"):
            continue
        if isinstance(value, DDP) and any(value.process_group is g for g in old):
            try:
                value._update_process_group(new)
                swapped.append(name)
            except Exception:  # an older torch or a DDP with its own group: the user re-wraps
                log.debug("could not move DDP %r onto the new group", name, exc_info=True)
                stale.append([name, "DDP"])
        elif isinstance(value, DeviceMesh) and value is not fresh:
            stale.append([name, "DeviceMesh"])
        elif type(value).__name__.startswith("FSDP") and hasattr(value, "reshard"):
            stale.append([name, "FSDP2"])
        elif isinstance(value, dist.ProcessGroup) and any(value is g for g in old):
            stale.append([name, "process group"])
    return swapped, stale


def reform(msg: dict, rank: int, device: str, user_ns: Dict[str, Any]) -> Dict[str, Any]:
    """REFORM from the kernel: a new default group in the same process; the reply's fields."""
    t0 = time.monotonic()
    try:
        import torch.distributed.distributed_c10d as c10d

        abort_local("the process group is being re-formed", own=False)  # whatever still holds the old sockets lets go
        old = list(c10d._world.pg_map)
        store = _reform_store(msg)
        _destroy_all()
        if store is None:
            rank_torch.init_process_group(rank, device)
        else:
            _init_on(store, rank, device)
        STATE.broken, STATE.released, STATE.own, STATE.gen = False, None, False, int(msg.get("gen") or 0)
        if os.environ.get(mesh.MESH_ENV):
            mesh.install(user_ns, device)  # --mesh's `mesh`, on the new group
        rank_group.keep_groups()
        swapped, stale = _stale(user_ns, old, c10d._get_default_group(), user_ns.get(mesh.NAME))
    except BaseException as e:
        log.debug("rank %d: re-forming the process group failed", rank, exc_info=True)
        return {"rank": rank, "ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    return {"rank": rank, "ok": True, "seconds": time.monotonic() - t0, "swapped": swapped, "stale": stale}


def group_gen() -> int:
    """The generation of this rank's group: the last REFORM's, else the one it was started into alone (a kernel that
    attaches a kept pool goes on from the highest its ranks say: kernel/keep/attach.py)."""
    return STATE.gen or int(os.environ.get("DDP_MAGIC_REFORM_GEN") or 0)


def _init_on(store: Any, rank: int, device: str) -> None:
    """A new default group on ``store`` (a pool whose ranks met through a TCP store)."""
    import torch.distributed as dist
    from datetime import timedelta

    kwargs: Dict[str, Any] = {"store": store, "rank": rank, "world_size": int(os.environ["WORLD_SIZE"])}
    limit = os.environ.get("DDP_MAGIC_PG_TIMEOUT")
    if limit:
        kwargs["timeout"] = timedelta(seconds=rank_debug.group_timeout(float(limit)))
    if os.environ.get("DDP_MAGIC_BACKEND") == "nccl":
        import torch

        kwargs["device_id"] = torch.device(device)
    dist.init_process_group(backend=os.environ.get("DDP_MAGIC_BACKEND", "gloo"), **kwargs)
    rank_group.adopt()

