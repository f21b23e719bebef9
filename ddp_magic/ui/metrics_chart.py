"""The metrics chart, from a payload (kernel/results/metrics.py ``CellMetrics.payload``): pure functions; inline SVG live, an <img> per metric saved.

One small chart per metric, one line per rank (step on x), and a table: per metric the
last value (mean over the ranks' last values, with their range), the lowest value, the
mean over every rank and step, and the slowest rank (kernel/results/metrics.py ``Straggler``: the
profile's when ``--profile`` ran, else the logged steps'; "no straggler" when none stands out).

Two forms (``ChartForm``). While the cell runs the chart is inline SVG coloured with
JupyterLab's CSS variables (the live status view is the kernel's own output, never
sanitized). What stays in the notebook must survive JupyterLab's sanitizer, because a
shipped or reopened notebook is untrusted and there text/html is still the output shown
(it is a "safe" renderer: it sanitizes), and the sanitizer drops every <svg> element and
every ``var()`` style. So the saved chart draws each metric as an <img> of a self-contained
SVG (a data: URL, which the sanitizer keeps on <img>) on its own light card (the JupyterLab extension's
stylesheet darkens the picture in a dark theme: labextension/style/cell.css), and writes the
legend and table in plain HTML whose colours come as a hex value first. The text/plain form
is the headline and the same table as text (what a terminal or a plain IPython shows).

Every label fits its chart: the y axis' margin is as wide as its longest label, by
``text_width``, an estimate that is at least DejaVu Sans' width (the widest common sans-serif).

The HTML starts with a one-line summary and a ``<!--chart-->`` marker, the text with the same
line; what follows holds the numbers, so notebooks/nbval_sanitize.cfg keeps the line and
replaces the rest.
"""
from __future__ import annotations

import base64
import html
import math
from enum import Enum
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..words import fmt_seconds, rank_list

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
TEXT = "var(--jp-ui-font-color1,#24292f)"
MUTED = "var(--jp-ui-font-color2,#6e7781)"
GRID = "var(--jp-border-color2,#d0d7de)"
FONT = "font-family:var(--jp-ui-font-family,sans-serif);font-size:var(--jp-ui-font-size1,12px)"
W, H = 300, 150
PAD, GAP, RIGHT, TOP, BOTTOM = 4, 4, 8, 24, 18  # PAD: the edge to a label; GAP: a y label to the plot; TOP/BOTTOM: the plot's margins
SIZE = 11  # px, every label of a chart
ASCENT, DESCENT = 0.93, 0.24  # DejaVu Sans' ascender and descender (em): a label's box around its baseline
MAX_LEGEND = 16
MARKER = "<!--chart-->"
UNITS = ((1e3, "k"), (1e6, "M"), (1e9, "G"), (1e12, "T"))
NO_STRAGGLER = "no straggler"


class ChartForm(str, Enum):
    """Where a chart is shown: live in the cell's status view, or saved in the notebook (sanitized when untrusted)."""

    LIVE = "live"
    SAVED = "saved"


class Ink(NamedTuple):
    """A form's colours: theme variables where the page's CSS applies, plain hex inside an <img>."""

    text: str
    muted: str
    grid: str
    font: str
    card: str  # the chart's own background ('' : the page's)


INKS = {
    ChartForm.LIVE: Ink(TEXT, MUTED, GRID, "var(--jp-ui-font-family,sans-serif)", ""),
    ChartForm.SAVED: Ink("#24292f", "#57606a", "#d0d7de", "sans-serif", "#ffffff"),
}


def rank_color(rank: int, form: ChartForm = ChartForm.LIVE) -> str:
    """A rank's colour: a theme may set --ddp-magic-rank-N where the page's CSS applies; else a categorical palette."""
    plain = PALETTE[rank % len(PALETTE)]
    return f"var(--ddp-magic-rank-{rank},{plain})" if form is ChartForm.LIVE else plain


