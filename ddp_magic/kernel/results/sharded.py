"""A sharded tensor put together in the kernel: every rank's piece of one DTensor, and the global tensor.

The ranks send their local shards with plain placement metadata (wire/sharded.py);
no collective runs on them. Here each piece's block of the global tensor is
worked out from the placements with torch's own chunking rule (``torch.chunk``:
ceil division, so the last coordinates may get less or nothing), mesh dim by
mesh dim, and the pieces are copied into one CPU tensor when ``full()`` is
first asked for. ``Replicate()`` dims keep one copy (coordinate 0);
``Partial(op)`` dims are reduced with the placement's own op, as
``full_tensor()`` would on the ranks. ``_StridedShard`` and other placements
are refused (the ranks' values then stay per rank, with a note).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Optional, Protocol, Sequence, Tuple

from ...words import rank_list
from ...wire.sharded import Placement, ShardPiece, placement_text

Block = Tuple[Tuple[int, ...], Tuple[int, ...]]  # (offsets, sizes) in the global tensor
REDUCE_OPS = ("sum", "avg", "max", "min", "product", "band", "bor", "bxor")


class ShardMismatch(ValueError):
    """The ranks' pieces do not make one global tensor (the message says why)."""


@dataclass(frozen=True)
class MeshInfo:
    """The DeviceMesh a sharded result lived on, as data: its shape, dim names, ranks (row-major) and device type."""

    shape: Tuple[int, ...]
    dim_names: Optional[Tuple[str, ...]]
    ranks: Tuple[int, ...]
    device_type: str = "cpu"

    @property
    def names(self) -> Tuple[str, ...]:
        return self.dim_names or tuple(f"dim{i}" for i in range(len(self.shape)))

    def text(self) -> str:
        """'dp=2 × tp=2 (cpu)', or '[2] (cpu)' for a mesh without dim names (FSDP2's own)."""
        if self.dim_names:
            return " × ".join(f"{n}={s}" for n, s in zip(self.dim_names, self.shape)) + f" ({self.device_type})"
        return "[" + " × ".join(map(str, self.shape)) + f"] ({self.device_type})"

    def __repr__(self) -> str:
        return f"MeshInfo({self.text()}, ranks {list(self.ranks)})"


