"""The pool as plain data, for every front end: ``PoolStatus`` (what ``%ddp status`` prints) with one ``RankRow`` per rank.

The session builds it (session.py ``Session.status``), safe from any thread; the
magics print it, the JupyterLab comm sends it (ui/labsnap.py), a background job's
line (kernel/jobs/turns.py ``Ticket``) is part of it.
"""
from __future__ import annotations

from dataclasses import dataclass
from collections import Counter
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from ..plan.plan import Plan
from ..states import RankState
from ..errors import signal_name
from ..words import fmt_seconds, plural, short_rank_list
from .memory import Memory, range_text
from .ranks import LastCell
from .jobs.turns import Ticket, Turns

NO_POOL = "no pool is running"
EACH_ABOVE = 32  # more ranks than this: a line per node and state, and the odd ranks alone (the status view's rule)
ODD_SHOWN = 32  # odd ranks with a line of their own at most; the others are grouped like the rest


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
    mem: Optional[Memory] = None  # RSS, peak, CUDA's figures (kernel/memory.py)


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
    job: Optional[Ticket] = None  # the cell that holds the pool's turn now (kernel/jobs/turns.py): a background one runs on
    queued: Tuple[str, ...] = ()  # the cells waiting for their turn, first first
    where: str = ""  # where the ranks run, when not on this host alone: the Slurm job, its state and nodes
    last_cell: Optional[LastCell] = None  # the last %%ddp cell that ran on this pool
    autoreload: str = ""  # on or off, and what the last cell reloaded (kernel/reload.py Autoreload.describe)
    kept: str = ""  # a kept pool's lease (kernel/keep/terms.py): "kept: ends 30 min after its kernel leaves, at most at 06:14"

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
        rows += [self.kept] if self.kept else []
        rows += rank_lines(self.ranks)
        if self.owned:
            rows.append("names on the workers: " + ", ".join(self.owned))
        rows += [self.job.text()] if self.job is not None else []
        rows += [f"queued: {', '.join(self.queued)}"] if self.queued else []
        rows += [self.autoreload] if self.autoreload else []
        if self.last_cell is not None and not self.last_cell.ok:
            rows.append(self.last_cell.text())
        return "\n".join(rows)

    def ready_text(self) -> str:
        """The one line a (re)start answers with."""
        took = fmt_seconds(self.start_seconds) if self.start_seconds is not None else "?"  # as the cell's view says it
        return f"pool of {self.nproc} ({self.backend}) ready in {took}, pids {self.pids}"


def rank_line(r: RankRow) -> str:
    """'  rank 1: pid 4242  running     cpu  on n2  RSS 1.2 GiB (peak 1.4 GiB)': one rank, as %ddp status says it."""
    ended = "" if r.exit_code is None else f"  ({signal_name(r.exit_code) or f'exit {r.exit_code}'})"  # as the view's exit column
    mem = f"  {r.mem.text()}" if r.mem is not None and r.mem.text() else ""
    return f"  rank {r.rank}: pid {r.pid}  {str(r.state):<11} {r.device}" + (f"  on {r.node}" if r.node else "") + ended + mem


def status_of(pool: Any, owned: Iterable[str], last: Optional[LastCell], turns: Turns, autoreload: str = "") -> PoolStatus:
    """A session's pool as data (``Session.status``); safe from any thread: it only reads."""
    if pool is None:
        return PoolStatus()
    rows = tuple(
        RankRow(r, i.pid, i.state, i.device, i.host, i.exit_code, i.elapsed, i.memory, i.last_line, i.node_name, i.mem)
        for r, i in sorted(dict(pool.ranks).items())
    )
    return PoolStatus(
        started=bool(pool.started), nproc=pool.nproc, backend=pool.backend, master_addr=pool.plan.master_addr,
        master_port=pool.plan.master_port, start_method=pool.spec.launcher_method, broken=pool.broken, generation=pool.generation,
        start_seconds=getattr(pool, "start_seconds", None), ranks=rows, owned=tuple(sorted(owned)), plan=pool.plan,
        last_cell=last if last is not None and last.generation == pool.generation else None,
        job=turns.holder, queued=tuple(turns.waiting()), where=pool.launcher.where() if pool.started else "",
        autoreload=autoreload, kept=pool.kept.text() if pool.kept is not None else "",
    )


def _group_line(rows: Sequence[RankRow]) -> str:
    """'  ranks 0-255: ready  cpu  on n1  (pids 4000-4255)': ranks in one state on one node."""
    first = rows[0]
    if len(rows) == 1:
        return rank_line(first)
    pids = [r.pid for r in rows if r.pid is not None]
    where = f"  on {first.node}" if first.node else ""
    who = f"rank {first.rank}" if len(rows) == 1 else f"ranks {short_rank_list((r.rank for r in rows), 8)}"
    mem = range_text([r.mem for r in rows])
    return f"  {who}: {first.state}  {first.device}{where}" + (f"  (pids {short_rank_list(pids)})" if pids else "") + (f"  {mem}" if mem else "")


def rank_lines(rows: Sequence[RankRow]) -> List[str]:
    """A line per rank up to 32 ranks; above, a line per node, state and device (ranks and pids compact), then a line
    for each rank not in the most common state (at most 32; the rest grouped too): 1,024 ranks in a handful of lines."""
    if len(rows) <= EACH_ABOVE:
        return [rank_line(r) for r in rows]
    common = Counter(r.state for r in rows).most_common(1)[0][0]
    odd = [r for r in rows if r.state != common]
    alone, rest = odd[:ODD_SHOWN], [r for r in rows if r.state == common] + odd[ODD_SHOWN:]
    groups: Dict[Tuple[str, str, str], List[RankRow]] = {}
    for r in sorted(rest, key=lambda r: r.rank):
        groups.setdefault((r.node or r.host, str(r.state), r.device), []).append(r)
    lines = [_group_line(g) for g in sorted(groups.values(), key=lambda g: g[0].rank)]
    return lines + ([f"  not {common}:"] + [rank_line(r) for r in alone] if alone else [])
