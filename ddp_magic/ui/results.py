"""The value a %%ddp cell returns: one entry per rank, in rank order; and the prompt number its tracebacks name."""
from __future__ import annotations

import re
import struct
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..logs import log
from ..wire.execution import name_cells
from . import sharded as _sharded  # noqa: F401  (makes it ShardedResult's repr)


class RankResults(list):
    """A list indexed by rank (``out[0]`` is rank 0's value) that prints rank by rank."""

    metrics: Optional[Dict[str, List[Any]]] = None  # the cell's ddp_magic.log rows as columns (kernel/results/metrics.py), set by the magic

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        if cycle:
            p.text("RankResults(...)")
            return
        from IPython.lib.pretty import pretty  # lazy: a plain repr() needs no IPython

        width = max(20, p.max_width - len(_prefix(len(self) - 1)))
        p.text(self._lines(lambda value: pretty(value, max_width=width)))

    def __repr__(self) -> str:
        return self._lines(repr)

    def _lines(self, show: Callable[[Any], str]) -> str:
        """One entry per rank, each value formatted alone (the same way for every rank) and its further lines
        indented under its first: no rank's value depends on where another's ended."""
        rows = [f"RankResults({len(self)} rank{'' if len(self) == 1 else 's'}):"]
        shown: Dict[Tuple[type, object], str] = {}  # a scalar every rank returned alike (a thousand ranks' 1) is formatted once
        for rank, value in enumerate(self):
            head = _prefix(rank)
            key = _scalar_key(value)
            text = shown.get(key) if key is not None else None
            if text is None:
                text = show(value) if key is None else shown.setdefault(key, repr(value))  # a plain scalar's pretty() is its repr()
            if "\n" not in text:  # one line, as every scalar's: no split, no indented rest
                rows.append(head + text)
                continue
            first, *rest = text.split("\n")
            rows.append(head + first)
            rows += [" " * len(head) + line if line else line for line in rest]
        return "\n".join(rows)

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


def _scalar_key(value: Any) -> Optional[Tuple[type, object]]:
    """A key under which equal values print alike, as their repr (what pretty() prints for them too): plain scalars
    only, a float by its bits (0.0 and -0.0 print apart); None for anything else."""
    kind = type(value)
    if kind is float:
        return kind, struct.pack("d", value)
    return (kind, value) if kind in (int, bool, str, bytes, type(None)) else None


def _prefix(rank: int) -> str:
    return f"  [{rank}] "


def running_cell(shell: Any) -> Tuple[Optional[int], int]:
    """The running cell's prompt number (In [n], the execution_count its execute_reply carries) and the editor's
    line number of the first line of the ``%%ddp`` cell's body (2: right below the ``%%ddp`` line).

    IPython 9 counts the next cell up before it runs this one (``shell.execution_count`` is n + 1 here): the
    running cell's own ExecutionResult has n. Outside a cell (no result), the shell's count; no %%ddp line in
    the cell (run_cell_magic called from code): the body's own numbering."""
    result = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    count = getattr(result, "execution_count", None)
    if not isinstance(count, int):
        count = getattr(shell, "execution_count", None)
    raw = str(getattr(getattr(result, "info", None), "raw_cell", "") or "")
    at = next((i for i, line in enumerate(raw.splitlines()) if _MAGIC_LINE.match(line)), None)
    return (count if isinstance(count, int) else None), (at + 2 if at is not None else 1)


_MAGIC_LINE = re.compile(r"^%%ddp(\s|$)")


class CellNumbers:
    """The prompt number (IPython's execution count) each %%ddp cell ran under, by the session's cell label:
    a rank's traceback then says ``Cell In[10], line 5`` as IPython's own do, for this cell and for functions
    defined in earlier ones (the ranks' file names stay unique, ``<ddp-cell-L>``, whatever the front end numbers)."""

    def __init__(self, numbers: Optional[Dict[str, Optional[int]]] = None) -> None:
        self.numbers: Dict[str, Optional[int]] = numbers if numbers is not None else {}  # the session's (Session.numbers)

    def name(self, label: str, number: Optional[int], failures: Sequence[Any], notes: Sequence[str]) -> List[str]:
        """Rename the cells in the failures' tracebacks (in place) and in the notes (returned); ``number``: the
        prompt number the cell ran under (``running_cell``)."""
        self.numbers[label] = number
        for f in failures:
            f.traceback = name_cells(f.traceback, self.numbers)
        return [name_cells(n, self.numbers) for n in notes]


def prompt_number(shell: Any) -> Optional[int]:
    """The prompt number (``In [n]``) of the cell running now (``running_cell``'s first half)."""
    return running_cell(shell)[0]
