"""The metrics chart of one %%ddp cell: hears ``ddp_magic.log`` rows, shows them live, leaves a static picture.

The magics' listener passes ``on_metrics`` here. While the cell runs the chart is
redrawn at most once per ``interval`` (a trailing timer draws the last rows of a
burst): into the status view, when it offers a section for it (``live_html``), and
to the JupyterLab panel (ui/labcomm.py's ``metrics`` message). When the cell ends,
``finish`` displays the saved chart (ui/metrics_chart.py: text/html that survives an
untrusted notebook's sanitizer, each metric an <img> of an SVG; the headline and the
table as text/plain) as the cell's own output, after what the ranks printed: the saved
notebook, nbviewer and nbval all see that one bundle, which is never updated in place.
With ``--profile`` the cell's metrics carry the profile's straggler by then
(kernel/results/profile_merge.py), so the chart and the profile's table name the same rank.
A cell that logged nothing shows nothing.
"""
from __future__ import annotations

import contextvars
import html
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..errors import UsageError
from ..kernel import Listener
from ..kernel.results.metrics import CellMetrics
from ..logs import log
from . import labcomm
from .metrics_chart import FONT, MUTED, bundle, chart_html, headline

Publish = Callable[[Dict[str, Any], bool], None]


class MetricsView(Listener):
    """The live chart of one cell (``interval``: seconds between two redraws)."""

    def __init__(self, interval: float = 1.0, publish: Publish = labcomm.metrics, display: Optional[Callable[..., Any]] = None,
                 on_redraw: Optional[Callable[[], None]] = None, cell: str = "") -> None:
        self.data = CellMetrics(cell)  # its label (the cell's In [n]) goes with each live message: the panel tells cells apart by it
        self.interval = interval
        self.publish = publish
        self._display = display
        self.on_redraw = on_redraw  # the status view's "render me" (its section reads live_html)
        self.html = ""
        self.text = ""
        self.redraws = 0
        self.shown = False
        self._last = float("-inf")
        self._timer: Optional[threading.Timer] = None
        self._lock = threading.RLock()
        self._finished = False
        self._view: Any = None  # the status view, until the chart goes into it

    def on_metrics(self, rank: int, rows: List[Tuple[int, float, Dict[str, float]]]) -> None:
        with self._lock:
            self.data.add(rank, rows)
            if self._finished:
                return
            wait = self._last + self.interval - time.monotonic()
            if wait <= 0:
                self.redraw()
            elif self._timer is None:
                ctx = contextvars.copy_context()  # comm messages keep the cell as their parent
                self._timer = threading.Timer(wait, ctx.run, args=(self._on_timer,))
                self._timer.daemon = True
                self._timer.start()

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None
            if not self._finished:
                self.redraw()

    def redraw(self) -> None:
        """Draw the live chart now: the status view's section and the JupyterLab panel."""
        try:
            with self._lock:
                self._last = time.monotonic()
                payload = self.data.payload()
                self.html = chart_html(payload, live=True)
                self.text = headline(payload)
                self.redraws += 1
                self._into_view()
            if self.on_redraw is not None:
                self.on_redraw()
            self.publish(payload, False)
        except Exception:  # the chart is never worth failing a cell for
            log.debug("the metrics chart could not be redrawn", exc_info=True)

    def live_html(self) -> str:
        """The live chart ('' until something was logged)."""
        return self.html

    def attach(self, view: Any) -> None:
        """Show the live chart as an extra section of the cell's status view (ui/status_view.py ``sections``),
        from the first row logged on: a cell that logs nothing keeps its view as it was."""
        self._view = view if isinstance(getattr(view, "sections", None), list) else None

    def _into_view(self) -> None:
        view, self._view = self._view, None
        if view is not None:
            view.sections.append(("Metrics", self._section_html, self._section_text))
            self.on_redraw = getattr(view, "changed", None)

    def _section_html(self, snapshot: Any) -> str:
        if not self.html:
            return ""
        if getattr(snapshot, "finished", False):  # the static chart follows the cell's output: no second copy here
            return f"<div style='{FONT};color:{MUTED}'>{html.escape(self.text)}: the chart is below the cell's output</div>"
        return self.html

    def _section_text(self, snapshot: Any) -> List[str]:
        return [self.text] if self.text else []

    def finish(self, store: Optional[CellMetrics] = None) -> None:
        """The cell ended: the static chart as the cell's output (``store``: the session's complete copy)."""
        with self._lock:
            self._finished = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        data = store if store is not None else self.data
        if not data:
            return
        try:
            payload = data.payload()
            self._put(bundle(payload))
            self.shown = True
            self.publish(payload, True)
        except Exception:
            log.debug("the metrics chart could not be shown", exc_info=True)

    def _put(self, data: Dict[str, str]) -> None:
        if self._display is not None:
            self._display(data, raw=True)
            return
        from IPython.display import display

        display(data, raw=True)


def metrics_data(store: Optional[CellMetrics], df: bool = False) -> Any:
    """``%ddp metrics``: the rows of the last cell that logged any, as a dict of lists or (``--df``) a DataFrame."""
    store = store if store is not None else CellMetrics()
    if not df:
        return store.columns()
    try:
        return store.frame()
    except ImportError as e:
        raise UsageError(str(e)) from None
