"""The panel's and the status bar's word for a preemption, in real JupyterLab (headless Chromium; docs/snapshots.md
"Preemption").

The notebook: ``%load_ext ddp_magic``, a cell that starts a pool armed with --save-on-preempt (``step = 7``), and a
cell that sends SIGTERM to the pool's template (the kernel's child: what a machine's shutdown sends it) once the ranks
are armed. Between cells the kernel saves, says the line and ends the pool; the status bar then says
``DDP preempted · step 7 saved to DIR`` and the panel's summary the cell's whole line, ``%ddp load DIR`` as a command.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Dict, Iterator

import pytest
from ui_pages import front_page, no_errors, run_cell, wait_prompt
from ui_server import Server

pytestmark = [pytest.mark.slow, pytest.mark.browser]
playwright_api = pytest.importorskip("playwright.sync_api", reason="Python Playwright is in requirements-dev.txt")

FOLDER = os.path.join(tempfile.gettempdir(), f"ddp_preempt_ui_{os.getpid()}")
ARM = f"%%ddp -n 2 --save-on-preempt {FOLDER}\nstep = 7"
KILL = ("import glob, os, signal, time\n"
        "for _ in range(200):  # the ranks armed (their marker in /dev/shm): the template's SIGTERM is a preemption\n"
        "    if glob.glob(f'/dev/shm/ddp_magic-*-{os.getpid()}-*preempt-armed'):\n"
        "        break\n"
        "    time.sleep(0.05)\n"
        "os.kill(get_ipython().magics_manager.registry['DDPMagics'].pool.launcher.proc.pid, signal.SIGTERM)")
READ_JS = """() => {
  const sb = document.querySelector('.jp-ddp-StatusItem');
  const sum = document.querySelector('.jp-ddp-Panel-summary');
  return {status: sb ? sb.textContent : null, statusPhase: sb ? sb.dataset.phase : null, statusTitle: sb ? sb.title : null,
          summary: sum ? sum.textContent : null, summaryPhase: sum ? sum.dataset.phase : null,
          command: sum && sum.querySelector('code') ? sum.querySelector('code').textContent : null};
}"""


@pytest.fixture(scope="module")
def seen(server: Server, browser: Any) -> Iterator[Dict[str, Any]]:
    with front_page(server, browser, "preempt_lab.ipynb", ["%load_ext ddp_magic", ARM, KILL], 900, panel=True, width=1300) as page:
        for i in range(3):
            run_cell(page, i)
            wait_prompt(page, i, 240)
        page.wait_for_function("() => { const s = document.querySelector('.jp-ddp-StatusItem');"
                               " return s && /^DDP preempted/.test(s.textContent); }", timeout=120_000)
        read = page.evaluate(READ_JS)
        no_errors(page)
        yield read
    shutil.rmtree(FOLDER, ignore_errors=True)


def test_the_status_bar_says_the_step_saved(seen: Dict[str, Any]) -> None:
    assert seen["status"] == f"DDP preempted · step 7 saved to {FOLDER}", seen
    assert seen["statusPhase"] == "preempted", seen
    assert seen["statusTitle"].startswith(f"preempted: saved step 7 to {FOLDER}/step-"), seen


def test_the_panel_says_the_cells_line_with_the_load_as_a_command(seen: Dict[str, Any]) -> None:
    assert seen["summary"].startswith(f"The last pool was preempted: saved step 7 to {FOLDER}/step-"), seen
    assert seen["summary"].endswith(f"%ddp load {FOLDER} on the next allocation"), seen
    assert seen["command"] == f"%ddp load {FOLDER}" and seen["summaryPhase"] == "preempted", seen
