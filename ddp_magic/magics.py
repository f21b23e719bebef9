"""The IPython layer: parse a magic's arguments, call the session, render what it returns.

The options are declared once, with IPython's ``magic_arguments``: the parsers
read the lines, and ``%ddp?``, ``%%ddp?`` and ``%ddp_env?`` show the help they
generate, examples included. Everything else lives in session.py (the pool and
the names on the workers) and ui/ (the views).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import types
from typing import Any, Dict, List, Optional

import IPython
from IPython.core.error import UsageError as IPythonUsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, kwds, magic_arguments

from . import logs
from .errors import CellError, JobCancelled, UsageError
from .kernel.jobs.peek import PEEK_TIMEOUT_S
from .kernel.pool import Pool
from .kernel.reload import kernel_follows
from .kernel.jobs.turns import Ticket
from .magic_options import (  # noqa: F401  (SEE_HELP, POOL_KEYS, SLURM_KEYS: the magics' own names, kept importable here)
    CELL_EXAMPLES, HELP_ARGUMENT, LINE_EXAMPLES, POOL_KEYS, SEE_HELP, SLURM_KEYS, cell_argv, keep_arguments, option_words, parse_line, where_request,
    pool_arguments,
)
from .magic_options import snapshot_arguments
from .plan.spec import positive_int as _positive_int
from .session import NO_POOL, CellOptions, Session
from .ui.cell_listener import MagicListener
from .ui import jobs
from .ui.jobs import Job
from .ui.report import env_report
from .ui.output import RankPrinter, parse_ranks, show_output
from .ui.results import CellNumbers, RankResults, running_cell
from .ui.metrics_view import metrics_data
from .ui import debugging, keep as keeping, save_every, transcripts
from .ui import snapshots as snapshotting
from .words import plural


@magic_arguments("ddp")
@kwds(epilog=LINE_EXAMPLES)
@argument("action", nargs="?", choices=("status", "stop", "restart", "log", "metrics", "wait", "output", "stacks", "autoreload", "keep", "attach",
                                        "save", "load", "snapshots"),
          default="status", help="what to do (default: status)")
@argument("--df", action="store_true", help="with metrics: a pandas DataFrame instead of a dict of lists")
@argument("--rank", type=int, metavar="R", help="with output: the rank whose whole output to show")
@argument("--cell", metavar="N", help="with output: the cell (its In [N]) whose output to show (default: the last %%%%ddp cell)")
@argument("--ranks", metavar="RANKS", help="with stacks: these ranks only, e.g. 0-3")
@argument("--all-threads", action="store_true", help="with stacks: every thread's stack, not only the main thread's")
@argument("--native", action="store_true", help="with stacks: native frames too (py-spy, where installed on the ranks' hosts)")
@argument("--timeout", type=float, metavar="SECONDS", help="with stacks: how long to wait for the ranks' answers (default 2)")
@pool_arguments
@keep_arguments
@snapshot_arguments
@HELP_ARGUMENT
def _ddp_line() -> None:
    """%ddp as a line magic: look after the pool of worker processes."""


def _parse(magic: Any, line: str, name: str) -> argparse.Namespace:
    """The magic's arguments; a bad one is a short UsageError that points to the full help."""
    try:
        return parse_line(magic, line)
    except IPythonUsageError as e:
        raise UsageError(f"{name}: {e}\n{SEE_HELP}") from None
    except ValueError as e:  # an unclosed quote
        raise UsageError(f"cannot read the arguments {line!r}: {e}") from None


def _pool_request(args: argparse.Namespace) -> Dict[str, Any]:
    """The pool options given on the line (PoolSpec names); empty when none was given."""
    request = {k: getattr(args, k) for k in POOL_KEYS if getattr(args, k) is not None}
    if args.nproc is not None:
        request["nproc"] = args.nproc
    if args.nccl_debug:
        request.setdefault("extra_env", {})["NCCL_DEBUG"] = args.nccl_debug
    if args.iface:
        request.setdefault("extra_env", {})["DDP_MAGIC_IFACE"] = args.iface  # procs/rank_net.py reads it on each node
    if args.control_addr:
        request["listen_addr"] = args.control_addr
    request.update(where_request(args))  # --slurm's or --hosts' (magic_options.py)
    return request


