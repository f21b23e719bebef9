"""The cell's one value when the ranks returned pieces of the same DTensors: the value itself or inside dicts.

When every rank's value at the same position (the value, or an entry of a dict,
list or tuple, such as a ``state_dict()`` of an FSDP2 model) is a piece of one
global tensor, that position becomes one ``ShardedResult``. Around those, an
entry every rank returned alike (a buffer, a step count) is kept once; one
that differs becomes a ``PerRank`` list. When the pieces do not fit together,
nothing is combined and a note says why: the per-rank values are still there.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...logs import log
from ...words import rank_list
from ...wire.sharded import ShardPiece
from .sharded import ShardedResult, ShardMismatch

MAX_DEPTH = 8  # nesting looked into for pieces (a state dict of an optimizer is 3 deep)
MAX_ITEMS = 10_000  # a bigger list or dict is not looked into: every plain result pays for the look


class PerRank(list):
    """An entry of a combined value that the ranks returned differently: one item per rank, in rank order."""

    def __repr__(self) -> str:
        return f"PerRank({list.__repr__(self)})"


def has_pieces(value: Any, depth: int = 0) -> bool:
    """Whether a DTensor piece is anywhere in value (dicts, lists, tuples; a few levels deep)."""
    if isinstance(value, ShardPiece):
        return True
    if depth >= MAX_DEPTH:
        return False
    if isinstance(value, dict):
        return len(value) <= MAX_ITEMS and any(has_pieces(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return len(value) <= MAX_ITEMS and any(has_pieces(v, depth + 1) for v in value)
    return False


def combine(values: Sequence[Any], notes: List[str]) -> Optional[Any]:
    """One value for all ranks when they returned DTensor pieces that fit together; else None (with a note if they did not fit)."""
    if not values or not has_pieces(values[0]):  # rank 0's value says whether to look further
        return None
    try:
        return _combine(list(values), "")
    except ShardMismatch as e:
        log.debug("the ranks' DTensor pieces were not combined: %s", e)
        notes.append(f"the ranks' DTensors were not put together{e.args[1] if len(e.args) > 1 else ''}: {e.args[0]}; each rank's value is returned")
        return None


def _combine(values: List[Any], where: str) -> Any:
    first = values[0]
    if any(isinstance(v, ShardPiece) for v in values):
        if not all(isinstance(v, ShardPiece) for v in values):
            raise ShardMismatch("some ranks returned a DTensor and others did not", _at(where))
        try:
            return _sharded(values)
        except ShardMismatch as e:
            raise ShardMismatch(e.args[0], _at(where)) from None
    if isinstance(first, dict) and all(type(v) is type(first) and list(v) == list(first) for v in values):
        combined = {k: _combine([v[k] for v in values], f"{where}[{k!r}]") for k in first}
        return type(first)(combined) if type(first) is not dict else combined
    if type(first) in (list, tuple) and all(type(v) is type(first) and len(v) == len(first) for v in values):
        return type(first)(_combine([v[i] for v in values], f"{where}[{i}]") for i in range(len(first)))
    if has_pieces(first):
        raise ShardMismatch("the ranks' values differ in structure", _at(where))
    return first if _alike(values) else PerRank(values)


def _sharded(pieces: List[ShardPiece]) -> ShardedResult:
    """One ShardedResult: of one mesh, or of sub-meshes that hold the same tensor (tensor parallel on each dp replica)."""
    groups: Dict[Tuple[int, ...], List[ShardPiece]] = {}
    for p in pieces:
        groups.setdefault(tuple(p.meta["mesh_ranks"]), []).append(p)
    if len(groups) == 1:
        return ShardedResult(pieces)
    results = [ShardedResult(g) for g in groups.values()]
    first = results[0].full()
    if not all(r.shape == results[0].shape and r.dtype == results[0].dtype and torch_equal(r.full(), first) for r in results[1:]):
        meshes = " / ".join(rank_list(mesh) for mesh in groups)
        raise ShardMismatch(
            f"the ranks returned DTensors on {len(groups)} sub-meshes (ranks {meshes}) that hold different values; call .full_tensor() on the ranks"
        )
    return ShardedResult(list(groups.values())[0], copies=list(groups.values())[1:])


def torch_equal(a: Any, b: Any) -> bool:
    import torch

    return bool(torch.equal(a, b))


def _at(where: str) -> str:
    return f" at {where}" if where else ""


def _alike(values: Sequence[Any]) -> bool:
    """Whether every rank returned the same value (tensors: same shape, dtype and elements)."""
    first = values[0]
    try:
        import sys

        torch = sys.modules.get("torch")
        if torch is not None and isinstance(first, torch.Tensor):
            return all(isinstance(v, torch.Tensor) and v.shape == first.shape and v.dtype == first.dtype and torch.equal(v, first) for v in values)
        return all(bool(v == first) for v in values[1:])
    except Exception:  # values that cannot be compared are kept per rank
        log.debug("could not compare the ranks' values", exc_info=True)
        return False


def full_values(value: Any) -> Any:
    """value with every ShardedResult replaced by its global tensor (dicts, lists and tuples looked into)."""
    if isinstance(value, ShardedResult):
        return value.full()
    if isinstance(value, dict):
        out = {k: full_values(v) for k, v in value.items()}
        return type(value)(out) if type(value) is not dict else out
    if type(value) in (list, tuple):
        return type(value)(full_values(v) for v in value)
    return value


def save(value: Any, path: Any, **kwargs: Any) -> None:
    """``torch.save`` of value with every ShardedResult as its global tensor: a normal checkpoint (e.g. a full state dict)."""
    import torch

    torch.save(full_values(value), path, **kwargs)
