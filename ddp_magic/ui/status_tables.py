"""The status view's page: the rank table, the env section, and the whole view as HTML and text, from a snapshot.

status_render.py says the summary line and the words for one value; this module
puts the page together: the ``<details>`` form left in the notebook
(``static_html``), what opens on click (``body_html``), and the text forms.
Pure functions of a ``Snapshot``; inline styles only (no ``<style>``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import describe_exit
from ..kernel.memory import peak_text, range_text
from ..plan import DIST_VARS, Check
from . import colours
from . import status_compact as C
from .report import (
    checks_html, checks_line, checks_text, common_env, env_digest, env_rows, env_table_html, table_text, worth_saying,
)
from .status_render import (
    FONT, LINE, TEXT_PREFIX, Label, Snapshot, clean_line, esc, exit_text, fmt_bytes, fmt_seconds, header_html, summary, tone_of,
)

CELL = "text-align:left;padding:0 9px 0 0;white-space:nowrap"
SMALL = "font-size:12px;line-height:18px"


@dataclass(frozen=True)
class RankRow:
    """One rank as the table shows it: the text of each column, plus the exit in words for a tooltip."""

    rank: int
    label: Label
    cells: Dict[str, str] = field(default_factory=dict)
    exit_title: str = ""


def rank_row(s: Snapshot, rank: int) -> RankRow:
    label, info = s.label(rank), s.infos.get(rank)
    cells = {"rank": str(rank), "state": str(label)}
    bar = s.bars.get(rank)
    cells["progress"] = bar.text() if bar is not None else ""
    if info is None:
        cells.update({c: "" for c in ("time", "device", "pid", "exit", "memory", "host", "last line")})
        return RankRow(rank, label, cells)
    exit_, mem = exit_text(info), getattr(info, "mem", None)
    live = s.lines.get(rank) or info.last_line or (info.tail[-1] if info.tail else "")
    cells.update(
        {
            "time": fmt_seconds(info.finished - info.started) if info.started and info.finished else "",  # the header has the live clock
            "device": info.device or "",
            "pid": str(info.pid or ""),
            "exit": exit_,
            "memory": mem.short() if mem is not None else fmt_bytes(info.memory) if (info.device or "").startswith("cuda") else "",
            "host": info.host or "",
            "last line": clean_line(live),
        }
    )
    return RankRow(rank, label, cells, (getattr(info, "death", "") or describe_exit(info.exit_code)) if exit_ else "")


def rank_rows(s: Snapshot) -> List[RankRow]:
    """A row per rank; over 32 ranks a row for each odd rank alone (the others are in the per-node rows and the grid)."""
    return [rank_row(s, r) for r in (C.detail_ranks(s.groups) if s.compact else s.ranks)]


def hosts(s: Snapshot) -> Dict[int, str]:
    """Each rank's node as the per-node rows name it: the scheduler's name for it, else its host."""
    out = {}
    for r in s.ranks:
        info = s.infos.get(r)
        out[r] = (getattr(info, "node_name", "") or info.host or "") if info is not None else ""
    return out


def row_columns(rows: Sequence[RankRow]) -> List[str]:
    """The columns worth showing: rank and state, then only those some rank has a value in (an exit only after
    one, progress only with a bar, memory once a rank said it), host only with more than one."""
    cols = ["rank", "state"] + [c for c in ("time", "progress", "device", "pid", "exit", "memory") if any(row.cells[c] for row in rows)]
    if len({row.cells["host"] for row in rows if row.cells["host"]}) > 1:
        cols.append("host")
    return cols + (["last line"] if any(row.cells["last line"] for row in rows) else [])


def _cell_html(row: RankRow, col: str) -> str:
    value = row.cells[col]
    if col == "state":
        return f"<td style='{CELL};{colours.color_ref(tone_of(row.label))};font-weight:bold'>{esc(value)}</td>"
    if not value:
        return "<td></td>"
    if col == "exit":
        return f"<td title='{esc(row.exit_title)}' style='{CELL}'>{esc(value)}</td>"
    if col == "last line":
        return f"<td title='{esc(value)}' style='{CELL};font-family:monospace;max-width:48em;overflow:hidden'>{esc(value)}</td>" if value else "<td></td>"
    return f"<td style='{CELL}'>{esc(value)}</td>"


def ranks_html(s: Snapshot) -> str:
    """The rank table, every style inline (32 rows stay ~13 kB); over 32 ranks the per-node rows, the grid, and the
    odd ranks' own rows (a few kB at 1,024 ranks)."""
    rows = rank_rows(s)
    mem = memory_line(s)
    mem_html = f"<div class='ddp-status-memory' style='{SMALL}'>{esc(mem)}</div>" if mem else ""
    if s.compact:
        odd = _table_html(rows) if rows else ""
        return C.groups_html(s.labels, hosts(s)) + mem_html + C.grid_html(s.labels) + odd
    return _table_html(rows) + mem_html