def _ranks(text: str, world: Optional[int] = None) -> Any:
    try:
        return parse_ranks(text, world)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _read_back(args: argparse.Namespace, number: Any) -> str:
    """How this cell's reader gets a rank's whole output back, named where lines are held back."""
    if args.bg and args.out:
        return f"{args.out}.output({{rank}})"
    return "%ddp output --rank {rank}" + (f" --cell {number}" if isinstance(number, int) else "")


def log_text(limit: int = 200) -> str:
    """What %ddp log shows: this kernel's recent ddp_magic records, oldest first."""
    records = logs.recent(limit)
    head = f"ddp_magic log: the last {plural(len(records), 'record')} of this kernel (pid {os.getpid()}); attach them to a bug report."
    hint = "DDP_MAGIC_LOG=debug in the kernel's env also prints every record, on the ranks too, as it happens."
    return "\n".join([head, hint, *records]) if records else f"ddp_magic log: no records yet.\n{hint}"


@magics_class
class DDPMagics(Magics):
    """%%ddp, %ddp and %ddp_env over one Session (the pool and the names on the workers live there)."""

    def __init__(self, shell: Any, session: Optional[Session] = None) -> None:
        super().__init__(shell)
        self.session = session or Session()
        self.last_failures: List[Any] = []  # the last failed %%ddp cell's, for %ddp_debug
        self.cell_numbers = CellNumbers(self.session.numbers)  # tracebacks say Cell In[N] with the prompt's number
        self.jobs: List[Job] = []  # the background cells not known to have ended (%ddp wait)
        if shell is not None:  # %ddp_export reads every cell in execution order (nbval keeps no IPython history)
            self.session.history.start_at(shell.execution_count)
            shell.events.register("post_run_cell", self.record_cell)
            shell.events.register("post_run_cell", self.newest_definition)

    def record_cell(self, result: Any) -> None:
        """IPython's post_run_cell: one more cell in the history %ddp_export reads."""
        info = result.info  # without stored history (nbval) every cell has the same count: the history numbers them
        number = result.execution_count if getattr(info, "store_history", True) else None
        self.session.history.cell(number, getattr(info, "raw_cell", "") or "", bool(result.success))

    def newest_definition(self, result: Any) -> None:
        """IPython's post_run_cell: what an ordinary cell defined replaces the workers' copy (session.notebook_cell)."""
        raw = getattr(result.info, "raw_cell", "") or ""
        if self.shell is not None and not raw.lstrip().startswith("%%"):  # a %%ddp cell's names are the session's business
            self.session.notebook_cell(raw, self.shell.transform_cell)

    @property
    def user_ns(self) -> Dict[str, Any]:
        assert self.shell is not None, "the magics run in an IPython shell"
        return self.shell.user_ns

    @property
    def pool(self) -> Optional[Pool]:
        """The session's pool (read-only here; tests and notebooks reach it this way)."""
        return self.session.pool

    # ------------------------------------------------------------ %%ddp / %ddp
    @line_cell_magic
    @magic_arguments("%ddp")
    @kwds(epilog=CELL_EXAMPLES)
    @pool_arguments
    @argument("--ranks", metavar="RANKS", help="show output of these ranks only, e.g. 0 or 0,2-3")
    @argument("--ordered", action="store_true", help="print output rank by rank when the cell ends (deterministic)")
    @argument("--timeout", type=float, metavar="SECONDS", help="stop the cell after this long (every rank's stack is shown)")
    @argument("--out", metavar="NAME", help="also store the per-rank results in this notebook variable")
    @argument("--scatter", type=lambda t: tuple(filter(None, t.split(","))), default=(), metavar="X,Y", help="each rank gets only its shard of these tensors")
    @argument("--restart", action="store_true", help="restart the pool before running the cell")
    @argument("--gather", choices=("auto", "collective", "direct"), default="auto", help="how tensors come back")
    @argument("--argv", help="sys.argv[1:] on the workers (default: none, as torchrun; argparse parsers that declare --local_rank get it)")
    @argument("--quiet", action="store_true", help="no notices from ddp_magic")
    @argument("--no-widget", action="store_true", help="no status view above the output")
    @argument("--pdb", action="store_true", help="on failure, open pdb on the failing rank (post-mortem; %%pdb on does it for every cell)")
    @argument("--profile", nargs="?", const="", metavar="TRACE.json", help="run under torch.profiler on every rank; one merged trace (default ddp_trace.json)")
    @argument("--bg", action="store_true", help="run in the background: the cell returns at once, its output keeps coming here; --out NAME keeps the job")
    @argument("--keep", action="store_true", help="the pool, and this cell if it runs in the background, outlive the kernel (docs/keep.md)")
    @argument("--no-heal", action="store_true", help="a rank started again after a crash stays empty (default: it gets the others' names first)")
    @argument("--no-queue", action="store_true", help="while another cell runs on the pool, fail at once instead of waiting for it")
    @argument("--peek", action="store_true", help="a short read-only cell on the ranks beside the running cell (--ranks: only these ranks)")
    @argument("--save-every", nargs=2, metavar=("DURATION", "DIR"), help="a snapshot in DIR at the first safe point after each DURATION (10m) while it runs")
    @argument("--save-on-preempt", metavar="DIR", help="on SIGTERM to the template or SIGUSR1 (Slurm: --signal=USR1@120): a snapshot in DIR; the pool ends")
    @HELP_ARGUMENT
    def ddp(self, line: str, cell: Optional[str] = None) -> Any:
        """Run the cell on N worker processes (ranks) with torch.distributed ready.

        The value of the cell's last expression comes back as a list indexed by rank
        (tensors as CPU tensors). Names assigned in %%ddp cells live on the workers;
        other names the cell uses are sent from the notebook (cloudpickle) each time.
        """
        if cell is None:
            return self._ddp_line(line)
        args = _parse(self.ddp, line, "%%ddp")
        if args.help:
            print(self.ddp.__doc__)
            return None
        return self._run_cell(args, cell)

    ddp.__doc__ = f"{ddp.__doc__}\n{_ddp_line.__doc__}"

    def _run_cell(self, args: argparse.Namespace, cell: str) -> Any:
        if args.peek:
            return self._peek(args, cell)
        if args.bg and args.pdb:
            raise UsageError("%%ddp --bg --pdb: a background cell cannot stop in pdb; run it without --bg, or %ddp_debug after it failed")
        number, first_line = running_cell(self.shell)  # In [n], and the editor's line of the body's first
        ticket = Ticket(f"cell [{number}]" if isinstance(number, int) else "a %%ddp cell", background=args.bg)
        printer = RankPrinter(_ranks(args.ranks) if args.ranks else None, ordered=args.ordered, read_back=_read_back(args, number))
        listener = MagicListener(printer, args.quiet, args.ranks, widget=not args.no_widget, cell=str(number) if isinstance(number, int) else "")
        request = _pool_request(args)
        spec = self.session.spec_for(**request) if request else None
        mailbox = debugging.background_mailbox(printer.flush, listener.on_notice) if args.bg else None  # --bg: questions wait there
        stdin = mailbox if mailbox is not None else debugging.kernel_ask(printer.flush)
        options = CellOptions(
            spec=spec, restart=args.restart, timeout=args.timeout, gather=args.gather, argv=cell_argv(args.argv), stdin=stdin,
            profile=args.profile, scatter=args.scatter, ticket=ticket, queue=not args.no_queue, number=number, first_line=first_line,
            kernel_autoreload=kernel_follows(self.shell), heal=not args.no_heal,
        )
        keeping.lost(self.session)
        if args.keep:  # the pool (and this cell's job) outlive the kernel: kept before the cell is sent
            keeping.keep_cell(self.session, spec, listener, ticket.name, args.save_on_preempt)
            options = dataclasses.replace(options, spec=None)
        if not args.bg:
            return self._cell_value(args, cell, printer, listener, options, self.shell)
        self.session.precheck(cell, options)  # what can fail at once fails here, not in the background
        as_shell = types.SimpleNamespace(call_pdb=False)  # a background cell never stops in pdb
        job = Job(ticket, lambda j: self._cell_value(args, cell, printer, listener, dataclasses.replace(options, cancel=j.cancel_event), as_shell),
                  live=lambda: listener.metrics.data, mailbox=mailbox)
        job.outputs = functools.partial(self.session.output, cell=str(number) if isinstance(number, int) else None)  # job.output(N)
        job.session = self.session  # job.stacks(), the ranks' memory in its repr
        self.session.history.begin_late(ticket)  # %ddp_export: its run goes to this cell's record, whenever it ends
        self.jobs = [j for j in self.jobs if not j.done()] + [job]
        transcripts.begin(self.shell, ticket.name, job.done)  # its outputs are kept: a page that reloads gets them back
        self.session.turns.reserve(ticket)  # its place in line is this cell's: the next cell runs after it (given up at its end)
        job.start(held=args.keep, on_end=functools.partial(self.session.turns.withdraw, ticket))
        if args.out:
            self.user_ns[args.out] = job
            return None
        return job

    def _cell_value(self, args: argparse.Namespace, cell: str, printer: RankPrinter, listener: MagicListener, options: CellOptions, shell: Any) -> Any:
        """Run the cell on the session and turn its outcome into what the cell gives: RankResults, or a CellError raised."""
        try:
            try:
                with save_every.saving(self.session, args, options.ticket):  # --save-every: at safe points (ui/save_every.py)
                    result = self.session.run(cell, self.user_ns, options, listener)
            finally:
                printer.flush()
        except BaseException as e:
            listener.finish(None, e)
            raise
        outcome = result.outcome
        notes = self.cell_numbers.name(result.label, options.number, outcome.failures, outcome.notes)
        listener.finish(outcome, metrics=result.metrics)
        results = RankResults(outcome.values)
        results.metrics = result.metrics.columns() if result.metrics else {}
        if result.profile is not None:
            print(result.profile.text())
        value = results if outcome.combined is None else outcome.combined  # DTensors: one ShardedResult each
        if args.out and not args.bg:  # a background cell's --out holds its job
            self.user_ns[args.out] = value
        if outcome.failures:
            self.last_failures = list(outcome.failures)
            if args.pdb or getattr(shell, "call_pdb", False):  # --pdb, or IPython's %pdb on
                debugging.once_instead_of_ipython(self.shell)
                self._post_mortem("", quiet=True)
            if outcome.cancel_text:
                raise JobCancelled(outcome.cancel_text, outcome.failures, notes, partial=results)
            raise CellError(outcome.failures, notes, partial=results)
        for note in notes:
            listener.on_notice(note)
        if all(v is None for v in outcome.values) or cell.rstrip().endswith(";"):
            return None
        return value

    def _peek(self, args: argparse.Namespace, cell: str) -> Any:
        """%%ddp --peek: the cell on the ranks' peek threads, beside the running cell; its output and value here."""
        ranks = sorted(_ranks(args.ranks)) if args.ranks else None
        results = jobs.peek_results(self.session.peek(cell, ranks, args.timeout if args.timeout is not None else PEEK_TIMEOUT_S))
        if args.out:
            self.user_ns[args.out] = results
        return None if cell.rstrip().endswith(";") else results

    def _ddp_line(self, line: str) -> Any:
        args = _parse(_ddp_line, line, "%ddp")
        if args.help:
            print(self.ddp.__doc__)
            return None
        request = _pool_request(args)
        keeping.lost(self.session)  # another kernel took our kept pool (%ddp attach --force): say so, forget it
        if args.action in ("keep", "attach"):
            return keeping.keep(self.session, args) if args.action == "keep" else keeping.attach(self, args)
        if args.action in ("save", "load", "snapshots") or args.names or args.into:  # docs/snapshots.md
            return snapshotting.command(self.session, args, request)
        if args.action == "metrics":
            return metrics_data(self.session.metrics, args.df)
        if args.action == "output":
            return show_output(self.session, args.rank, args.cell)
        if args.action == "stacks":
            return print(self.session.stacks(sorted(_ranks(args.ranks)) if args.ranks else None, args.all_threads, args.native, args.timeout))
        if args.rank is not None or args.cell is not None:
            raise UsageError("%ddp: --rank and --cell go with output, e.g. %ddp output --rank 3")
        if args.ranks or args.all_threads or args.native or args.timeout is not None:
            raise UsageError("%ddp: --ranks, --all-threads, --native and --timeout go with stacks, e.g. %ddp stacks --ranks 0-3")
        if args.action in ("status", "log", "wait", "autoreload") and request:
            raise UsageError("%ddp: pool options need an action, e.g. %ddp restart -n 2 (or put them on a %%ddp cell)")
        if args.action == "autoreload" or args.target:
            return print(self.session.autoreload.set(args.action, args.target, IPython.__version__))
        if args.action == "stop":
            print(self.session.stop() or NO_POOL)
        elif args.action == "restart":
            spec = self.session.spec_for(**request) if request else None
            print(self.session.restart(spec, MagicListener(RankPrinter())).ready_text())
        elif args.action == "log":
            print(log_text())
        elif args.action == "wait":
            jobs.wait_all(self.jobs)
        else:
            self.session.refresh()  # a rank that died while idle shows as dead
            print(self.session.status().text())

    # ------------------------------------------------------------ %ddp_debug
    @line_magic
    def ddp_debug(self, line: str = "") -> None:
        """Post-mortem: pdb on a rank's traceback from the last failed %%ddp cell, as %debug does for a plain cell.

        examples:
          %ddp_debug                 the rank whose error explains the failure (the root cause)
          %ddp_debug 2               rank 2
        The frames stay on the rank until the next %%ddp cell or until you quit pdb. See docs/debugging.md.
        """
        self._post_mortem(line)

    def _post_mortem(self, line: str, quiet: bool = False) -> None:
        asking = jobs.asking(self.jobs) if not quiet else None  # a background rank waits for a line: answer it here
        if asking is not None:
            return debugging.attach(asking, line, debugging.kernel_ask())
        self.session.turns.check_idle("%ddp_debug runs on the ranks between cells")
        printer = RankPrinter()
        try:
            listener = MagicListener(printer, widget=False)
            listener.name_nodes(self.session.pool)  # [rank 3 n2] on a Slurm pool, as in the cell's output
            debugging.post_mortem(self.session.pool, self.last_failures, line, listener, debugging.kernel_ask(printer.flush), quiet)
        finally:
            printer.flush()

    # ------------------------------------------------------------ %ddp_env
    @line_magic
    @magic_arguments()
    @pool_arguments
    @argument("--json", action="store_true", help="return the report as a dict")
    @HELP_ARGUMENT
    def ddp_env(self, line: str) -> Any:
        """Show and check the env of every rank: planned (before a pool, or for the options given) or live (read from the workers).

        examples:
          %ddp_env -n 4              what 4 ranks would get, with every check
          %ddp_env                   what the running pool's ranks see
          env = %ddp_env --json      the same as a dict
        """
        args = _parse(self.ddp_env, line, "%ddp_env")
        if args.help:
            print(self.ddp_env.__doc__)
            return None
        request = _pool_request(args)
        spec = self.session.spec_for(**request) if request else None
        report = env_report(self.session.env(spec))
        return report.to_dict() if args.json else report

    # ------------------------------------------------------------ %ddp_export
    @line_magic
    @magic_arguments()
    @argument("path", nargs="?", default="train.py", help="the script to write (default train.py)")
    @argument("--cells", metavar="RANGE", help="export these cells (In [n] numbers), e.g. 3-9 or 2,4-6; the definitions they use come along")
    @argument("--n", dest="nproc", type=_positive_int, metavar="N", help="ranks in the launch line (default: the pool's)")
    @argument("--slurm", action="store_true", help="also write an sbatch file: srun torchrun on each node, c10d rendezvous")
    @argument("--nodes", type=_positive_int, metavar="N", help="nodes of the sbatch job (default: the pool's --nnodes)")
    @argument("--gpus-per-node", type=_positive_int, metavar="G", help="ranks (GPUs) per node of the sbatch job (default: ranks / nodes)")
    @argument("--accelerate", action="store_true", help="launch lines with accelerate launch instead of torchrun")
    @argument("--check", action="store_true", help="run the script under torchrun --standalone here and compare it with the cells")
    @HELP_ARGUMENT
    def ddp_export(self, line: str) -> None:
        """Write the %%ddp cells that ran, and the notebook definitions they used, as a script torchrun or Slurm runs.

        examples:
          %ddp_export train.py                 every %%ddp cell that ran, with the cells defining what they used
          %ddp_export train.py --cells 3-9     only these cells (definitions they use come along)
          %ddp_export train.py --slurm --nodes 2 --gpus-per-node 8     also train.sbatch (srun torchrun)
          %ddp_export train.py --check         run it under torchrun here and compare it with the cells
        See docs/export.md.
        """
        args = _parse(self.ddp_export, line, "%ddp_export")
        if args.help:
            print(self.ddp_export.__doc__)
            return
        from .export import check, write  # lazy: loading the extension stays light

        opts = write.ExportOptions(args.path, args.cells, args.nproc, args.slurm, args.nodes, args.gpus_per_node, args.accelerate)
        result = write.export_files(self.session.history.cells, opts)
        print(result.text())
        for warning in result.warnings:
            print(f"ddp_export: {warning}", file=sys.stderr)
        if args.check:
            report = check.run_check(result.script, len(result.expected.lines), result.expected, cwd=os.getcwd())
            if not report.ok:
                raise write.ExportError(report.text)
            print(report.text)
