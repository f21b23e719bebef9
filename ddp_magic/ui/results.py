"""The value a %%ddp cell returns: one entry per rank, in rank order; and the prompt number its tracebacks name."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from ..logs import log
from ..wire.execution import name_cells
from . import sharded as _sharded  # noqa: F401  (makes it ShardedResult's repr)


class RankResults(list):
    """A list indexed by rank (``out[0]`` is rank 0's value) that prints rank by rank."""

    metrics: Optional[Dict[str, List[Any]]] = None  # the cell's ddp_magic.log rows as columns (kernel/metrics.py), set by the magic

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


class CellNumbers:
    """The prompt number (IPython's execution count) each %%ddp cell ran under, by the session's cell label:
    a rank's traceback then says ``Cell In[10], line 5`` as IPython's own do, for this cell and for functions
    defined in earlier ones (the ranks' file names stay unique, ``<ddp-cell-L>``, whatever the front end numbers)."""

    def __init__(self) -> None:
        self.numbers: Dict[str, Optional[int]] = {}

    def name(self, label: str, shell: Any, failures: Sequence[Any], notes: Sequence[str]) -> List[str]:
        """Rename the cells in the failures' tracebacks (in place) and in the notes (returned)."""
        self.numbers[label] = prompt_number(shell)
        for f in failures:
            f.traceback = name_cells(f.traceback, self.numbers)
        return [name_cells(n, self.numbers) for n in notes]


def prompt_number(shell: Any) -> Optional[int]:
    """The prompt number (``In [n]``) of the cell running now: its ExecutionResult's, since IPython has already
    counted the next one in ``execution_count`` while a cell runs (a shell-like without one: its execution_count)."""
    running = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    count = getattr(running, "execution_count", None)
    if not isinstance(count, int):
        count = getattr(shell, "execution_count", None)
    return count if isinstance(count, int) else None
