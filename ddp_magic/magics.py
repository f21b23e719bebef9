"""The IPython layer: parse a magic's arguments, call the core, render. Nothing else lives here."""
from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any, List, Optional, Set

from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class

from .ui import labcomm
from .wire import namespace
from .wire import transfer
from .plan.plan import BACKENDS, PlanError, make_plan
from .errors import CellError, ShipError, UsageError
from .wire.execution import syntax_error_text
from .ui.output import RankPrinter, parse_ranks
from .kernel.pool import Listener, Pool, RankInfo
from .ui.report import live_report, plan_report
from .ui.results import RankResults

DDP_HELP = """Run the cell on N worker processes (ranks) with torch.distributed ready.

  %%ddp -n 4                 run on 4 ranks (starts the pool on first use; later cells may omit -n)
  %%ddp --ranks 0            show only rank 0's output (every rank still runs)
  %%ddp --timeout 60         stop the cell after 60 s, showing where every rank was
  %%ddp --out losses         also store the per-rank results in the notebook variable `losses`
  %%ddp --no-widget          no status widget above the output (DDP_MAGIC_WIDGET=0 in the env: never)
  %ddp status                the pool's ranks, pids and states
  %ddp restart [-n N]        restart the pool (fresh port, state on the workers is lost)
  %ddp stop                  stop every worker
  %ddp_env [-n N]            the env each rank will get (or sees, once the pool runs), with checks

The value of the cell's last expression comes back as a list indexed by rank
(tensors as CPU tensors). Names assigned in %%ddp cells live on the workers;
other names the cell uses are sent from the notebook (cloudpickle) each time.
"""


