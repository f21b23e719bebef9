"""The status view over 32 ranks: counts per state, the odd ranks named, a grid and a row per node, not 1,024 squares.

At n ≤ 32 the view keeps a square per rank and a row per rank (status_render.py,
status_tables.py). Above, the one-line header holds a bar of one segment per state
(``span.ddp-status-strip`` of ``i.ddp-status-segment[data-state][data-count]``) and
names the odd ranks ('rank 517 failed'); what opens on click holds one row per node
and state (``div.ddp-status-groups``), a grid of one small square per rank in runs of
one state (``div.ddp-status-grid``), and the odd ranks' own rows. Pure functions of
each rank's label (status_labels.py) and host: O(n) string work, a few kB of HTML.
"""
from __future__ import annotations

import html
from typing import Dict, List, Mapping, Sequence, Tuple

from ..words import short_rank_list
from . import colours
from .status_labels import FAILURES, STATE_TONES, Label, tone_of

COMPACT_ABOVE = 32  # more ranks than this: the view summarises; at most this many keep a square and a row each
ODD_MAX = 32  # a state (not the most common one) with at most this many ranks is odd: its ranks are named
NAMED_RUNS = 4  # a rank list in a sentence shows this many runs, then counts the rest
GRID_ROW = 64  # squares per line of the grid
DETAIL_ROWS = 32  # the odd ranks' own rows at most
ORDER: Tuple[Label, ...] = tuple(STATE_TONES)


def compact(n: int) -> bool:
    """Whether a view of ``n`` ranks summarises them (n > 32)."""
    return n > COMPACT_ABOVE


def by_label(labels: Mapping[int, Label]) -> Dict[Label, List[int]]:
    """Each label's ranks, in the mapping's order (rank order: Snapshot.labels), the labels in the summary's order."""
    out: Dict[Label, List[int]] = {}
    for r, lb in labels.items():
        out.setdefault(lb, []).append(r)
    return {label: out[label] for label in sorted(out, key=lambda lb: ORDER.index(lb) if lb in ORDER else len(ORDER))}


def short_list(ranks: Sequence[int], runs: int = NAMED_RUNS) -> str:
    """'0-511', '3, 9, 17, 20 and 40 more' (words.short_rank_list)."""
    return short_rank_list(ranks, runs)


