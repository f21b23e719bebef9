"""What the status view says, from a snapshot: pure functions, no widgets, no clock, no pool.

The presenter (status_view.py) takes a ``Snapshot`` of what it has heard and
hands it here. Two models are rendered twice, as text (plain IPython, repr,
a terminal) and as HTML (the live widget and the static form left in the
notebook), so the two forms cannot drift apart:

- the summary line (``summary_parts``): '4 ranks ✓ 2.31 s · gloo · env ✓' at the
  end, the count of each state while the cell runs;
- the rank rows (``rank_rows``): one ``RankRow`` per rank, its cells by column.

The text tables are report.py's ``table_text``; the env checks are report.py's.
nbval compares the first line of the static HTML (notebooks/nbval_sanitize.cfg
replaces the rest), so the summary's wording is part of the interface.
"""
from __future__ import annotations

import html
import re
import signal
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple, Union

from ..errors import describe_exit
from ..plan import DIST_VARS, Check, checks_verdict
from ..states import FailureKind, RankState, Waiting
from .report import checks_html, checks_text, env_digest, env_table_html, table_text, verdict_html

TEXT_PREFIX = "ddp_magic status: "

# What a rank is shown as: its state, with DEAD told apart as killed (a signal) or died (an exit code).
Label = Union[RankState, FailureKind]

# label -> colour; the order is the order of the counts in the running summary
STATE_COLORS: Dict[Label, str] = {
    RankState.STARTING: "#6e7781",
    RankState.CONNECTING: "#6e7781",
    RankState.READY: "#0969da",
    RankState.RUNNING: "#0969da",
    RankState.DONE: "#1a7f37",
    RankState.FAILED: "#cf222e",
    RankState.INTERRUPTED: "#9a6700",
    FailureKind.KILLED: "#82071e",
    FailureKind.DIED: "#82071e",
    RankState.STOPPED: "#6e7781",
}
GREY = "#6e7781"
ACTIVE = (RankState.STARTING, RankState.CONNECTING, RankState.RUNNING)
STRIP_CSS = ".ddp-status-strip i{display:inline-block;width:9px;height:9px;margin:0 1px;border-radius:2px}"
_R = "div.ddp-status-ranks.ddp-status-ranks table"  # specific enough to win over JupyterLab's rendered-HTML table rules
RANKS_CSS = (
    f"{_R} th,{_R} td{{text-align:left;padding:1px 10px 1px 0;white-space:nowrap;border:none}}"
    f"{_R} th{{position:sticky;top:0;background:var(--jp-layout-color1,#fff)}}"
    f"{_R} .st{{color:#fff;border-radius:3px;padding:0 5px}}"
    f"{_R} td.ll{{font-family:monospace;max-width:48em;overflow:hidden;text-overflow:ellipsis}}"
)
FONT = "font-family:var(--jp-ui-font-family,sans-serif)"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class RankLike(Protocol):
    """What the renderer reads of a rank (kernel.pool.RankInfo has it; so does a test's stand-in)."""

    rank: int
    state: Any  # a RankState (or its value)
    pid: Optional[int]
    device: str
    host: str
    exit_code: Optional[int]
    started: float
    finished: Optional[float]
    memory: Optional[int]
    last_line: str
    tail: Any  # the last lines printed, newest last
    debugging: Waiting  # what it waits on the notebook for (Waiting.NO: nothing)


@dataclass(frozen=True)
class Snapshot:
    """Everything the view shows, at one moment."""

    nproc: int
    infos: Mapping[int, RankLike]
    now: float  # the view's clock: a running rank's time is now - started
    elapsed: float  # of the cell (from its first running rank), or since the view was made
    backend: str = ""
    checks: Sequence[Check] = ()
    envs: Sequence[Mapping[str, str]] = ()  # the DIST_VARS each rank received, by rank
    notices: Sequence[str] = ()
    finished: bool = False
    ok: bool = False
    note: str = ""  # why it failed, in a few words
    started_in: Optional[float] = None  # seconds the pool took to start, when it started in this cell

    @property
    def ranks(self) -> List[int]:
        return all_ranks(self.nproc, self.infos)

    def label(self, rank: int) -> Label:
        info = self.infos.get(rank)
        return state_label(info) if info is not None else RankState.STARTING


