"""Content fingerprints of a rank's states: whether a name is equal on every rank (a save writes it once, a heal copies it).

Sums of 8-byte words, not a hash of the bytes: a 1 GiB model's replicas are compared at the memory's pace, on the
tensor's own device (procs/rank_snapshot.py's sharing, procs/rank_heal.py's verdict).
"""
from __future__ import annotations

import hashlib
from typing import Any, List, Tuple

import torch

PRINT_WORDS = 1 << 15  # 8-byte words a sum covers in a tensor's fingerprint (256 KiB)


def _tensor_print(value: torch.Tensor) -> bytes:
    """A tensor's content as sums of its 8-byte words, one sum each 256 KiB, and its tail as bytes: on its own device,
    several GB/s where sha256 of the bytes is under 1 (a 1 GiB model's replicas compared in a save or a heal). Two
    replicas that differ anywhere differ in a sum unless their changes cancel within 256 KiB: not what training does."""
    raw = value.detach().contiguous().reshape(-1).view(torch.uint8)
    if raw.storage_offset() % 8:  # a view at an odd offset (a healed rank's tensors sit in its received buckets) cannot be read as words
        raw = raw.clone()
    words = raw[: raw.numel() - raw.numel() % 8].view(torch.int64)
    full = words.numel() - words.numel() % PRINT_WORDS
    sums = words[:full].view(-1, PRINT_WORDS).sum(1)  # int64 sums wrap: fine for a fingerprint
    return sums.cpu().numpy().tobytes() + raw[full * 8:].cpu().numpy().tobytes()


def digest(state: Any) -> Tuple[str, bool]:
    """The state's content fingerprint (sha256 over each tensor's shape, dtype and word sums, _tensor_print), and
    whether it holds DTensors (sharded: DCP keeps each shard)."""
    h, sharded = hashlib.sha256(), False
    leaves: List[Tuple[str, Any]] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k in sorted(value, key=str):
                walk(f"{prefix}/{k}", value[k])
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(f"{prefix}/{i}", v)
        else:
            leaves.append((prefix, value))

    walk("", state)
    for key, value in leaves:
        h.update(key.encode())
        if isinstance(value, torch.Tensor):
            if type(value).__name__ == "DTensor":
                sharded, value = True, value.to_local()  # type: ignore[attr-defined]
            h.update(repr((tuple(value.shape), value.dtype)).encode() + _tensor_print(value))
        else:
            h.update(repr(value).encode())
    return h.hexdigest(), sharded
