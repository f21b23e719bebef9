"""What %ddp_env shows: the env each rank gets (or sees), and the checks, as text, HTML and data."""
from __future__ import annotations

import html
import json
from typing import Any, Dict, List, Mapping, Optional, Sequence

from .env import DIST_VARS, Check, Plan, check_rank_envs, plan_checks

SHOWN_VARS = DIST_VARS + ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
SECRET_HINTS = ("SECRET", "TOKEN", "PASSWORD", "KEY")


def _redact(env: Mapping[str, str]) -> Dict[str, str]:
    return {k: ("<hidden>" if any(h in k.upper() for h in SECRET_HINTS) else v) for k, v in env.items()}


class EnvReport:
    """Per-rank env table plus checks; renders as HTML in Jupyter and as text elsewhere."""

    def __init__(self, title: str, envs: Sequence[Mapping[str, str]], checks: List[Check], extra: Optional[Dict[str, Any]] = None) -> None:
        self.title = title
        self.envs = [_redact(e) for e in envs]
        self.checks = checks
        self.extra = extra or {}

    @property
    def ok(self) -> bool:
        return all(c.ok or c.level != "error" for c in self.checks)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "title": self.title,
            "ok": self.ok,
            "ranks": [{k: e.get(k) for k in SHOWN_VARS if k in e} for e in self.envs],
            "checks": [{"name": c.name, "ok": c.ok, "level": c.level, "detail": c.detail} for c in self.checks],
            **self.extra,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def _columns(self) -> List[str]:
        return [k for k in SHOWN_VARS if any(k in e for e in self.envs)]

    def __repr__(self) -> str:
        cols = self._columns()
        rows = [cols] + [[e.get(k, "") for k in cols] for e in self.envs]
        widths = [max(len(str(r[i])) for r in rows) for i in range(len(cols))]
        lines = [f"{self.title} — {'env ✓' if self.ok else 'env ✗'}"]
        for r in rows:
            lines.append("  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip())
        lines.append("")
        for c in self.checks:
            lines.append(f"{c.mark} {c.name}: {c.detail}")
        for k, v in self.extra.items():
            if isinstance(v, (str, int, float)):
                lines.append(f"  {k}: {v}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        cols = self._columns()
        head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(e.get(c, '')))}</td>" for c in cols) + "</tr>" for e in self.envs)
        color = {"✓": "#1a7f37", "✗": "#cf222e", "!": "#9a6700"}
        checks = "".join(
            f"<li><span style='color:{color[c.mark]};font-weight:bold'>{c.mark}</span> <b>{html.escape(c.name)}</b>: {html.escape(c.detail)}</li>"
            for c in self.checks
        )
        status = "<span style='color:#1a7f37'>env ✓</span>" if self.ok else "<span style='color:#cf222e'>env ✗</span>"
        return (
            f"<div class='ddp-env'><b>{html.escape(self.title)}</b> — {status}"
            f"<table style='font-family:monospace;font-size:12px'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            f"<ul style='list-style:none;padding-left:0;font-size:12px'>{checks}</ul></div>"
        )


def plan_report(plan: Plan) -> EnvReport:
    title = f"planned env for {plan.nproc} rank(s), backend {plan.backend} ({plan.backend_reason})"
    return EnvReport(title, plan.all_envs(), plan_checks(plan), {"backend": plan.backend, "state": "planned"})


def live_report(live: Dict[int, Dict[str, Any]], nproc: int, backend: str) -> EnvReport:
    """From each worker's own os.environ and process-group state."""
    envs = [live[r]["env"] if r in live else {} for r in range(nproc)]
    checks = check_rank_envs([e for e in envs if e])
    missing = [r for r in range(nproc) if r not in live]
    checks.append(Check("every rank answered", not missing, "all ranks answered" if not missing else f"no answer from rank(s) {missing}"))
    pgs = {r: live[r]["process_group"] for r in live}
    init = [r for r, pg in pgs.items() if pg.get("initialised")]
    if init:
        sizes = {pg.get("world_size") for pg in pgs.values() if pg.get("initialised")}
        backends = {pg.get("backend") for pg in pgs.values() if pg.get("initialised")}
        consistent = len(init) == len(pgs) and sizes == {nproc} and len(backends) == 1
        checks.append(
            Check(
                "process group",
                consistent,
                f"initialised on {len(init)}/{len(pgs)} ranks, backend {', '.join(sorted(map(str, backends)))}, world size {', '.join(map(str, sorted(sizes)))}",
            )
        )
    else:
        checks.append(Check("process group", True, "not initialised (started with --no-init, or destroyed by the cell)", level="info"))
    extra = {"state": "live", "pids": {r: live[r].get("pid") for r in live}, "devices": {r: live[r].get("device") for r in live}}
    return EnvReport(f"live env of {nproc} rank(s), backend {backend}", envs, checks, extra)