@dataclass(frozen=True)
class RankRow:
    """One rank as the table shows it: the text of each column, plus the exit in words for a tooltip."""

    rank: int
    label: Label
    cells: Dict[str, str] = field(default_factory=dict)
    exit_title: str = ""


# ---------------------------------------------------------------- words for one value
def all_ranks(nproc: int, infos: Mapping[int, Any]) -> List[int]:
    """The ranks to show: every rank asked for, and any the pool reported beyond them."""
    return sorted(set(range(nproc)) | set(infos))


def state_label(info: RankLike) -> Label:
    """The word shown for a rank: the pool's state, with DEAD split into killed (signal) and died (exit code)."""
    if info.state == RankState.DEAD:
        return FailureKind.KILLED if info.exit_code is not None and info.exit_code < 0 else FailureKind.DIED
    return RankState(info.state)


def exit_text(info: RankLike) -> str:
    if info.state != RankState.DEAD or info.exit_code is None:
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


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


# ---------------------------------------------------------------- the summary line: one model, two forms
class TextStyle:
    """How the summary's parts are written in plain text."""

    def esc(self, x: Any) -> str:
        return str(x)

    def mark(self, ok: bool) -> str:
        return "✓" if ok else "✗"

    def note(self, text: str) -> str:
        return text

    def count(self, label: Label, n: int) -> str:
        return f"{label} {n}"

    def verdict(self, checks: Sequence[Check]) -> str:
        return checks_verdict(checks)


class HtmlStyle(TextStyle):
    """The same parts in HTML: escaped, the marks and counts coloured inline (they survive sanitizers)."""

    def esc(self, x: Any) -> str:
        return _esc(x)

    def mark(self, ok: bool) -> str:
        color = STATE_COLORS[RankState.DONE] if ok else STATE_COLORS[RankState.FAILED]
        return f"<span style='color:{color};font-weight:bold'>{super().mark(ok)}</span>"

    def note(self, text: str) -> str:
        return f"<span style='color:{STATE_COLORS[RankState.FAILED]}'>{_esc(text)}</span>"

    def count(self, label: Label, n: int) -> str:
        return f"<span style='color:{STATE_COLORS[label]}'>{label} {n}</span>"

    def verdict(self, checks: Sequence[Check]) -> str:
        return verdict_html(checks)


TEXT, HTML = TextStyle(), HtmlStyle()


def summary_parts(s: Snapshot, style: TextStyle) -> List[str]:
    """The parts of the summary line, joined by ' · ': the outcome (or the counts), backend, checks, start time."""
    n = plural(len(s.ranks), "rank")
    if s.finished:
        note = f"{style.note(s.note)} · " if not s.ok and s.note else ""
        parts = [f"{n} {style.mark(s.ok)} {note}{style.esc(fmt_seconds(s.elapsed))}"]
    else:
        counts = Counter(s.label(r) for r in s.ranks)
        states = debugging_text(s) or ", ".join(style.count(label, counts[label]) for label in STATE_COLORS if counts.get(label))
        parts = [n, states, style.esc(fmt_seconds(s.elapsed))]
    if s.backend:
        parts.append(style.esc(s.backend))
    parts.append(style.verdict(s.checks))
    if s.finished and s.started_in is not None:
        parts.append(f"pool started in {style.esc(fmt_seconds(s.started_in))}")
    return parts


def debugging_text(s: Snapshot) -> str:
    """'rank 1 in debugger, 3 waiting' while ranks wait on the notebook (kernel/stdin.py); "" otherwise."""
    infos = [i for i in (s.infos.get(r) for r in s.ranks) if i is not None]
    held = [(i.rank, i.debugging) for i in infos if i.debugging != Waiting.NO]
    if not held:
        return ""
    others = sum(1 for i in infos if i.state == RankState.RUNNING and i.debugging == Waiting.NO)
    return ", ".join([f"rank {r} {waiting}" for r, waiting in held] + ([f"{others} waiting"] if others else []))


