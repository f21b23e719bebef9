"""A background save (``%ddp save ckpt/ --bg``, ``--save-every``): the training waits only while each rank copies its share.

The rank's share is what it writes: its sharded and per-rank state, and a part of the state
that is equal on every rank (a DDP replica, its optimizer), its tensors dealt out so each rank
copies and writes about 1/world of it. The copy (CPU memory; a GPU tensor is copied off its
device) is taken in the foreground, at the cell boundary or safe point, so the state saved is
that step's; then a thread of the rank writes it with DCP over a gloo group of its own (its
collectives never meet the cell's), writes the rank's file, and all ranks agree on the outcome;
rank 0 writes meta.json and renames the folder, as a foreground save does (procs/rank_snapshot.py).
A second save, a load, or the kernel's ``written`` call waits for the writer first: one at a time.
"""
from __future__ import annotations

import copy
import os
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Set

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.api import CheckpointException

from ..logs import log
from ..wire import snapshot as S
from ..words import fmt_bytes

GROUP_TIMEOUT = timedelta(minutes=30)  # a rank that died mid-write: the others' writer gives up after this (the cell's group is not touched)


class _Writer:
    """This process's one background save, and the gloo group its collectives use (made once per default group)."""

    def __init__(self) -> None:
        self.thread: Optional[threading.Thread] = None
        self.result: Optional[Dict[str, Any]] = None
        self.group: Any = None
        self.world_group: Any = None  # the default group the writer's group was made beside (a re-formed one needs a new one)
        self.pinned = 0  # bytes the last share staged in pinned memory (GPU tensors)


WRITER = _Writer()


def wait() -> Optional[Dict[str, Any]]:
    """Wait for the background save this rank is writing, if any: its outcome (None: there was none). A writer that
    ended with no outcome failed: the folder it left is partial, and the next save must say so, not call it whole."""
    thread = WRITER.thread
    if thread is None:
        return None
    thread.join()
    WRITER.thread = None
    if WRITER.result is None:
        rank = dist.get_rank() if dist.is_initialized() else 0
        WRITER.result = {"rank": rank, "error": NO_OUTCOME, "failed": {rank: NO_OUTCOME}}
    return WRITER.result


NO_OUTCOME = "its writer thread ended with no outcome (the exception that ended it is in that rank's stderr)"
FAILURES = (Exception, CheckpointException)  # DCP's CheckpointException is a BaseException: a writer must catch it too


def why(e: BaseException) -> str:
    """An exception in one line. DCP's CheckpointException holds every rank's traceback in its text: its first
    rank's own exception is the one said."""
    if isinstance(e, CheckpointException) and e.failures:
        rank = min(e.failures)
        inner = e.failures[rank][0]
        return f"{type(inner).__name__}: {inner} (in DCP, on rank {rank})"
    return f"{type(e).__name__}: {e}"


def share(tree: Dict[str, Any], replicated: Set[str], rank: int, world: int) -> Dict[str, Any]:
    """This rank's share of the DCP tree, copied: every leaf of its sharded and per-rank names, and of the replicated
    names the tensors dealt to it (the largest-first greedy over equal trees gives every rank the same deal; small
    values go to rank 0). Keys are DCP's flattened ones, so a load of the nested tree finds them."""
    flat, _ = flatten_state_dict(tree)
    sizes = {k: v.numel() * v.element_size() for k, v in flat.items() if k.split(".", 1)[0] in replicated and isinstance(v, torch.Tensor)}
    loads, owner = [0] * world, {}
    for key in sorted(sizes, key=lambda k: (-sizes[k], k)):
        owner[key] = min(range(world), key=lambda r: (loads[r], r))
        loads[owner[key]] += sizes[key]
    mine = {k: v for k, v in flat.items() if k.split(".", 1)[0] not in replicated or owner.get(k, 0) == rank}
    staging = Staging()
    copied = {k: staging.copy(v) for k, v in mine.items()}
    staging.wait()
    WRITER.pinned = staging.pinned
    return copied


