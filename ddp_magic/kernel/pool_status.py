"""The pool as plain data, for every front end: ``PoolStatus`` (what ``%ddp status`` prints) with one ``RankRow`` per rank.

The session builds it (session.py ``Session.status``), safe from any thread; the
magics print it, the JupyterLab comm sends it (ui/labsnap.py), a background job's
line (kernel/turns.py ``Ticket``) is part of it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Tuple

from ..plan.plan import Plan
from ..states import RankState
from ..words import fmt_seconds, plural
from .ranks import LastCell
from .turns import Ticket

NO_POOL = "no pool is running"


class RankRow(NamedTuple):
    """One rank as a status shows it."""

    rank: int
    pid: Optional[int]
    state: RankState
    device: str
    host: str = ""
    exit_code: Optional[int] = None
    elapsed: float = 0.0
    memory: Optional[int] = None
    last_line: str = ""
    node: str = ""  # a Slurm pool's node of the rank (n2)


@dataclass(frozen=True)
class PoolStatus:
    """The session's pool as plain data; ``nproc == 0`` means there is none."""

    started: bool = False
    nproc: int = 0
    backend: str = ""
    master_addr: str = ""
    master_port: Optional[int] = None
    start_method: str = ""
    broken: Optional[str] = None  # why the next cell restarts the pool
    generation: int = 0
    start_seconds: Optional[float] = None
    ranks: Tuple[RankRow, ...] = ()
    owned: Tuple[str, ...] = ()  # names assigned by earlier cells, living on the workers
    plan: Optional[Plan] = None  # the pool's plan, for the env checks of a view
    job: Optional[Ticket] = None  # the cell that holds the pool's turn now (kernel/turns.py): a background one runs on
    queued: Tuple[str, ...] = ()  # the cells waiting for their turn, first first
    where: str = ""  # where the ranks run, when not on this host alone: the Slurm job, its state and nodes
    last_cell: Optional[LastCell] = None  # the last %%ddp cell that ran on this pool

    @property
    def exists(self) -> bool:
        return self.nproc > 0

    @property
    def pids(self) -> List[Optional[int]]:
        return [r.pid for r in self.ranks]

    def text(self) -> str:
        """What ``%ddp status`` prints."""
        if not self.started:
            return f"{NO_POOL}; start one with %%ddp -n N"
        head = f"pool of {plural(self.nproc, 'rank')}, backend {self.backend}, MASTER_PORT {self.master_port}"
        rows = [head + (f" — needs restart: {self.broken}" if self.broken else "")] + ([self.where] if self.where else [])
        rows += [f"  rank {r.rank}: pid {r.pid}  {str(r.state):<11} {r.device}" + (f"  on {r.node}" if r.node else "") for r in self.ranks]
        if self.owned:
            rows.append("names on the workers: " + ", ".join(self.owned))
        rows += [self.job.text()] if self.job is not None else []
        rows += [f"queued: {', '.join(self.queued)}"] if self.queued else []
        if self.last_cell is not None and not self.last_cell.ok:
            rows.append(self.last_cell.text())
        return "\n".join(rows)

    def ready_text(self) -> str:
        """The one line a (re)start answers with."""
        took = fmt_seconds(self.start_seconds) if self.start_seconds is not None else "?"  # as the cell's view says it
        return f"pool of {self.nproc} ({self.backend}) ready in {took}, pids {self.pids}"
