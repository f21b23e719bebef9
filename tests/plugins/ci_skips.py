"""In CI (``CI=true``), a skip is a failure unless the machine cannot have what the test needs: a pytest plugin.

A skip turns red into green: without Chromium all the browser tests skip and the run stays green, although nothing of
the extension was tried. Locally a skip says what to install; in CI, where scripts/setup.sh installed everything, it
fails the run, naming each skipped test and why. Accepted in CI: no GPU (CI has none), and Notebook 7's missing status
bar (a fact of that front end, not of this machine).

Loaded by setup.cfg's ``-p ci_skips`` for every test folder (tests/, labextension/ui-tests, notebooks/). Under xdist
the workers' skips reach the controller, which decides the run's status.
"""
from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Tuple

import pytest

ACCEPTED = (
    re.compile(r"no NVIDIA GPU visible here|needs \d+ GPUs, \d+ visible"),  # tests/kernel/test_gpu.py
    re.compile(r"Notebook 7 has no status bar"),  # labextension/ui-tests/test_views_agree.py
)
SHOWN = 20  # tests named per reason; the rest counted


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _reason(report: Any) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return str(text).removeprefix("Skipped: ")


class CISkips:
    """Collects the skips CI does not accept; fails the run once it is over."""

    def __init__(self) -> None:
        self.unexpected: List[Tuple[str, str]] = []  # (nodeid, reason)

    def _note(self, report: Any) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            why = _reason(report)
            if not any(p.search(why) for p in ACCEPTED):
                self.unexpected.append((report.nodeid, why))

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: Any) -> None:
        self._note(report)

    @pytest.hookimpl
    def pytest_collectreport(self, report: Any) -> None:  # a module's importorskip
        self._note(report)

    def text(self) -> str:
        by_reason: Dict[str, List[str]] = {}
        for nodeid, why in self.unexpected:
            by_reason.setdefault(why, []).append(nodeid)
        lines = [f"CI=true: {len(self.unexpected)} tests skipped for a reason CI does not accept (only 'no GPU' and "
                 "'Notebook 7 has no status bar' are): install what each reason names (scripts/setup.sh does), or fix the test"]
        for why, ids in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"  {len(ids)} skipped: {why}")
            lines += [f"    {nodeid}" for nodeid in ids[:SHOWN]]
            if len(ids) > SHOWN:
                lines.append(f"    ... and {len(ids) - SHOWN} more")
        return "\n".join(lines)

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.unexpected:
            terminalreporter.section("skips CI does not accept", sep="=", red=True, bold=True)
            terminalreporter.line(self.text(), red=True)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.unexpected and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    if in_ci() and not hasattr(config, "workerinput"):  # the controller decides (xdist forwards its workers' skips)
        config.pluginmanager.register(CISkips(), "ci_skips_checker")
