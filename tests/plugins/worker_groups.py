"""Which tests may run at the same time under ``pytest -n 2`` (scripts/test.sh): a pytest plugin.

Two workers cut the suite's wall time on CI's two cores, because most of a test's time is spent waiting on kernels,
ranks, browsers and daemons. What must not overlap shares a group; a group runs on one worker, in order:

- a file's tests share its module-scoped kernel and pool (a notebook's cells, nbval's kernel): one group per file;
- the Slurm and cluster-in-a-box tests share machine-wide daemons, locks, network namespaces and a view of every
  ``slurm_template`` on the machine: one group, ``hosts``;
- the browser tests share one JupyterLab server and one Chromium (session fixtures; a process may run one Playwright
  only): one group, ``browser``.

The groups are xdist scopes (``pytest_xdist_make_scheduler``: xdist's own ``xdist_group`` mark rewrites a nodeid, which
pytest 9 no longer allows). The longest groups are collected first, and ``--no-loadscope-reorder`` keeps that order,
so that neither worker is left with one of them at the end. Without xdist this plugin only reorders."""
from __future__ import annotations

from typing import Any, List, Optional

import pytest

HOSTS = ("tests/cluster/", "tests/slurm/", "labextension/ui-tests/test_slurm_start_ui.py")
HOSTS_FIXTURES = frozenset({"slurm_cluster", "box", "box_kernel", "ssh_login"})  # tests/slurm/slurm_fixtures.py, tests/cluster/box_fixtures.py
BROWSER = ("labextension/ui-tests/", "tests/kernel/test_debugging.py::test_input_box_in_jupyterlab")
BROWSER_FIXTURES = frozenset({"server", "browser"})  # labextension/ui-tests/ui_fixtures.py: one Playwright a process
FIRST = ("hosts", "browser")


def group_of(nodeid: str) -> str:
    """A test's group: ``hosts``, ``browser`` or its file's path."""
    path = nodeid.split("::", 1)[0]
    if path.startswith(HOSTS):
        return "hosts"
    if nodeid.startswith(BROWSER):
        return "browser"
    return path


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    for fixtures, group, where in ((HOSTS_FIXTURES, "hosts", "HOSTS"), (BROWSER_FIXTURES, "browser", "BROWSER")):
        strays = [i.nodeid for i in items if fixtures & set(getattr(i, "fixturenames", ())) and group_of(i.nodeid) not in (group, "hosts")]
        if strays:
            raise pytest.UsageError(f"{strays[0]} uses the {group} fixtures: add it to {where} in {__file__}")
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(group_of(item.nodeid), len(FIRST)))  # stable: each group keeps its order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Optional[Any]:
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """xdist's per-scope scheduling, a scope being a group above."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return GroupScheduling(config, log)
