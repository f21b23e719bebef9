"""The ``mesh`` a pool started with ``--mesh dp=2,tp=2`` gives every rank: a DeviceMesh made before the first cell.

The kernel validated the shape (plan/spec.py) and wrote it into the env as
``DDP_MAGIC_MESH=dp=2,tp=2``; each rank builds the same DeviceMesh (on cuda
with nccl, else cpu) with those dim names, once its process group is up, and
binds it to ``mesh`` in the cells' namespace.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Tuple

MESH_ENV = "DDP_MAGIC_MESH"
NAME = "mesh"


def dims(text: str) -> List[Tuple[str, int]]:
    """'dp=2,tp=2' -> [('dp', 2), ('tp', 2)] (already validated by the kernel)."""
    out = []
    for part in text.split(","):
        name, _, size = part.partition("=")
        out.append((name.strip(), int(size)))
    return out


def install(user_ns: Dict[str, Any], device: str) -> None:
    """Bind ``mesh`` on this rank when the pool asked for one (needs the process group)."""
    text = os.environ.get(MESH_ENV, "")
    if not text:
        return
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        raise RuntimeError(f"--mesh {text} needs the pool's process group; leave out --no-init")
    shape = dims(text)
    user_ns[NAME] = init_device_mesh(device.split(":")[0], tuple(s for _, s in shape), mesh_dim_names=tuple(n for n, _ in shape))
