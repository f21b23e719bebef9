"""tests/plugins/ci_skips.py: in CI a skip fails the run, unless it is for no GPU (or Notebook 7's missing status bar);
elsewhere a skip stays a skip. Run on a small suite of its own, in a pytest of its own."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict

ROOT = Path(__file__).resolve().parents[2]

SUITE: Dict[str, str] = {
    "test_browser.py": "import pytest\n\ndef test_ui():\n    pytest.skip('no Chromium at /nowhere (apt-get install -y chromium)')\n",
    "test_gpu.py": "import pytest\n\n@pytest.mark.skipif(True, reason='no NVIDIA GPU visible here (nvidia-smi)')\ndef test_nccl():\n    pass\n",
    "test_status.py": "import pytest\n\ndef test_bar():\n    pytest.skip('Notebook 7 has no status bar')\n",
    "test_module.py": "import pytest\n\npytest.importorskip('no_such_module_here', reason='needs no_such_module_here')\n\ndef test_x():\n    pass\n",
    "test_ok.py": "def test_fine():\n    pass\n",
}


def _pytest(folder: Path, ci: bool, *files: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update({"PYTHONPATH": str(ROOT / "tests" / "plugins"), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"} | ({"CI": "true"} if ci else {}))
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "ci_skips", "-p", "no:cacheprovider", "-c", str(folder / "pytest.ini"), *files]
    return subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=120)


def test_in_ci_a_skip_fails_the_run_naming_each_test_and_why(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    for name, text in SUITE.items():
        (tmp_path / name).write_text(text)
    ran = _pytest(tmp_path, True)
    assert ran.returncode == 1, ran.stdout
    assert "CI=true: 2 tests skipped for a reason CI does not accept" in ran.stdout, ran.stdout
    assert "  1 skipped: no Chromium at /nowhere (apt-get install -y chromium)\n    test_browser.py::test_ui\n" in ran.stdout, ran.stdout
    assert "  1 skipped: needs no_such_module_here\n    test_module.py\n" in ran.stdout, ran.stdout  # a module skipped whole
    assert "test_gpu.py::test_nccl" not in ran.stdout.split("CI does not accept")[1].split("short test summary")[0]
    assert _pytest(tmp_path, False).returncode == 0, "outside CI a skip stays a skip"
    accepted = _pytest(tmp_path, True, "test_gpu.py", "test_status.py", "test_ok.py")
    assert accepted.returncode == 0, accepted.stdout  # no GPU, Notebook 7's status bar: CI has neither
