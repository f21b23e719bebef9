"""A test run keeps nothing in the user's own Jupyter runtime directory.

Each test here runs pytest itself, on a small test file of its own, with the runtime directory of a pretend user
(JUPYTER_RUNTIME_DIR, as a user who set it would have it) and the plugin that guards it (tests/plugins/runtime_guard.py).
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Tuple

import pytest

pytestmark = pytest.mark.kernel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LEAVES = """
import json, os

def test_leaves_a_file():
    with open(os.path.join(os.environ["JUPYTER_RUNTIME_DIR"], "ddp-kept-0000dead.json"), "w") as f:
        json.dump({"id": "0000dead", "state": "ended"}, f)
"""

KEEPS = """
import json, os, signal, time
from kernel_helper import Kernel

def test_a_kept_pool_ends_while_no_kernel_is_attached():
    k = Kernel(extra_env={"JPY_SESSION_NAME": "guard.ipynb"})  # no runtime directory given: the helper's own
    try:
        k.run("%load_ext ddp_magic").ok()
        k.run("%%ddp -n 2\\n1", timeout=180).ok()
        where = k.value("__import__('os').environ['JUPYTER_RUNTIME_DIR']")
        assert "kept pool" in k.run("%ddp keep --idle 1s").ok().stdout
        os.kill(k.pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        ended = lambda: [n for n in os.listdir(where) if n.endswith(".json") and json.load(open(os.path.join(where, n))).get("state") == "ended"]
        while not ended() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ended(), os.listdir(where)  # the record of an ended pool, which `python -m ddp_magic kept` lists
    finally:
        k.shutdown()
"""


def run_pytest(tmp_path, source: str) -> Tuple[int, str, str]:
    """pytest on ``source`` with the guard, as a user whose runtime directory is ``<tmp>/user-runtime``; (rc, output, that dir)."""
    user = tmp_path / "user-runtime"
    user.mkdir(mode=0o700)
    (tmp_path / "test_inner.py").write_text(source)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    paths = [ROOT, os.path.join(ROOT, "tests"), os.path.join(ROOT, "tests", "plugins"), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(user), PYTHONPATH=os.pathsep.join(p for p in paths if p))
    env.pop("PYTEST_CURRENT_TEST", None)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "runtime_guard", "-c", str(tmp_path / "pytest.ini"),
                          str(tmp_path / "test_inner.py")], env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=600)
    return out.returncode, out.stdout + out.stderr, str(user)


def test_the_guard_fails_a_run_that_leaves_a_kept_file(tmp_path) -> None:
    rc, out, user = run_pytest(tmp_path, LEAVES)
    assert rc == 1 and "1 passed" in out, out
    assert f"this test run left 1 kept-pool file(s) in the user's own Jupyter runtime directory {user}: ddp-kept-0000dead.json" in out, out


def test_a_kernel_test_keeps_nothing_in_the_users_runtime_dir(tmp_path) -> None:
    """A test that keeps a pool through kernel_helper's Kernel and lets it end: its ended record is never the user's."""
    rc, out, user = run_pytest(tmp_path, KEEPS)
    assert not [n for n in os.listdir(user) if n.startswith("ddp-kept-")], (os.listdir(user), out)
    assert rc == 0 and "1 passed" in out, out
