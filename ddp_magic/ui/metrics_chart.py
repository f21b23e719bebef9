"""The metrics chart, from a payload (kernel/metrics.py ``CellMetrics.payload``): pure functions, inline SVG.

One small chart per metric, one line per rank (step on x), and a table: per metric the
last value (mean over the ranks' last values, with their range), the lowest value, the
mean over every rank and step, and the slowest rank (the one that reached the latest
common step last, and how much later). Everything is inline: ``style=`` attributes only
(an untrusted notebook loses <style> elements), colours as JupyterLab CSS variables with
fallbacks, so it reads in light and dark themes, after a reload, in nbviewer and on GitHub.

The HTML starts with a one-line summary and a ``<!--chart-->`` marker; what follows holds
the numbers, so notebooks/nbval_sanitize.cfg keeps the line and replaces the rest.
``chart_text`` is the text/plain form: that same line, which a run reproduces exactly.
"""
from __future__ import annotations

import html
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
TEXT = "var(--jp-ui-font-color1,#24292f)"
MUTED = "var(--jp-ui-font-color2,#6e7781)"
GRID = "var(--jp-border-color2,#d0d7de)"
FONT = "font-family:var(--jp-ui-font-family,sans-serif);font-size:var(--jp-ui-font-size1,12px)"
W, H = 300, 150
LEFT, RIGHT, TOP, BOTTOM = 46, 8, 18, 18
MAX_LEGEND = 16
MARKER = "<!--chart-->"


def rank_color(rank: int) -> str:
    """A rank's colour: a theme may set --ddp-magic-rank-N; else a categorical palette."""
    return f"var(--ddp-magic-rank-{rank},{PALETTE[rank % len(PALETTE)]})"


def fmt(x: Optional[float]) -> str:
    """Short numbers: 4 significant digits, thousands and up as k, M, G (throughput reads 19.1k, not 1.913e+04)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e4, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.4g}"


def headline(payload: Dict[str, Any]) -> str:
    """The one line both forms start with: what was logged, by how many ranks, over which steps."""
    names, ranks = payload.get("names", []), payload.get("ranks", [])
    if not names:
        return "ddp_magic metrics: nothing logged (call ddp_magic.log(step=i, loss=loss) on the ranks)"
    steps = [s for row in payload.get("summary", []) for s in row["steps"]]
    span = f", steps {min(steps)}-{max(steps)}" if steps else ""
    return f"ddp_magic metrics: {', '.join(names)} from {len(ranks)} rank{'s' if len(ranks) != 1 else ''}{span} (%ddp metrics gives the data)"


def chart_text(payload: Dict[str, Any]) -> str:
    return headline(payload)


def chart_html(payload: Dict[str, Any], live: bool = False) -> str:
    """The whole chart: the headline, one SVG per metric, the legend and the table."""
    head = html.escape(headline(payload))
    style = f"{FONT};color:{TEXT};margin:4px 0"
    if not payload.get("names"):
        return f"<div class='ddp-metrics' style='{style}'>{head}{MARKER}</div>"
    charts = "".join(f"<div style='margin:0 8px 4px 0'>{metric_svg(payload, n)}</div>" for n in payload["names"])
    body = (
        f"<div style='display:flex;flex-wrap:wrap'>{charts}</div>"
        f"{legend_html(payload.get('ranks', []))}{table_html(payload.get('summary', []), live)}"
    )
    return f"<div class='ddp-metrics' style='{style}'><div style='color:{MUTED};margin-bottom:2px'>{head}</div>{MARKER}{body}</div>"


def legend_html(ranks: Sequence[int]) -> str:
    shown = list(ranks)[:MAX_LEGEND]
    items = "".join(
        f"<span style='margin-right:10px;white-space:nowrap'><span style='display:inline-block;width:14px;height:3px;"
        f"vertical-align:middle;margin-right:4px;background:{rank_color(r)}'></span>rank {r}</span>"
        for r in shown
    )
    more = f"<span style='color:{MUTED}'>… {len(ranks) - len(shown)} more</span>" if len(ranks) > len(shown) else ""
    return f"<div style='margin:2px 0 4px 0'>{items}{more}</div>"


def table_html(summary: Sequence[Dict[str, Any]], live: bool = False) -> str:
    cell = "padding:1px 12px 1px 0;text-align:left;border:none;white-space:nowrap"
    heads = ("metric", "last (mean over ranks)", "min", "mean", "slowest rank" + (" so far" if live else ""))
    rows = ["<tr>" + "".join(f"<th style='{cell};color:{MUTED};font-weight:normal'>{h}</th>" for h in heads) + "</tr>"]
    for s in summary:
        spread = f" <span style='color:{MUTED}'>({fmt(s['last_lo'])} to {fmt(s['last_hi'])})</span>" if s["last_lo"] != s["last_hi"] else ""
        slow = f"rank {s['slowest']} (+{s['lag']:.2f} s)" if s.get("slowest") is not None else "-"
        values = (html.escape(s["name"]), fmt(s["last"]) + spread, fmt(s["min"]), fmt(s["mean"]), slow)
        rows.append("<tr>" + "".join(f"<td style='{cell}'>{v}</td>" for v in values) + "</tr>")
    return f"<table style='border-collapse:collapse;margin:0'>{''.join(rows)}</table>"


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


def metric_svg(payload: Dict[str, Any], name: str) -> str:
    """One metric: a line per rank, the y range at the left, the first and last step below."""
    lines = payload.get("series", {}).get(name, {})
    x0, x1, y0, y1 = _bounds(lines)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        return TOP + (y1 - y) / (y1 - y0) * ph

    parts = [f"<text x='{LEFT}' y='12' style='fill:{TEXT};font-weight:600'>{html.escape(name)}</text>"]
    for frac in (0.0, 0.5, 1.0):
        y = y0 + frac * (y1 - y0)
        parts.append(f"<line x1='{LEFT}' x2='{W - RIGHT}' y1='{py(y):.1f}' y2='{py(y):.1f}' style='stroke:{GRID};stroke-width:1'/>")
        parts.append(f"<text x='{LEFT - 4}' y='{py(y) + 4:.1f}' text-anchor='end' style='fill:{MUTED}'>{fmt(y)}</text>")
    for x, anchor in ((x0, "start"), (x1, "end")):
        parts.append(f"<text x='{px(x):.1f}' y='{H - 4}' text-anchor='{anchor}' style='fill:{MUTED}'>{fmt(x)}</text>")
    for rank in sorted(lines, key=int):
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in lines[rank] if y is not None)
        if pts:
            parts.append(f"<polyline points='{pts}' style='fill:none;stroke:{rank_color(int(rank))};stroke-width:1.5'/>")
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{H}' viewBox='0 0 {W} {H}' "
        f"style='{FONT};font-size:11px;overflow:visible'>{''.join(parts)}</svg>"
    )


def bundle(payload: Dict[str, Any]) -> Dict[str, str]:
    """The display bundle left in the notebook when the cell ends: the static chart and its text line."""
    return {"text/html": chart_html(payload), "text/plain": chart_text(payload)}