def summary(s: Snapshot) -> str:
    """One line: '4 ranks ✓ 2.31 s · gloo · env ✓' at the end, the counts of each state while it runs."""
    return " · ".join(summary_parts(s, TEXT))


def header_html(s: Snapshot) -> str:
    """The summary line in HTML, with a square per rank and the last notices under it."""
    strip = strip_html(s) if len(s.ranks) > 1 else ""
    notices = "".join(f"<div style='color:#9a6700;font-size:12px'>{_esc(clean_line(t, 300))}</div>" for t in s.notices[-3:])
    state = "finished" if s.finished else "running"
    return (
        f"<div class='ddp-status-header' data-state='{state}' style='font-size:13px;line-height:1.6'>"
        f"<b>%%ddp</b> {' · '.join(summary_parts(s, HTML))}{strip}{notices}</div>"
    )


def strip_html(s: Snapshot) -> str:
    """One small square per rank, coloured by state: readable at a glance with 64 ranks."""
    cells = "".join(f"<i title='rank {r}: {s.label(r)}' style='background:{STATE_COLORS.get(s.label(r), GREY)}'></i>" for r in s.ranks)
    return f" <span class='ddp-status-strip'><style>{STRIP_CSS}</style>{cells}</span>"


# ---------------------------------------------------------------- the rank table: one row model, two forms
def rank_row(rank: int, label: Label, info: Optional[RankLike], now: float) -> RankRow:
    cells = {"rank": str(rank), "state": str(label)}
    if info is None:
        cells.update({c: "" for c in ("time", "device", "pid", "exit", "memory", "host", "last line")})
        return RankRow(rank, label, cells)
    exit_ = exit_text(info)
    cells.update(
        {
            "time": fmt_seconds((info.finished or now) - info.started),
            "device": info.device or "",
            "pid": str(info.pid or ""),
            "exit": exit_,
            "memory": fmt_bytes(info.memory) if (info.device or "").startswith("cuda") else "",
            "host": info.host or "",
            "last line": clean_line(info.last_line or (info.tail[-1] if info.tail else "")),
        }
    )
    return RankRow(rank, label, cells, describe_exit(info.exit_code) if exit_ else "")


def rank_rows(s: Snapshot) -> List[RankRow]:
    return [rank_row(r, s.label(r), s.infos.get(r), s.now) for r in s.ranks]


def row_columns(rows: Sequence[RankRow]) -> List[str]:
    """The columns worth showing: memory only with a GPU, host only with more than one."""
    cols = ["rank", "state", "time", "device", "pid", "exit"]
    if any(row.cells["device"].startswith("cuda") for row in rows):
        cols.append("memory")
    if len({row.cells["host"] for row in rows if row.cells["host"]}) > 1:
        cols.append("host")
    return cols + ["last line"]


def _cell_html(row: RankRow, col: str) -> str:
    value = row.cells[col]
    if col == "state":
        return f"<td><span class='st' style='background:{STATE_COLORS.get(row.label, GREY)}'>{_esc(value)}</span></td>"
    if col == "exit" and value:
        return f"<td title='{_esc(row.exit_title)}'>{_esc(value)}</td>"
    if col == "last line":
        return f"<td class='ll' title='{_esc(value)}'>{_esc(value)}</td>" if value else "<td class='ll'></td>"
    return f"<td>{_esc(value)}</td>"


def ranks_html(s: Snapshot) -> str:
    """The rank table. Cell styles live in one scoped <style> (64 rows stay ~15 kB); colours are inline, so they survive sanitizers."""
    rows = rank_rows(s)
    cols = row_columns(rows)
    head = "".join(f"<th>{c}</th>" for c in cols)
    body = "".join(
        f"<tr data-rank='{row.rank}' data-state='{_esc(row.label)}'>" + "".join(_cell_html(row, c) for c in cols) + "</tr>" for row in rows
    )
    return (
        "<div class='ddp-status-ranks' style='max-height:20em;overflow:auto;line-height:1.4'>"
        f"<style>{RANKS_CSS}</style>"
        f"<table style='font-size:12px;border-collapse:collapse'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
    )


