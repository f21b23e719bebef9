"""What the status view says, from a snapshot: pure functions, no widgets, no clock, no pool.

The presenter (status_view.py) takes a ``Snapshot`` of what it has heard and
hands it here. Two models are rendered twice, as text (plain IPython, repr,
a terminal) and as HTML (the live widget and the static form left in the
notebook), so the two forms cannot drift apart:

- the summary line (``summary_parts``): '4 ranks ✓ 2.31 s · gloo · ✓ 19 checks passed'
  at the end, the count of each state while the cell runs;
- the rank rows (status_tables.py): one ``RankRow`` per rank, its cells by column.

One clock: the plain seconds are always the cell's run time (from the cell
being sent to the ranks); the pool's start is its own, labelled clock ('start
5.4 s' while it starts, 'pool started in 5.40 s' after). A clock that runs says
tenths (``fmt_clock``: the view moves it ten times a second); a time that ended
says ``fmt_seconds`` (words.py: '998 ms', '2.31 s'), as every notice does.
While tqdm bars run, the line says the slowest one's '43% 12.3 it/s'. All HTML styling is
inline ``style=`` (no ``<style>`` block: untrusted notebooks drop those), with
colours from colours.py. The HTML's class names and data attributes are an
interface (browser tests, nbval's sanitizer): see docs in ``static_html``.
"""
from __future__ import annotations

import html
import re
import signal
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Protocol, Sequence, Tuple

from ..plan import Check
from ..words import fmt_bytes as fmt_bytes, fmt_seconds, plural, ranks_phrase
from ..states import FailureKind, RankState, Waiting
from . import colours
from . import status_compact as C
from .progress import Bar
from .report import checks_line
from .status_labels import ACTIVE as ACTIVE, ROOT_CAUSES as ROOT_CAUSES, STATE_TONES as STATE_TONES, STOPPED_BY_US, Label, tone_of

TEXT_PREFIX = "ddp_magic status: "

FONT = "font-family:var(--jp-ui-font-family,sans-serif)"
LINE = "font-size:13px;line-height:20px"
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


# An extra section of the view (e.g. a metrics chart): (title, html of a snapshot, text lines of a snapshot).
Section = Tuple[str, Callable[["Snapshot"], str], Callable[["Snapshot"], List[str]]]


@dataclass(frozen=True)
class Snapshot:
    """Everything the view shows, at one moment."""

    nproc: int
    infos: Mapping[int, RankLike]
    now: float  # the view's clock: a running rank's time is now - started
    elapsed: float  # the run clock: since the cell was sent to the ranks (0 while the pool starts)
    backend: str = ""
    checks: Sequence[Check] = ()
    envs: Sequence[Mapping[str, str]] = ()  # the DIST_VARS each rank received, by rank (planned: will receive)
    planned: bool = False  # the pool has not started: no rank exists, the env is the plan's (a queued Slurm job's port is not chosen)
    notices: Sequence[str] = ()
    finished: bool = False
    ok: bool = False
    note: str = ""  # why it failed, in a few words
    started_in: Optional[float] = None  # seconds the pool took to start, when it started in this cell
    restarted: Sequence[int] = ()  # the ranks started again alone in this cell (the others ran on): "rank 1 restarted in 42 ms"
    starting_for: Optional[float] = None  # the start clock, while the pool starts in this cell
    root: Optional[int] = None  # the rank whose failure explains the others
    stopped: FrozenSet[int] = frozenset()  # ranks stopped or released because of it (kernel.failures.blame.causes)
    timed_out: FrozenSet[int] = frozenset()  # root causes of a --timeout (kernel.failures.blame.causes): shown as "timeout"
    lines: Mapping[int, str] = field(default_factory=dict)  # each rank's live line (progress.LiveLines)
    bars: Mapping[int, Bar] = field(default_factory=dict)  # each rank's tqdm bar, when it shows one
    sections: Sequence[Section] = ()  # extra sections, after the ranks and the env
    kept: str = ""  # a kept pool's lease (kernel/keep/terms.py), "" for a pool that ends with its kernel

    @cached_property
    def ranks(self) -> List[int]:
        return all_ranks(self.nproc, self.infos)

    @cached_property
    def labels(self) -> Dict[int, Label]:
        """Every rank's label, worked out once per snapshot (the counts, the strip and the tables all read it)."""
        return {r: self.label(r) for r in self.ranks}

    @cached_property
    def groups(self) -> Dict[Label, List[int]]:
        """Each label's ranks, in rank order (status_compact.by_label), worked out once per snapshot."""
        return C.by_label(self.labels)

    @property
    def compact(self) -> bool:
        """Over 32 ranks: counts, the odd ranks named and a grid, not a square and a row per rank (status_compact.py)."""
        return C.compact(len(self.ranks))

    def label(self, rank: int) -> Label:
        info = self.infos.get(rank)
        label = state_label(info) if info is not None else RankState.STARTING
        # ddp_magic stopped it because another rank failed: not its fault. Once the cell ended, kernel.failures.blame.causes
        # (``stopped``) is the whole answer, so every root cause (a timeout may blame several ranks) keeps its own label.
        if rank in self.stopped or (not self.finished and self.root is not None and rank != self.root and label in STOPPED_BY_US):
            return RankState.STOPPED
        if rank in self.timed_out and self.finished:
            return FailureKind.TIMEOUT  # what the cell's message says of it: the others waited for this rank
        return label


