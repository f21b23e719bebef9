"""How a heal's payload travels from the donor to the new ranks (procs/rank_heal.py decides what goes).

Its small part (imports, skeletons, pickled values) goes by one broadcast on every rank. Its states' tensors go one of
two ways, on a group of the donor and the new ranks only (the survivors neither receive nor unpickle the model):

- **through a file in /dev/shm** where every new rank sees the donor's (one host, CPU tensors): the donor writes each
  tensor once into a private file of its pool (wire/shm.py names it, so a rank killed mid-heal leaves nothing the pool's
  end does not remove), and removes it once the new ranks have it. The only new rank maps its pages as its own (one
  copy in all, as a result's way to the kernel); several copy it out of private mappings (docs/bench/snapshots.md:
  gloo's TCP on loopback cost 3× that);
- **by broadcasts** in buckets of BUCKET bytes otherwise: across hosts, and NCCL's between devices.

Broadcasts, not send/recv: point-to-point ops advance only their own ranks' sequence numbers, and the collectives'
record (hang forensics) would then read every later wait as a mismatched collective.
"""
from __future__ import annotations

import math
import mmap
import os
import secrets
from enum import Enum
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from ..logs import log
from ..wire import shm
from . import rank_snapshot_objects as O

class Via(str, Enum):
    """The way a heal's tensors went, as its notice says it."""

    FILE = "through /dev/shm"
    BROADCASTS = "by broadcasts"


BUCKET = 64 << 20  # bytes of tensors a broadcast carries: the donor's extra memory while it sends
ALIGN = 64  # each tensor's offset in the file: any dtype's alignment


