"""The status view of a ``%%ddp`` cell: a pool Listener that only presents.

It hears the pool's events (``on_state``, ``on_output``, ``on_notice``) and
shows, for each rank, its state, elapsed time, device, pid, exit code or
signal, last printed line and GPU memory, plus the env each rank received and
the checks of env.py. It decides nothing: the pool decides, the view shows.

Stock ipywidgets only (VBox, HTML, Accordion): no custom JavaScript, so it
renders in JupyterLab, Notebook 7 and VS Code without our lab extension.

Never the only copy of anything: the cell's output stays in its streams and
its result. The display bundle carries ``text/html`` beside the widget, and
when the cell ends it is replaced (update_display) by that static form alone:
the same one-line summary with the rank table and the env checks behind
``<details>``. Saved notebooks, nbviewer, GitHub and a reloaded JupyterLab
show it without widget state; plain IPython gets the summary as text. nbval
sees the first bundle (it does not apply display updates), whose HTML holds
timings and pids: strict nbval runs sanitise it (e.g. the pattern
``(?s)<div class='ddp-status'.*``) or turn the view off (``%%ddp --no-widget``,
or ``DDP_MAGIC_WIDGET=0`` in the kernel's env).

Updates are throttled: events only mark the view dirty. A change of state is
rendered at most once per ``min_interval`` (default 0.2 s); printed lines alone
(the "last line" column) at most once per ``refresh`` (default 1 s), the pace
at which the elapsed times move anyway. Each render is a couple of widget
messages, sent by the event that finds its interval elapsed or by a small
ticker thread that sleeps until the next render is due, so a long training
cell costs the kernel about one wake-up a second. ``finish()`` always renders
the final state.

Importing this module does not import ipywidgets; ``show()`` does.
"""
from __future__ import annotations

import contextvars
import html
import os
import re
import signal
import sys
import threading
import time
from collections import Counter
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..plan.plan import DIST_VARS, Check, Plan, checks_verdict, plan_checks
from ..errors import describe_exit
from ..kernel.pool import Listener, RankInfo
from .report import checks_html, checks_text, env_digest, env_table_html, env_table_text, verdict_html

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
TEXT_PREFIX = "ddp_magic status: "
OFF_VALUES = ("0", "off", "false", "no")

# label -> colour; the order is the order of the counts in the running summary
STATE_COLORS = {
    "starting": "#6e7781",
    "connecting": "#6e7781",
    "ready": "#0969da",
    "running": "#0969da",
    "done": "#1a7f37",
    "failed": "#cf222e",
    "interrupted": "#9a6700",
    "killed": "#82071e",
    "died": "#82071e",
    "stopped": "#6e7781",
}
ACTIVE = ("starting", "connecting", "running")
STRIP_CSS = ".ddp-status-strip i{display:inline-block;width:9px;height:9px;margin:0 1px;border-radius:2px}"
_R = "div.ddp-status-ranks.ddp-status-ranks table"  # specific enough to win over JupyterLab's rendered-HTML table rules
RANKS_CSS = (
    f"{_R} th,{_R} td{{text-align:left;padding:1px 10px 1px 0;white-space:nowrap;border:none}}"
    f"{_R} th{{position:sticky;top:0;background:var(--jp-layout-color1,#fff)}}"
    f"{_R} .st{{color:#fff;border-radius:3px;padding:0 5px}}"
    f"{_R} td.ll{{font-family:monospace;max-width:48em;overflow:hidden;text-overflow:ellipsis}}"
)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


# ---------------------------------------------------------------- pure formatting
def state_label(info: RankInfo) -> str:
    """The word shown for a rank: the pool's state, with 'dead' split into killed (signal) and died (exit code)."""
    if info.state == "dead":
        return "killed" if info.exit_code is not None and info.exit_code < 0 else "died"
    return info.state


def exit_text(info: RankInfo) -> str:
    if info.state != "dead" or info.exit_code is None:
        return ""
    if info.exit_code < 0:
        try:
            return signal.Signals(-info.exit_code).name
        except ValueError:
            return f"signal {-info.exit_code}"
    return f"exit {info.exit_code}"


def fmt_seconds(s: Optional[float]) -> str:
    if s is None:
        return ""
    if s < 60:
        return f"{s:.2f} s"
    m, sec = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m} m {sec:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} m"


def fmt_bytes(n: Optional[int]) -> str:
    if n is None:
        return ""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def clean_line(text: str, limit: int = 160) -> str:
    text = _ANSI.sub("", text).replace("\t", " ").strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