def shard_block(shape: Sequence[int], mesh_shape: Sequence[int], placements: Sequence[Placement], coord: Sequence[int]) -> Block:
    """The block of the global tensor that the rank at ``coord`` holds (torch's chunking, mesh dim by mesh dim)."""
    sizes, offsets = list(shape), [0] * len(shape)
    for mesh_dim, p in enumerate(placements):
        if p[0] != "shard":
            continue
        d, chunks, size = p[1], mesh_shape[mesh_dim], sizes[p[1]]
        full_chunk = -(-size // chunks)
        start = min(coord[mesh_dim] * full_chunk, size)
        end = min(start + full_chunk, size)
        sizes[d] = end - start
        offsets[d] += start
    return tuple(offsets), tuple(sizes)


class Renderer(Protocol):
    """How a sharded result shows in a notebook; ui/sharded.py provides it (the kernel knows no views)."""

    def text(self, result: "ShardedResult") -> str: ...

    def html(self, result: "ShardedResult") -> str: ...


class ShardedResult:
    """One global tensor that the ranks returned as DTensor shards: ``.full()``, ``.shape``, ``.dtype``,
    ``.placements``, ``.mesh``, ``.local(rank)``; it shows the sharding, not the numbers."""

    renderer: ClassVar[Optional[Renderer]] = None

    def __init__(self, pieces: Sequence[ShardPiece], copies: Sequence[Sequence[ShardPiece]] = ()) -> None:
        """``pieces``: one DTensor's, one per rank of its mesh; ``copies``: the same tensor's pieces on other
        sub-meshes of the pool (a TP model on each dp replica), checked equal by the caller."""
        self._pieces: Dict[int, ShardPiece] = {p.rank: p for p in pieces}
        self._copies: Dict[int, ShardPiece] = {p.rank: p for group in copies for p in group}
        self.copies: List[Tuple[int, ...]] = [tuple(p.rank for p in group) for group in copies]
        self._meta = pieces[0].meta
        self._full: Any = None
        _validate(pieces)

    # ------------------------------------------------------------ what it is
    @property
    def shape(self) -> Any:
        import torch

        return torch.Size(self._meta["shape"])

    @property
    def dtype(self) -> Any:
        import torch

        return getattr(torch, self._meta["dtype"])

    @property
    def ndim(self) -> int:
        return len(self._meta["shape"])

    @property
    def mesh(self) -> MeshInfo:
        m = self._meta
        return MeshInfo(tuple(m["mesh_shape"]), m["mesh_dims"], tuple(m["mesh_ranks"]), m["device_type"])

    @property
    def placement_specs(self) -> Tuple[Placement, ...]:
        """The placements as plain tuples (("shard", 0), ("replicate",), ("partial", "sum"))."""
        return tuple(self._meta["placements"])

    @property
    def placements(self) -> Tuple[Any, ...]:
        """The placements as torch's own objects (Shard(0), Replicate(), Partial()), as DTensor.placements gives them."""
        from torch.distributed.tensor import Partial, Replicate, Shard

        made = {"shard": lambda p: Shard(p[1]), "replicate": lambda p: Replicate(), "partial": lambda p: Partial(p[1])}
        return tuple(made[p[0]](p) for p in self.placement_specs)

    @property
    def ranks(self) -> List[int]:
        return sorted(self._pieces)

    def local(self, rank: int) -> Any:
        """Rank ``rank``'s local shard, as it sent it."""
        piece = self._pieces.get(rank) or self._copies.get(rank)
        if piece is None:
            raise KeyError(f"rank {rank} holds no piece of this tensor; its ranks are {self.ranks}")
        return piece.local

    def coordinate(self, rank: int) -> Tuple[int, ...]:
        return tuple(self._pieces[rank].meta["coord"])

    def block(self, rank: int) -> Block:
        """(offsets, sizes): where rank ``rank``'s shard sits in the global tensor."""
        m = self._meta
        return shard_block(m["shape"], m["mesh_shape"], m["placements"], self.coordinate(rank))

    # ------------------------------------------------------------ the whole
    def full(self) -> Any:
        """The global tensor on the CPU (assembled once, then kept)."""
        if self._full is None:
            self._full = _assemble(self)
        return self._full

    def __repr__(self) -> str:
        if self.renderer is not None:
            return self.renderer.text(self)
        return f"ShardedResult(shape={tuple(self.shape)}, dtype={self._meta['dtype']}, placements={self._placements_text()}, mesh={self.mesh.text()})"

    def _repr_html_(self) -> Optional[str]:
        return self.renderer.html(self) if self.renderer is not None else None

    def _placements_text(self) -> str:
        return "(" + ", ".join(placement_text(p) for p in self.placement_specs) + ")"

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickled exactly as its global tensor: ``torch.save`` writes a normal checkpoint (loadable with
        ``weights_only=True``, without ddp_magic), and a name shipped to the ranks arrives as a plain tensor."""
        return self.full().__reduce_ex__(protocol)


def _validate(pieces: Sequence[ShardPiece]) -> None:
    """Raise ShardMismatch unless the pieces are every coordinate of one mesh, of one global tensor, once."""
    first = pieces[0]
    m = first.meta
    for p in pieces[1:]:
        if p.meta["mesh_ranks"] != m["mesh_ranks"]:
            raise ShardMismatch(
                f"the ranks returned DTensors on different sub-meshes (ranks {_ranks(m)} and {_ranks(p.meta)}): "
                "call .full_tensor() on the ranks, or return a DTensor of the whole mesh"
            )
        if p.key() != first.key():
            raise ShardMismatch(f"rank {p.rank}'s DTensor differs from rank {first.rank}'s ({_difference(first.meta, p.meta)})")
    other = [placement_text(p) for p in m["placements"] if p[0] not in ("shard", "replicate", "partial")]
    if other:
        raise ShardMismatch(f"placement {other[0]} is not assembled in the kernel; call .full_tensor() on the ranks instead")
    bad_ops = [p[1] for p in m["placements"] if p[0] == "partial" and p[1] not in REDUCE_OPS]
    if len(set(p[1] for p in m["placements"] if p[0] == "partial")) > 1:
        raise ShardMismatch("Partial placements with different reduce ops are not reduced in the kernel; redistribute on the ranks first")
    if bad_ops:
        raise ShardMismatch(f"Partial({bad_ops[0]}) cannot be reduced in the kernel; redistribute to Replicate() on the ranks first")
    coords = sorted(tuple(p.meta["coord"]) for p in pieces if p.meta["coord"] is not None)
    size = 1
    for s in m["mesh_shape"]:
        size *= s
    if len(coords) != size or len(set(coords)) != size or len(pieces) != size:
        raise ShardMismatch(f"{len(pieces)} rank(s) returned pieces of a mesh of {size}: a sub-mesh or a missing rank; return it from every rank of its mesh")
    for p in pieces:
        _, sizes = shard_block(m["shape"], m["mesh_shape"], m["placements"], p.meta["coord"])
        if tuple(p.local.shape) != sizes:
            raise ShardMismatch(f"rank {p.rank}'s local shard is {tuple(p.local.shape)} where its placements say {sizes}")


def _ranks(meta: Dict[str, Any]) -> str:
    return rank_list(meta["mesh_ranks"])


def _difference(a: Dict[str, Any], b: Dict[str, Any]) -> str:
    for key, label in (("shape", "global shape"), ("dtype", "dtype"), ("placements", "placements"), ("mesh_shape", "mesh")):
        if a[key] != b[key]:
            return f"{label} {a[key]} vs {b[key]}"
    return "mesh dim names"


def _assemble(result: ShardedResult) -> Any:
    """The global tensor: each piece copied to its block; Replicate dims from coordinate 0; Partial dims reduced."""
    import torch

    meta = result._meta
    placements = meta["placements"]
    replicate = [i for i, p in enumerate(placements) if p[0] == "replicate"]
    partial = [i for i, p in enumerate(placements) if p[0] == "partial"]
    out = torch.empty(meta["shape"], dtype=result.dtype)
    # Pieces whose Partial coordinates are all 0 are written first; the others are then reduced into them.
    order = sorted(result.ranks, key=lambda r: tuple(result.coordinate(r)[i] for i in partial))
    for rank in order:
        coord = result.coordinate(rank)
        if any(coord[i] for i in replicate):
            continue
        offsets, sizes = result.block(rank)
        if 0 in sizes:  # uneven sharding: this rank holds nothing
            continue
        region = out[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))]
        local = result.local(rank)
        if any(coord[i] for i in partial):
            _reduce_into(region, local, placements, partial, coord)
        else:
            region.copy_(local)
    for i in partial:
        if placements[i][1] == "avg":
            out /= meta["mesh_shape"][i]
    return out


def _reduce_into(region: Any, local: Any, placements: Sequence[Placement], partial: List[int], coord: Sequence[int]) -> None:
    import torch

    op = next(placements[i][1] for i in partial if coord[i])
    if op in ("sum", "avg"):
        region.add_(local)
    elif op == "product":
        region.mul_(local)
    else:
        fn = {"max": torch.maximum, "min": torch.minimum, "band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[op]
        region.copy_(fn(region, local))
