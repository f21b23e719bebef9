"""What the JupyterLab extension is told about the pool: the ``pool`` of a snapshot (ui/labcomm.py sends it).

Apart from the comm's threads and requests because it is the part that must say
the same as the cell's status view at every moment:

- while the pool starts (the template warms up, no rank has joined yet) the ranks
  are shown as ``starting``, as the cell view shows them, with the start's clock;
- the cell that holds the pool's turn (a background job, ``job``) and the cells queued behind it;
- the start method is the one the pool uses (``fork`` for ``auto`` on Linux);
- ``last_cell``: the last ``%%ddp`` cell's outcome on this pool (session.py
  ``LastCell.to_dict``): its prompt ``number`` (In [n], the numbering of tracebacks,
  metrics and %ddp_export), ``ok``, ``headline`` (its root cause, as its error
  says), ``recovered``, ``root`` (the ranks to blame) and ``causes``
  (``{rank: {kind, cause}}``, kernel/failures/policy.py ``causes``), ``text`` (what
  ``%ddp status`` prints); null while a cell runs and before the first;
- a failed cell's pool that is whole again is ready, and its ranks say so
  (``ready``): the failure is the last cell's, not the ranks'. Only a rank still
  failed, dead or interrupted (the pool not whole: a rank died, ranks were
  stopped) carries its ``kind`` (``states.FailureKind``) and ``cause``: ``root``
  for the failure that explains the others, ``stopped`` for ranks ddp_magic
  interrupted, released or stopped because of it. The panel colours only the root
  cause as failed.
"""
from __future__ import annotations

import json
import time
import weakref
from typing import Any, Dict, List, Optional, Tuple

from ..logs import log
from ..plan import checks_verdict, plan_checks
from ..kernel.jobs.turns import Ticket
from ..session import PoolStatus, Session
from ..states import RankState
from .status_tables import planned_checks

LAUNCHER_NAMES = {"forkserver": "fork"}  # a launcher's name -> the start method a user names (--start-method)
BAD_STATES = (RankState.FAILED, RankState.DEAD, RankState.INTERRUPTED)
STARTING_STATES = (RankState.QUEUED, RankState.STARTING, RankState.CONNECTING)


_ENDED: Dict[int, Tuple["weakref.ref[Session]", Dict[str, Any]]] = {}  # id(session) -> it, its last pool's end (unhashable)


def pool_ended(session: Session, end: Dict[str, Any]) -> None:
    """The session's pool was ended by a preemption (ui/preempt.py): ``why`` (``preempted``), ``text`` (the line its cell
    said), ``step`` (None: nothing saved), ``folder``, ``seconds``, ``saved``; the snapshots' ``ended`` until a pool runs."""
    _ENDED[id(session)] = weakref.ref(session), end


def jsonable(value: Any) -> Any:
    """What json can carry (tuples, numbers as keys, enums as their value, odd objects as their str)."""
    return json.loads(json.dumps(value, default=str))


def job_dict(ticket: Optional[Ticket]) -> Optional[Dict[str, Any]]:
    """The cell that holds the pool's turn (kernel/jobs/turns.py), as the panel and the status bar show it: their clock
    goes on from ``elapsed`` (labextension/src/format.ts ``jobText`` says it as ``Ticket.text`` does)."""
    if ticket is None:
        return None
    now = time.monotonic()
    phase = ticket.phase  # queued, starting (the pool starts for it), running
    elapsed = ticket.on_ranks(now) if phase == "running" else None  # seconds on the ranks: the cell's run clock, job.elapsed
    return {"name": ticket.name, "background": ticket.background, "phase": phase, "elapsed": elapsed, "step": ticket.progress(),
            "text": ticket.text(now)}


def _memory(row: Any) -> Dict[str, Any]:
    """A rank's memory for the panel: ``memory`` the bytes its memory column shows (CUDA's allocated on a GPU, else RSS),
    ``mem`` every figure (kernel/memory.py), ``death`` how it died, with the evidence (kernel/failures/deaths.py)."""
    mem = row.mem
    if mem is None:
        return {"mem": None}
    return {"memory": mem.cuda_allocated if mem.cuda_allocated is not None else mem.rss, "mem": dict(mem.to_dict(), text=mem.text())}


