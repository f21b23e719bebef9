"""What %ddp_env shows: the env each rank gets (or sees), and the checks, as text, HTML and data.

The checks themselves live in plan/ (pure functions); this module only renders
them. The status view (status_render.py) uses the same helpers for its env
section and its text tables. One count for one plan: a report's checks are the
plan's (``plan_checks``, the list the cell's status view counts); a live report
adds, apart and said so, what the ranks report about themselves (``live_checks``).
The variables every rank shares are said once; the table has only what differs.
"""
from __future__ import annotations

import html
import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..plan import DIST_VARS, Check, Plan, checks_verdict, device_map, live_checks, plan_checks
from ..plan.checks import mesh_checks
from ..words import plural
from ..session import EnvData
from . import colours

SHOWN_VARS = DIST_VARS + ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
SEEN_PREFIXES = ("NCCL_", "TORCH_NCCL_", "GLOO_")  # shown too, as the ranks will see them
SECRET_HINTS = ("SECRET", "TOKEN", "PASSWORD", "KEY")
MARK_TONES = {"✓": "ok", "✗": "fail", "!": "warn"}


def _redact(env: Mapping[str, str]) -> Dict[str, str]:
    return {k: ("<hidden>" if any(h in k.upper() for h in SECRET_HINTS) else v) for k, v in env.items()}


def _shown(key: str) -> bool:
    return key in SHOWN_VARS or key.startswith(SEEN_PREFIXES)


# ---------------------------------------------------------------- shared rendering
def mark_html(mark: str) -> str:
    tone = MARK_TONES.get(mark)
    style = colours.color(tone) if tone else "color:inherit"
    return f"<span style='{style};font-weight:bold'>{html.escape(mark)}</span>"


def checks_line(checks: Sequence[Check]) -> str:
    """'✓ 19 checks passed', '✗ 2 of 19 checks failed' or '! 1 warning, 18 checks passed': the checks in one line."""
    return checks_verdict(checks)


FACTS = ("GPU per rank", "device mesh", "collectives' interface")  # informative lines worth one even when all is well


def worth_saying(checks: Sequence[Check]) -> List[Check]:
    """What a healthy env's short form still shows: the problems, and the facts this report adds (the GPU map, the mesh)."""
    return [c for c in checks if not c.ok or c.name in FACTS]


def verdict_html(checks: Sequence[Check]) -> str:
    line = checks_line(checks)
    tone = MARK_TONES.get(line[:1], "ok")
    return f"<span style='{colours.color(tone)};font-weight:bold'>{html.escape(line)}</span>"


def checks_text(checks: Sequence[Check]) -> List[str]:
    return [f"{c.mark} {c.name}: {c.detail}" for c in checks]


def checks_html(checks: Sequence[Check]) -> str:
    """Failures first, each with its mark and the reason in words."""
    order = sorted(checks, key=lambda c: (c.ok, c.level != "error"))
    items = "".join(
        f"<li data-check='{html.escape(c.name)}' data-ok='{str(c.ok).lower()}'>{c.mark if c.ok else mark_html(c.mark)} "
        f"<b>{html.escape(c.name)}</b>: {html.escape(c.detail)}</li>"
        for c in order
    )
    return f"<ul style='list-style:none;padding-left:0;margin:2px 0;font-size:12px;line-height:1.5'>{items}</ul>"


def env_columns(envs: Sequence[Mapping[str, str]], first: Sequence[str] = SHOWN_VARS) -> List[str]:
    cols = [k for k in first if any(k in e for e in envs)]
    extra = sorted({k for e in envs for k in e if _shown(k) and k not in cols})
    return cols + extra