def fmt(x: Optional[float]) -> str:
    """Short numbers: 4 significant digits below 10,000 ("5963", "0.0002628", "1e-06"); from 10,000 up, 3 significant
    digits and the largest of k, M, G, T whose mantissa stays under 1000 ("15.9k" is 15,900; 999,999 is "1M"); past
    that, "1e+15". None, NaN and infinities are "-", zero (and -0) is "0". labextension/src/metrics.ts fmtValue is the same."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if x == 0:
        return "0"
    if abs(float(f"{x:.4g}")) < 1e4:
        return f"{x:.4g}"
    for div, suffix in UNITS:
        m = float(f"{x / div:.3g}")
        if abs(m) < 1000:
            return f"{m:.3g}{suffix}"
    return f"{x:.3g}"


def tick_labels(values: Sequence[float]) -> List[str]:
    """The y axis' labels, in one precision: 4 significant digits on the largest, every label with as many decimals,
    and no more than the labels need ("1.05", "8.92", "16.80"; "0.0", "0.5", "1.0"), so that they read as one scale.
    From 10,000 up, and below 0.0001, ``fmt``'s own forms ("15.9k", "1e-05"). labextension/src/metrics.ts tickLabels
    is the same."""
    top = max(abs(v) for v in values)
    if not top > 0 or top >= 1e4 or top < 1e-4:
        return [fmt(v) for v in values]
    decimals = max(0, 3 - math.floor(math.log10(top)))
    labels = [f"{v:.{decimals}f}" for v in values]
    while decimals > 0 and all(t.endswith("0") for t in labels):
        decimals -= 1
        labels = [f"{v:.{decimals}f}" for v in values]
    return [t.replace("-", "") if float(t) == 0 else t for t in labels]


def identical_ranks(lines: Dict[str, List[List[Any]]]) -> List[List[int]]:
    """The ranks whose points are the same on every step they both logged (a loss DDP keeps in step; one rank may be a
    step ahead of another while the job runs): groups of two or more, lowest rank first. One line is drawn per group,
    its longest member's, in its first rank's colour, and the chart says so: drawn one over the other, the last rank's
    line would hide the others'. labextension/src/metrics.ts identicalRanks is the same."""
    groups: List[Tuple[List[List[Any]], List[int]]] = []  # (the longest points of the group, its ranks)
    for rank in sorted(lines, key=int):
        pts = [list(p) for p in lines[rank]]
        for i, (rep, ranks) in enumerate(groups):
            short, long_ = (pts, rep) if len(pts) <= len(rep) else (rep, pts)
            if pts and long_[: len(short)] == short:
                groups[i] = (long_, ranks + [int(rank)])
                break
        else:
            groups.append((pts, [int(rank)]))
    return [ranks for _, ranks in groups if len(ranks) > 1]


def group_line(lines: Dict[str, List[List[Any]]], group: Sequence[int]) -> List[List[Any]]:
    """The points drawn for an identical group: its longest member's (the rank a step ahead shows that step)."""
    by_rank = {int(k): v for k, v in lines.items()}
    return max((by_rank[r] for r in group), key=len)


def identical_text(groups: Sequence[Sequence[int]]) -> str:
    """ "ranks 0-1 identical" ('' when none)."""
    return "; ".join(f"ranks {rank_list(g)} identical" for g in groups)


def slowest_text(s: Dict[str, Any]) -> str:
    """A summary row's straggler: "rank 1 (+0.12 s)", with the profile's measure named, or "no straggler"."""
    if s.get("slowest") is None:
        return NO_STRAGGLER
    if s.get("slowest_by") == "profile":
        return f"rank {s['slowest']} (profile: the others waited +{fmt_seconds(s['lag'])})"
    return f"rank {s['slowest']} (+{fmt_seconds(s['lag'])})"  # the panel's words too (metrics.ts summaryRows: fmtSeconds)


# ---------------------------------------------------------------- text: widths, headline, the table as text
_NARROW, _MID, _WIDE = set("ijlI.,:;'|!"), set("frt()-/ "), set("mwMW%+…")


def text_width(text: str, size: float = SIZE, bold: bool = False) -> float:
    """An upper estimate of ``text``'s width in px (per character, at least DejaVu Sans' advance)."""
    em = sum(0.36 if c in _NARROW else 0.45 if c in _MID else 1.0 if c in _WIDE else 0.8 if c.isupper() else 0.66 for c in text)
    return em * size * (1.1 if bold else 1.0)


def fit(text: str, width: float, bold: bool = False) -> str:
    """``text`` cut (with "…") to ``width`` px."""
    if text_width(text, bold=bold) <= width:
        return text
    while text and text_width(text + "…", bold=bold) > width:
        text = text[:-1]
    return text + "…"


