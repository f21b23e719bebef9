"""What %ddp_env shows: the env each rank gets (or sees), and the checks, as text, HTML and data.

The checks themselves live in plan/ (pure functions); this module only renders
them. The status view (status_render.py) uses the same helpers for its env
section and its text tables.
"""
from __future__ import annotations

import html
import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..plan import DIST_VARS, Check, Plan, checks_verdict, device_map, live_checks, plan_checks
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
    failed = [c for c in checks if c.failed]
    warned = [c for c in checks if not c.ok and not c.failed]
    passed = len(checks) - len(failed) - len(warned)
    if failed:
        return f"✗ {len(failed)} of {plural(len(checks), 'check')} failed"
    if warned:
        return f"! {plural(len(warned), 'warning')}, {plural(passed, 'check')} passed"
    return f"✓ {plural(passed, 'check')} passed"


FACTS = ("GPU per rank", "device mesh")  # the report's own informative lines: worth a line even when all is well


def worth_saying(checks: Sequence[Check]) -> List[Check]:
    """What a healthy env's short form still shows: the problems, and the facts this report adds (the GPU map, the mesh)."""
    return [c for c in checks if not c.ok or c.name in FACTS]


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


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


# ---------------------------------------------------------------- the report
class EnvReport:
    """Per-rank env table plus checks; renders as HTML in Jupyter and as text elsewhere; to_dict() for programs."""

    def __init__(self, title: str, envs: Sequence[Mapping[str, str]], checks: List[Check], extra: Optional[Dict[str, Any]] = None) -> None:
        self.title = title
        self.envs = [_redact(e) for e in envs]
        self.checks = checks
        self.extra = extra or {}

    @property
    def ok(self) -> bool:
        return not any(c.failed for c in self.checks)

    @property
    def verdict(self) -> str:
        return checks_verdict(self.checks)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "title": self.title,
            "ok": self.ok,
            "verdict": self.verdict,
            "ranks": [{k: e.get(k) for k in env_columns(self.envs) if k in e} for e in self.envs],
            "checks": [c.to_dict() for c in self.checks],
            **self.extra,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)

    def _columns(self) -> List[str]:
        return env_columns(self.envs)

    def __repr__(self) -> str:
        """The title, the env table, and only the checks that did not pass (``full_text()``: all of them)."""
        return self.full_text(every_check=False)

    def full_text(self, every_check: bool = True) -> str:
        lines = [f"{self.title} — {checks_line(self.checks)}"]
        lines += table_text(self.envs, self._columns())
        shown = self.checks if every_check else worth_saying(self.checks)
        if shown:
            lines.append("")
            lines += checks_text(shown)
        if not every_check and len(shown) < len(self.checks):
            lines.append("(every check: print(_.full_text()), or _.to_dict())")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """The verdict and the problems; every check one click away (inline styles only)."""
        said = worth_saying(self.checks)
        return (
            f"<div class='ddp-env'><b>{html.escape(self.title)}</b> — {verdict_html(self.checks)}"
            f"{checks_html(said) if said else ''}"
            f"{env_table_html(self.envs, self._columns(), max_height='24em')}"
            f"<details class='ddp-env-checks'><summary style='cursor:pointer'>all {plural(len(self.checks), 'check')}</summary>"
            f"{checks_html(self.checks)}</details></div>"
        )


def seen_env(plan: Plan, rank: int, environ: Mapping[str, str] = os.environ, planned: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The shown part of the env a rank will get: the plan's variables (``planned``: that rank's) over what it inherits from the kernel."""
    env = {k: v for k, v in environ.items() if _shown(k)}
    env.update(planned if planned is not None else plan.rank_env(rank))
    return {k: v for k, v in env.items() if _shown(k)}


def plan_report(plan: Plan, environ: Mapping[str, str] = os.environ, started: bool = False, extra_checks: Sequence[Check] = ()) -> EnvReport:
    where = f" on {plan.nnodes} Slurm node(s)" if plan.slurm is not None else ""
    title = f"planned env for {plan.world_size if plan.slurm else plan.nproc} rank(s){where}, backend {plan.backend} ({plan.backend_reason})"
    envs = [seen_env(plan, r, environ, e) for r, e in enumerate(plan.all_envs())]
    extra = {
        "state": "planned",
        "backend": plan.backend,
        "backend_reason": plan.backend_reason,
        "master_addr": plan.master_addr,
        "master_port": plan.master_port,
        "nproc": plan.nproc,
    }
    checks = plan_checks(plan, environ, started=started) + list(extra_checks) + mesh_checks([plan.rank_env(0)])
    if plan.backend == "nccl":
        mapping = device_map(plan.nproc, environ)
        extra["devices"] = mapping
        checks.append(Check("GPU per rank", True, ", ".join(f"rank {r} → {d}" for r, d in mapping.items()), level="info"))
    return EnvReport(title, envs, checks, extra)


def live_report(live: Dict[int, Dict[str, Any]], nproc: int, backend: str) -> EnvReport:
    """From each worker's own os.environ and process-group state."""
    envs = [live[r]["env"] if r in live else {} for r in range(nproc)]
    checks = live_checks(live, nproc, backend) + mesh_checks(envs)
    extra = {
        "state": "live",
        "backend": backend,
        "nproc": nproc,
        "pids": {r: live[r].get("pid") for r in live},
        "devices": {r: live[r].get("device") for r in live},
        "process_group": {r: live[r].get("process_group") for r in live},
    }
    return EnvReport(f"live env of {nproc} rank(s), backend {backend}", envs, checks, extra)


def mesh_checks(envs: Sequence[Mapping[str, str]]) -> List[Check]:
    """--mesh, in words: the DeviceMesh every rank finds as ``mesh``."""
    text = envs[0].get("DDP_MAGIC_MESH") if envs else None
    if not text:
        return []
    dims = " × ".join(text.split(","))
    names = ", ".join(part.split("=")[0] for part in text.split(","))
    return [Check("device mesh", True, f"{dims}: a DeviceMesh named `mesh` on every rank (dim names {names})", level="info")]


def env_report(env: EnvData) -> EnvReport:
    """The report of the session's env data, planned or live: what %ddp_env shows and the panel's env request returns."""
    if env.live is not None:
        return live_report(env.live, env.nproc, env.backend)
    assert env.plan is not None
    return plan_report(env.plan, extra_checks=env.checks)
