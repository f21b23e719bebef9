"""One check's result, and the verdict over many: what every check in plan/checks*.py returns.

Every check returns a Check; none raises, none imports torch (unless the
kernel already did), none starts a process. ``%ddp_env``, the status view, the
JupyterLab panel and the tests read the same functions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Sequence

from ..words import plural


@dataclass(frozen=True)
class Check:
    """One validation result: shown with a mark, and a reason in words when it fails (a value: cached lists share them)."""

    name: str
    ok: bool
    detail: str
    level: str = "error"  # "error" fails the check; "warning" and "info" only inform

    @property
    def mark(self) -> str:
        if self.ok:
            return "✓"
        return "✗" if self.level == "error" else "!"

    @property
    def failed(self) -> bool:
        """A failure that stops a pool from working (warnings do not)."""
        return not self.ok and self.level == "error"

    def to_dict(self) -> Dict[str, object]:
        return {"name": self.name, "ok": self.ok, "level": self.level, "mark": self.mark, "detail": self.detail}


def checks_verdict(checks: Sequence[Check]) -> str:
    """'✓ 19 checks passed', '✗ 2 of 19 checks failed' or '! 1 warning, 18 checks passed': the checks in one line,
    the same words in the cell's status view, %ddp_env and the JupyterLab extension."""
    failed = [c for c in checks if c.failed]
    warned = [c for c in checks if not c.ok and not c.failed]
    passed = len(checks) - len(failed) - len(warned)
    if failed:
        return f"✗ {len(failed)} of {plural(len(checks), 'check')} failed"
    if warned:
        return f"! {plural(len(warned), 'warning')}, {plural(passed, 'check')} passed"
    return f"✓ {plural(passed, 'check')} passed"


def few(items: Sequence[str], limit: int = 4) -> str:
    """The first ``limit`` problems and how many more: a failed check stays one readable line."""
    items = list(items)
    if len(items) <= limit:
        return "; ".join(items)
    return "; ".join(items[:limit]) + f"; and {len(items) - limit} more"