def memory_line(s: Snapshot) -> str:
    """Under the ranks: over 32 ranks the memory column in one line ('memory: RSS 1.1 to 1.3 GiB'), and once the cell
    has settled its peak ('memory: peak 3.1 GiB on rank 2'); '' before any figure."""
    pairs = [(r, getattr(i, "mem", None)) for r, i in s.infos.items()]
    said = ([range_text(m for _, m in pairs)] if s.compact else []) + ([peak_text(pairs)] if s.finished else [])
    said = [x for x in said if x]
    return "memory: " + "; ".join(said) if said else ""


def _table_html(rows: Sequence[RankRow]) -> str:
    cols = row_columns(rows)
    head = "".join(f"<th style='{CELL};font-weight:bold'>{c}</th>" for c in cols)
    body = "".join(
        f"<tr data-rank='{row.rank}' data-state='{esc(row.label)}'>" + "".join(_cell_html(row, c) for c in cols) + "</tr>"
        for row in rows
    )
    return (
        f"<div class='ddp-status-ranks' style='{colours.defs()}max-height:20em;overflow:auto;{SMALL}'>"
        f"<table style='border-collapse:collapse;margin:0;{SMALL}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
    )


def ranks_text(s: Snapshot) -> List[str]:
    """A row per rank; over 32 ranks a row per node and state, then the odd ranks' own rows."""
    rows = rank_rows(s)
    own = table_text([row.cells for row in rows], row_columns(rows)) if rows else []
    mem = [memory_line(s)] if memory_line(s) else []
    if not s.compact:
        return own + mem
    groups = C.group_rows(s.labels, hosts(s))
    return table_text(groups, C.group_columns(groups)) + mem + own


def notices_html(s: Snapshot) -> str:
    if not s.notices:
        return ""
    items = "".join(f"<div>{esc(clean_line(t, 300))}</div>" for t in s.notices[-3:])  # a notice informs: the text's own colour
    return f"<div class='ddp-status-notices' style='{SMALL}'>{items}</div>"


# ---------------------------------------------------------------- the env section
_ENV_CACHE: Dict[Tuple[Any, ...], Tuple[Sequence[Any], str]] = {}  # the env section is the same cell after cell: once per plan and checks


def env_html(s: Snapshot) -> str:
    """'✓ 19 checks passed' and only the problems; every check and the variables one click further."""
    if not s.checks and not s.envs:
        return ""
    # The view hands the same envs list every time (status_facts.PlanFacts): found by identity, it costs nothing at
    # 1,024 ranks; another list (a test's, a new plan's) is rendered anew.
    key = (tuple(s.checks), id(s.envs), s.planned)
    hit = _ENV_CACHE.get(key)
    if hit is not None and hit[0] is s.envs:
        return hit[1]
    if len(_ENV_CACHE) > 16:
        _ENV_CACHE.clear()
    _ENV_CACHE[key] = (s.envs, _env_html(s))  # the entry holds the list: its id cannot be reused while it is here
    return _ENV_CACHE[key][1]


UNPLACED = ("MASTER_ADDR", "MASTER_PORT")  # chosen when the ranks start (Pool.start: the launcher's placed plan)
PLACED_CHECKS = tuple(f"same {v}" for v in UNPLACED)  # plan/checks_ranks.py: they quote the value
ENV_WORDS = {False: "the env each rank received", True: "planned: the env each rank will receive; MASTER_ADDR/PORT are set when the ranks start"}


def planned_checks(checks: Sequence[Check]) -> List[Check]:
    """The checks of a pool not yet started, as the cell and the panel show them: the ones that quote MASTER_ADDR/PORT
    say it is set when the ranks start, not the plan's placeholder (a queued Slurm job's port is not chosen)."""
    return [dataclasses.replace(c, detail=f"{c.name[5:]}: one value on every rank, set when the ranks start")
            if c.ok and c.name in PLACED_CHECKS else c for c in checks]


