"""The kernel's side of a pool: lifecycle (pool.py), admission, the control hub, a cell's
failure handling (cell.py, policy.py), results, the user-facing texts, and the launchers.

``Pool`` is imported lazily so that importing a light module here (``ranks``) stays light.
"""
from __future__ import annotations

from typing import Any

from .ranks import CellOutcome, Listener, RankInfo

__all__ = ["CellOutcome", "Listener", "Pool", "RankInfo"]


def __getattr__(name: str) -> Any:
    if name == "Pool":
        from .pool import Pool

        return Pool
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
