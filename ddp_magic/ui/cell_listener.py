"""What a %%ddp cell shows while it runs: rank-prefixed output, notices (on stdout), the status view, the chart, the lab panel.

One listener per cell (the magics make it, foreground or background alike): the pool's
events reach it on whichever thread drives the cell, and everything it shows goes to the
cell that started it (a background cell's thread runs in that cell's context, ui/jobs.py).
"""
from __future__ import annotations

import contextvars
import threading
import time
from typing import Any, Optional, Sequence

from ..errors import UsageError
from ..kernel import RankInfo
from ..kernel.pool import Pool
from ..kernel.jobs.turns import Ticket
from ..session import CellListener
from . import labcomm
from .metrics_view import MetricsView
from .output import RankPrinter, parse_ranks


class MagicListener(CellListener):
    """What a cell shows while it runs: rank-prefixed output, notices (on stdout), the status view, the lab panel."""

    def __init__(self, printer: RankPrinter, quiet: bool = False, ranks: Optional[str] = None, widget: bool = True, cell: str = "") -> None:
        self.printer = printer
        self.quiet = quiet
        self.ranks = ranks
        self.widget = widget
        self.view: Optional[Any] = None  # the status view (ui/status.StatusView), once shown
        self.metrics = MetricsView(cell=cell)  # ddp_magic.log's live chart (labelled with the cell's In [n]), its static picture at the end
        self.slurm = False  # a Slurm pool: prefixes name each rank's node
        self.queued_notice = ""  # "queued behind cell [16], …" while this cell waits its turn; withdrawn when it comes
        self.ended = False

    def on_pool(self, pool: Pool) -> None:
        if self.queued_notice:  # the turn came: the panel's "queued behind …" is no longer true (the cell's own line stays)
            labcomm.notice(self.queued_notice, withdraw=True)
            self.queued_notice = ""
        if self.ranks:
            try:
                parse_ranks(self.ranks, pool.nproc)  # the magic checked the form; this checks them against the pool
            except ValueError as e:
                raise UsageError(str(e)) from None
        from .status import show_status  # lazy: ipywidgets is imported when a cell first runs

        if not pool.started and threading.current_thread() is not threading.main_thread():
            self._announce_start(pool)
        self.view = show_status(pool, enabled=self.widget)  # above any output of the ranks
        self.metrics.attach(self.view)  # ddp_magic.log's live chart: a section of the view
        self.printer.world = pool.nproc  # a stderr line every rank sent is shown once, at once
        self.slurm = pool.spec.over_hosts

    def _announce_start(self, pool: Pool) -> None:
        """A background job's pool starts on the job's thread while the notebook is idle: no cell's watcher (labcomm)
        sends the start's snapshots, so the status bar and the panel would show nothing, then a clock from nowhere.
        This asks for one each interval until the pool has started or the cell ended (in the cell's context)."""
        def watch() -> None:
            while not pool.started and not self.ended:
                labcomm.changed()
                time.sleep(labcomm.MIN_INTERVAL)
            labcomm.changed()

        threading.Thread(target=contextvars.copy_context().run, args=(watch,), name="ddp_magic-start-watch", daemon=True).start()

    def name_nodes(self, pool: Optional[Pool]) -> None:
        """Name each rank's Slurm node in its prefix from the start (a post-mortem hears no on_state first)."""
        if pool is not None and pool.spec.over_hosts:
            self.slurm = True
            self.printer.nodes.update({r: i.node_name for r, i in pool.ranks.items() if i.node_name})

    def on_output(self, rank: int, stream: str, text: str) -> None:
        if self.view is not None:
            self.view.on_output(rank, stream, text)
        self.printer.feed(rank, stream, text)
        labcomm.changed()  # the JupyterLab extension's view, throttled; a no-op without it

    def on_notice(self, text: str) -> None:
        if self.view is not None:
            self.view.on_notice(text)
        if not self.quiet:
            print(f"ddp_magic: {text}")  # a notice is not an error: stdout, in order with the ranks' lines
        labcomm.notice(text)

    def on_state(self, info: RankInfo) -> None:
        self.on_states((info,))

    def on_states(self, infos: Sequence[RankInfo]) -> None:
        if self.view is not None:
            self.view.on_states(infos)
        for info in infos if self.slurm else ():
            if info.node_name:
                self.printer.nodes[info.rank] = info.node_name  # [rank 5 n2]: the node it runs on
        labcomm.changed()

    def on_metrics(self, rank: int, rows: Any) -> None:
        self.metrics.on_metrics(rank, rows)
        labcomm.changed()  # the panel's "step 4,120" of a background cell, throttled; a no-op without it

    def finish(self, outcome: Any = None, error: Optional[BaseException] = None, metrics: Any = None) -> None:
        self.ended = True
        if self.queued_notice:  # taken out of the queue before its turn: it waits no more
            labcomm.notice(self.queued_notice, withdraw=True)
            self.queued_notice = ""
        if self.view is not None:
            self.view.finish(outcome, error)
        self.metrics.finish(metrics)  # the session's copy: complete, and labelled with the cell

    def on_queued(self, holder: Ticket) -> None:
        self.queued_notice = f"queued behind {holder.name}, which runs on the pool now; this cell starts when it ends (Ctrl-C takes it out of the queue)"
        self.on_notice(self.queued_notice)
