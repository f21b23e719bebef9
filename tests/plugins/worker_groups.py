"""Which tests may run at the same time under ``pytest -n 3`` (scripts/test.sh): a pytest plugin.

Three workers cut the suite's wall time on CI's two cores, because much of a test's time is spent waiting on kernels,
ranks, browsers, daemons and the timers under test (a lease's idle, a node's silence): on this 2-core VM the suite
took 34:16 on two workers (the CPUs 74% busy) and 29:30 on three (86% busy; top over the run, 2026-12-07). A fourth
would find little CPU free. What must not overlap shares a group; a group runs on one worker, in order:

- a file's tests share its module-scoped kernel and pool (a notebook's cells, nbval's kernel): one group per file;
- the cluster-in-a-box tests share its network namespaces, its Slurm, sshd and Ray, and /tmp/ddp_box.lock: one group,
  ``box``;
- the one-host Slurm tests share its daemons and its queue: one group, ``slurm``. The two coexist (the box's Slurm
  has its own conf, munged and paths; a one-host test counts only processes in this host's network namespace or
  under its own runtime directory: tests/slurm/slurm_helpers.py ``on_this_host``);
- the browser tests share one JupyterLab server and one Chromium (session fixtures; a process may run one Playwright
  only): one group, ``browser``. The Slurm start's UI test is a ``slurm`` one (its worker starts a Playwright of its own).

The box group is the longest (26 minutes of the 29:30 on three workers) and what it runs is the box's own hosts, so
its worker keeps the CPU's first claim: under xdist, every other test runs at nice ``OTHERS_NICE`` (its worker, and what
it starts: kernels, ranks, browsers), and fills the time the box waits. Wall time only: no test's order changes.

The groups are xdist scopes (``pytest_xdist_make_scheduler``: xdist's own ``xdist_group`` mark rewrites a nodeid, which
pytest 9 no longer allows). The longest groups are collected first, and ``--no-loadscope-reorder`` keeps that order,
so that no worker is left with one of them at the end. Without xdist this plugin only reorders."""
from __future__ import annotations

import logging
import os
from typing import Any, List, Optional

import pytest

log = logging.getLogger(__name__)
BOX = ("tests/cluster/",)
BOX_FIXTURES = frozenset({"box", "box_kernel", "ssh_login"})  # tests/cluster/box_fixtures.py
SLURM = ("tests/slurm/", "labextension/ui-tests/test_slurm_start_ui.py")
SLURM_FIXTURES = frozenset({"slurm_cluster"})  # tests/slurm/slurm_fixtures.py
BROWSER = ("labextension/ui-tests/", "tests/kernel/test_debugging.py::test_input_box_in_jupyterlab")
BROWSER_FIXTURES = frozenset({"server", "browser"})  # labextension/ui-tests/ui_fixtures.py: one Playwright a process
FIRST = ("box", "browser", "slurm")
CRITICAL = ("box",)  # the longest group: its tests keep nice 0 (the others: OTHERS_NICE)
OTHERS_NICE = 4  # CFS weights 1024 against 423: the box's hosts get about 70% of a core they contend for
OWN_PLAYWRIGHT = ("slurm",)  # groups whose worker may start a Playwright of its own (never beside the browser group's)


def group_of(nodeid: str) -> str:
    """A test's group: ``box``, ``slurm``, ``browser`` or its file's path."""
    path = nodeid.split("::", 1)[0]
    if path.startswith(BOX):
        return "box"
    if path.startswith(SLURM):
        return "slurm"
    if nodeid.startswith(BROWSER):
        return "browser"
    return path


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    checks = ((BOX_FIXTURES, ("box",), "BOX"), (SLURM_FIXTURES, ("slurm",), "SLURM"), (BROWSER_FIXTURES, ("browser",) + OWN_PLAYWRIGHT, "BROWSER"))
    for fixtures, groups, where in checks:
        strays = [i.nodeid for i in items if fixtures & set(getattr(i, "fixturenames", ())) and group_of(i.nodeid) not in groups]
        if strays:
            raise pytest.UsageError(f"{strays[0]} uses the {groups[0]} fixtures: add it to {where} in {__file__}")
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(group_of(item.nodeid), len(FIRST)))  # stable: each group keeps its order


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under xdist: the critical group's tests at nice 0, the others at OTHERS_NICE (what they start inherits it)."""
    if "PYTEST_XDIST_WORKER" not in os.environ or not hasattr(os, "setpriority"):
        return
    want = 0 if group_of(item.nodeid) in CRITICAL else OTHERS_NICE
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) != want:
            os.setpriority(os.PRIO_PROCESS, 0, want)
    except OSError:  # back to a lower nice takes root (CI is root): the test runs as it is
        log.debug("could not set this worker's nice to %d", want, exc_info=True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Optional[Any]:
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """xdist's per-scope scheduling, a scope being a group above."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return GroupScheduling(config, log)
