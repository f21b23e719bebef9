"""The value a %%ddp cell returns: one entry per rank, in rank order."""
from __future__ import annotations

from typing import Any

from ..logs import log
from . import sharded as _sharded  # noqa: F401  (makes it ShardedResult's repr)


class RankResults(list):
    """A list indexed by rank (``out[0]`` is rank 0's value) that prints rank by rank."""

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        if cycle:
            p.text("RankResults(...)")
            return
        with p.group(2, f"RankResults({len(self)} ranks):", ""):
            for rank, value in enumerate(self):
                p.break_()
                with p.group(len(f"[{rank}] "), f"[{rank}] ", ""):
                    p.pretty(value)

    def __repr__(self) -> str:
        body = "\n".join(f"  [{rank}] {value!r}" for rank, value in enumerate(self))
        return f"RankResults({len(self)} ranks):\n{body}"

    @property
    def same(self) -> bool:
        """True when every rank returned an equal value (tensors compared elementwise)."""
        first = self[0] if self else None
        for v in self[1:]:
            try:
                eq = v == first
                if hasattr(eq, "all"):
                    eq = bool(eq.all())
                if not eq:
                    return False
            except Exception:  # values that cannot be compared are not the same
                log.debug("RankResults.same: could not compare two ranks' values", exc_info=True)
                return False
        return True
