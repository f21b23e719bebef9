"""Which notebook values count as array data, and how ``ddp_magic.scatter`` splits one per rank.

``scatter(x, dim=0)`` (``ddp_magic.scatter``, or ``%%ddp --scatter x``) is a marker the
notebook wraps a value in: on rank r of n the name then holds ``torch.tensor_split(x, n, dim)[r]``
(``numpy.array_split`` for an array, the same split for a list or tuple): the first ``len % n``
shards are one longer, and together they cover x exactly once. notebook_data.py ships a large
one through /dev/shm, each shard on its own pages; a small one travels whole in the message,
and each rank keeps its own piece (``pick``).
"""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Optional, Sequence

THRESHOLD = 1 << 20  # a tensor or array this large goes through /dev/shm (notebook_data.py)


class Scatter:
    """``ddp_magic.scatter(x, dim=0)``: on rank r of n, the name holds ``torch.tensor_split(x, n, dim)[r]``, not x."""

    __slots__ = ("value", "dim", "__weakref__")

    def __init__(self, value: Any, dim: int = 0) -> None:
        torch = sys.modules.get("torch")
        if kind(value) is None and not isinstance(value, (list, tuple)) and not (torch is not None and isinstance(value, torch.Tensor)):
            raise TypeError(f"scatter takes a torch tensor, a numpy array, a list or a tuple (got {type(value).__name__})")
        if not isinstance(dim, int) or (isinstance(value, (list, tuple)) and dim != 0):
            raise ValueError(f"scatter: dim must be a whole number (0 for a list or tuple), got {dim!r}")
        ndim = len(value.shape) if hasattr(value, "shape") else 1
        if not -ndim <= dim < ndim:
            raise ValueError(f"scatter: dim {dim} is out of range for a value of {ndim} dimension(s)")
        self.value, self.dim = value, dim % ndim

    def __repr__(self) -> str:
        return f"scatter({type(self.value).__name__} of shape {tuple(getattr(self.value, 'shape', (len(self.value),)))}, dim={self.dim})"


def kind(obj: Any) -> Optional[str]:
    """'torch' for a plain dense CPU tensor (or Parameter), 'numpy' for a plain array of values; None otherwise."""
    torch = sys.modules.get("torch")
    if torch is not None and type(obj) in (torch.Tensor, torch.nn.Parameter):
        ok = obj.layout == torch.strided and not obj.is_quantized and obj.device.type == "cpu"
        return "torch" if ok and (obj.is_leaf or not obj.requires_grad) else None
    np = sys.modules.get("numpy")
    if np is not None and type(obj) is np.ndarray and not obj.dtype.hasobject:
        return "numpy"
    return None


def nbytes(obj: Any) -> int:
    return int(obj.numel() * obj.element_size()) if hasattr(obj, "numel") else int(obj.nbytes)


def scattered(needed: Dict[str, Any], names: Sequence[str], user_ns: Any, owned: Any) -> Dict[str, Any]:
    """The cell's values with ``--scatter`` names wrapped; a name the cell cannot take that way is a ValueError that says why."""
    out = dict(needed)
    for name in names:
        if name in owned:
            raise ValueError(f"--scatter {name}: {name} lives on the workers (a %%ddp cell assigned it); scatter a notebook variable")
        if name not in user_ns:
            raise ValueError(f"--scatter {name}: there is no notebook variable {name!r}")
        if name not in needed:
            raise ValueError(f"--scatter {name}: the cell does not use {name}")
        try:
            out[name] = needed[name] if isinstance(needed[name], Scatter) else Scatter(needed[name])
        except (TypeError, ValueError) as e:
            raise ValueError(f"--scatter {name}: {e}") from None
    return out


def split(value: Any, n: int, dim: int) -> List[Any]:
    """tensor_split semantics for tensors, arrays, lists and tuples; small pieces are copies, so each pickles alone."""
    what = kind(value)
    if what == "torch":
        import torch

        pieces = list(torch.tensor_split(value.detach(), n, dim))
        return pieces if nbytes(value) >= THRESHOLD else [p.clone() for p in pieces]
    if what == "numpy":
        import numpy as np

        return [np.ascontiguousarray(p) for p in np.array_split(value, n, axis=dim)]
    if what is None and not isinstance(value, (list, tuple)):  # a tensor on a GPU, a subclass: torch's own split
        return [p.clone() for p in value.tensor_split(n, dim)]
    q, r = divmod(len(value), n)
    bounds = [i * q + min(i, r) for i in range(n + 1)]
    return [value[bounds[i] : bounds[i + 1]] for i in range(n)]


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def pick(pieces: List[Any]) -> Any:
    """A small scattered value: every rank got every piece; this rank keeps its own."""
    return pieces[rank()]