def table_text(rows: Sequence[Mapping[str, Any]], cols: Sequence[str]) -> List[str]:
    """A text table: a header line, then one line per row, each column padded to its widest cell."""
    table = [list(cols)] + [[str(row.get(k, "")) for k in cols] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(cols))]
    return ["  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in table]


TD = "text-align:left;padding:0 8px 0 0"


def env_table_html(envs: Sequence[Mapping[str, str]], cols: Sequence[str], max_height: str = "16em") -> str:
    """Every style inline: untrusted notebooks drop <style> blocks."""
    head = "".join(f"<th style='{TD}'>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td style='{TD}'>{html.escape(str(e.get(c, '')))}</td>" for c in cols) + "</tr>" for e in envs)
    return (
        f"<div style='max-height:{max_height};overflow:auto'>"
        f"<table class='ddp-env-table' style='font-family:monospace;font-size:12px;border-collapse:collapse'>"
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
    )


def env_digest(envs: Sequence[Mapping[str, str]], cols: Sequence[str]) -> str:
    """One line for many ranks: the values every rank shares, then how the others vary.

    'MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=4 LOCAL_WORLD_SIZE=4 NODE_RANK=0 on every rank; RANK, LOCAL_RANK = rank (0..3)'
    """
    if not envs:
        return "no rank env"
    same = [c for c in cols if len({e.get(c) for e in envs}) == 1 and envs[0].get(c) is not None]
    varying = [c for c in cols if c not in same and any(c in e for e in envs)]
    parts = []
    if same:
        parts.append(" ".join(f"{c}={envs[0][c]}" for c in same) + (" on every rank" if len(envs) > 1 else ""))
    indexed = [c for c in varying if [e.get(c) for e in envs] == [str(i) for i in range(len(envs))]]
    if indexed:
        parts.append(f"{', '.join(indexed)} = rank (0..{len(envs) - 1})")
    others = [c for c in varying if c not in indexed]
    if others:
        parts.append("differ by rank: " + ", ".join(others))
    return "; ".join(parts)


EACH_ABOVE = 32  # more ranks than this: the table shows runs of ranks that follow one pattern, not a row per rank
RUNS_SHOWN = 64  # runs listed at most; the rest are counted (to_dict() has every rank)


def _steps(a: Sequence[str], b: Sequence[str]) -> Optional[List[int]]:
    """How each column goes from one rank's row to the next: 0 (the same), 1 (counts up by one), None (neither)."""
    out = []
    for x, y in zip(a, b):
        if x == y:
            out.append(0)
        elif x.isdigit() and y.isdigit() and int(y) == int(x) + 1:
            out.append(1)
        else:
            return None
    return out


def env_runs(envs: Sequence[Mapping[str, str]], cols: Sequence[str]) -> List[Dict[str, str]]:
    """The table's rows over many ranks: one per run of consecutive ranks in which every column stays the same or
    counts up by one with the rank, as ranges ('RANK 256-511, LOCAL_RANK 0-255, NODE_RANK 1'). 1,024 ranks on 4 nodes
    are 4 rows; a rank that breaks the pattern is a row of its own."""
    runs: List[Tuple[List[str], List[str], Optional[List[int]]]] = []  # (first row, last row, steps)
    for e in envs:
        row = [str(e.get(c, "")) for c in cols]
        if runs:
            first, last, steps = runs[-1]
            step = _steps(last, row)
            if step is not None and (steps is None or step == steps):
                runs[-1] = (first, row, step)
                continue
        runs.append((row, row, None))
    return [{c: a if a == b else f"{a}-{b}" for c, a, b in zip(cols, first, last)} for first, last, _ in runs]


def env_rows(envs: Sequence[Mapping[str, str]], cols: Sequence[str]) -> Tuple[List[Mapping[str, str]], str]:
    """(the table's rows, a line for what is left out): a row per rank up to 32 ranks, else the runs, at most 64."""
    if len(envs) <= EACH_ABOVE:
        return list(envs), ""
    runs = env_runs(envs, cols)
    if len(runs) <= RUNS_SHOWN:
        return list(runs), ""
    return list(runs[:RUNS_SHOWN]), f"… and {len(runs) - RUNS_SHOWN} more runs of ranks (every rank: .to_dict()['ranks'])"


