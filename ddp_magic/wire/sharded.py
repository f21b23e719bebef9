"""A DTensor as it travels from a rank to the kernel: its local shard plus where that shard sits.

A rank never runs a collective to send one back (``full_tensor()`` would need
every rank, in step): the pickler (transfer.py) hands a DTensor to
``reduce_dtensor``, which keeps only the local tensor (sent out of band like
any tensor) and plain metadata: global shape, stride and dtype, the mesh's
shape, dim names and ranks, the placements, this rank's mesh coordinate. The
kernel unpickles that as a ``ShardPiece`` and, once every rank's piece is in,
kernel/results/sharded.py puts the global tensor together.
"""
from __future__ import annotations

import sys
from typing import Any, Dict, Optional, Tuple

Placement = Tuple[Any, ...]  # ("shard", dim) | ("replicate",) | ("partial", reduce_op) | ("other", repr)


class ShardPiece:
    """One rank's part of a DTensor, as the kernel receives it: ``local`` (a CPU tensor) and ``meta``."""

    def __init__(self, local: Any, meta: Dict[str, Any]) -> None:
        self.local, self.meta = local, meta

    @property
    def rank(self) -> int:
        return int(self.meta["rank"])

    def key(self) -> Tuple[Any, ...]:
        """What every piece of one global tensor shares."""
        m = self.meta
        return (m["shape"], m["dtype"], m["mesh_shape"], m["mesh_dims"], m["mesh_ranks"], m["placements"])

    def __repr__(self) -> str:
        m = self.meta
        return (
            f"<shard of a DTensor {tuple(m['shape'])} {m['dtype']} from rank {m['rank']}: local {tuple(self.local.shape)}, "
            f"placements {', '.join(placement_text(p) for p in m['placements'])}, mesh coordinate {tuple(m['coord'])}>"
        )


def placement_text(p: Placement) -> str:
    """How torch writes the placement: Shard(0), Replicate(), Partial(sum)."""
    kind = p[0]
    if kind == "shard":
        return f"Shard({p[1]})"
    if kind == "replicate":
        return "Replicate()"
    if kind == "partial":
        return f"Partial({p[1]})"
    return str(p[1])


def _rebuild_shard(local: Any, meta: Dict[str, Any]) -> ShardPiece:
    """Kernel side: the piece as sent (its local tensor arrived by transfer's tensor path)."""
    return ShardPiece(local, meta)


def is_dtensor(value: Any) -> bool:
    """Whether value is a DTensor, without importing torch.distributed.tensor where nobody has."""
    mod = sys.modules.get("torch.distributed.tensor")
    cls = getattr(mod, "DTensor", None) if mod is not None else None
    return cls is not None and isinstance(value, cls)


def _placement(p: Any, ndim: int) -> Placement:
    name = type(p).__name__
    if name == "Shard":
        return ("shard", int(p.dim) % max(ndim, 1))
    if name == "Replicate":
        return ("replicate",)
    if name == "Partial":
        return ("partial", str(p.reduce_op))
    return ("other", repr(p))


def dtensor_meta(dt: Any) -> Dict[str, Any]:
    """The placement metadata of one rank's DTensor: plain Python, so the kernel needs no process group to read it."""
    mesh = dt.device_mesh
    coord = mesh.get_coordinate()
    import torch.distributed as dist

    return {
        "shape": tuple(int(s) for s in dt.shape),
        "stride": tuple(int(s) for s in dt.stride()),
        "dtype": str(dt.dtype).replace("torch.", ""),
        "requires_grad": bool(dt.requires_grad),
        "mesh_shape": tuple(int(s) for s in mesh.mesh.shape),
        "mesh_dims": tuple(mesh.mesh_dim_names) if mesh.mesh_dim_names else None,
        "mesh_ranks": tuple(int(r) for r in mesh.mesh.flatten().tolist()),
        "device_type": str(mesh.device_type),
        "placements": tuple(_placement(p, dt.ndim) for p in dt.placements),
        "coord": tuple(int(c) for c in coord) if coord is not None else None,
        "rank": dist.get_rank() if dist.is_initialized() else 0,
    }


def reduce_dtensor(obj: Any) -> Optional[Tuple[Any, Tuple[Any, ...]]]:
    """Rank side, the pickler's hook: a DTensor as (its local shard, its metadata); None for anything else."""
    if not is_dtensor(obj):
        return None
    return _rebuild_shard, (obj.to_local().detach(), dtensor_meta(obj))