class _ArgParser(argparse.ArgumentParser):
    """argparse that raises a short UsageError instead of exiting the kernel."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}\nSee %ddp? for every option, with examples.")

    def exit(self, status: int = 0, message: Optional[str] = None) -> None:  # type: ignore[override]
        if message:
            raise UsageError(message)
        raise UsageError(self.format_help())


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} ranks makes no pool; give 1 or more")
    return value


def _port(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None


def _add_pool_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--nproc", type=_positive_int, help="number of ranks (processes)")
    p.add_argument("--backend", choices=BACKENDS, help="process-group backend (default auto: nccl with a GPU per rank, else gloo)")
    p.add_argument("--master-addr", help="MASTER_ADDR (default 127.0.0.1)")
    p.add_argument("--master-port", type=_port, help="MASTER_PORT (default: a free port)")
    p.add_argument("--no-init", action="store_true", help="do not call init_process_group before the first cell")
    p.add_argument("--start-method", choices=("auto", "fork", "spawn"), help="fork server (fast, Linux) or spawn")
    p.add_argument("--nnodes", type=_positive_int, help="spread the -n ranks over this many nodes (torchrun c10d rendezvous)")
    p.add_argument("--join-timeout", type=float, help="seconds to wait for every rank (and node) to join (default 180)")
    p.add_argument("--pg-timeout", type=float, help="seconds before a collective with a missing peer fails (default 300)")
    p.add_argument("--nccl-debug", choices=("WARN", "INFO", "TRACE"), help="set NCCL_DEBUG on the ranks (NCCL's own output appears per rank)")


def _cell_parser() -> _ArgParser:
    p = _ArgParser(prog="%%ddp", add_help=False)
    _add_pool_args(p)
    p.add_argument("--ranks", help="show output of these ranks only, e.g. 0 or 0,2-3")
    p.add_argument("--ordered", action="store_true", help="print output rank by rank when the cell ends (deterministic)")
    p.add_argument("--timeout", type=float, help="seconds before the cell is stopped (every rank's stack is shown)")
    p.add_argument("--out", help="also store the per-rank results in this notebook variable")
    p.add_argument("--restart", action="store_true", help="restart the pool before running the cell")
    p.add_argument("--gather", choices=("auto", "collective", "direct"), default="auto", help="how tensors come back")
    p.add_argument("--argv", help="sys.argv[1:] on the workers (default: --local_rank=LOCAL_RANK)")
    p.add_argument("--quiet", action="store_true", help="no notices from ddp_magic")
    p.add_argument("--no-widget", action="store_true", help=argparse.SUPPRESS)  # in DDP_HELP; kept out of the short usage line
    p.add_argument("-h", "--help", action="store_true")
    return p


def _line_parser() -> _ArgParser:
    p = _ArgParser(prog="%ddp", add_help=False)
    p.add_argument("action", nargs="?", choices=("status", "stop", "restart"), default="status")
    _add_pool_args(p)
    return p


def _env_parser() -> _ArgParser:
    p = _ArgParser(prog="%ddp_env", add_help=False)
    _add_pool_args(p)
    p.add_argument("--json", action="store_true", help="return the report as a dict")
    return p


def _split(line: str) -> List[str]:
    try:
        return shlex.split(line)
    except ValueError as e:
        raise UsageError(f"cannot read the arguments {line!r}: {e}") from None


class _MagicListener(Listener):
    def __init__(self, printer: RankPrinter, quiet: bool, view: Optional[Listener] = None) -> None:
        self.printer = printer
        self.quiet = quiet
        self.view = view  # the status widget (widget.StatusView), when shown

    def on_output(self, rank: int, stream: str, text: str) -> None:
        if self.view is not None:
            self.view.on_output(rank, stream, text)
        self.printer.feed(rank, stream, text)
        labcomm.changed()  # the JupyterLab extension's view, throttled; a no-op without it

    def on_notice(self, text: str) -> None:
        if self.view is not None:
            self.view.on_notice(text)
        if not self.quiet:
            print(f"ddp_magic: {text}", file=sys.stderr)
        labcomm.notice(text)

    def on_state(self, info: RankInfo) -> None:
        if self.view is not None:
            self.view.on_state(info)
        labcomm.changed()


@magics_class
class DDPMagics(Magics):
    """%%ddp, %ddp and %ddp_env. The pool and the owned-names set are this object's only state."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.pool: Optional[Pool] = None
        self.worker_owned: Set[str] = set()
        self._cells = 0  # names tracebacks' <ddp-cell-N>: unique even when the frontend stores no history
        self._generation = 0

    # ------------------------------------------------------------ pool lifecycle
    def _pool_options(self, args: argparse.Namespace) -> dict:
        opts = {}
        for key in ("backend", "master_addr", "master_port", "start_method", "nnodes"):
            if getattr(args, key, None) is not None:
                opts[key] = getattr(args, key)
        if getattr(args, "join_timeout", None) is not None:
            opts["start_timeout"] = args.join_timeout
        if getattr(args, "pg_timeout", None) is not None:
            opts["pg_timeout"] = args.pg_timeout
        if getattr(args, "nccl_debug", None):
            opts["extra_env"] = {"NCCL_DEBUG": args.nccl_debug}
        if args.no_init:
            opts["init"] = False
        return opts

    def _get_pool(self, args: argparse.Namespace, listener: Listener) -> Pool:
        opts = self._pool_options(args)
        pool = self.pool
        if pool is not None:
            changes = []
            if args.nproc is not None and args.nproc != pool.nproc:
                changes.append(f"-n {pool.nproc} → {args.nproc}")
            if "backend" in opts and opts["backend"] != "auto" and opts["backend"] != pool.backend:
                changes.append(f"backend {pool.backend} → {opts['backend']}")
            for key in ("master_addr", "master_port", "init", "extra_env"):
                if key in opts and opts[key] != pool.request.get(key):
                    changes.append(f"{key.replace('_', '-')} {pool.request.get(key)} → {opts[key]}")
            if opts.get("pg_timeout", pool.pg_timeout) != pool.pg_timeout:
                changes.append(f"pg-timeout {pool.pg_timeout:g} → {opts['pg_timeout']:g}")
            if opts.get("nnodes", pool.nnodes) != pool.nnodes:
                changes.append(f"nodes {pool.nnodes} → {opts['nnodes']}")
            if "start_method" in opts and opts["start_method"] != pool.start_method:
                changes.append(f"start method {pool.start_method} → {opts['start_method']}")
            if not changes:
                return pool
            nproc = args.nproc or pool.nproc
            new = self._new_pool(nproc, opts)  # validated before the old pool goes
            listener.on_notice("restarting the pool (" + ", ".join(changes) + "); variables defined in earlier %%ddp cells are gone")
            pool.stop()
            self.pool = new
            self.worker_owned.clear()
            return new
        if args.nproc is None:
            raise UsageError("no pool is running yet: give the number of ranks on the first cell, e.g. %%ddp -n 2")
        self.pool = self._new_pool(args.nproc, opts)
        return self.pool

    @staticmethod
    def _new_pool(nproc: int, opts: dict) -> Pool:
        try:
            pool = Pool(nproc, **opts)
        except PlanError as e:
            raise UsageError(str(e)) from None
        _warm_torch_import()
        return pool

    def _next_label(self) -> int:
        self._cells += 1
        return self._cells

    # ------------------------------------------------------------ %%ddp / %ddp
    @line_cell_magic
    def ddp(self, line: str, cell: Optional[str] = None) -> Any:
        if cell is None:
            return self._ddp_line(line)
        args = _cell_parser().parse_args(_split(line))
        if args.help:
            print(DDP_HELP)
            return None
        return self._run_cell(args, cell)

    ddp.__doc__ = DDP_HELP

    def _run_cell(self, args: argparse.Namespace, cell: str) -> Any:
        filename = "<ddp-cell>"
        try:
            compile(cell, filename, "exec", dont_inherit=True)
            needed = namespace.names_to_ship(cell, filename, self.shell.user_ns, self.worker_owned)
        except SyntaxError as e:
            raise UsageError("SyntaxError in the cell; nothing was run:\n" + syntax_error_text(e)) from None
        blobs, failure = transfer.dumps_names(needed)
        if failure:
            name, why = failure
            raise ShipError(
                f"cannot send the notebook variable {name!r} to the workers ({why}).\n"
                f"Create it inside the %%ddp cell instead, or make it picklable (cloudpickle)."
            )
        printer = RankPrinter(parse_ranks(args.ranks) if args.ranks else None, ordered=args.ordered)
        listener = _MagicListener(printer, args.quiet)
        pool = self._get_pool(args, listener)
        if args.ranks:
            try:
                parse_ranks(args.ranks, pool.nproc)
            except ValueError as e:
                raise UsageError(str(e)) from None
        from .ui.status import show_status  # lazy: ipywidgets is imported when a cell first runs

        view = listener.view = show_status(pool, enabled=not args.no_widget)  # above any output of the ranks
        outcome = None
        try:
            if args.restart and pool.started:
                pool.restart(listener)
                self.worker_owned.clear()
                listener.on_notice("restarted the pool; variables defined in earlier %%ddp cells are gone")
            generation = pool.generation
            try:
                outcome = pool.run(cell, blobs, listener=listener, timeout=args.timeout, gather=args.gather, argv=_argv(args.argv), label=str(self._next_label()), owned=self.worker_owned)
            finally:
                printer.flush()
        except BaseException as e:
            if view is not None:
                view.finish(None, e)
            raise
        if view is not None:
            view.finish(outcome)
        if pool.generation != generation:
            self.worker_owned.clear()
        if outcome.state_lost:
            self.worker_owned.clear()
        else:
            self.worker_owned |= namespace.assigned_globals(cell, filename)
        results = RankResults(outcome.values)
        if args.out:
            self.shell.user_ns[args.out] = results
        if outcome.failures:
            raise CellError(outcome.failures, outcome.notes, partial=results)
        for note in outcome.notes:
            listener.on_notice(note)
        if all(v is None for v in outcome.values) or cell.rstrip().endswith(";"):
            return None
        return results

    def _ddp_line(self, line: str) -> Any:
        args = _line_parser().parse_args(_split(line))
        if args.action == "status" and any(v not in (None, False) for k, v in vars(args).items() if k != "action"):
            raise UsageError("%ddp: pool options need an action, e.g. %ddp restart -n 2 (or put them on a %%ddp cell)")
        listener = _MagicListener(RankPrinter(), False)
        if args.action == "stop":
            if self.pool is None:
                print("no pool is running")
                return None
            self.pool.stop()
            self.pool = None
            self.worker_owned.clear()
            print("stopped the pool; its workers have exited")
            return None
        if args.action == "restart":
            if self.pool is None:
                if args.nproc is None:
                    raise UsageError("no pool to restart: start one with %%ddp -n N, or give -n here")
                self._get_pool(args, listener).start(listener)
            else:
                pool = self._get_pool(args, listener)
                pool.restart(listener) if pool.started else pool.start(listener)
            self.worker_owned.clear()
            pool = self.pool
            assert pool is not None
            print(f"pool of {pool.nproc} ({pool.backend}) ready in {pool.start_seconds:.2f}s, pids {pool.pids}")
            return None
        return self.status()

    def status(self) -> str:
        pool = self.pool
        if pool is None or not pool.started:
            text = "no pool is running; start one with %%ddp -n N"
        else:
            rows = [f"pool of {pool.nproc} rank(s), backend {pool.backend}, MASTER_PORT {pool.plan.master_port}" + (f" — needs restart: {pool.broken}" if pool.broken else "")]
            for r in sorted(pool.ranks):
                i = pool.ranks[r]
                rows.append(f"  rank {r}: pid {i.pid}  {i.state:<11} {i.device}")
            if self.worker_owned:
                rows.append("names on the workers: " + ", ".join(sorted(self.worker_owned)))
            text = "\n".join(rows)
        print(text)
        return None

    # ------------------------------------------------------------ %ddp_env
    @line_magic
    def ddp_env(self, line: str) -> Any:
        """Show and check the env of every rank: planned (before a pool) or live (read from the workers).

        %ddp_env -n 4 [--backend B] [--master-addr A] [--master-port P] [--json]
        """
        args = _env_parser().parse_args(_split(line))
        pool = self.pool
        planning = args.nproc is not None or pool is None or not pool.alive or any(v is not None for v in (args.backend, args.master_addr, args.master_port))
        if planning:
            nproc = args.nproc or (pool.nproc if pool else None)
            if nproc is None:
                raise UsageError("no pool is running: give the number of ranks to plan for, e.g. %ddp_env -n 4")
            try:
                plan = make_plan(nproc, strict=False, **{k: v for k, v in self._pool_options(args).items() if k not in ("start_method", "nnodes", "start_timeout", "pg_timeout")})
            except PlanError as e:
                raise UsageError(str(e)) from None
            report = plan_report(plan)
        else:
            assert pool is not None
            report = live_report(pool.live_env(), pool.nproc, pool.backend)
        if args.json:
            return report.to_dict()
        return report


def _warm_torch_import() -> None:
    """Results (tensors) unpickle in the kernel, which then needs torch: import it in the
    background while the ranks start, instead of making the first result wait ~2 s."""
    if "torch" in sys.modules:
        return
    import os
    import threading

    def _import() -> None:
        if sys.platform.startswith("linux"):  # elsewhere a thread id is no pid: never renice another process
            try:
                # Linux nice is per thread: on few cores the template's own import of torch,
                # which every rank waits for, goes first.
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
            except OSError:
                pass
        try:
            import torch  # noqa: F401
        except Exception:
            pass

    threading.Thread(target=_import, name="ddp-warm-torch", daemon=True).start()


def _argv(text: Optional[str]) -> Optional[List[str]]:
    if text is None:
        return None
    return ["ddp_cell"] + shlex.split(text)