def common_env(envs: Sequence[Mapping[str, str]], cols: Sequence[str]) -> Dict[str, str]:
    """The variables every rank that answered has, with one value ({} for fewer than two ranks: a table says it all)."""
    answered = [e for e in envs if e]
    if len(answered) < 2:
        return {}
    return {c: answered[0][c] for c in cols if c != "RANK" and c in answered[0] and all(e.get(c) == answered[0][c] for e in answered)}


# ---------------------------------------------------------------- the report
class EnvReport:
    """The env every rank shares said once, a table of what differs by rank, and the checks; renders as HTML in
    Jupyter and as text elsewhere; to_dict() for programs. ``checks`` are the plan's (the list the cell's status
    view counts); ``reported``, on a live pool, what the ranks report about themselves, counted apart."""

    def __init__(self, title: str, envs: Sequence[Mapping[str, str]], checks: List[Check], extra: Optional[Dict[str, Any]] = None,
                 reported: Optional[List[Check]] = None) -> None:
        self.title = title
        self.envs = [_redact(e) for e in envs]
        self.checks = checks
        self.reported = reported
        self.extra = extra or {}
        self.autoreload = ""  # "autoreload: on (...); reloaded at the last cell: model" (kernel/reload.py)

    @property
    def all_checks(self) -> List[Check]:
        return self.checks + (self.reported or [])

    @property
    def ok(self) -> bool:
        return not any(c.failed for c in self.all_checks)

    @property
    def verdict(self) -> str:
        """'✓ 19 checks passed', and on a live pool '; from the ranks: ✓ 12 checks passed'."""
        head = checks_verdict(self.checks)
        return head if self.reported is None else f"{head}; from the ranks: {checks_verdict(self.reported)}"

    def to_dict(self) -> Dict[str, Any]:
        checks = [dict(c.to_dict(), source="plan") for c in self.checks] + [dict(c.to_dict(), source="ranks") for c in self.reported or []]
        return {
            "title": self.title,
            "ok": self.ok,
            "verdict": self.verdict,
            "ranks": [{k: e.get(k) for k in env_columns(self.envs) if k in e} for e in self.envs],
            "checks": checks,
            **self.extra,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)

    def _layout(self) -> Tuple[Dict[str, str], List[str]]:
        """(what every rank shares, the table's columns: RANK and what differs)."""
        cols = env_columns(self.envs)
        common = common_env(self.envs, cols)
        return common, [c for c in cols if c not in common]

    def __repr__(self) -> str:
        """The title, the env, and only the checks that did not pass (``full_text()``: all of them)."""
        return self.full_text(every_check=False)

    def full_text(self, every_check: bool = True) -> str:
        lines = [f"{self.title} — {self.verdict}"]
        common, cols = self._layout()
        if common:
            lines.append("every rank: " + " ".join(f"{k}={v}" for k, v in common.items()))
        rows, left = env_rows(self.envs, cols)
        lines += table_text(rows, cols) + ([left] if left else [])
        shown = self.all_checks if every_check else worth_saying(self.all_checks)
        if shown:
            lines.append("")
            lines += checks_text(shown)
        if not every_check and len(shown) < len(self.all_checks):
            lines.append("(every check: print(_.full_text()), or _.to_dict())")
        return "\n".join(lines + ([self.autoreload] if self.autoreload else []))

    def _repr_html_(self) -> str:
        """The verdict and the problems; every check one click away (inline styles only)."""
        said = worth_saying(self.all_checks)
        common, cols = self._layout()
        rows, left = env_rows(self.envs, cols)
        shared = " ".join(f"{html.escape(k)}={html.escape(v)}" for k, v in common.items())
        line = f"<div class='ddp-env-common' style='font-family:monospace;font-size:12px'>every rank: {shared}</div>" if common else ""
        every = checks_html(self.checks) + (f"<div>from the ranks:</div>{checks_html(self.reported)}" if self.reported else "")
        return (
            f"<div class='ddp-env'><b>{html.escape(self.title)}</b> — {verdict_html(self.checks)}"
            f"{'; from the ranks: ' + verdict_html(self.reported) if self.reported is not None else ''}"
            f"{checks_html(said) if said else ''}{line}"
            f"{env_table_html(rows, cols, max_height='24em')}{html.escape(left)}"
            f"<details class='ddp-env-checks'><summary style='cursor:pointer'>all {plural(len(self.all_checks), 'check')}</summary>"
            f"{every}</details>"
            f"{f'<div class=ddp-env-autoreload>{html.escape(self.autoreload)}</div>' if self.autoreload else ''}</div>"
        )