# ---------------------------------------------------------------- the view
class StatusView(Listener):
    """Live per-rank status of one %%ddp cell. Modes:

    - ``widget``: stock ipywidgets, updated live over the comm (a kernel with ipywidgets). A cell
      that ends within ``live_after`` seconds never builds them: its static summary is shown at
      the start and replaced once at the end: two messages instead of the ~30 comm messages of a
      widget's life, which cost a quick cell ~13 ms, five times the pool's own ~2.5 ms;
    - ``html``: a text/html display updated in place (a kernel without ipywidgets);
    - ``text``: nothing live; the summary is displayed when the cell ends (plain IPython);
    - ``off``: nothing at all.
    """

    def __init__(
        self,
        nproc: int,
        plan: Optional[Plan] = None,
        *,
        pool: Any = None,
        mode: str = "widget",
        min_interval: float = 0.2,
        refresh: float = 1.0,
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
        self.min_interval = min_interval
        self.refresh = refresh
        self.live_after = live_after
        self.use_ticker = ticker
        self.clock = clock
        self._display_fn = display
        self._update_fn = update_display
        self._fixed_checks = list(checks) if checks is not None else None
        self._checks: List[Check] = []
        self._checks_for: Optional[str] = None
        self.infos: Dict[int, RankInfo] = {}
        self.history: List[Tuple[int, str]] = []  # (rank, label) each time a rank's shown state changed
        self.notices: List[str] = []
        self.renders = 0  # how many times the live view was re-rendered (each sends at most a few widget messages)
        self.finished = False
        self.result_ok: Optional[bool] = None
        self.result_note = ""
        self.elapsed_final: Optional[float] = None
        self.started_in: Optional[float] = None
        self._labels: Dict[int, str] = {}
        self._t0 = clock()
        self._run_t0: Optional[float] = None
        self._dirty = False  # a state or notice changed: render within min_interval
        self._dirty_output = False  # only printed lines changed: render within refresh
        self._last_render = float("-inf")
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # the ticker's sleep ends early: something is due sooner
        self._thread: Optional[threading.Thread] = None
        self._display_id: Optional[str] = None
        self._widgets: Dict[str, Any] = {}
        self._shown = False
        self._error: Optional[str] = None
        if pool is not None and getattr(pool, "started", False):
            for r, info in dict(getattr(pool, "ranks", {}) or {}).items():  # a running pool: its ranks as they are now
                self.infos[r] = info
                self._labels[r] = state_label(info)

    # ------------------------------------------------------------ facts
    @property
    def plan(self) -> Optional[Plan]:
        if self._pool is not None:
            return getattr(self._pool, "plan", self._plan)
        return self._plan

    @property
    def backend(self) -> str:
        plan = self.plan
        return plan.backend if plan is not None else ""

    @property
    def checks(self) -> List[Check]:
        """env.py's checks of the pool's plan, computed once per plan."""
        if self._fixed_checks is not None:
            return self._fixed_checks
        plan = self.plan
        if plan is None:
            return []
        if self._checks_for != plan.run_id:
            try:
                self._checks = plan_checks(plan, started=bool(getattr(self._pool, "started", False)))
            except Exception as e:  # a check must never break a cell
                self._checks = [Check("env checks", False, f"could not run: {type(e).__name__}: {e}", level="warning")]
            self._checks_for = plan.run_id
        return self._checks

    def label(self, rank: int) -> str:
        info = self.infos.get(rank)
        return state_label(info) if info is not None else "starting"

    def _ranks(self) -> List[int]:
        return sorted(set(range(self.nproc)) | set(self.infos))

    def start_seconds(self) -> Optional[float]:
        """How long the pool took to start in this cell (the pool's own measure when it has one)."""
        if self.started_in is None:
            return None
        measured = getattr(self._pool, "start_seconds", None)
        return measured if isinstance(measured, (int, float)) else self.started_in

    def elapsed(self) -> float:
        if self.elapsed_final is not None:
            return self.elapsed_final
        return self.clock() - (self._run_t0 if self._run_t0 is not None else self._t0)

    # ------------------------------------------------------------ listener events
    def on_state(self, info: RankInfo) -> None:
        if self._error:
            return
        try:
            self.infos[info.rank] = info
            label = state_label(info)
            if self._labels.get(info.rank) != label:
                self._labels[info.rank] = label
                self.history.append((info.rank, label))
            if label == "running" and self._run_t0 is None:
                self._run_t0 = info.started if info.started else self.clock()
            if label == "ready":
                self.started_in = max(self.started_in or 0.0, info.elapsed)
            self._changed()
        except Exception as e:
            self._fail(e)

    def on_output(self, rank: int, stream: str, text: str) -> None:
        if self._error:
            return
        try:
            self._changed(urgent=False)
        except Exception as e:
            self._fail(e)

    def on_notice(self, text: str) -> None:
        if self._error:
            return
        try:
            self.notices.append(text)
            self._changed()
        except Exception as e:
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        """The view broke: stop updating it, never the cell."""
        self._error = f"{type(e).__name__}: {e}"
        self._stop.set()
        self._wake.set()
        try:
            print(f"ddp_magic: the status view stopped updating ({self._error})", file=sys.stderr)
        except Exception:
            pass

    # ------------------------------------------------------------ throttling
    def _changed(self, urgent: bool = True) -> None:
        if urgent:
            self._dirty = True
        else:
            self._dirty_output = True
        if not self._shown or self.mode not in ("widget", "html"):
            return
        if self.clock() - self._last_render >= (self.min_interval if self._dirty else self.refresh):
            self._render()
        elif urgent:
            self._wake.set()  # the ticker may be sleeping until a later moment

    def _render(self) -> None:
        with self._lock:
            if self._error or not self._shown:
                return
            if self.mode == "widget" and not self._live and self.clock() - self._t0 < self.live_after:
                return  # still dirty: shown when the view goes live, or in the final summary
            self._dirty = self._dirty_output = False
            self._last_render = self.clock()
            self.renders += 1
            if self.mode == "widget":
                if not self._live:
                    self._go_live()
                    return
                w = self._widgets
                w["header"].value = self.header_html()
                w["ranks"].value = self.ranks_html()
                env = self.env_html()
                if w["env"].value != env:
                    w["env"].value = env
            elif self.mode == "html":
                self._update(self.bundle(widget=False))

    def _next_render(self) -> float:
        """When the ticker must render next (the view's clock): the widget going live,
        a held-back change of state, or the once-a-refresh move of times and last lines."""
        if self.mode == "widget" and not self._live:
            return self._t0 + self.live_after  # _render puts the widget up then, with whatever is held back
        if self._dirty:
            return self._last_render + self.min_interval
        if self._dirty_output or any(self.label(r) in ACTIVE for r in self._ranks()):
            return self._last_render + self.refresh
        return self.clock() + self.refresh  # nothing moves: look again later (an event wakes it sooner)

    def _tick_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._wake.wait(max(0.0, min(self._next_render() - self.clock(), self.refresh)))
                self._wake.clear()
                if self._stop.is_set():
                    return
                if self.clock() >= self._next_render():
                    self._render()
            except Exception as e:
                self._fail(e)
                return

    # ------------------------------------------------------------ display
    def show(self) -> "StatusView":
        """Put the view at the top of the cell's output (before any rank prints)."""
        if self.mode == "off" or self._shown:
            return self
        if self.mode == "widget" and self.live_after <= 0:
            self._build_widgets()
        if self.mode in ("widget", "html"):
            # Before it goes live, the widget mode shows only the summary line: a quick cell's
            # placeholder should cost little, its tables come with the final summary.
            brief = self.mode == "widget" and not self._live
            handle = self._display({"text/html": self.brief_html()} if brief else self.bundle(widget=self.mode == "widget"))
            self._display_id = getattr(handle, "display_id", None)
            self._shown = True
            self._last_render = self.clock()
            if self.use_ticker:
                ctx = contextvars.copy_context()  # comm messages keep the cell as their parent
                self._thread = threading.Thread(target=ctx.run, args=(self._tick_loop,), name="ddp-status", daemon=True)
                self._thread.start()
        else:
            self._shown = True
        return self

    @property
    def _live(self) -> bool:
        """Whether the ipywidgets exist (the widget mode builds them only for a cell that runs a while)."""
        return "root" in self._widgets

    def _build_widgets(self) -> None:
        import ipywidgets as W

        self._widgets["header"] = W.HTML(value=self.header_html(), layout=W.Layout(margin="0 0 2px 0"))
        self._widgets["ranks"] = W.HTML(value=self.ranks_html())
        self._widgets["env"] = W.HTML(value=self.env_html())
        details = W.Accordion(children=[self._widgets["ranks"], self._widgets["env"]], titles=("Ranks", "Env validation"), selected_index=0)
        self._widgets["details"] = details
        root = W.VBox([self._widgets["header"], details], layout=W.Layout(width="100%"), _dom_classes=("ddp-status",))
        self._widgets["root"] = root

    def _go_live(self) -> None:
        """The cell is taking a while: the static summary at the top becomes the live widget."""
        self._build_widgets()
        self._update(self.bundle(widget=True))

    def finish(self, outcome: Any = None, error: Optional[BaseException] = None) -> None:
        """The cell ended: render the final state, collapse to the one-line summary, leave a static copy."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        if self.finished:
            return
        self.finished = True
        if outcome is not None:
            self.result_ok = bool(getattr(outcome, "ok", False))
            self.elapsed_final = getattr(outcome, "elapsed", None)
            failures = list(getattr(outcome, "failures", []) or [])
            if failures:
                self.result_note = clean_line(failures[0].headline(), 100)
        else:
            self.result_ok = False
            if error is not None:
                first = (str(error).strip().splitlines() or [""])[0]
                self.result_note = clean_line(f"{type(error).__name__}: {first}" if first else type(error).__name__, 100)
            else:
                self.result_note = "the cell did not finish"
        if self.elapsed_final is None:
            self.elapsed_final = self.clock() - (self._run_t0 if self._run_t0 is not None else self._t0)
        if self._error:
            return
        try:
            if self.mode == "widget" and self._shown and not self._live:
                self._update(self.bundle(widget=False))  # a quick cell: its summary, never a widget
            elif self.mode == "widget" and self._shown:
                self._render()
                self._widgets["details"].selected_index = None  # settled: the one-line summary
                # What stays in the notebook is the static form (the same summary, the tables
                # behind <details>): it renders after a reload, in nbviewer, on GitHub and in
                # VS Code without a widget manager or saved widget state. The widgets go.
                self._update(self.bundle(widget=False))
                self._close_widgets()
            elif self.mode == "html" and self._shown:
                self._render()
            elif self.mode == "text":
                self._display({"text/plain": self.final_text()})
        except Exception as e:
            self._fail(e)

    def _close_widgets(self) -> None:
        """Close every model the view opened (its layouts and styles too), so none lingers in the kernel."""
        models = []
        for w in self._widgets.values():
            models += [getattr(w, "layout", None), getattr(w, "style", None), w]
        seen = set()
        for m in models:
            if m is not None and id(m) not in seen and hasattr(m, "close"):
                seen.add(id(m))
                m.close()

    def _display(self, bundle: Dict[str, Any]) -> Any:
        if self._display_fn is not None:
            return self._display_fn(bundle, raw=True, display_id=True)
        from IPython.display import display

        return display(bundle, raw=True, display_id=True)

    def _update(self, bundle: Dict[str, Any]) -> None:
        if self._display_id is None:
            return
        if self._update_fn is not None:
            self._update_fn(bundle, raw=True, display_id=self._display_id)
            return
        from IPython.display import update_display

        update_display(bundle, raw=True, display_id=self._display_id)

    def bundle(self, widget: bool = True) -> Dict[str, Any]:
        """The display bundle: the widget (while the cell runs) and its static HTML form.

        No text/plain on purpose: a cell's text/plain results stay the cell's own
        (tools that read "the cell's result" from display text are not misled), and
        the first and the final bundle carry the same MIME types, so a notebook
        checker that sees only the first one (nbval) compares like with like.
        """
        data: Dict[str, Any] = {"text/html": self.static_html()}
        if widget and self._live:
            data[WIDGET_MIME] = {"version_major": 2, "version_minor": 0, "model_id": self._widgets["root"].model_id}
        return data

    def _repr_html_(self) -> str:
        return self.static_html()

    def __repr__(self) -> str:
        return self.static_text()

    # ------------------------------------------------------------ what it says
    def summary(self) -> str:
        """One line: '4 ranks ✓ 2.31 s · gloo · env ✓' at the end, the counts of each state while it runs."""
        ranks = self._ranks()
        n = _plural(len(ranks), "rank")
        tail = [self.backend] if self.backend else []
        tail.append(checks_verdict(self.checks))
        if self.finished:
            if self.result_ok:
                head = f"{n} ✓ {fmt_seconds(self.elapsed())}"
            else:
                head = f"{n} ✗ " + (f"{self.result_note} · " if self.result_note else "") + fmt_seconds(self.elapsed())
            if self.started_in is not None:
                tail.append(f"pool started in {fmt_seconds(self.start_seconds())}")
            return " · ".join([head] + tail)
        counts = Counter(self.label(r) for r in ranks)
        states = ", ".join(f"{label} {counts[label]}" for label in STATE_COLORS if counts.get(label))
        return " · ".join([n, states, fmt_seconds(self.elapsed())] + tail)

    def header_html(self) -> str:
        ranks = self._ranks()
        if self.finished:
            ok = bool(self.result_ok)
            color = STATE_COLORS["done"] if ok else STATE_COLORS["failed"]
            mark = f"<span style='color:{color};font-weight:bold'>{'✓' if ok else '✗'}</span>"
            note = f"<span style='color:{color}'>{_esc(self.result_note)}</span> · " if not ok and self.result_note else ""
            head = f"{_plural(len(ranks), 'rank')} {mark} {note}"
            head += _esc(fmt_seconds(self.elapsed()))
        else:
            counts = Counter(self.label(r) for r in ranks)
            states = ", ".join(
                f"<span style='color:{STATE_COLORS[label]}'>{label} {counts[label]}</span>" for label in STATE_COLORS if counts.get(label)
            )
            head = f"{_plural(len(ranks), 'rank')} · {states} · {_esc(fmt_seconds(self.elapsed()))}"
        parts = [head]
        if self.backend:
            parts.append(_esc(self.backend))
        parts.append(verdict_html(self.checks))
        if self.finished and self.started_in is not None:
            parts.append(f"pool started in {_esc(fmt_seconds(self.start_seconds()))}")
        strip = self._strip_html() if len(ranks) > 1 else ""
        notices = "".join(f"<div style='color:#9a6700;font-size:12px'>{_esc(clean_line(t, 300))}</div>" for t in self.notices[-3:])
        state = "finished" if self.finished else "running"
        return (
            f"<div class='ddp-status-header' data-state='{state}' style='font-size:13px;line-height:1.6'>"
            f"<b>%%ddp</b> {' · '.join(parts)}{strip}{notices}</div>"
        )

    def _strip_html(self) -> str:
        """One small square per rank, coloured by state: readable at a glance with 64 ranks."""
        cells = "".join(f"<i title='rank {r}: {self.label(r)}' style='background:{STATE_COLORS.get(self.label(r), '#6e7781')}'></i>" for r in self._ranks())
        return f" <span class='ddp-status-strip'><style>{STRIP_CSS}</style>{cells}</span>"

    def _rows(self) -> List[Dict[str, str]]:
        rows = []
        for r in self._ranks():
            info = self.infos.get(r)
            label = self.label(r)
            if info is None:
                rows.append({"rank": str(r), "state": label, "time": "", "device": "", "pid": "", "exit": "", "memory": "", "host": "", "last line": ""})
                continue
            rows.append(
                {
                    "rank": str(r),
                    "state": label,
                    "time": fmt_seconds((info.finished or self.clock()) - info.started),
                    "device": info.device or "",
                    "pid": str(info.pid or ""),
                    "exit": exit_text(info),
                    "memory": fmt_bytes(info.memory) if (info.device or "").startswith("cuda") else "",
                    "host": info.host or "",
                    "last line": clean_line(info.last_line or (info.tail[-1] if info.tail else "")),
                }
            )
        return rows

    def _columns(self, rows: List[Dict[str, str]]) -> List[str]:
        cols = ["rank", "state", "time", "device", "pid", "exit"]
        if any(row["device"].startswith("cuda") for row in rows):
            cols.append("memory")
        if len({row["host"] for row in rows if row["host"]}) > 1:
            cols.append("host")
        return cols + ["last line"]

    def ranks_html(self) -> str:
        """The rank table. Cell styles live in one scoped <style> (64 rows stay ~15 kB); colours are inline, so they survive sanitizers."""
        rows = self._rows()
        cols = self._columns(rows)
        head = "".join(f"<th>{c}</th>" for c in cols)
        body = []
        for row in rows:
            info = self.infos.get(int(row["rank"]))
            cells = []
            for c in cols:
                value = row[c]
                if c == "state":
                    cells.append(f"<td><span class='st' style='background:{STATE_COLORS.get(value, '#6e7781')}'>{_esc(value)}</span></td>")
                elif c == "exit" and value and info is not None:
                    cells.append(f"<td title='{_esc(describe_exit(info.exit_code))}'>{_esc(value)}</td>")
                elif c == "last line":
                    cells.append(f"<td class='ll' title='{_esc(value)}'>{_esc(value)}</td>" if value else "<td class='ll'></td>")
                else:
                    cells.append(f"<td>{_esc(value)}</td>")
            body.append(f"<tr data-rank='{row['rank']}' data-state='{_esc(row['state'])}'>" + "".join(cells) + "</tr>")
        return (
            "<div class='ddp-status-ranks' style='max-height:20em;overflow:auto;line-height:1.4'>"
            f"<style>{RANKS_CSS}</style>"
            f"<table style='font-size:12px;border-collapse:collapse'><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
        )

    def _rank_envs(self) -> List[Dict[str, str]]:
        plan = self.plan
        if plan is None:
            return []
        return [{k: v for k, v in env.items() if k in DIST_VARS} for env in plan.all_envs()]

    def env_html(self) -> str:
        checks = self.checks
        envs = self._rank_envs()
        table = env_table_html(envs, list(DIST_VARS)) if envs else ""
        digest = f"<div style='font-family:monospace'>{_esc(env_digest(envs, list(DIST_VARS)))}</div>" if envs else ""
        return (
            f"<div class='ddp-status-env' style='font-size:12px;line-height:1.4'>{verdict_html(checks)} — {len(checks)} checks of the env each rank received"
            f"{checks_html(checks)}<div style='margin-top:4px'><b>Variables each rank received</b></div>{digest}{table}</div>"
        )

    def static_text(self) -> str:
        """The plain-text form of everything the widget shows (saved notebooks, terminals, nbval)."""
        rows = self._rows()
        cols = self._columns(rows)
        table = [[c for c in cols]] + [[row[c] for c in cols] for row in rows]
        widths = [max(len(t[i]) for t in table) for i in range(len(cols))]
        lines = [TEXT_PREFIX + self.summary()]
        lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(t, widths)).rstrip() for t in table]
        lines += [f"  {t}" for t in self.notices[-3:]]
        checks = self.checks
        if checks:
            bad = [c for c in checks if not c.ok]
            lines.append(f"  {checks_verdict(checks)}: {len(checks) - len(bad)} of {len(checks)} checks passed")
            lines += ["  " + line for line in checks_text(bad)]
        envs = self._rank_envs()
        if envs:
            lines.append("  env: " + env_digest(envs, list(DIST_VARS)))
            varying = [c for c in DIST_VARS if len({e.get(c) for e in envs}) > 1 and [e.get(c) for e in envs] != [str(i) for i in range(len(envs))]]
            if varying:
                lines += ["  " + line for line in env_table_text(envs, ["RANK"] + [c for c in varying if c != "RANK"])]
        return "\n".join(lines)

    def brief_html(self) -> str:
        return f"<div class='ddp-status' style='font-family:var(--jp-ui-font-family,sans-serif)'>{self.header_html()}</div>"

    def static_html(self) -> str:
        return (
            f"<div class='ddp-status' style='font-family:var(--jp-ui-font-family,sans-serif)'>{self.header_html()}"
            f"<details><summary style='cursor:pointer;font-size:12px'>Ranks</summary>{self.ranks_html()}</details>"
            f"<details><summary style='cursor:pointer;font-size:12px'>Env validation</summary>{self.env_html()}</details></div>"
        )

    def final_text(self) -> str:
        """What a terminal shows when the cell ends: the summary and any check that did not pass."""
        lines = [TEXT_PREFIX + self.summary()]
        lines += ["  " + line for line in checks_text([c for c in self.checks if not c.ok])]
        return "\n".join(lines)


# ---------------------------------------------------------------- choosing a mode
def choose_mode(enabled: bool = True, environ: Any = os.environ) -> str:
    """widget in a kernel with ipywidgets, html in a kernel without, text in plain IPython, off when disabled."""
    if not enabled or str(environ.get("DDP_MAGIC_WIDGET", "1")).strip().lower() in OFF_VALUES:
        return "off"
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return "off"
    if shell is None:
        return "off"
    if getattr(shell, "kernel", None) is None:
        return "text"
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return "html"
    return "widget"


def show_status(pool: Any, enabled: bool = True, **options: Any) -> Optional[StatusView]:
    """Create and display the status view of a cell for ``pool``; None when it is off or cannot be shown."""
    mode = choose_mode(enabled)
    if mode == "off":
        return None
    try:
        view = StatusView(pool.nproc, pool=pool, mode=mode, **options)
        return view.show()
    except Exception as e:  # the view is never worth failing a cell for
        print(f"ddp_magic: no status view ({type(e).__name__}: {e})", file=sys.stderr)
        return None
