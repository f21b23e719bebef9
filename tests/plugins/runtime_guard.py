"""No test run leaves a kept pool's files in the user's own Jupyter runtime directory: a pytest plugin.

Every kernel a test starts gets a runtime directory of its own (tests/kernel_helper.py ``Kernel``, unless the test
gives one), and so does the browser tests' server (labextension/ui-tests/ui_server.py). This checks that it stays so:
at the session's start it lists the ``ddp-kept-*`` files of the runtime directory the user's own Jupyter uses (the
environment pytest started with), and at its end a new one fails the run, named, with the test files that make kernels
to look at. ``python -m ddp_magic kept`` would otherwise list a test's ended pools to the user.
"""
from __future__ import annotations

import os
from typing import Optional, Set

import pytest

PREFIX = "ddp-kept-"
_KEY = pytest.StashKey[Set[str]]()
_DIR = pytest.StashKey[str]()


def user_runtime_dir() -> str:
    """The user's Jupyter runtime directory, as jupyter_core finds it from this process's environment (not made)."""
    from jupyter_core.paths import jupyter_runtime_dir

    return str(jupyter_runtime_dir())


def kept_files(path: str) -> Set[str]:
    try:
        return {n for n in os.listdir(path) if n.startswith(PREFIX)}
    except OSError:
        return set()


def _controller(config: pytest.Config) -> bool:
    """The one process that sees the whole run: not an xdist worker."""
    return not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if _controller(config):
        path = user_runtime_dir()
        config.stash[_DIR] = path
        config.stash[_KEY] = kept_files(path)


def left_behind(config: pytest.Config) -> Optional[str]:
    """What this run left in the user's runtime directory, said; None when nothing."""
    if _DIR not in config.stash:
        return None
    path = config.stash[_DIR]
    new = sorted(kept_files(path) - config.stash[_KEY])
    if not new:
        return None
    return (f"this test run left {len(new)} kept-pool file(s) in the user's own Jupyter runtime directory {path}: {', '.join(new)}. "
            "A kernel a test starts must use a runtime directory of its own (tests/kernel_helper.py Kernel does, unless "
            "the test passes JUPYTER_RUNTIME_DIR); `python -m ddp_magic stop ID` ends such a pool")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    said = left_behind(session.config)
    if said is None:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"ERROR: {said}", red=True)
    else:
        print(f"ERROR: {said}")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
