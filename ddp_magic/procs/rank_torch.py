"""A rank's torch.distributed: devices, the process group, the result gather, GPU memory.

Of the rank's modules, this and rank_group.py (what scripts' own init and destroy
do to the pool's group) call torch.distributed (the template only imports it, the
rendezvous program only hosts a TCPStore).
torch is imported inside functions only, so a spawned rank connects to the
kernel (and shows as connecting) before it pays for importing torch.
"""
from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any, List, Optional

from ..logs import log
from ..wire import sharded, shm
from . import rank_debug, rank_group


def planned_device(local_rank: int) -> str:
    """The device the rank will use, known before torch is imported (sent in HELLO)."""
    if os.environ.get("DDP_MAGIC_BACKEND") == "nccl":
        return f"cuda:{local_rank}"
    return "cpu"


def setup(local_rank: int) -> str:
    """Threads and device as the plan set them; returns the rank's device."""
    import torch

    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit():
        torch.set_num_threads(int(threads))
    device = "cpu"
    if os.environ.get("DDP_MAGIC_BACKEND", "gloo") == "nccl":
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    rank_group.install()  # scripts' own init/destroy keep the pool's group; sub-groups get its timeout
    return device


def init_process_group(rank: int, device: str, generation: int = 0) -> None:
    """The pool's process group, from the env the plan wrote (DDP_MAGIC_INIT=0 skips it).

    ``generation`` > 0 re-forms a group that went: a fresh FileStore, none of the old keys.
    """
    import torch.distributed as dist

    if os.environ.get("DDP_MAGIC_INIT", "1") != "1":
        return
    backend = os.environ.get("DDP_MAGIC_BACKEND", "gloo")
    kwargs: dict = {}
    timeout = os.environ.get("DDP_MAGIC_PG_TIMEOUT")
    if timeout:
        from datetime import timedelta

        # Short by default in a notebook: a collective whose peer is gone fails in
        # minutes, not torch's 10 (nccl) or 30 (gloo) minutes.
        kwargs["timeout"] = timedelta(seconds=rank_debug.group_timeout(float(timeout)))  # --pg-timeout: rank_debug's watchdog
    if backend == "nccl":
        import torch

        kwargs["device_id"] = torch.device(device)
    store_path = os.environ.get("DDP_MAGIC_STORE")
    if store_path:
        # One host: a file store in /dev/shm. No port to race for and no TCPStore, whose
        # reverse DNS lookup of its peers stalled 1 start in 10 by 5 s on some hosts.
        world = int(os.environ["WORLD_SIZE"])
        if generation:
            store_path = f"{store_path}.{generation}"
        shm.create_private(store_path)  # before torch creates it 0644; the kernel or template removes it (wire/shm.py)
        kwargs.update(store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    elif os.environ.get("DDP_MAGIC_REFORM_GEN"):  # started again alone: join the survivors' group in rank 0's TCP store
        kwargs.update(store=_reform_store(os.environ["DDP_MAGIC_REFORM_GEN"], float(timeout or 300)), rank=rank,
                      world_size=int(os.environ["WORLD_SIZE"]))
    elif rank != 0:
        _wait_for_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), float(timeout or 300))
    try:
        dist.init_process_group(backend=backend, **kwargs)
    except TypeError:  # torch without device_id
        kwargs.pop("device_id", None)
        dist.init_process_group(backend=backend, **kwargs)
    rank_group.adopt()


def _reform_store(gen: str, timeout: float) -> "object":
    """The store of the group the survivors re-formed at ``gen`` (procs/rank_recover.py names its keys so)."""
    from datetime import timedelta

    import torch.distributed as dist

    tcp = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"]), is_master=False,
                        timeout=timedelta(seconds=timeout))
    return dist.PrefixStore(reform_prefix(gen), tcp)


def reform_prefix(gen: object) -> str:
    """The keys of the group re-formed at generation ``gen`` in the pool's TCP store (procs/rank_recover.py forms it)."""
    return f"ddp_magic/reform/{gen}"


def _wait_for_store(host: str, port: int, timeout: float) -> None:
    """Wait (5 ms steps) until rank 0's store listens: torch's own retry after a refused
    connection sleeps 0.25 s and more, which made a pool start or restart stall for nothing."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.005)


def process_group_report() -> dict:
    """The process group as this rank sees it (for %ddp_env)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return {"initialised": True, "backend": str(dist.get_backend()), "world_size": dist.get_world_size(), "rank": dist.get_rank()}
    except Exception as e:  # a broken torch install is reported, not raised
        log.debug("could not describe the process group", exc_info=True)
        return {"initialised": False, "error": str(e)}
    return {"initialised": False}


def collective_candidate(value: Any, gather: str) -> bool:
    """Whether a tensor result may come back through all_gather (the kernel decides after DONE)."""
    if gather == "direct" or "torch" not in sys.modules:
        return False
    import torch
    import torch.distributed as dist

    if not isinstance(value, torch.Tensor) or not (dist.is_available() and dist.is_initialized()):
        return False
    if sharded.is_dtensor(value):  # goes as its local shard, no collective (wire/sharded.py)
        return False
    return gather == "collective" or value.is_cuda


def all_gather(value: Any) -> List[Any]:
    """Every rank's copy of a tensor result, on every rank (each rank must call it)."""
    import torch.distributed as dist

    t = value.detach().contiguous()
    parts = [t.new_empty(t.shape) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t)
    return parts


def tensor_meta(t: Any) -> dict:
    return {"shape": tuple(t.shape), "dtype": str(t.dtype), "device": str(t.device)}


def gpu_memory() -> Optional[int]:
    """Bytes this rank holds on its GPU, or None when CUDA is not in use (never imports torch)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.memory_allocated())
    except Exception:  # a figure for the status view is not worth failing a cell
        log.debug("could not read the GPU memory in use", exc_info=True)
    return None
