"""How one cell runs on the pool, and what it did: what ``Session.run`` takes and returns (session.py re-exports both).

Every front end builds a ``CellOptions`` (the magics, the JupyterLab comm, ``%ddp save``'s own cells)
and reads a ``CellResult``; they live here so the session stays its own room.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from . import CellOutcome
from .jobs.turns import Ticket
from .results.metrics import CellMetrics
from .results.profile_merge import ProfileReport
from ..plan.spec import PoolSpec


@dataclass(frozen=True)
class CellOptions:
    """How one cell runs; ``spec`` None means "on the pool as it is"."""

    spec: Optional[PoolSpec] = None
    restart: bool = False  # restart the pool first (state on the workers is lost)
    timeout: Optional[float] = None
    gather: str = "auto"
    argv: Optional[List[str]] = None  # sys.argv on the ranks; None: ["ddp_cell"], --local_rank=N where a parser declares it
    stdin: Optional[Callable[[str, bool], str]] = None  # answers the ranks' input() and pdb (kernel/jobs/stdin.py); None: EOF
    scatter: Tuple[str, ...] = ()  # --scatter x,y: these notebook names reach each rank as its shard (wire/notebook_data.py)
    profile: Optional[str] = None  # --profile: the merged trace's path ("": the default); None: no profiler (kernel/results/profile_merge.py)
    number: Optional[int] = None  # the prompt number the cell runs under (In [n]): tracebacks, metrics and the panel name it so
    first_line: int = 1  # the editor's line number of the source's first line (2 below a %%ddp line): every line named is the editor's
    ticket: Optional[Ticket] = None  # the cell's place in the pool's line ("cell [12]", background or not); None: a new one
    queue: bool = True  # wait for the turn when another cell holds it (--no-queue: False, a UsageError instead)
    cancel: Optional[threading.Event] = None  # set: interrupt the cell as Ctrl-C would (a job's cancel(); out of the queue if it waits)
    kernel_autoreload: bool = False  # the kernel's %autoreload 2 is on: the ranks follow it unless %ddp autoreload off (kernel/reload.py)
    internal: bool = False  # ddp_magic's own cell (%ddp save, load): no record for %ddp_export, which writes the user's cells
    heal: bool = True  # a rank started again before this cell gets the others' names first (--no-heal: it starts empty)


@dataclass(frozen=True)
class CellResult:
    """What a cell did: the pool's outcome, and the label its tracebacks carry (<ddp-cell-N>)."""

    outcome: CellOutcome
    label: str
    metrics: Optional[CellMetrics] = None  # what the ranks logged with ddp_magic.log (kernel/results/metrics.py)
    profile: Optional[ProfileReport] = None  # --profile: the merged trace and the straggler table

    @property
    def ok(self) -> bool:
        return self.outcome.ok
