"""How a ShardedResult shows in a notebook: its global shape and a small picture of who holds which block.

Like torch's ``visualize_sharding``: the tensor's (up to two) sharded dims are
cut where the shards begin, and each cell of the grid names the ranks that hold
that block (several where a mesh dim replicates it, marked ``+`` where it is
Partial and summed). Never the numbers: a sharded result is usually megabytes.
Importing this module makes it the renderer of ``kernel.results.sharded.ShardedResult``.
"""
from __future__ import annotations

import html
from typing import Dict, List, Sequence, Tuple

from ..kernel.results.sharded import ShardedResult
from ..words import ranks_phrase
from ..wire.sharded import placement_text

MAX_CUTS = 8  # rows or columns drawn; more are elided
COLORS = ("#dbeafe", "#fde68a", "#bbf7d0", "#fecaca", "#e9d5ff", "#fed7aa", "#a5f3fc", "#f5d0fe")

Span = Tuple[int, int]


def headline(r: ShardedResult) -> str:
    """'ShardedResult (8, 16) float32 — Shard(0), Shard(1) on mesh dp=2 × tp=2 (cpu)'."""
    shape = "(" + ", ".join(str(s) for s in r.shape) + ("," if r.ndim == 1 else "") + ")"
    placements = ", ".join(placement_text(p) for p in r.placement_specs)
    return f"ShardedResult {shape} {str(r.dtype).replace('torch.', '')} — {placements} on mesh {r.mesh.text()}"


def picture_dims(r: ShardedResult) -> List[int]:
    """The tensor dims the picture's rows and columns follow: the sharded ones first, then the leading ones (at most 2)."""
    sharded = sorted({p[1] for p in r.placement_specs if p[0] == "shard"})
    dims = sharded + [d for d in range(r.ndim) if d not in sharded]
    return sorted(dims[: min(2, r.ndim)])


def _spans(r: ShardedResult, dim: int) -> List[Span]:
    """Where the blocks along ``dim`` begin and end (every rank's block, non-empty ones)."""
    cuts = {0, int(r.shape[dim])}
    for rank in r.ranks:
        offsets, sizes = r.block(rank)
        if sizes[dim]:
            cuts |= {offsets[dim], offsets[dim] + sizes[dim]}
    edges = sorted(cuts)
    return list(zip(edges, edges[1:]))


def grid(r: ShardedResult) -> Tuple[List[int], List[Span], List[Span], Dict[Tuple[int, int], List[int]]]:
    """(dims, row spans, column spans, (row, col) -> ranks holding that block)."""
    dims = picture_dims(r)
    rows = _spans(r, dims[0]) if dims else [(0, 1)]
    cols = _spans(r, dims[1]) if len(dims) > 1 else [(0, 1)]
    cells: Dict[Tuple[int, int], List[int]] = {}
    for rank in r.ranks:
        offsets, sizes = r.block(rank)
        if 0 in sizes:
            continue
        for i, (a, b) in enumerate(rows):
            for j, (c, d) in enumerate(cols):
                inside_row = not dims or offsets[dims[0]] <= a and b <= offsets[dims[0]] + sizes[dims[0]]
                inside_col = len(dims) < 2 or offsets[dims[1]] <= c and d <= offsets[dims[1]] + sizes[dims[1]]
                if inside_row and inside_col:
                    cells.setdefault((i, j), []).append(rank)
    return dims, rows, cols, cells


def _who(r: ShardedResult, ranks: Sequence[int]) -> str:
    if len(ranks) > 1 and any(p[0] == "partial" for p in r.placement_specs):
        return "ranks " + "+".join(str(x) for x in ranks)  # partial values: the block is their sum
    return ranks_phrase(ranks)


def _span_text(span: Span) -> str:
    return f"{span[0]}:{span[1]}"


def footnotes(r: ShardedResult) -> List[str]:
    notes = []
    empty = [rank for rank in r.ranks if 0 in r.block(rank)[1]]
    if empty:
        notes.append(f"uneven: {ranks_phrase(empty)} {'holds' if len(empty) == 1 else 'hold'} an empty shard")
    partial = [placement_text(p) for p in r.placement_specs if p[0] == "partial"]
    if partial:
        notes.append(f"{partial[0]}: the ranks of a block are reduced by .full()")
    if any(p[0] == "replicate" for p in r.placement_specs):
        notes.append("Replicate(): ranks of a block hold the same copy; .full() uses one")
    if r.copies:
        others = "; ".join(ranks_phrase(ranks) for ranks in r.copies)
        notes.append(f"the same tensor on the sub-mesh of {others} too: equal copies")
    return notes


def text(r: ShardedResult) -> str:
    """The text repr: the headline, then one line per row of blocks (columns padded)."""
    dims, rows, cols, cells = grid(r)
    head = [""] + [f"dim{dims[1]} {_span_text(c)}" if len(dims) > 1 else "" for c in cols[:MAX_CUTS]]
    table = [head]
    for i, row in enumerate(rows[:MAX_CUTS]):
        label = f"dim{dims[0]} {_span_text(row)}" if dims else "scalar"
        table.append([label] + [_who(r, cells.get((i, j), [])) if cells.get((i, j)) else "-" for j in range(len(cols[:MAX_CUTS]))])
    widths = [max(len(line[k]) for line in table) for k in range(len(head))]
    lines = ["  " + "  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in table]
    if len(dims) < 2:
        lines = lines[1:]
    if len(rows) > MAX_CUTS or len(cols) > MAX_CUTS:
        lines.append(f"  … {len(rows)} × {len(cols)} blocks in all")
    return "\n".join([headline(r)] + lines + [f"  ({n})" for n in footnotes(r)])


def html_repr(r: ShardedResult) -> str:
    """A coloured grid, one colour per rank (the first rank of a block decides)."""
    dims, rows, cols, cells = grid(r)
    esc = html.escape
    th = "".join(f"<th style='padding:2px 6px'>{esc(f'dim{dims[1]} {_span_text(c)}') if len(dims) > 1 else ''}</th>" for c in cols[:MAX_CUTS])
    body = ""
    for i, row in enumerate(rows[:MAX_CUTS]):
        tds = ""
        for j in range(len(cols[:MAX_CUTS])):
            ranks = cells.get((i, j), [])
            color = COLORS[ranks[0] % len(COLORS)] if ranks else "#f3f4f6"
            tds += f"<td style='background:{color};padding:4px 10px;text-align:center;border:1px solid #fff'>{esc(_who(r, ranks) if ranks else '-')}</td>"
        label = f"dim{dims[0]} {_span_text(row)}" if dims else "scalar"
        body += f"<tr><th style='padding:2px 6px;text-align:right'>{esc(label)}</th>{tds}</tr>"
    notes = "".join(f"<div style='font-size:11px;color:#555'>{esc(n)}</div>" for n in footnotes(r))
    return (
        f"<div class='ddp-sharded'><div style='font-family:monospace'>{esc(headline(r))}</div>"
        f"<table style='border-collapse:collapse;font-family:monospace;font-size:12px;margin:4px 0'>"
        f"<thead><tr><th></th>{th}</tr></thead><tbody>{body}</tbody></table>{notes}</div>"
    )


class _Renderer:
    def text(self, result: ShardedResult) -> str:
        return text(result)

    def html(self, result: ShardedResult) -> str:
        return html_repr(result)


ShardedResult.renderer = _Renderer()