def headline(payload: Dict[str, Any]) -> str:
    """The one line both forms start with: what was logged, by how many ranks, over which steps."""
    names, ranks = payload.get("names", []), payload.get("ranks", [])
    if not names:
        return "ddp_magic metrics: nothing logged (call ddp_magic.log(step=i, loss=loss) on the ranks)"
    steps = [s for row in payload.get("summary", []) for s in row["steps"]]
    span = f", steps {min(steps)}-{max(steps)}" if steps else ""
    return f"ddp_magic metrics: {', '.join(names)} from {len(ranks)} rank{'s' if len(ranks) != 1 else ''}{span} (%ddp metrics gives the data)"


def table_rows(summary: Sequence[Dict[str, Any]], live: bool = False) -> List[Tuple[str, ...]]:
    """The table's header and one row per metric, as text: what both the HTML and the text table show."""
    heads = ("metric", "last (mean over ranks)", "min", "mean", "slowest rank" + (" so far" if live else ""))
    rows: List[Tuple[str, ...]] = [heads]
    for s in summary:
        spread = f" ({fmt(s['last_lo'])} to {fmt(s['last_hi'])})" if s["last_lo"] != s["last_hi"] else ""
        rows.append((s["name"], fmt(s["last"]) + spread, fmt(s["min"]), fmt(s["mean"]), slowest_text(s)))
    return rows


def chart_text(payload: Dict[str, Any]) -> str:
    """The text/plain form: the headline, then the table in aligned columns."""
    rows = table_rows(payload.get("summary", []))
    if len(rows) < 2:
        return headline(payload)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join([headline(payload)] + lines)


# ---------------------------------------------------------------- HTML
def chart_html(payload: Dict[str, Any], live: bool = False) -> str:
    """The whole chart: the headline, one picture per metric, the legend and the table (``live``: the live form)."""
    form = ChartForm.LIVE if live else ChartForm.SAVED
    head = html.escape(headline(payload))
    style = f"{FONT};color:{TEXT};margin:4px 0"
    if not payload.get("names"):
        return f"<div class='ddp-metrics' style='{style}'>{head}{MARKER}</div>"
    charts = "".join(f"<div style='margin:0 8px 4px 0'>{_picture(payload, n, form)}</div>" for n in payload["names"])
    body = (
        f"<div style='display:flex;flex-wrap:wrap'>{charts}</div>"
        f"{legend_html(payload.get('ranks', []), form)}{table_html(payload.get('summary', []), live)}"
    )
    return f"<div class='ddp-metrics' style='{style}'><div style='color:{MUTED};margin-bottom:2px'>{head}</div>{MARKER}{body}</div>"


def _picture(payload: Dict[str, Any], name: str, form: ChartForm) -> str:
    svg = metric_svg(payload, name, form)
    if form is ChartForm.LIVE:
        return svg
    data = base64.b64encode(svg.encode()).decode("ascii")
    return f"<img src='data:image/svg+xml;base64,{data}' width='{W}' height='{H}' alt='{html.escape(_alt(payload, name), quote=True)}'>"


def _alt(payload: Dict[str, Any], name: str) -> str:
    s = next((s for s in payload.get("summary", []) if s["name"] == name), None)
    return f"{name}: chart of {len(payload.get('ranks', []))} ranks" + (f", last {fmt(s['last'])}, min {fmt(s['min'])}" if s else "")


def legend_html(ranks: Sequence[int], form: ChartForm = ChartForm.LIVE) -> str:
    """A swatch per rank: hex first (what a sanitizer keeps), then the theme's rank colour where the page's CSS applies."""
    shown = list(ranks)[:MAX_LEGEND]

    def swatch(r: int) -> str:
        hexed = f"background:{rank_color(r, ChartForm.SAVED)}"
        return hexed if form is ChartForm.SAVED else f"{hexed};background:{rank_color(r)}"

    items = "".join(
        f"<span style='margin-right:10px;white-space:nowrap'><span style='display:inline-block;width:14px;height:3px;"
        f"vertical-align:middle;margin-right:4px;{swatch(r)}'></span>rank {r}</span>"
        for r in shown
    )
    more = f"<span style='color:{MUTED}'>… {len(ranks) - len(shown)} more</span>" if len(ranks) > len(shown) else ""
    return f"<div style='margin:2px 0 4px 0'>{items}{more}</div>"


