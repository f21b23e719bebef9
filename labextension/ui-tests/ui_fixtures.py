"""One Jupyter server and one headless Chromium for every browser test (JupyterLab and Notebook 7): see ui_server.py.

A pytest plugin (setup.cfg: ``-p ui_fixtures``), not a conftest.py: a second top-level ``conftest`` module would
shadow tests/conftest.py, whose helpers the kernel tests import by name; and a fixture module imported by each test
module would make its session-wide fixtures one per module (two Playwrights at once fail)."""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Iterator

import pytest
from ui_server import BUILT, CHROMIUM, CHROMIUM_ARGS, Server


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install -y chromium; scripts/setup.sh does)")
    assert os.path.exists(os.path.join(BUILT, "package.json")), "the extension is not built: run scripts/setup.sh (or jlpm build:prod in labextension/)"
    tmp = tempfile.mkdtemp(prefix="ddp-ui-")
    srv = Server(tmp)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.close()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def browser(server: Server) -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="Python Playwright is in requirements-dev.txt")
    pw = sync_api.sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()
    finally:
        pw.stop()