class PoolSnapshots:
    """Builds the ``pool`` of each snapshot from one session (its status, its last cell)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def cell_started(self, raw_cell: str) -> None:
        """A cell starts (labcomm's pre_run_cell): nothing to do, the session knows which cell is the last."""

    def cell_ended(self, result: Any) -> None:
        """A cell ended (labcomm's post_run_cell): nothing to do, the session keeps the last %%ddp cell's outcome."""

    def pool_dict(self) -> Optional[Dict[str, Any]]:
        status = self.session.status()
        pool = self.session.pool
        if not status.exists or pool is None:
            return None
        ranks = [dict(row._asdict(), elapsed=round(row.elapsed, 3), last_line=(row.last_line or "")[-300:], **_memory(row)) for row in status.ranks]
        clock = self._start_clock(pool, status)
        queued = any(r["state"] == RankState.QUEUED for r in ranks)  # a Slurm job waits in the queue: the ranks say so themselves
        if clock is not None and not queued and not any(r["pid"] for r in ranks):  # the template warms up: every rank is on its way
            ranks = [dict(rank=r, state=str(RankState.STARTING), pid=None, device="", host="", exit_code=None, elapsed=clock,
                          memory=None, last_line="") for r in range(status.nproc)]
        for r in ranks if clock is not None else ():  # one start clock: a rank on its way shows the pool's, as the cell does
            if r["state"] in STARTING_STATES:
                r["elapsed"] = clock
        last = status.last_cell
        for r in ranks:
            if last is not None and r["rank"] in last.causes and RankState(r["state"]) in BAD_STATES:
                r["kind"], r["cause"] = last.causes[r["rank"]]
        checks, verdict = self._env_checks(status)
        seconds = status.start_seconds
        out = {k: getattr(status, k) for k in ("nproc", "backend", "started", "broken", "generation", "master_addr", "master_port")}
        name = getattr(getattr(pool, "launcher", None), "name", "") or ""
        out.update(start_method=LAUNCHER_NAMES.get(name, name) or status.start_method, start_method_asked=status.start_method)
        out.update(world_size=status.nproc, start_seconds=round(seconds, 3) if isinstance(seconds, (int, float)) else None)
        out.update(ranks=ranks, checks=checks, verdict=verdict, names=list(status.owned), last_cell=last.to_dict() if last is not None else None)
        out.update(job=job_dict(status.job), queued=list(status.queued), kept=status.kept or None)
        kept_state = getattr(pool, "kept", None)  # the page forgets what it held of a kept pool once it runs here no more
        out.update(kept_id=kept_state.id if kept_state is not None else None)
        out.update(planned=not status.started)  # no rank exists yet: MASTER and the env are the plan's, not facts (a queued Slurm job)
        return jsonable(out)

    def ended_dict(self) -> Optional[Dict[str, Any]]:
        """How the last pool ended, while no pool runs since (the next pool is the news then): a preemption, else None."""
        found = _ENDED.get(id(self.session))
        if self.session.pool is not None or found is None or found[0]() is not self.session:
            return None
        return jsonable(found[1])

    def kept_dicts(self) -> List[Dict[str, Any]]:
        """With no pool here: this notebook's kept pools (after a kernel restart), which the panel offers to attach."""
        if self.session.pool is not None:
            return []
        try:
            from .kept_list import kept_rows

            return kept_rows()
        except Exception:  # a snapshot must never fail for this
            log.debug("labcomm: could not list the kept pools", exc_info=True)
            return []

    def _start_clock(self, pool: Any, status: PoolStatus) -> Optional[float]:
        """While the pool starts, the seconds since its start began (``Pool.start_began``, the clock the cell's view
        shows: the template's warm-up and a Slurm queue included; 0 until it begins); None once it has started."""
        if status.started:
            return None
        began = getattr(pool, "start_began", None)
        return round(max(0.0, time.monotonic() - began), 3) if isinstance(began, (int, float)) else 0.0

    def _env_checks(self, status: PoolStatus) -> Tuple[List[dict], str]:
        """The checks of the pool's plan (plan_checks caches them: a snapshot may ask often)."""
        try:
            assert status.plan is not None
            checks = plan_checks(status.plan, started=status.started)
            shown = checks if status.started else planned_checks(checks)  # no placeholder port presented as a fact
            return [c.to_dict() for c in shown], checks_verdict(checks)
        except Exception as e:  # a check must never break a cell
            log.debug("labcomm: env checks failed", exc_info=True)
            failed = {"name": "env checks", "ok": False, "level": "warning", "mark": "!", "detail": f"could not run: {type(e).__name__}: {e}"}
            return [failed], "env ! could not check"
