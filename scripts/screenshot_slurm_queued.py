"""Screenshot what JupyterLab shows while a `%%ddp --slurm` job is queued: the cell's status view, the DDP panel, the status bar.

    .venv/bin/python scripts/screenshot_slurm_queued.py     # writes docs/img/slurm-queued.png (needs the local Slurm, root)

It starts the local two-node Slurm (scripts/local_slurm.py) if it is not up, holds both
nodes with a job of its own (``sbatch --exclusive -N2 sleep``), starts JupyterLab
(scripts/screenshot_widget.py's way: a free port, temporary notebook and settings dirs,
headless Chromium through Playwright, never ``playwright install``), runs a
``%%ddp --slurm --nodes 2 --ntasks-per-node 2`` cell, opens the DDP panel, waits until the
view says "queued: job N pending (Resources)" and how long it waited, and screenshots the
window. Then it interrupts the kernel (Ctrl-C cancels the queued job), cancels the holding
job and checks that squeue lists neither. Exits non-zero when the view did not say queued.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import local_slurm  # noqa: E402
from screenshot_widget import CHROMIUM_ARGS, find_chromium, start_lab  # noqa: E402

CELL = "%%ddp --slurm --nodes 2 --ntasks-per-node 2\nimport torch\ntorch.__version__"


def _notebook() -> dict:
    def code(src: str) -> dict:
        return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": src}

    return {"cells": [code("%load_ext ddp_magic"), code(CELL)],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}}, "nbformat": 4, "nbformat_minor": 5}


def _squeue(name: str) -> str:
    return subprocess.run(["squeue", "-h", "-n", name, "-o", "%i %T"], capture_output=True, text=True, timeout=20).stdout.strip()


def _shoot(page, out: str, timeout: float) -> Dict[str, object]:  # noqa: ANN001 (Playwright's Page)
    page.wait_for_function(
        "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
        " const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;"
        " return k && k.status === 'idle'; }", timeout=90_000)
    page.evaluate("() => window.jupyterapp.commands.execute('application:toggle-left-area')")
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    page.evaluate("() => window.jupyterapp.commands.execute('ddp-magic:show-panel')")
    page.wait_for_function("() => document.body.innerText.includes('queued: job') && /waited \\d/.test(document.body.innerText)",
                           timeout=timeout * 1000)
    page.wait_for_function("() => { const p = document.querySelector('#ddp-magic-panel'); return p && p.innerText.includes('queued'); }",
                           timeout=timeout * 1000)
    page.wait_for_timeout(2500)  # a few seconds waited, as the user sees it
    seen = {
        "cell": " ".join(page.locator(".jp-CodeCell").nth(1).inner_text().split())[:300],
        "panel": " ".join(page.locator("#ddp-magic-panel").inner_text().split())[:300],
        "status_bar": " ".join(page.locator(".jp-ddp-StatusItem").first.inner_text().split()),
    }
    page.mouse.move(0, 0)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    page.screenshot(path=out)
    page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.interrupt()")
    page.wait_for_function("() => document.body.innerText.includes('KeyboardInterrupt')", timeout=60_000)
    return seen


def take(out: str, timeout: float = 180.0, chromium: Optional[str] = None) -> Dict[str, object]:
    """Hold the nodes, run the cell in JupyterLab, screenshot the queued view to ``out``; returns what the browser showed."""
    from playwright.sync_api import sync_playwright

    chromium = chromium or find_chromium()
    if chromium is None:
        raise RuntimeError("no Chromium found; apt-get install -y chromium")
    print(local_slurm.start(), flush=True)
    hold = subprocess.run(["sbatch", "--parsable", "--job-name=screenshot-hold", "--output=/dev/null", "-N2", "--exclusive", "--wrap", "sleep 600"],
                          capture_output=True, text=True, check=True).stdout.strip()
    tmp = tempfile.mkdtemp(prefix="ddp-shot-slurm-")
    server = None
    try:
        server, log, url = start_lab(tmp, "slurm.ipynb", _notebook())
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1280, "height": 720}, device_scale_factor=1)
            page.goto(url, timeout=60_000)
            seen = _shoot(page, out, timeout)
            browser.close()
        deadline = time.monotonic() + 15
        while _squeue("ddp_magic") and time.monotonic() < deadline:
            time.sleep(0.3)
        seen["left_after_ctrl_c"] = _squeue("ddp_magic")
        return seen
    finally:
        subprocess.run(["scancel", hold], capture_output=True, timeout=20)
        if server is not None:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
            log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "img", "slurm-queued.png"))
    args = ap.parse_args(argv)
    seen = take(args.out)
    print(json.dumps(seen, ensure_ascii=False))
    ok = all("queued: job" in str(seen[k]) for k in ("cell", "panel", "status_bar")) and not seen["left_after_ctrl_c"]
    if not ok:
        print("the view, the panel or the status bar did not say queued, or Ctrl-C left a job", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