def by_cause(found: Mapping[int, Tuple[str, str]]) -> Tuple[FrozenSet[int], FrozenSet[int]]:
    """kernel.failures.blame.causes -> (the ranks stopped or released because of another, the root causes of a --timeout)."""
    stopped = frozenset(r for r, (_, cause) in found.items() if cause == "stopped")
    return stopped, frozenset(r for r, (kind, cause) in found.items() if cause == "root" and kind == str(FailureKind.TIMEOUT))


# ---------------------------------------------------------------- words for one value
def all_ranks(nproc: int, infos: Mapping[int, Any]) -> List[int]:
    """The ranks to show: every rank asked for, and any the pool reported beyond them."""
    return sorted(set(range(nproc)) | set(infos))


def state_label(info: RankLike) -> Label:
    """The word shown for a rank: the pool's state, with DEAD split into killed (signal) and died (exit code)."""
    if info.state == RankState.DEAD:
        return FailureKind.KILLED if info.exit_code is not None and info.exit_code < 0 else FailureKind.DIED
    return info.state if isinstance(info.state, RankState) else RankState(info.state)  # the enum call costs µs a rank


def exit_text(info: RankLike) -> str:
    if info.state != RankState.DEAD or info.exit_code is None:
        return ""
    if info.exit_code < 0:
        try:
            return signal.Signals(-info.exit_code).name
        except ValueError:
            return f"signal {-info.exit_code}"
    return f"exit {info.exit_code}"


def fmt_clock(s: Optional[float]) -> str:
    """A live clock, at the precision it moves (the view ticks every ``status_view.CLOCK_TICK``): '0.4 s', '12.3 s',
    then fmt_seconds' '3 m 05 s'. A duration that ended is fmt_seconds' ('2.31 s', '998 ms')."""
    if s is None:
        return ""
    if s < 60:
        return f"{max(0.0, s):.1f} s" if round(s, 1) < 60 else "1 m 00 s"
    return fmt_seconds(s)


def clean_line(text: str, limit: int = 160) -> str:
    text = _ANSI.sub("", text).replace("\t", " ").strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def esc(x: Any) -> str:
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
        return checks_line(checks)

    def progress(self, text: str, s: "Snapshot") -> str:
        return text

    def odd(self, text: str) -> str:
        """The odd ranks named, over 32 ranks ('rank 517 failed')."""
        return text