def ranks_text(s: Snapshot) -> List[str]:
    rows = rank_rows(s)
    return table_text([row.cells for row in rows], row_columns(rows))


# ---------------------------------------------------------------- the env section
def env_html(s: Snapshot) -> str:
    table = env_table_html(s.envs, list(DIST_VARS)) if s.envs else ""
    digest = f"<div style='font-family:monospace'>{_esc(env_digest(s.envs, list(DIST_VARS)))}</div>" if s.envs else ""
    return (
        f"<div class='ddp-status-env' style='font-size:12px;line-height:1.4'>{verdict_html(s.checks)} — {len(s.checks)} checks of the env each rank received"
        f"{checks_html(s.checks)}<div style='margin-top:4px'><b>Variables each rank received</b></div>{digest}{table}</div>"
    )


def env_text(s: Snapshot) -> List[str]:
    """The checks that did not pass, and the env in one line (plus a table of what varies oddly by rank)."""
    lines = []
    if s.checks:
        bad = [c for c in s.checks if not c.ok]
        lines.append(f"{checks_verdict(s.checks)}: {len(s.checks) - len(bad)} of {len(s.checks)} checks passed")
        lines += checks_text(bad)
    envs = s.envs
    if envs:
        lines.append("env: " + env_digest(envs, list(DIST_VARS)))
        by_rank = [str(i) for i in range(len(envs))]
        varying = [c for c in DIST_VARS if len({e.get(c) for e in envs}) > 1 and [e.get(c) for e in envs] != by_rank]
        if varying:
            lines += table_text(envs, ["RANK"] + [c for c in varying if c != "RANK"])
    return lines


# ---------------------------------------------------------------- the whole view, and how the cell ended
def static_text(s: Snapshot) -> str:
    """The plain-text form of everything the widget shows (terminals, repr)."""
    lines = [TEXT_PREFIX + summary(s)]
    lines += ["  " + line for line in ranks_text(s)]
    lines += [f"  {t}" for t in s.notices[-3:]]
    lines += ["  " + line for line in env_text(s)]
    return "\n".join(lines)


def brief_html(s: Snapshot) -> str:
    """The summary line alone: a quick cell's placeholder costs little."""
    return f"<div class='ddp-status' style='{FONT}'>{header_html(s)}</div>"


def static_html(s: Snapshot) -> str:
    """The summary with the rank table and the env checks behind <details>: renders without a widget manager."""
    return (
        f"<div class='ddp-status' style='{FONT}'>{header_html(s)}"
        f"<details><summary style='cursor:pointer;font-size:12px'>Ranks</summary>{ranks_html(s)}</details>"
        f"<details><summary style='cursor:pointer;font-size:12px'>Env validation</summary>{env_html(s)}</details></div>"
    )


def final_text(s: Snapshot) -> str:
    """What a terminal shows when the cell ends: the summary and any check that did not pass."""
    lines = [TEXT_PREFIX + summary(s)]
    lines += ["  " + line for line in checks_text([c for c in s.checks if not c.ok])]
    return "\n".join(lines)


def verdict(outcome: Any, error: Optional[BaseException]) -> Tuple[bool, str]:
    """Whether the cell succeeded, and why not in a few words (its first failure, or the error)."""
    if outcome is not None:
        failures = list(getattr(outcome, "failures", []) or [])
        note = clean_line(failures[0].headline(), 100) if failures else ""
        return bool(getattr(outcome, "ok", False)), note
    if error is not None:
        first = (str(error).strip().splitlines() or [""])[0]
        return False, clean_line(f"{type(error).__name__}: {first}" if first else type(error).__name__, 100)
    return False, "the cell did not finish"
