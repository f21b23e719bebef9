"""The status view of a ``%%ddp`` cell: a pool Listener that only presents.

It hears the pool's events (``on_state``, ``on_output``, ``on_notice``) and
shows, for each rank, its state, elapsed time, device, pid, exit code or
signal, last printed line and GPU memory, plus the env each rank received and
the plan's checks. It decides nothing: the pool decides, the view shows.
What it says comes from status_render.py (pure functions of a ``Snapshot``);
where it goes, from status_display.py (widget, html, text or off, chosen once).

Never the only copy of anything: the cell's output stays in its streams and
its result. The display bundle carries ``text/html`` beside the widget, and
when the cell ends it is replaced (update_display) by that static form alone:
the same one-line summary with the rank table and the env checks behind
``<details>``. Saved notebooks, nbviewer, GitHub and a reloaded JupyterLab
show it without widget state; plain IPython gets the summary as text. nbval
sees the first bundle (no display updates), whose HTML holds timings and pids: strict nbval runs sanitise
it (``(?s)<div class='ddp-status'.*``) or turn the view off (``--no-widget``, ``DDP_MAGIC_WIDGET=0``).

Updates are throttled: events only mark the view dirty. A change of state is
rendered at most once per ``min_interval`` (default 0.2 s); printed lines alone
(the "last line" column) at most once per ``refresh`` (default 1 s). The live
clock moves at the precision it shows (status_render.fmt_clock: tenths): while a
rank is active, every ``clock_tick`` (default 0.1 s) the display sends the
one-line header alone (one small widget message; a display that cannot, html mode,
keeps the refresh pace). Each render is a couple of widget messages, sent by the
event that finds its interval elapsed or by the kernel's one ticker thread
(ticker.py) that sleeps until the next render is due. ``finish()`` always renders
the final state.
"""
from __future__ import annotations

import functools
import sys
import threading
import time
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, TypeVar, cast

from ..kernel import Listener, RankInfo
from ..kernel.failures.blame import causes
from ..logs import log
from ..plan import Check, Plan
from ..states import RankState
from . import quiet_display
from . import status_render as R
from . import status_tables as T
from .progress import LiveLines
from .status_display import Bundle, make_display
from .status_facts import PlanFacts
from .status_labels import LabelChanges
from .ticker import TICKER

# Extra sections of every view (e.g. a metrics chart): each factory gets the new view and returns a
# status_render.Section, or None when it has nothing to show for this cell. A section whose data
# changes calls ``view.changed()``; the view renders it (throttled) in the live body and in the static form.
SECTION_FACTORIES: List[Callable[["StatusView"], Optional[R.Section]]] = []

F = TypeVar("F", bound=Callable[..., Any])
CLOCK_TICK = 0.1  # seconds between two moves of the live clock: it shows tenths (status_render.fmt_clock)


def _guarded(method: F) -> F:
    """A view's work that must never break the cell: the first error stops the view, never the cell."""

    @functools.wraps(method)
    def run(self: "StatusView", *args: Any) -> Any:
        if self._error:
            return None
        try:
            return method(self, *args)
        except Exception as e:
            log.debug("the status view failed in %s", method.__name__, exc_info=True)
            self._fail(e)
            return None

    return cast(F, run)


def _says(render: Callable[[R.Snapshot], str]) -> Callable[["StatusView"], str]:
    """A method of the view that renders its snapshot now with one of status_render's functions."""

    def method(self: "StatusView") -> str:
        return render(self.snapshot())

    method.__name__, method.__doc__ = render.__name__, render.__doc__
    return method