def _env_html(s: Snapshot) -> str:
    bad = worth_saying(s.checks)
    shown = [c for c in DIST_VARS if not (s.planned and c in UNPLACED)]  # no placeholder presented as a fact
    common = common_env(s.envs, shown)
    shared = " ".join(f"{esc(k)}={esc(v)}" for k, v in common.items())
    cols = [c for c in shown if c not in common]
    rows, left = env_rows(s.envs, cols)  # over 32 ranks: runs of ranks that follow one pattern (report.env_runs)
    table = (f"<div class='ddp-env-common' style='font-family:monospace'>every rank: {shared}</div>" if common else "") + (
        env_table_html(rows, cols) + esc(left) if s.envs else "")
    problems = checks_html(bad) if bad else ""
    every = planned_checks(s.checks) if s.planned else s.checks
    return (
        f"<div class='ddp-status-env' style='{SMALL}'>{esc(checks_line(s.checks))} ({ENV_WORDS[s.planned]}){problems}"
        f"<details><summary style='cursor:pointer'>all checks and variables</summary>{checks_html(every)}{table}</details></div>"
    )


def env_text(s: Snapshot) -> List[str]:
    """The checks that did not pass, and the env in one line (plus a table of what varies oddly by rank)."""
    lines = []
    if s.checks:
        bad = [c for c in s.checks if not c.ok]
        lines.append(checks_line(s.checks))
        lines += checks_text(bad)
    envs = s.envs
    if envs:
        lines.append("env: " + env_digest(envs, list(DIST_VARS)))
        by_rank = [str(i) for i in range(len(envs))]
        varying = [c for c in DIST_VARS if len({e.get(c) for e in envs}) > 1 and [e.get(c) for e in envs] != by_rank]
        if varying:
            cols = ["RANK"] + [c for c in varying if c != "RANK"]
            rows, left = env_rows(envs, cols)
            lines += table_text(rows, cols) + ([left] if left else [])
    return lines


# ---------------------------------------------------------------- the whole view
def static_text(s: Snapshot) -> str:
    """The plain-text form of everything the widget shows (terminals, repr)."""
    lines = [TEXT_PREFIX + summary(s)]
    lines += ["  " + line for line in ranks_text(s)]
    lines += [f"  {t}" for t in s.notices[-3:]]
    lines += ["  " + line for line in env_text(s)]
    for _title, _html, text in s.sections:
        lines += ["  " + line for line in text(s)]
    return "\n".join(lines)


def body_html(s: Snapshot) -> str:
    """What opens on click: the notices, the rank table, the env checks, and any extra section."""
    extra = "".join(f"<div class='ddp-status-section' data-title='{esc(title)}'>{render(s)}</div>" for title, render, _text in s.sections)
    return f"<div class='ddp-status-body' style='padding:2px 0 4px 14px'>{notices_html(s)}{ranks_html(s)}{env_html(s)}{extra}</div>"


def static_html(s: Snapshot, body: bool = True, body_text: Optional[str] = None) -> str:
    """The one-line summary as a ``<details>`` whose body is the rank table and the env: renders without widgets.

    Structure (class names and data attributes are an interface: browser tests and notebooks/nbval_sanitize.cfg):
    ``div.ddp-status[data-state=running|finished][data-outcome=ok|failed]`` > ``details.ddp-status-details`` >
    ``summary`` > ``span.ddp-status-header`` (the line, with ``span.ddp-status-strip`` of ``i.ddp-status-square``
    [data-rank][data-state] or ``i.ddp-status-bar`` [data-rank][data-n][data-total]), then ``div.ddp-status-body``
    with ``div.ddp-status-ranks`` (``tr[data-rank][data-state]``), ``div.ddp-status-env`` (``li[data-check][data-ok]``)
    and any ``div.ddp-status-section[data-title]``. ``body=False``: the line alone (a quick cell's placeholder).
    """
    state = "finished" if s.finished else "running"
    outcome = f" data-outcome='{'ok' if s.ok else 'failed'}'" if s.finished else ""
    inner = (body_text if body_text is not None else body_html(s)) if body else ""
    return (
        f"<div class='ddp-status' data-state='{state}'{outcome} style='{FONT};{LINE}'>"
        f"<details class='ddp-status-details'><summary style='cursor:pointer;{LINE}'>{header_html(s)}</summary>{inner}</details></div>"
    )


def brief_html(s: Snapshot) -> str:
    """The summary line alone, in the same disclosure form: a quick cell's placeholder costs little."""
    return static_html(s, body=False)


def final_text(s: Snapshot) -> str:
    """What a terminal shows when the cell ends: the summary and any check that did not pass."""
    lines = [TEXT_PREFIX + summary(s)]
    lines += ["  " + line for line in checks_text([c for c in s.checks if not c.ok])]
    return "\n".join(lines)