def table_html(summary: Sequence[Dict[str, Any]], live: bool = False) -> str:
    cell = "padding:1px 12px 1px 0;text-align:left;border:none;white-space:nowrap"
    heads, *body = table_rows(summary, live)
    rows = ["<tr>" + "".join(f"<th style='{cell};color:{MUTED};font-weight:normal'>{html.escape(h)}</th>" for h in heads) + "</tr>"]
    for values in body:
        rows.append("<tr>" + "".join(f"<td style='{cell}'>{html.escape(v)}</td>" for v in values) + "</tr>")
    return f"<table style='border-collapse:collapse;margin:0'>{''.join(rows)}</table>"


# ---------------------------------------------------------------- SVG
def _bounds(lines: Dict[str, List[List[Any]]]) -> Tuple[float, float, float, float]:
    xs = [p[0] for pts in lines.values() for p in pts if p[1] is not None]
    ys = [p[1] for pts in lines.values() for p in pts if p[1] is not None]
    if not xs:
        return 0.0, 1.0, 0.0, 1.0
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        pad = abs(y0) * 0.05 or 1.0
        y0, y1 = y0 - pad, y1 + pad
    return float(x0), float(x1), float(y0), float(y1)


def _label(x: float, y: float, text: str, fill: str, anchor: str = "start", bold: bool = False) -> str:
    weight = ";font-weight:600" if bold else ""
    return f"<text x='{x:.1f}' y='{y:.1f}' text-anchor='{anchor}' style='fill:{fill}{weight}'>{html.escape(text)}</text>"


def metric_svg(payload: Dict[str, Any], name: str, form: ChartForm = ChartForm.LIVE) -> str:
    """One metric: a line per rank, the y range at the left (a margin as wide as its labels), the first and last step below."""
    ink = INKS[form]
    lines = payload.get("series", {}).get(name, {})
    x0, x1, y0, y1 = _bounds(lines)
    values = [y0 + f * (y1 - y0) for f in (0.0, 0.5, 1.0)]
    ticks = list(zip(values, tick_labels(values)))
    same = identical_ranks(lines)
    once = {r for g in same for r in g[1:]}  # drawn in their group's first rank's line
    note = fit(identical_text(same), W / 2) if same else ""
    left = PAD + max(text_width(t) for _, t in ticks) + GAP
    pw, ph = W - left - RIGHT, H - TOP - BOTTOM

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        return TOP + (y1 - y) / (y1 - y0) * ph

    parts = [f"<rect x='0.5' y='0.5' width='{W - 1}' height='{H - 1}' rx='4' style='fill:{ink.card};stroke:{ink.grid}'/>"] if ink.card else []
    parts.append(_label(PAD, 13, fit(name, W - 2 * PAD - (text_width(note) + GAP * 2 if note else 0), bold=True), ink.text, bold=True))
    if note:
        parts.append(_label(W - PAD, 13, note, ink.muted, "end"))
    for y, text in ticks:
        parts.append(f"<line x1='{left:.1f}' x2='{W - RIGHT}' y1='{py(y):.1f}' y2='{py(y):.1f}' style='stroke:{ink.grid};stroke-width:1'/>")
        parts.append(_label(left - GAP, py(y) + 4, text, ink.muted, "end"))
    parts.append(_label(px(x0), H - 4, fmt(x0), ink.muted, "start"))
    parts.append(_label(px(x1), H - 4, fmt(x1), ink.muted, "end"))
    drawn = {g[0]: group_line(lines, g) for g in same}
    for rank in sorted(lines, key=int):
        if int(rank) in once:
            continue
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in drawn.get(int(rank), lines[rank]) if y is not None)
        if pts:
            parts.append(f"<polyline points='{pts}' style='fill:none;stroke:{rank_color(int(rank), form)};stroke-width:1.5'/>")
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{H}' viewBox='0 0 {W} {H}' "
        f"style='font-family:{ink.font};font-size:{SIZE}px'>{''.join(parts)}</svg>"
    )


def bundle(payload: Dict[str, Any]) -> Dict[str, str]:
    """The display bundle left in the notebook when the cell ends: the saved chart and its text form."""
    return {"text/html": chart_html(payload), "text/plain": chart_text(payload)}
