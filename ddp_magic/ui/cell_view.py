"""What a ``%%ddp`` cell shows while it runs: rank-prefixed output, notices on stderr, the status view, the lab panel.

The magics (magics.py) hand one ``CellView`` to the session for each cell; it only
presents what the pool tells it (the Listener calls) and holds no logic of its own.
"""
from __future__ import annotations

import sys
from typing import Any, Optional

from ..errors import UsageError
from ..kernel import RankInfo
from ..kernel.pool import Pool
from ..session import CellListener
from . import labcomm
from .metrics_view import MetricsView
from .output import RankPrinter, parse_ranks


def _check_ranks(text: str, world: int) -> None:
    """--ranks names ranks the pool has (a bad one is a UsageError before the cell runs)."""
    try:
        parse_ranks(text, world)
    except ValueError as e:
        raise UsageError(str(e)) from None


class CellView(CellListener):
    """What a cell shows while it runs: rank-prefixed output, notices on stderr, the status view, the lab panel."""

    def __init__(self, printer: RankPrinter, quiet: bool = False, ranks: Optional[str] = None, widget: bool = True) -> None:
        self.printer = printer
        self.quiet = quiet
        self.ranks = ranks
        self.widget = widget
        self.view: Optional[Any] = None  # the status view (ui/status.StatusView), once shown
        self.metrics = MetricsView()  # ddp_magic.log's live chart, and its static picture when the cell ends
        self.slurm = False  # a Slurm pool: prefixes name each rank's node

    def on_pool(self, pool: Pool) -> None:
        if self.ranks:
            _check_ranks(self.ranks, pool.nproc)
        from .status import show_status  # lazy: ipywidgets is imported when a cell first runs

        self.view = show_status(pool, enabled=self.widget)  # above any output of the ranks
        self.metrics.attach(self.view)  # ddp_magic.log's live chart: a section of the view
        self.printer.world = pool.nproc  # a stderr line every rank sent is shown once, at once
        self.slurm = pool.spec.slurm is not None

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
        if info.node_name and self.slurm:
            self.printer.nodes[info.rank] = info.node_name  # [rank 5 n2]: the node it runs on
        if self.view is not None:
            self.view.on_state(info)
        labcomm.changed()

    def on_metrics(self, rank: int, rows: Any) -> None:
        self.metrics.on_metrics(rank, rows)

    def finish(self, outcome: Any = None, error: Optional[BaseException] = None, metrics: Any = None) -> None:
        if self.view is not None:
            self.view.finish(outcome, error)
        self.metrics.finish(metrics)  # the session's copy: complete, and labelled with the cell