def ranks_words(ranks: Sequence[int]) -> str:
    """'rank 517', 'ranks 3, 9, 17, 20 and 40 more'."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {short_list(ranks)}"


def odd(groups: Mapping[Label, List[int]]) -> List[Tuple[Label, List[int]]]:
    """The states worth naming ranks for (of ``by_label``'s groups): a failure however many, any other but the most
    common one when few."""
    if len(groups) < 2:
        return []
    common = max(groups, key=lambda lb: len(groups[lb]))
    return [(lb, rs) for lb, rs in groups.items() if lb != common and (lb in FAILURES or len(rs) <= ODD_MAX)]


def odd_text(groups: Mapping[Label, List[int]], said: Sequence[int] = ()) -> str:
    """'rank 517 failed; ranks 3, 9 running' (a state whose ranks are exactly ``said``, named already, is left out)."""
    return "; ".join(f"{ranks_words(rs)} {lb}" for lb, rs in odd(groups) if list(rs) != list(said))


def detail_ranks(groups: Mapping[Label, List[int]]) -> List[int]:
    """The ranks that get a row of their own: the odd ones, at most DETAIL_ROWS."""
    return sorted(r for _, rs in odd(groups) for r in rs)[:DETAIL_ROWS]


def _esc(x: object) -> str:
    return html.escape(str(x), quote=True)


STRIP = "display:inline-block;width:120px;height:9px;margin:0 2px;border-radius:2px;overflow:hidden;vertical-align:middle;line-height:0;white-space:nowrap"


def segments_html(groups: Mapping[Label, List[int]]) -> str:
    """The header's bar: one segment per state, as wide as its share of the ranks (never less than 2 px)."""
    n = max(1, sum(len(rs) for rs in groups.values()))
    segs = "".join(
        f"<i class='ddp-status-segment' data-state='{lb}' data-count='{len(rs)}' title='{lb} {len(rs)}: {_esc(short_list(rs))}' "
        f"style='display:inline-block;height:100%;min-width:2px;width:{100 * len(rs) / n:.2f}%;{colours.background_ref(tone_of(lb))}'></i>"
        for lb, rs in groups.items()
    )
    return f" <span class='ddp-status-strip' data-ranks='{n}' style='{STRIP}'>{segs}</span>"


def grid_html(labels: Mapping[int, Label]) -> str:
    """One small square per rank, 64 a line (its first rank in front), each run of one state a single coloured span:
    a few µs a run, so 1,024 ranks of alternating states stay a few ms and ~50 kB (which ranks: the rows above)."""
    items = list(labels.items())  # rank order (Snapshot.labels)
    styles = {lb: f"<span data-state='{lb}' style='{colours.color_ref(tone_of(lb))}'>" for lb in set(labels.values())}
    lines = []
    for at in range(0, len(items), GRID_ROW):
        chunk = items[at:at + GRID_ROW]
        squares, run_label, run = [], chunk[0][1], 0
        for _, lb in chunk:
            if lb != run_label:
                squares.append(f"{styles[run_label]}{'■' * run}</span>")
                run_label, run = lb, 0
            run += 1
        squares.append(f"{styles[run_label]}{'■' * run}</span>")
        first, last = chunk[0][0], chunk[-1][0]
        lines.append(f"<div title='ranks {first}-{last}'><span style='{ROW_HEAD}'>{first}</span>{''.join(squares)}</div>")
    return f"<div class='ddp-status-grid' style='{colours.defs()}font-family:monospace;font-size:10px;line-height:11px'>{''.join(lines)}</div>"


ROW_HEAD = "display:inline-block;width:4em;text-align:right;margin-right:4px;opacity:.6"


def group_rows(labels: Mapping[int, Label], hosts: Mapping[int, str]) -> List[Dict[str, str]]:
    """One row per node (host) and state: the state, how many ranks, which (compact); nodes in order of their first rank."""
    groups: Dict[Tuple[str, Label], List[int]] = {}
    for r, lb in labels.items():  # rank order (Snapshot.labels)
        groups.setdefault((hosts.get(r, ""), lb), []).append(r)
    first: Dict[str, int] = {}
    for (host, _), rs in groups.items():
        first[host] = min(first.get(host, rs[0]), rs[0])
    order = sorted(groups, key=lambda k: (first[k[0]], ORDER.index(k[1]) if k[1] in ORDER else len(ORDER)))
    return [{"node": host, "state": str(lb), "count": str(len(groups[(host, lb)])), "ranks": short_list(groups[(host, lb)], 6)}
            for host, lb in order]


def group_columns(rows: Sequence[Mapping[str, str]]) -> List[str]:
    """The node column only when the ranks are on more than one."""
    return (["node"] if len({row["node"] for row in rows}) > 1 else []) + ["state", "count", "ranks"]


CELL = "text-align:left;padding:0 9px 0 0;white-space:nowrap"


def groups_html(labels: Mapping[int, Label], hosts: Mapping[int, str]) -> str:
    """The per-node rows as a small table (inline styles only), the state coloured."""
    rows = group_rows(labels, hosts)
    cols = group_columns(rows)

    def cell(row: Mapping[str, str], col: str) -> str:
        tone = f"{colours.color_ref(tone_of(STATE_BY_NAME[row['state']]))};font-weight:bold" if col == "state" and row["state"] in STATE_BY_NAME else ""
        return f"<td style='{CELL};{tone}'>{_esc(row[col])}</td>"

    head = "".join(f"<th style='{CELL};font-weight:bold'>{c}</th>" for c in cols)
    body = "".join(f"<tr data-state='{_esc(row['state'])}' data-count='{row['count']}'>" + "".join(cell(row, c) for c in cols) + "</tr>" for row in rows)
    return (f"<div class='ddp-status-groups' style='{colours.defs()}'><table style='border-collapse:collapse;margin:0'>"
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>")


STATE_BY_NAME: Dict[str, Label] = {str(lb): lb for lb in ORDER}