class HtmlStyle(TextStyle):
    """The same parts in HTML: escaped, the marks and counts coloured inline (they survive sanitizers)."""

    def esc(self, x: Any) -> str:
        return esc(x)

    def mark(self, ok: bool) -> str:
        return f"<span style='{colours.color('ok' if ok else 'fail')};font-weight:bold'>{super().mark(ok)}</span>"

    def note(self, text: str) -> str:
        return f"<span style='{colours.color('fail')}'>{esc(text)}</span>"

    def count(self, label: Label, n: int) -> str:
        return f"<span style='{colours.color(tone_of(label))}'>{label} {n}</span>"

    def verdict(self, checks: Sequence[Check]) -> str:
        line = checks_line(checks)
        tone = "fail" if line.startswith("✗") else "warn" if line.startswith("!") else "ok"
        return f"<span class='ddp-status-checks' style='{colours.color(tone)}'>{esc(line)}</span>"

    def progress(self, text: str, s: "Snapshot") -> str:
        """The slowest bar's '43% 12.3 it/s'; every rank's bar in its tooltip."""
        every = "; ".join(f"rank {r}: {b.text()}" for r, b in sorted(s.bars.items()) if s.label(r) in ACTIVE)
        return f"<span class='ddp-status-progress' title='{esc(every)}'>{esc(text)}</span>"

    def odd(self, text: str) -> str:
        return f"<span class='ddp-status-odd'>{esc(text)}</span>"


TEXT, HTML = TextStyle(), HtmlStyle()


def summary_parts(s: Snapshot, style: TextStyle) -> List[str]:
    """The parts of the summary line, joined by ' · ': the outcome (or the counts), the run clock, backend, checks, start."""
    n = plural(len(s.ranks), "rank")
    if s.finished:
        note = f"{style.note(s.note)} · " if not s.ok and s.note else ""
        parts = [f"{n} {style.mark(s.ok)} {note}{style.esc(fmt_seconds(s.elapsed))}"]
    elif queue_text(s):  # the scheduler has not started the job: its words, and how long it has waited
        parts = [n, style.esc(queue_text(s)), style.esc(f"waited {fmt_seconds(s.starting_for or 0.0)}")]
    else:
        counts = s.groups
        states = debugging_text(s) or ", ".join(style.count(label, len(counts[label])) for label in STATE_TONES if counts.get(label))
        clock = f"start {fmt_clock(s.starting_for)}" if s.starting_for is not None else fmt_clock(s.elapsed)
        parts = [n, states, style.esc(clock)]
        progress = bars_text(s)
        if progress:
            parts.append(style.progress(progress, s))
    odd = C.odd_text(s.groups, said=[s.root] if s.finished and s.root is not None else ()) if s.compact else ""
    if odd:  # over 32 ranks no square names them: the line does
        parts.append(style.odd(odd))
    if s.backend:
        parts.append(style.esc(s.backend))
    if s.checks:
        parts.append(style.verdict(s.checks))
    if s.started_in is not None and s.starting_for is None:
        what = f"{ranks_phrase(s.restarted)} restarted" if s.restarted else "pool started"  # not the whole pool's old figure
        parts.append(f"{what} in {style.esc(fmt_seconds(s.started_in))}")
    if s.kept:
        parts.append(style.esc(s.kept))
    return parts


def opens_itself(s: Snapshot) -> bool:
    """Whether the live body is worth opening without a click: a chart to watch (a section) or a progress bar."""
    return not s.finished and (bool(s.bars) or bool(s.sections))
def queue_text(s: Snapshot) -> str:
    """'queued: job 1234 pending (Resources)' while a Slurm pool's job waits in the queue (kernel/placement.py); "" otherwise."""
    for r in s.ranks:
        info = s.infos.get(r)
        if info is not None and info.state == RankState.QUEUED:
            return clean_line(info.last_line, 120) or "queued"
    return ""


def debugging_text(s: Snapshot) -> str:
    """'rank 1 in debugger, 3 waiting' while ranks wait on the notebook (kernel/jobs/stdin.py); "" otherwise."""
    infos = [i for i in (s.infos.get(r) for r in s.ranks) if i is not None]
    held = [(i.rank, i.debugging) for i in infos if i.debugging != Waiting.NO]
    if not held:
        return ""
    others = sum(1 for i in infos if i.state == RankState.RUNNING and i.debugging == Waiting.NO)
    return ", ".join([f"rank {r} {waiting}" for r, waiting in held] + ([f"{others} waiting"] if others else []))


def summary(s: Snapshot) -> str:
    """One line: '4 ranks ✓ 2.31 s · gloo · ✓ 19 checks passed' at the end, the counts of each state while it runs."""
    return " · ".join(summary_parts(s, TEXT))


