"""bench_scale.py's profile of a cell at the largest n: where the kernel's CPU goes, phase by phase, for the goals it misses.

Installed inside the Jupyter kernel (``install()``, from a cell), it wraps a few functions of
ddp_magic with ``time.process_time`` (every thread of the kernel) and counts the garbage
collector's time (``gc.callbacks``); ``take()`` returns what one cell cost per phase and
resets. Nested phases are counted where they run: the status view's live updates happen
inside the poll loop (listener calls), so they are in "the poll loop", not apart. What no
phase covers is the rest: IPython, the session, the magic's bookkeeping.
"""
from __future__ import annotations

import functools
import gc
import importlib
import time
from typing import Any, Dict, List, Tuple

# (module, attribute path, phase): what is wrapped, in the order the report lists the phases
PHASES: Tuple[Tuple[str, str, str], ...] = (
    ("ddp_magic.kernel.pool", "Pool._send_cell", "send the cell (RUN to every rank; the views hear RUNNING)"),
    ("ddp_magic.kernel.cell", "CellRun.drive", "the poll loop (every DONE and output marker; the view's live updates)"),
    ("ddp_magic.kernel.pool", "Pool._outcome", "the outcome (results unpacked; after a failure, the re-form)"),
    ("ddp_magic.ui.status_view", "StatusView.finish", "the status view's last render"),
    ("ddp_magic.ui.results", "RankResults._repr_pretty_", "RankResults printed"),
)
GC = "garbage collection (any phase)"
_spent: Dict[str, float] = {}
_depth: Dict[str, int] = {}
_gc_t0: List[float] = [0.0]


def _wrap(owner: Any, name: str, phase: str) -> None:
    real = getattr(owner, name)
    if getattr(real, "_scale_phase", None):
        return

    @functools.wraps(real)
    def timed(*args: Any, **kwargs: Any) -> Any:
        _depth[phase] = _depth.get(phase, 0) + 1
        c0 = time.process_time()
        try:
            return real(*args, **kwargs)
        finally:
            _depth[phase] -= 1
            if not _depth[phase]:  # a recursive call (drive, carried-out actions) counts once
                _spent[phase] = _spent.get(phase, 0.0) + time.process_time() - c0

    timed._scale_phase = phase  # type: ignore[attr-defined]
    setattr(owner, name, timed)


def _on_gc(stage: str, info: dict) -> None:
    if stage == "start":
        _gc_t0[0] = time.process_time()
    else:
        _spent[GC] = _spent.get(GC, 0.0) + time.process_time() - _gc_t0[0]


def install() -> None:
    """Wrap the phases' functions (once) and count the collector's time."""
    for module, path, phase in PHASES:
        owner: Any = importlib.import_module(module)
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        _wrap(owner, name, phase)
    if _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)


def take() -> Dict[str, float]:
    """Seconds of kernel CPU per phase since the last take (a phase that did not run: 0)."""
    out = {phase: _spent.get(phase, 0.0) for _, _, phase in PHASES}
    out[GC] = _spent.get(GC, 0.0)
    _spent.clear()
    return out