class Slot:
    """A state tensor's place in the payload as broadcast: sent as a tensor, not pickled."""

    def __init__(self, index: int, tensor: torch.Tensor) -> None:
        self.index, self.shape, self.dtype = index, tuple(tensor.shape), tensor.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def slots_of(tree: Any, found: List[torch.Tensor]) -> Any:
    """``tree`` with each tensor replaced by a Slot, the tensors appended to ``found`` in order."""
    if isinstance(tree, torch.Tensor):
        found.append(tree)
        return Slot(len(found) - 1, tree)
    if isinstance(tree, dict):
        return {k: slots_of(v, found) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(slots_of(v, found) for v in tree)
    return tree


def fill(tree: Any, tensors: List[torch.Tensor]) -> Any:
    if isinstance(tree, Slot):
        return tensors[tree.index]
    if isinstance(tree, dict):
        return {k: fill(v, tensors) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(fill(v, tensors) for v in tree)
    return tree


def buckets(slots: List[Slot]) -> List[List[int]]:
    """The tensors' indices grouped by dtype into buckets of about BUCKET bytes: one broadcast each."""
    out: List[List[int]] = []
    filling: Dict[torch.dtype, List[int]] = {}
    size: Dict[torch.dtype, int] = {}
    for slot in slots:
        if filling.get(slot.dtype) and size[slot.dtype] + slot.nbytes > BUCKET:
            out.append(filling.pop(slot.dtype))
            size[slot.dtype] = 0
        filling.setdefault(slot.dtype, []).append(slot.index)
        size[slot.dtype] = size.get(slot.dtype, 0) + slot.nbytes
    return out + list(filling.values())


def _offsets(slots: List[Slot]) -> List[int]:
    out, at = [], 0
    for slot in slots:
        out.append(at)
        at += -(-slot.nbytes // ALIGN) * ALIGN
    return out + [at]


def write_file(tensors: List[torch.Tensor], slots: List[Slot], rank: int) -> Optional[str]:
    """The tensors in one new private file of the pool, named as ``rank``'s (None: no /dev/shm here, or no room: the
    broadcasts then)."""
    pool = os.environ.get(shm.ENV)
    if not pool or not os.path.isdir(shm.SHM_DIR):
        return None
    offsets = _offsets(slots)
    path = os.path.join(shm.SHM_DIR, shm.rank_prefix(pool, rank) + "heal-" + secrets.token_hex(8))
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError:
        log.debug("heal: no file in %s; broadcasting", shm.SHM_DIR, exc_info=True)
        return None
    try:
        os.ftruncate(fd, offsets[-1])  # the size first (no pages yet): a reader maps all of it
        for slot, at, tensor in zip(slots, offsets, tensors):
            data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().data if slot.nbytes else memoryview(b"")
            done = 0
            while done < slot.nbytes:  # written, not mapped: /dev/shm full is an error here, never a SIGBUS
                done += os.pwrite(fd, data[done:], at + done)
        return path
    except (OSError, ValueError, RuntimeError):  # /dev/shm full: the broadcasts carry it
        log.info("heal: could not write the state to %s; broadcasting it", path, exc_info=True)
        shm.remove(path)
        return None
    finally:
        os.close(fd)


def read_file(path: str, slots: List[Slot], alone: bool = False) -> List[torch.Tensor]:
    """The tensors of the donor's file. ``alone`` (the only new rank): its pages themselves, mapped shared, the file
    then removed by the donor (the rank's memory from now on, no copy). Otherwise each tensor copied out of a private
    mapping: several new ranks must not share what each of them steps in place."""
    offsets = _offsets(slots)
    fd = os.open(path, os.O_RDWR if alone else os.O_RDONLY)
    try:
        flags = mmap.MAP_SHARED if alone else mmap.MAP_PRIVATE
        mm = mmap.mmap(fd, max(offsets[-1], 1), flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    out = []
    for slot, at in zip(slots, offsets):
        numel = math.prod(slot.shape)
        view = torch.frombuffer(mm, dtype=slot.dtype, count=numel, offset=at) if numel else torch.empty(0, dtype=slot.dtype)
        out.append(view.view(slot.shape) if alone else view.clone().view(slot.shape))
        del view
    if not alone:
        mm.close()
    return out


def _device() -> torch.device:
    """Where this group's collectives take their tensors: NCCL's on this rank's device, gloo's on the CPU."""
    return O.rank_device("cuda" if "nccl" in str(dist.get_backend()) else "cpu")


def _by_file(tensors: List[torch.Tensor], slots: List[Slot], donor: int, group: Any) -> Tuple[bool, Optional[List[Any]]]:
    """The tensors through /dev/shm, where every new rank sees the donor's file: (sent, this rank's copies); (False,
    None), nothing sent, where one does not."""
    rank = dist.get_rank()
    box: List[Any] = [write_file(tensors, slots, rank) if rank == donor else None]
    dist.broadcast_object_list(box, src=donor, group=group, device=_device())
    path = box[0]
    try:
        seen = torch.tensor([1 if path and os.path.exists(path) else 0], device=_device())
        dist.all_reduce(seen, op=dist.ReduceOp.MIN, group=group)  # on another host a new rank sees no such file
        if not seen.item():
            return False, None
        got = None if rank == donor else read_file(path, slots, alone=dist.get_world_size(group) == 2)
        dist.barrier(group=group)  # every new rank has its copy: the file may go
        return True, got
    finally:
        if rank == donor and path:
            shm.remove(path)


def _by_broadcast(tensors: List[torch.Tensor], slots: List[Slot], donor: int, group: Any) -> List[Any]:
    rank, device = dist.get_rank(), _device()
    received: List[Any] = [None] * len(slots)
    for bucket in buckets(slots):
        if rank == donor:
            flat = torch.cat([tensors[i].detach().reshape(-1) for i in bucket]).to(device)
        else:
            flat = torch.empty(sum(math.prod(slots[i].shape) for i in bucket), dtype=slots[bucket[0]].dtype, device=device)
        dist.broadcast(flat, src=donor, group=group)
        offset, flat = 0, flat.cpu()  # the new rank's take() puts each tensor on its own device
        for i in bucket:
            numel = math.prod(slots[i].shape)
            received[i] = flat[offset:offset + numel].view(slots[i].shape)
            offset += numel
    return received


def send(got: Any, donor: int, fresh: List[int]) -> Any:
    """The donor's payload on each new rank (``got``: the donor's, None elsewhere); None on every other rank."""
    rank = dist.get_rank()
    tensors: List[torch.Tensor] = []
    box: List[Any] = [None]
    if rank == donor:
        box = [dict(got, states=slots_of(got["states"], tensors))]
        box[0]["slots"] = [Slot(i, t) for i, t in enumerate(tensors)]
        box[0]["on_cpu"] = all(t.device.type == "cpu" for t in tensors)
    dist.broadcast_object_list(box, src=donor)
    if not box[0]["slots"]:  # no module or optimizer copied: every rank knows it from the small part
        return None if rank == donor else box[0]
    group = dist.new_group([donor, *fresh])  # every rank takes part in making a group
    try:
        if rank != donor and rank not in fresh:
            return None
        slots: List[Slot] = box[0]["slots"]
        sent, received = _by_file(tensors, slots, donor, group) if box[0]["on_cpu"] else (False, None)
        if not sent:
            received = _by_broadcast(tensors, slots, donor, group)
        if rank == donor:
            return None
        assert received is not None
        moved = {"bytes": sum(slot.nbytes for slot in slots), "via": Via.FILE.value if sent else Via.BROADCASTS.value}
        return dict(box[0], states=fill(box[0]["states"], received), moved=moved)
    finally:
        dist.destroy_process_group(group)