def header_html(s: Snapshot) -> str:
    """The summary line in HTML, then one square (or progress bar) per rank: always one line high."""
    state = "finished" if s.finished else "running"
    return (
        f"<span class='ddp-status-header' data-state='{state}' style='{colours.defs()}{LINE};white-space:nowrap'>"
        f"<b>%%ddp</b> {' · '.join(summary_parts(s, HTML))}{strip_html(s)}</span>"
    )


SQUARE = "display:inline-block;width:9px;height:9px;margin:0 1px;border-radius:2px;vertical-align:middle"
BAR = "display:inline-block;width:24px;height:7px;margin:0 2px;border-radius:2px;vertical-align:middle;overflow:hidden;border:1px solid"


def strip_html(s: Snapshot) -> str:
    """One small square per rank coloured by state, or a small bar while the rank shows a tqdm bar (32 ranks fit);
    over 32 ranks one bar of a segment per state (status_compact.py)."""
    if len(s.ranks) < 2 and not s.bars:
        return ""
    if s.compact:
        return C.segments_html(s.groups)
    cells = []
    for r in s.ranks:
        label, bar = s.label(r), s.bars.get(r)
        tone = tone_of(label)
        if bar is not None and bar.fraction is not None and label in ACTIVE:
            pct = f"{100 * bar.fraction:.0f}"
            cells.append(
                f"<i class='ddp-status-bar' data-rank='{r}' data-n='{bar.n:g}' data-total='{bar.total:g}' title='rank {r}: {esc(bar.text())}' style='{BAR}'>"
                f"<i style='display:block;height:100%;width:{pct}%;{colours.background_ref(tone)}'></i></i>"
            )
        else:
            square = f"{SQUARE};{colours.background_ref(tone)}"
            cells.append(f"<i class='ddp-status-square' data-rank='{r}' data-state='{label}' title='rank {r}: {label}' style='{square}'></i>")
    return f" <span class='ddp-status-strip'>{''.join(cells)}</span>"


def slowest_bar(s: Snapshot) -> Optional[Tuple[int, Bar]]:
    """The active rank whose bar is least far (the one the cell waits for), with its bar; None without bars."""
    bars = [(r, b) for r, b in s.bars.items() if s.label(r) in ACTIVE]
    if not bars:
        return None
    return min(bars, key=lambda rb: (rb[1].fraction if rb[1].fraction is not None else float("inf"), rb[1].n, rb[0]))


def bars_text(s: Snapshot) -> str:
    """'43% 12.3 it/s': the slowest running bar's progress and rate ('' without bars)."""
    slowest = slowest_bar(s)
    return slowest[1].short() if slowest is not None else ""


# ---------------------------------------------------------------- how the cell ended
def verdict(outcome: Any, error: Optional[BaseException]) -> Tuple[bool, str]:
    """Whether the cell succeeded, and why not in a few words (its first failure, or the error)."""
    if outcome is not None:
        failures = list(getattr(outcome, "failures", []) or [])
        note = clean_line(getattr(outcome, "cancel_text", "") or (failure_note(failures) if failures else ""), 100)
        return bool(getattr(outcome, "ok", False)), note
    if error is not None:
        first = (str(error).strip().splitlines() or [""])[0]
        return False, clean_line(f"{type(error).__name__}: {first}" if first else type(error).__name__, 100)
    return False, "the cell did not finish"


def failure_note(failures: Sequence[Any]) -> str:
    """The root cause's headline; when other ranks raised the very same error, all of them, in rank order
    ('ranks 0-3 raised ValueError: boom'), whichever rank's report came first."""
    root = failures[0]
    if getattr(root, "kind", None) != FailureKind.ERROR:
        return str(root.headline())
    same = [f.rank for f in failures if (f.kind, f.type, f.message) == (root.kind, root.type, root.message)]
    if len(same) < 2:
        return str(root.headline())
    return f"{ranks_phrase(same)} raised {root.type}: {root.message}".rstrip(": ")


def root_rank(outcome: Any) -> Optional[int]:
    """The rank whose failure explains the others (the policy lists it first)."""
    failures = list(getattr(outcome, "failures", []) or [])
    return getattr(failures[0], "rank", None) if failures else None