class StatusView(PlanFacts, Listener):
    """Live per-rank status of one %%ddp cell; ``mode`` is widget, html, text or off (see status_display.py)."""

    def __init__(
        self,
        nproc: int,
        plan: Optional[Plan] = None,
        *,
        pool: Any = None,
        mode: str = "widget",
        min_interval: float = 0.2,
        refresh: float = 1.0,
        clock_tick: float = CLOCK_TICK,
        live_after: float = 0.3,
        ticker: bool = True,
        clock: Callable[[], float] = time.monotonic,
        display: Optional[Callable[..., Any]] = None,
        update_display: Optional[Callable[..., Any]] = None,
        checks: Optional[Sequence[Check]] = None,
    ) -> None:
        self.nproc = nproc
        self._plan = plan
        self._pool = pool
        self.mode = mode
        self.display = make_display(mode, self)
        self.min_interval = min_interval
        self.refresh = refresh
        self.clock_tick = clock_tick
        self.live_after = live_after
        self.use_ticker = ticker
        self.clock = clock
        self._display_fn = display
        self._update_fn = update_display
        self._fixed_checks = list(checks) if checks is not None else None  # the plan's facts: status_facts.PlanFacts
        self.infos: Dict[int, RankInfo] = {}
        self.history = LabelChanges()  # (rank, label) each time a rank's shown state changed
        self.notices: List[str] = []
        self.renders = 0  # how many times the live view was re-rendered (each sends at most a few widget messages)
        self.clock_renders = 0  # how many times the live clock alone moved (the header line alone is sent)
        self.finished = False
        self.result_ok: Optional[bool] = None
        self.result_note = ""
        self.elapsed_final: Optional[float] = None
        self.started_in: Optional[float] = None
        self._labels: Dict[int, R.Label] = {}
        self.started_at = clock()
        self._run_t0: Optional[float] = None
        self._dirty = False  # a state or notice changed: render within min_interval
        self._dirty_output = False  # only printed lines changed: render within refresh
        self._last_render = float("-inf")
        self._ticker_told = False  # the ticker was woken for the pending render (render() clears it)
        self._last_clock = float("-inf")  # the header (and its clock) was last sent then: by a render or a clock tick
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._display_id: Optional[str] = None
        self.shown = False
        self._error: Optional[str] = None
        self._attach()
        if pool is not None and getattr(pool, "started", False):
            self.infos.update(getattr(pool, "ranks", {}) or {})  # a running pool: its ranks as they are now (labelled as they change)

    # ------------------------------------------------------------ facts
    def _attach(self) -> None:
        """The live lines, the root cause and the extra sections: what the view adds to the pool's own facts."""
        self.live_lines = LiveLines()  # each rank's line now and its tqdm bar, from its raw output
        self.root: Optional[int] = None  # the rank whose failure explains the others
        self.stopped: FrozenSet[int] = frozenset()  # ranks stopped or released because of it, once the cell ended
        self.timed_out: FrozenSet[int] = frozenset()  # root causes of a --timeout: the ranks the others waited for
        self.sections: List[R.Section] = [sec for sec in (f(self) for f in SECTION_FACTORIES) if sec is not None]

    def label(self, rank: int) -> R.Label:
        info = self.infos.get(rank)
        return R.state_label(info) if info is not None else RankState.STARTING

    def start_seconds(self) -> Optional[float]:
        """How long the pool took to start in this cell: the pool's own measure (its first start's), or the ranks' own."""
        measured = getattr(self._pool, "start_seconds", None) if self.started_in is not None and not self.history.restarted(self.nproc) else None
        return measured if isinstance(measured, (int, float)) else self.started_in

    def elapsed(self) -> float:
        """The run clock: from the cell reaching the ranks (0 before), the same definition everywhere."""
        if self.elapsed_final is not None:
            return self.elapsed_final
        return self.clock() - self._run_t0 if self._run_t0 is not None else 0.0

    def starting_for(self) -> Optional[float]:
        """The start clock while the pool starts for this cell (None once the cell runs, or with a pool up): the pool's
        own (``Pool.start_began``; the status bar's and the panel's too, ui/labsnap.py), 0 until the start begins."""
        if self._run_t0 is not None or self.finished:
            return None
        if not any(self.label(r) in (RankState.QUEUED, RankState.STARTING, RankState.CONNECTING) for r in R.all_ranks(self.nproc, self.infos)):
            return None
        began = getattr(self._pool, "start_began", None) if self._pool is not None else self.started_at  # no pool: a test's view
        return max(0.0, self.clock() - began) if isinstance(began, (int, float)) else 0.0

    def snapshot(self) -> R.Snapshot:
        """What the view shows now, for the renderer."""
        return R.Snapshot(
            nproc=self.nproc,
            infos=dict(self.infos),
            now=self.clock(),
            elapsed=self.elapsed(),
            backend=self.backend,
            checks=self.checks,
            envs=self._rank_envs(), planned=self._pool is not None and not getattr(self._pool, "started", False),
            notices=list(self.notices),
            finished=self.finished,
            ok=bool(self.result_ok),
            note=self.result_note,
            started_in=self.start_seconds(), restarted=self.history.restarted(self.nproc) if self.started_in is not None else (),
            starting_for=self.starting_for(),
            root=self.root,
            stopped=self.stopped, timed_out=self.timed_out,
            lines=dict(self.live_lines.lines),
            bars=dict(self.live_lines.bars) if not self.finished else {},
            sections=list(self.sections), kept=getattr(getattr(self._pool, "kept", None), "text", str)(),  # a kept pool's lease
        )

    # ------------------------------------------------------------ listener events
    def on_state(self, info: RankInfo) -> None:
        self.on_states((info,))

    @_guarded
    def on_states(self, infos: Sequence[RankInfo]) -> None:
        known, labels, label_of = self.infos, self._labels, R.state_label  # 2,048 ranks' changes a cell at scale
        for info in infos:
            known[info.rank] = info
            label = label_of(info)
            if labels.get(info.rank) != label:
                labels[info.rank] = label
                self.history.append(info.rank, label)
            if self.root is None and label in R.ROOT_CAUSES:
                self.root = info.rank
            if label == RankState.RUNNING and self._run_t0 is None:
                self._run_t0 = info.started if info.started else self.clock()
            if label == RankState.READY:
                self.started_in = max(self.started_in or 0.0, info.elapsed)
        self._changed()

    @_guarded
    def on_output(self, rank: int, stream: str, text: str) -> None:
        self.live_lines.feed(rank, stream, text)
        if self.shown and self._display_id is None and self.display.live:  # stay above the ranks' output
            self._display_id = getattr(self._put(self.display.placeholder()), "display_id", None)
        self._changed(urgent=False)

    def changed(self) -> None:
        """Something an extra section shows changed: render it within the refresh interval."""
        self._changed(urgent=False)

    @_guarded
    def on_notice(self, text: str) -> None:
        self.notices.append(text)
        self._changed()

    def _fail(self, e: BaseException) -> None:
        """The view broke: stop updating it, never the cell."""
        self._error = f"{type(e).__name__}: {e}"
        self._stop.set()
        TICKER.remove(self)
        try:
            print(f"ddp_magic: the status view stopped updating ({self._error})", file=sys.stderr)
        except Exception:
            log.debug("could not say that the status view stopped", exc_info=True)

    # ------------------------------------------------------------ throttling
    def _changed(self, urgent: bool = True) -> None:
        if urgent:
            self._dirty = True
        else:
            self._dirty_output = True
        if not self.shown or not self.display.live or (self._ticker_told and self.use_ticker):
            return  # the ticker renders whatever is dirty by then: nothing to work out per rank's change (2,048 a cell at scale)
        if self.clock() - self._last_render >= (self.min_interval if self._dirty else self.refresh):
            self.render()
        elif urgent:
            self._ticker_told = True  # once per pending render, not once per rank's change
            if not self.display.holds():  # a held display's own moment (display.due) is the one the ticker sleeps until
                TICKER.wake()  # the ticker may be sleeping until a later moment

    def render(self) -> None:
        """Bring the page up to date now (the display may hold it back: the view stays dirty then)."""
        with self._lock:
            if self._error or not self.shown or self.display.holds():
                return
            self._dirty = self._dirty_output = self._ticker_told = False
            self._last_render = self._last_clock = self.clock()
            self.renders += 1
            self.display.render()

    def _ticking(self) -> bool:
        """Whether the live clock moves between renders: a display that sends the header alone, a rank active."""
        if not self.display.ticks_clock or self.finished or not self.shown or self.display.holds():
            return False
        return any(self.label(r) in R.ACTIVE for r in R.all_ranks(self.nproc, self.infos))

    def _next_render(self) -> float:
        """When the ticker must render everything next (the view's clock): the display's own moment (the widget
        going live), a held-back change of state, or the once-a-refresh move of last lines (and of the clock, on a
        display that cannot send the header alone)."""
        due = self.display.due()
        if due is not None:
            return due  # the display renders then, with whatever is held back
        if self._dirty:
            return self._last_render + self.min_interval
        if self._dirty_output or (not self.display.ticks_clock and any(self.label(r) in R.ACTIVE for r in R.all_ranks(self.nproc, self.infos))):
            return self._last_render + self.refresh  # new lines, or a clock only a whole render moves
        return self.clock() + self.refresh  # nothing else moves (the clock ticks alone): look again later

    def next_render(self) -> float:
        """The ticker's next moment: the next render, or sooner the next move of the live clock."""
        due = self._next_render()
        if self._ticking():
            due = min(due, self._last_clock + self.clock_tick)
        return due

    @_guarded
    def tick(self) -> None:
        """The shared ticker (ticker.py) found a render (or a move of the clock) due."""
        with self._lock:  # finish() sets _stop under the same lock
            if self._stop.is_set():
                return
            now = self.clock()
            if now >= self._next_render():
                self.render()
            elif self._ticking() and now >= self._last_clock + self.clock_tick:
                self._last_clock = now
                self.clock_renders += 1
                self.display.render_clock()

    # ------------------------------------------------------------ display
    def show(self) -> "StatusView":
        """Put the view at the top of the cell's output (before any rank prints)."""
        if self.shown:
            return self
        first = self.display.first_bundle()
        if first is not None:
            handle = self._put(first)
            self._display_id = getattr(handle, "display_id", None)
        self.shown = True
        if self.display.live:
            self._last_render = self.clock()
            if self.use_ticker:
                TICKER.add(self)  # renders in this context: comm messages keep the cell as their parent
        return self

    def finish(self, outcome: Any = None, error: Optional[BaseException] = None) -> None:
        """The cell ended: render the final state, collapse to the one-line summary, leave a static copy."""
        with self._lock:  # a tick renders under the lock too: once this holds, no tick renders again
            self._stop.set()
        TICKER.remove(self)
        if self.finished:
            return
        self.finished = True
        self.result_ok, self.result_note = R.verdict(outcome, error)
        self.root = R.root_rank(outcome) if outcome is not None else self.root
        self.stopped, self.timed_out = R.by_cause(causes(list(getattr(outcome, "failures", None) or [])))
        if outcome is not None:
            self.elapsed_final = getattr(outcome, "elapsed", None)
        if self.elapsed_final is None:
            self.elapsed_final = self.clock() - self._run_t0 if self._run_t0 is not None else 0.0
        self._settle()

    @_guarded
    def _settle(self) -> None:
        self.display.finish()

    def _put(self, bundle: Bundle) -> Any:
        if self._display_fn is not None:
            return self._display_fn(bundle, raw=True, display_id=True)
        return quiet_display.display(bundle)  # IPython's display, without an idle stream's flush

    def put(self, bundle: Bundle) -> None:
        """Display a bundle of its own (not the one updated in place)."""
        self._put(bundle)

    def replace(self, bundle: Bundle) -> None:
        """Replace what the view put at the top of the cell; the first time, put it there (a quick cell's one message)."""
        if not self.shown:
            return
        if self._display_id is None:
            self._display_id = getattr(self._put(bundle), "display_id", None)
            return
        if self._update_fn is not None:
            self._update_fn(bundle, raw=True, display_id=self._display_id)
            return
        quiet_display.display(bundle, self._display_id, update=True)

    def bundle(self, widget: bool = True) -> Bundle:
        """The display bundle: the widget (while the cell runs) and its static HTML form.

        No text/plain on purpose: a cell's text/plain results stay the cell's own
        (tools that read "the cell's result" from display text are not misled), and
        the first and the final bundle carry the same MIME types, so a notebook
        checker that sees only the first one (nbval) compares like with like.
        """
        data: Bundle = {"text/html": T.static_html(self.snapshot())}
        if widget:
            data.update(self.display.widget_bundle())
        return data

    # ------------------------------------------------------------ what it says (status_render.py, of the snapshot now)
    summary = _says(R.summary)
    header_html = _says(R.header_html)
    ranks_html = _says(T.ranks_html)
    env_html = _says(T.env_html)
    static_html = _says(T.static_html)
    static_text = _says(T.static_text)

    _repr_html_ = _says(T.static_html)
    __repr__ = _says(T.static_text)