class Staging:
    """The copy of a rank's share, as it is now. A GPU tensor goes to pinned host memory, all of them asynchronously
    and waited for once (DMA at the link's full rate, where pageable memory goes through a bounce buffer; torch's
    pinned cache gives the next save the blocks this one freed)."""

    def __init__(self) -> None:
        self.pinned = 0  # bytes staged in pinned memory
        self.devices: Set[torch.device] = set()

    def copy(self, value: Any) -> Any:
        """A leaf in CPU memory (a DTensor keeps its placements: DCP writes its local shard)."""
        if not isinstance(value, torch.Tensor):
            return copy.deepcopy(value)
        if type(value).__name__ == "DTensor":
            from torch.distributed.tensor import DTensor

            local = self.host(value.to_local().detach())  # type: ignore[attr-defined]
            return DTensor.from_local(local, value.device_mesh, value.placements, run_check=False,  # type: ignore[attr-defined]
                                      shape=value.shape, stride=value.stride())
        return self.host(value.detach())

    def host(self, tensor: torch.Tensor) -> torch.Tensor:
        """A copy of ``tensor`` in host memory (a GPU one's copy may still be on its way until ``wait``)."""
        if tensor.device.type != "cuda":
            return tensor.to("cpu", copy=True)
        try:
            out = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        except RuntimeError:  # no pinned memory to be had (a locked-memory limit): pageable, synchronously
            log.debug("no pinned memory for %s bytes; copied to pageable memory", tensor.nbytes, exc_info=True)
            return tensor.to("cpu", copy=True)
        out.copy_(tensor, non_blocking=True)
        self.pinned += out.nbytes
        self.devices.add(tensor.device)
        return out

    def wait(self) -> None:
        """Every asynchronous copy done: the share is that step's before the training goes on."""
        for device in self.devices:
            torch.cuda.synchronize(device)


def _group() -> Any:
    """The writer's gloo group; every rank calls this at the same save (a collective), and makes a new one only
    when the default group is another than the one it was made beside (a pool re-formed after a heal)."""
    world_group = dist.group.WORLD
    flags: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(flags, WRITER.group is not None and WRITER.world_group is world_group)
    if not all(flags):
        WRITER.group = dist.new_group(backend="gloo", timeout=GROUP_TIMEOUT)
        WRITER.world_group = world_group
    return WRITER.group


def start(staged: Dict[str, Any], record: bytes, partial: str, rank: int, finish: Callable[[], Dict[str, Any]],
          write_record: Callable[[str, int, bytes], None], label: str) -> None:
    """Write ``staged`` and ``record`` on a thread; ``finish`` (rank 0's meta.json and rename) once every rank has written;
    rank 0 then prints that ``label`` (the snapshot as the user's folder names it) is whole."""
    group = _group()
    WRITER.result = None
    WRITER.thread = threading.Thread(target=_write, args=(staged, record, partial, rank, group, finish, write_record, label),
                                     name="ddp-snapshot-writer", daemon=True)
    WRITER.thread.start()


def _write(staged: Dict[str, Any], record: bytes, partial: str, rank: int, group: Any, finish: Callable[[], Dict[str, Any]],
           write_record: Callable[[str, int, bytes], None], label: str) -> None:
    t0, error = time.monotonic(), None
    try:
        dcp.save(staged, checkpoint_id=os.path.join(partial, S.DCP_DIR), process_group=group)
        write_record(partial, rank, record)
    except FAILURES as e:  # said by rank 0 for every rank, and by the next save or load here
        log.debug("rank %d: the background save into %s failed", rank, partial, exc_info=True)
        error = why(e)
    staged.clear()  # the copy's memory goes back before the others are waited for
    try:
        errors: List[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(errors, error, group=group)
        failed = {r: e for r, e in enumerate(errors) if e}
        if failed or rank != 0:
            WRITER.result = {"rank": rank, "error": error, "failed": failed}
        else:
            WRITER.result = dict(finish(), seconds=time.monotonic() - t0)
    except FAILURES as e:  # a rank gone mid-write: the folder stays partial, the snapshots before it whole
        log.debug("rank %d: the background save's agreement failed", rank, exc_info=True)
        failed = {rank: why(e)}
        WRITER.result = {"rank": rank, "error": failed[rank], "failed": failed}
    if rank == 0:
        print(said(WRITER.result, label), flush=True)


def failure(result: Optional[Dict[str, Any]]) -> str:
    """Why a background save failed ('' when it did not, or there was none): the next save says it too."""
    if not result or not result.get("failed"):
        return ""
    first = min(result["failed"])
    return f"failed on rank {first}: {result['failed'][first]}; it is left partial, the snapshots before it are whole"


def said(result: Dict[str, Any], label: str) -> str:
    """Rank 0's line once the background save is whole, or why it is not."""
    if result.get("failed"):
        return f"ddp_magic: the background save of {label} {failure(result)}"
    return (f"ddp_magic: {label} is whole: {fmt_bytes(result['bytes'])} written in "
            f"{result['seconds']:.2f} s in the background")