def seen_env(plan: Plan, rank: int, environ: Mapping[str, str] = os.environ, planned: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The shown part of the env a rank will get: the plan's variables (``planned``: that rank's) over what it inherits from the kernel."""
    env = {k: v for k, v in environ.items() if _shown(k)}
    env.update(planned if planned is not None else plan.rank_env(rank))
    return {k: v for k, v in env.items() if _shown(k)}


def plan_report(plan: Plan, environ: Mapping[str, str] = os.environ, started: bool = False, extra_checks: Sequence[Check] = ()) -> EnvReport:
    """What a plan gives each rank, with the plan's checks (the same list and count as the cell's status view) and,
    for a Slurm plan, what the scheduler said of it (``extra_checks``)."""
    where = f" on {plural(plan.nnodes, 'Slurm node')}" if plan.slurm is not None else f" on {plural(plan.nnodes, 'host')} over SSH" if plan.ssh else ""
    title = f"planned env for {plural(plan.world_size if plan.over_hosts else plan.nproc, 'rank')}{where}, backend {plan.backend} ({plan.backend_reason})"
    envs = [seen_env(plan, r, environ, e) for r, e in enumerate(plan.all_envs())]
    extra: Dict[str, Any] = {
        "state": "planned",
        "backend": plan.backend,
        "backend_reason": plan.backend_reason,
        "master_addr": plan.master_addr,
        "master_port": plan.master_port,
        "nproc": plan.nproc,
    }
    checks = plan_checks(plan, environ, started=started) + list(extra_checks)
    if plan.backend == "nccl":
        extra["devices"] = device_map(plan.nproc, environ)
    return EnvReport(title, envs, checks, extra)


def live_report(live: Dict[int, Dict[str, Any]], nproc: int, backend: str, plan: Optional[Plan] = None) -> EnvReport:
    """From each worker's own os.environ and process-group state: the plan's checks (as the cell counts them, when the
    plan is known) and, apart, the checks of what the ranks report."""
    envs = [live[r]["env"] if r in live else {} for r in range(nproc)]
    reported = live_checks(live, nproc, backend)
    extra = {
        "state": "live",
        "backend": backend,
        "nproc": nproc,
        "pids": {r: live[r].get("pid") for r in live},
        "devices": {r: live[r].get("device") for r in live},
        "process_group": {r: live[r].get("process_group") for r in live},
    }
    title = f"live env of {plural(nproc, 'rank')}, backend {backend}"
    if plan is None:
        return EnvReport(title, envs, reported + mesh_checks(envs), extra)
    return EnvReport(title, envs, plan_checks(plan, started=True), extra, reported=reported)


def env_report(env: EnvData) -> EnvReport:
    """The report of the session's env data, planned or live: what %ddp_env shows and the panel's env request returns."""
    if env.live is not None:
        report = live_report(env.live, env.nproc, env.backend, env.plan)
    else:
        assert env.plan is not None
        report = plan_report(env.plan, extra_checks=env.checks)
    if env.autoreload:  # on, or turned off: said (a report of a session that never asked stays as it was)
        report.autoreload = report.extra["autoreload"] = env.autoreload
    return report
