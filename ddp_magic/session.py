"""One kernel's session: its pool, the names that live on the workers, and what a front end may ask.

The magics (magics.py) and the JupyterLab comm (ui/labcomm.py) both drive the pool through a :class:`Session`; it
returns data (:class:`PoolStatus`, :class:`EnvData`, :class:`CellResult`) and raises the user-facing errors of
errors.py, and it never prints: each front end renders what it gets. It holds the only reference a front end has to
the pool, so the magics, the comm and a plain-Python caller all see the same pool and the same worker-owned names.
No IPython here (tests/unit/test_structure.py checks that): a test or a script drives a session as a notebook does.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from .errors import PlanError, ShipError, UsageError
from .export.record import History
from .kernel import Listener
from .kernel.ranks import LastCell
from .kernel.results.metrics import CellMetrics
from .kernel.output.output_log import OutputLog
from .kernel import snapshots, templates
from .kernel.jobs import peek as peeks
from .kernel.launchers import preview
from .kernel.pool import Pool
from .kernel.results.profile_merge import ProfileRun
from .kernel.reload import Autoreload
from .kernel.texts import NAMES_GONE, cancelled_text
from .kernel.jobs.turns import Ticket, TicketClock, Turns
from .kernel.cell_types import CellOptions, CellResult  # noqa: F401  (the front ends import them from here)
from .kernel.pool_status import NO_POOL, PoolStatus, RankRow, status_of  # noqa: F401  (NO_POOL: the front ends read it here)
from .kernel.stacks import Stacks, stacks as read_stacks
from .logs import log
from .plan import Check
from .plan.plan import Plan, make_plan
from .plan.spec import PoolSpec
from .wire import namespace, notebook_data
from .wire import protocol as P
from .wire.execution import editor_lines, name_cells, syntax_error_text

CELL_FILENAME = "<ddp-cell>"  # what names are read from; tracebacks name each cell <ddp-cell-N>
STOPPED = "stopped the pool; its workers have exited"
NEED_N_FOR_CELL = "no pool is running yet: give the number of ranks on the first cell, e.g. %%ddp -n 2"
NEED_N_FOR_RESTART = "no pool to restart: start one with %%ddp -n N, or give -n here"
NEED_N_FOR_ENV = "no pool is running: give the number of ranks to plan for, e.g. %ddp_env -n 4"
MEMORY_WAIT_S = 1.0  # %ddp status between cells: how long the ranks get to say their memory
scatter = notebook_data.Scatter  # ddp_magic.scatter(x, dim=0): each rank gets its shard of x (wire/notebook_data.py)


@dataclass(frozen=True)
class EnvData:
    """The env of every rank: planned (``plan``: what a pool would get) or live (``live``: what each worker reports)."""

    nproc: int
    backend: str
    plan: Optional[Plan] = None
    live: Optional[Dict[int, Dict[str, Any]]] = None
    checks: Tuple[Check, ...] = ()  # what the plan's own checks cannot know: Slurm's verdict on a --slurm request
    autoreload: str = ""  # whether autoreload is on, and what the last cell reloaded (kernel/reload.py)

    @property
    def state(self) -> str:
        return "live" if self.live is not None else "planned"


class CellListener(Listener):
    """A Listener that also hears which pool a cell will run on, before any rank of it starts.

    A front end shows its status view there (above the ranks' output) and checks
    what depends on the pool's size; an exception it raises stops the cell.
    """

    def on_pool(self, pool: Pool) -> None:
        pass

    def on_queued(self, holder: Ticket) -> None:
        """The cell waits in line behind ``holder`` (kernel/jobs/turns.py); called once, before it waits."""


@dataclass
class Session:
    """The pool of one kernel and the names its workers own. Every method runs on the kernel's main thread,
    except ``status``, which only reads."""

    pool: Optional[Pool] = None
    owned: Set[str] = field(default_factory=set)
    cells: int = 0  # numbers tracebacks' <ddp-cell-N>: unique even when the front end stores no history
    definitions: namespace.Definitions = field(default_factory=namespace.Definitions)  # the newest definition wins
    history: History = field(default_factory=History)  # the cells as %ddp_export reads them (export/record.py)
    template: templates.WarmTemplate = field(default_factory=templates.WarmTemplate)  # started at %load_ext; the first pool adopts it
    data: notebook_data.Outbox = field(default_factory=notebook_data.Outbox)  # notebook tensors in /dev/shm, sent once; .sent counts bytes
    metrics: Optional[CellMetrics] = None  # the last cell's that logged any: %ddp metrics
    last: Optional[LastCell] = None  # the last %%ddp cell's outcome, while its pool runs (None once it stops or restarts)
    turns: Turns = field(default_factory=Turns)  # one cell at a time on the pool; the others wait in line (kernel/jobs/turns.py)
    outputs: OutputLog = field(default_factory=OutputLog)  # every rank's whole output of the recent cells: %ddp output --rank N
    autoreload: Autoreload = field(default_factory=Autoreload)  # %ddp autoreload: edited modules reach the ranks (kernel/reload.py)
    numbers: Dict[str, Optional[int]] = field(default_factory=dict)  # cell label -> its prompt number (In [n]): Cell In[n]
    later_imports: bool = False  # snapshots were saved or loaded: every pool's template imports what they need (import_later)

    def import_later(self) -> None:
        """Snapshots are in use: the templates import what a load, a save and DDP's constructor import, once, so that
        the ranks forked after (this pool's started again and healed, the next pool's) have them: about 1 s of CPU a rank."""
        self.later_imports = True
        if self.pool is not None:
            self.pool.launcher.import_later()

    # ------------------------------------------------------------ specs
    def spec_for(self, nproc: Optional[int] = None, extra_env: Optional[Mapping[str, str]] = None, **options: Any) -> Optional[PoolSpec]:
        """The spec a request asks for: the pool's own with these options changed, or a new one.

        ``None`` options keep what the pool has (one whose start failed: only a retry, no ``-n``); the
        result is None when there is no pool and no ``nproc`` (each caller says what is missing).
        """
        try:
            if self.pool is not None and (self.pool.started or nproc is None):
                return self.pool.spec.with_options(nproc, extra_env=extra_env, **options)
            if nproc is None and all(options.get(k) is None for k in ("slurm", "ssh", "ray")):  # a Slurm (SSH, Ray) request's shape may say how many
                return None
            return PoolSpec.from_options(nproc, extra_env=extra_env, **options)
        except PlanError as e:
            raise UsageError(str(e)) from None

    def changes(self, spec: PoolSpec) -> List[str]:
        """What ``spec`` changes about the pool, as the user would say it; empty: keep the pool. A backend named explicitly
        that "auto" already chose is no change, and the join timeout only matters while a pool starts: neither restarts one."""
        pool = self.pool
        if pool is None:
            return []
        old = pool.spec.with_options(backend=pool.backend) if spec.backend == pool.backend else pool.spec
        return spec.with_options(start_timeout=old.start_timeout).changes_from(old)

    # ------------------------------------------------------------ lifecycle
    def start(self, spec: PoolSpec, listener: Optional[Listener] = None) -> PoolStatus:
        """Start a pool of ``spec`` (a running pool with other options is restarted, with a notice)."""
        listener = listener or Listener()
        self.turns.check_idle("no start")
        pool = self._pool_for(spec, listener, NEED_N_FOR_CELL)
        templates.start_replaced(pool, listener)
        pool.start(listener)
        return self.status()

    def restart(self, spec: Optional[PoolSpec] = None, listener: Optional[Listener] = None) -> PoolStatus:
        """Restart the pool (fresh port, the names on the workers are gone), with ``spec``'s options if given."""
        listener = listener or Listener()
        self.turns.check_idle("no restart")
        written = self.wait_for_writes()
        if written:
            listener.on_notice(written)
        pool = self._pool_for(spec, listener, NEED_N_FOR_RESTART)
        if templates.start_replaced(pool, listener):
            pass  # a new pool of the options asked for: just started
        elif pool.started:
            pool.restart(listener, who="%ddp restart")  # a node still silent: refused, nothing stopped
        else:
            pool.start(listener)
        self.owned.clear()
        self.last = None
        return self.status()

    def stop(self, force: bool = False) -> str:
        """Stop every worker, the template and the notebook data in /dev/shm; what it says ("" when there was no pool).
        A cell holding the turn (a background job) refuses it, unless ``force`` (the kernel goes away)."""
        if not force:
            self.turns.check_idle("the pool was not stopped")
        written = "" if force else self.wait_for_writes()
        pool, self.pool = self.pool, None
        self.owned.clear()
        self.last = None
        self.template.close()
        self.data.clear()
        if pool is None:
            return ""
        unreached = pool.stop()  # ranks on a silent node: ", except ranks 2-3 on n2, which could not be reached (…)"
        stopped = STOPPED + unreached + getattr(pool.launcher, "released", "")  # a Slurm pool: its job released (or the kernel's own kept)
        return f"{written}\n{stopped}" if written else stopped

    def wait_for_writes(self) -> str:
        """A background save (%ddp save --bg, --save-every) still being written is waited for before its ranks go."""
        return snapshots.finish_writes(self.pool, lambda source: self.run(source, {}, CellOptions(internal=True)))

    def _pool_for(self, spec: Optional[PoolSpec], listener: Listener, missing: str) -> Pool:
        """The pool ``spec`` asks for: the running one, a new one, or a replacement (validated before the old one goes)."""
        pool = self.pool
        if pool is None:
            if spec is None:
                raise UsageError(missing)
            self.pool, self.last = _new_pool(spec), None
            self.template.give(self.pool)  # the template %load_ext started, torch imported already
            return self._later(self.pool)
        changes = self.changes(spec) if spec is not None else []
        if not changes:
            return pool
        assert spec is not None
        new = _new_pool(spec)
        templates.hand_over(pool, new, changes)  # the new ranks fork from the same template where they can; start_replaced says so
        self.pool, self.last = new, None
        self.owned.clear()
        return self._later(new)

    def _later(self, pool: Pool) -> Pool:
        if self.later_imports:
            pool.launcher.import_later()  # before its ranks fork: they have the imports already
        return pool

    # ------------------------------------------------------------ reading
    def refresh(self) -> None:
        """The pool takes in what happened while idle (main thread only), and each rank's memory now when no cell runs
        (while one does, its own pump reads what the ranks' samplers send); then ``status`` is current."""
        pool, me = self.pool, Ticket("%ddp status")
        if pool is not None:
            pool.refresh()
            if pool.alive and self.turns.try_take(me):
                try:
                    pool.ask(P.MEMORY, MEMORY_WAIT_S)
                finally:
                    self.turns.give_back(me)

    def status(self) -> PoolStatus:
        """The pool as data; safe from any thread (it only reads)."""
        return status_of(self.pool, self.owned, self.last, self.turns, self.autoreload.describe())

    def env(self, spec: Optional[PoolSpec] = None) -> EnvData:
        """The env each rank sees (read from the live workers) or, given a spec or without a live pool, will get."""
        pool = self.pool
        if spec is None and pool is not None and pool.alive:
            self.turns.check_idle("%ddp_env reads the ranks between cells")
            return EnvData(pool.nproc, pool.backend, pool.plan, pool.live_env(), autoreload=self.autoreload.describe())  # plan: the checks the cell counts
        spec = spec or (pool.spec if pool is not None else None)
        if spec is None:
            raise UsageError(NEED_N_FOR_ENV)
        try:
            plan = make_plan(spec, strict=False)
        except PlanError as e:
            raise UsageError(str(e)) from None
        plan, checks = preview(plan)  # Slurm asked, or each host over ssh: nothing allocated, nothing started
        return EnvData(nproc=spec.nproc, backend=plan.backend, plan=plan, checks=tuple(checks), autoreload=self.autoreload.describe())

    # ------------------------------------------------------------ cells
    def run(self, source: str, user_ns: Mapping[str, Any], options: Optional[CellOptions] = None, listener: Optional[Listener] = None) -> CellResult:
        """Run a cell on every rank: ship the notebook names it uses, run it, keep track of the names it leaves there.

        It waits for its turn first while another cell runs on the pool (kernel/jobs/turns.py;
        ``options.queue`` False: UsageError at once, Dequeued when taken out of the line).
        Raises UsageError (a syntax error: nothing ran) or ShipError (a name that
        cannot be pickled: nothing was sent); a cell that fails on a rank is an
        outcome with failures, not an exception.
        """
        options = options or CellOptions()
        listener = listener or Listener()
        ticket = options.ticket or Ticket(f"ddp cell {self.cells + 1}")
        with self.turns.turn(ticket, options.queue, listener.on_queued if isinstance(listener, CellListener) else None, options.cancel):
            return self._run(source, user_ns, options, listener, ticket)

    def precheck(self, source: str, options: CellOptions) -> None:
        """What a background cell is told at once, in its own cell, not later by its job: a syntax error, no pool, --no-queue's refusal."""
        check_syntax(source)
        if self.pool is None and options.spec is None:
            raise UsageError(NEED_N_FOR_CELL)
        if not options.queue:
            self.turns.check_idle(f"%%ddp --no-queue: {options.ticket.name if options.ticket else 'the cell'} did not run")

    def _run(self, source: str, user_ns: Mapping[str, Any], options: CellOptions, listener: Listener, ticket: Ticket) -> CellResult:
        newer = self.definitions.stale(self.owned)
        blobs = self._ship(source, user_ns, newer, options)
        self._newest_wins(newer, user_ns, listener)
        pool = self._pool_for(options.spec, listener, NEED_N_FOR_CELL)
        if isinstance(listener, CellListener):
            listener.on_pool(pool)
        templates.start_replaced(pool, listener)
        if options.restart and pool.started:
            pool.restart(listener, who="%%ddp --restart")
            self.owned.clear()
            listener.on_notice("restarted the pool; " + NAMES_GONE)
        generation = pool.generation
        reload = self.autoreload.before_cell(pool, options.kernel_autoreload, listener)  # raises (nothing ran) when the ranks disagree
        self.cells += 1
        label = str(self.cells)
        self.numbers[label] = options.number  # Cell In[12] in tracebacks and stacks, while it runs too
        metrics = CellMetrics(label if options.number is None else str(options.number))  # outermost listener: ddp_magic.log rows
        ticket.progress, ticket.assigns = metrics.last_step, frozenset(namespace.assigned_globals(source, CELL_FILENAME))  # "step 4,120"; a safe point's save
        profile = ProfileRun.arm(pool, listener, options.profile) if options.profile is not None else None
        self.last = None  # this cell is the news now
        kept = self.outputs.tap(listener, label if options.number is None else str(options.number))  # %ddp output --rank N
        outcome = pool.run(
            editor_lines(source, options.first_line), blobs, listener=TicketClock(ticket, metrics.tee(self.history.tap(kept), listener)),
            timeout=options.timeout, gather=options.gather, argv=options.argv, label=label, owned=sorted(self.owned), stdin=options.stdin,
            cancel=options.cancel, reload=reload, heal=options.heal,
        )
        self.autoreload.after_cell(pool, listener)
        ticket.ran_for = outcome.elapsed  # the job's run time is the cell's: seconds on the ranks
        outcome.cancel_text = cancelled_text(outcome, metrics.last_step())  # job.cancel()'s words ("" for any other end)
        self.last = LastCell.of(outcome, options.number, label, pool.generation)
        if pool.generation != generation:  # the pool (re)started for this cell: earlier names are gone
            self.owned.clear()
        if outcome.state_lost:  # ranks were stopped: this cell's names are gone too
            self.owned.clear()
        else:
            assigned = namespace.assigned_globals(source, CELL_FILENAME) | ({"mesh"} if pool.spec.mesh else set())  # --mesh made it there
            self.owned |= assigned
            pool.recovery.assigned(assigned | set(newer), but={f.rank for f in outcome.failures})  # a restarted rank has them again
        self.definitions.ddp_cell(self.owned, newer)
        if not options.internal:
            self.history.ran(source, blobs, user_ns, pool, outcome, late=ticket if ticket.background else None)
        self.metrics = metrics if metrics else self.metrics
        return CellResult(outcome=outcome, label=label, metrics=metrics, profile=profile.collect(pool, metrics) if profile is not None else None)

    def output(self, rank: int, cell: Optional[str] = None) -> List[Tuple[str, str]]:
        """Rank ``rank``'s whole output in a recent cell (``cell``: its In [n]; None: the last cell that ran), as (stream,
        text) in the order the kernel read it: what the notebook held back or hid (``--ranks``) included."""
        if self.pool is not None and not 0 <= rank < self.pool.nproc:
            raise UsageError(f"%ddp output --rank {rank}: the pool has ranks 0..{self.pool.nproc - 1}")
        try:
            return [(stream, name_cells(text, self.numbers)) for stream, text in self.outputs.pieces(rank, cell)]  # a crash's report: Cell In[n]
        except KeyError as e:
            raise UsageError(f"%ddp output: {e.args[0]}; name one with --cell N (its In [N])") from None

    def peek(self, source: str, ranks: Optional[Iterable[int]] = None, timeout: float = peeks.PEEK_TIMEOUT_S) -> peeks.PeekOutcome:
        """``%%ddp --peek``: ``source`` on the ranks' peek threads, beside the running cell (kernel/jobs/peek.py); nothing is shipped."""
        check_syntax(source, "the peek")
        if self.pool is None or not self.pool.alive:
            raise UsageError("%%ddp --peek: no pool is running; a peek looks into the ranks of a running pool (start one with %%ddp -n N)")
        return peeks.peek(self.pool, self.turns, source, list(ranks) if ranks is not None else None, timeout)

    def stacks(self, ranks: Optional[Iterable[int]] = None, all_threads: bool = False, native: bool = False,
               timeout: Optional[float] = None) -> Stacks:
        """``%ddp stacks``: every rank's stack now, read by a thread of its own beside whatever runs (kernel/stacks.py)."""
        if self.pool is None or not self.pool.alive:
            raise UsageError("%ddp stacks: no pool is running; start one with %%ddp -n N")
        return read_stacks(self.pool, self.turns, list(ranks) if ranks is not None else None, all_threads, native, timeout, self.numbers)

    def notebook_cell(self, source: str, transform: Callable[[str], str] = str) -> None:
        """An ordinary notebook cell ran (IPython's post_run_cell): what it defined is now the newest definition.

        ``transform`` turns the cell's magics into Python (IPython's transform_cell)."""
        try:
            self.definitions.notebook_cell(namespace.assigned_globals(transform(source), "<cell>"))
        except Exception:  # bookkeeping must never disturb the notebook's own cell
            log.debug("could not read the names a notebook cell defined", exc_info=True)

    def _newest_wins(self, newer: Set[str], user_ns: Mapping[str, Any], listener: Listener) -> None:
        """Names the workers held that an ordinary cell defined since are no longer theirs (this cell sends them)."""
        self.owned -= newer
        news = {n for n in newer if not namespace.by_reference(user_ns.get(n))}  # `import torch` again is no news
        if news and not self.definitions.noticed:
            self.definitions.noticed = True
            listener.on_notice(namespace.newer_notice(news))

    def _ship(self, source: str, user_ns: Mapping[str, Any], newer: Iterable[str] = (), options: Optional[CellOptions] = None) -> Dict[str, bytes]:
        """The notebook values the cell uses and the workers do not own (and those ``newer`` there), pickled, large
        tensors through /dev/shm once (wire/notebook_data.py); nothing runs when one fails."""
        options = options or CellOptions()
        try:
            compile(editor_lines(source, options.first_line), CELL_FILENAME, "exec", dont_inherit=True)  # its line, as the editor numbers it
            needed = namespace.names_to_ship(source, CELL_FILENAME, dict(user_ns), self.owned)
            needed.update(namespace.shippable(newer, dict(user_ns)))
            needed = notebook_data.scattered(needed, options.scatter, user_ns, self.owned)
        except SyntaxError as e:
            raise UsageError("SyntaxError in the cell; nothing was run:\n" + syntax_error_text(e)) from None
        except ValueError as e:  # --scatter of a name the cell cannot take
            raise UsageError(str(e)) from None
        spec = options.spec or (self.pool.spec if self.pool is not None else None)
        blobs, failure = self.data.dumps_names(needed, spec.nproc if spec else 1, local=spec is None or (spec.nnodes == 1 and not spec.over_hosts))
        if failure:
            name, why = failure
            raise ShipError(
                f"cannot send the notebook variable {name!r} to the workers ({why}).\n"
                f"Create it inside the %%ddp cell instead, or make it picklable (cloudpickle)."
            )
        return blobs


def check_syntax(source: str, what: str = "the cell") -> None:
    """A syntax error is a UsageError before anything runs (a background cell's too: at once, in its own cell)."""
    try:
        compile(source, CELL_FILENAME, "exec", dont_inherit=True)
    except SyntaxError as e:
        raise UsageError(f"SyntaxError in {what}; nothing was run:\n" + syntax_error_text(e)) from None


def _new_pool(spec: PoolSpec) -> Pool:
    """A pool for ``spec``, validated (nothing started yet); a bad request is a short UsageError."""
    try:
        pool = Pool(spec)
    except PlanError as e:
        raise UsageError(str(e)) from None
    templates.warm_torch_import()  # the kernel unpickles tensor results: import torch while the ranks start
    return pool
