"""Screenshot the %%ddp status widget after a 4-rank cell in real JupyterLab (headless Chromium).

    .venv/bin/python scripts/screenshot_widget.py      # writes docs/img/widget.png and docs/img/widget-live.png
    .venv/bin/python scripts/screenshot_widget.py --out /tmp/w.png -n 4 --section env

It starts its own JupyterLab server (a free port, a temporary notebook dir and
settings dir), opens a notebook with ``%load_ext ddp_magic`` and a ``%%ddp -n 4``
cell, runs it, waits until the widget has settled to its one-line summary,
opens one section of it (the rank table by default) and screenshots that cell.
(While the cell runs the view is an ipywidgets VBox/Accordion updated live; when
it ends, its static HTML form replaces it: same summary, same tables.)
It checks what the browser shows (the summary line, one table row per rank)
and exits non-zero when the widget did not render.

Needs Python Playwright (``pip install playwright``; never ``playwright install``)
and a system Chromium (``apt-get install -y chromium``).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import IO, Dict, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-dev-shm-usage",
]
CELL = """%%ddp -n {n}
import time, torch, torch.distributed as dist
x = torch.ones(2) * dist.get_rank()
for step in range(3):
    dist.all_reduce(x)
    print(f"step {{step}}: sum", x.tolist())
    time.sleep(0.8)
x"""


def find_chromium() -> Optional[str]:
    for name in ("/usr/bin/chromium", "/usr/bin/chromium-browser", shutil.which("chromium") or "", shutil.which("google-chrome") or ""):
        if name and os.path.exists(name):
            return name
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _notebook(n: int) -> dict:
    def code(src: str) -> dict:
        return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": src}

    return {
        "cells": [code("%load_ext ddp_magic"), code(CELL.format(n=n))],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def _wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.25)
    raise TimeoutError(f"JupyterLab did not answer at {url}")


def start_lab(tmp: str, name: str, notebook: dict) -> Tuple["subprocess.Popen[bytes]", IO[bytes], str]:
    """A JupyterLab on a free port over ``tmp`` (its settings quiet, ``notebook`` saved as ``name``), this tree's
    ddp_magic and extension first; up once its API answers. Returns the server, its log and the notebook's URL."""
    settings = os.path.join(tmp, "settings")
    os.makedirs(os.path.join(settings, "@jupyterlab", "apputils-extension"))
    with open(os.path.join(settings, "@jupyterlab", "apputils-extension", "notification.jupyterlab-settings"), "w") as f:
        json.dump({"fetchNews": "false", "checkForUpdates": False}, f)
    nbdir = os.path.join(tmp, "nb")
    os.makedirs(nbdir)
    with open(os.path.join(nbdir, name), "w") as f:
        json.dump(notebook, f)
    port, token = _free_port(), "ddpshot"
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=settings, JUPYTERLAB_WORKSPACES_DIR=os.path.join(tmp, "ws"))
    built = os.path.join(ROOT, "ddp_magic", "labextension")  # this tree's extension (its CSS styles the view), ahead of an installed copy
    if os.path.exists(os.path.join(built, "package.json")):
        os.makedirs(os.path.join(tmp, "jupyter", "labextensions"))
        os.symlink(built, os.path.join(tmp, "jupyter", "labextensions", "ddp-magic"))
        env["JUPYTER_PATH"] = os.pathsep.join(p for p in (os.path.join(tmp, "jupyter"), env.get("JUPYTER_PATH", "")) if p)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    env.pop("PYTEST_CURRENT_TEST", None)
    log = open(os.path.join(tmp, "lab.log"), "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}", "--ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={nbdir}", "--LabApp.expose_app_in_browser=True",
         "--ServerApp.disable_check_xsrf=True"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=nbdir,
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/api?token={token}", 60)
    except BaseException:
        server.kill()
        log.close()
        raise
    return server, log, f"http://127.0.0.1:{port}/lab/tree/{name}?token={token}&reset"


def take(
    out: str, n: int = 4, section: str = "ranks", timeout: float = 240.0, chromium: Optional[str] = None, live_out: Optional[str] = None
) -> Dict[str, object]:
    """Run the cell in JupyterLab, screenshot it to ``out`` (and, while it runs, to ``live_out``); returns what the browser showed."""
    from playwright.sync_api import sync_playwright

    chromium = chromium or find_chromium()
    if chromium is None:
        raise RuntimeError("no Chromium found; apt-get install -y chromium")
    tmp = tempfile.mkdtemp(prefix="ddp-shot-")
    server, log, url = start_lab(tmp, "ddp.ipynb", _notebook(n))
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1180, "height": 1400}, device_scale_factor=1)
            page.goto(url, timeout=60_000)
            page.wait_for_function(
                "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                " const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;"
                " return k && k.status === 'idle'; }",
                timeout=90_000,
            )
            page.evaluate("() => window.jupyterapp.commands.execute('application:toggle-left-area')")
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")  # do not wait for the run
            cell = page.locator(".jp-CodeCell").nth(1)
            live: Dict[str, object] = {}
            if live_out:  # the ipywidgets view while the ranks run: every rank running and printing, the strip opened
                page.wait_for_function(
                    f"() => document.querySelectorAll(\".ddp-status-live .ddp-status-strip [data-state='running']\").length === {n}",
                    timeout=timeout * 1000,
                )
                cell.locator(".ddp-status-live .widget-toggle-button", has_text="▾").first.click()  # opens the rank table
                page.wait_for_function(
                    "() => { const t = document.querySelector('.ddp-status-live .ddp-status-ranks');"
                    " return t && t.textContent.includes('step 1'); }",
                    timeout=timeout * 1000,
                )
                live["live_header"] = " ".join(cell.locator(".ddp-status-header").first.inner_text().split())
                live["live_widget"] = cell.locator(".ddp-status-live").count() > 0
                page.mouse.move(0, 0)
                cell.screenshot(path=live_out)
            page.wait_for_selector("div.ddp-status .ddp-status-header[data-state='finished']", timeout=timeout * 1000)
            if section != "none":  # the settled form: one summary line, the tables behind its <details>
                cell.locator("details.ddp-status-details > summary").first.click()
                page.wait_for_timeout(300)
                if section == "env":
                    cell.locator(".ddp-status-env details > summary").first.click()
                    page.wait_for_timeout(300)
            header = cell.locator(".ddp-status-header").first.inner_text()
            rows = cell.locator(".ddp-status-ranks tr[data-rank]").count()
            done = cell.locator(".ddp-status-ranks tr[data-state='done']").count()
            page.mouse.move(0, 0)
            os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
            cell.screenshot(path=out)
            browser.close()
        return {"header": " ".join(header.split()), "rows": rows, "done": done, "png": out, "bytes": os.path.getsize(out), **live}
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "img", "widget.png"), help="the settled view after the cell")
    ap.add_argument("--live-out", default=os.path.join(ROOT, "docs", "img", "widget-live.png"), help="the live widget while the cell runs ('' for none)")
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("--section", choices=("ranks", "env", "none"), default="ranks", help="the part of the widget to open before the shot")
    args = ap.parse_args(argv)
    info = take(args.out, args.n, args.section, live_out=args.live_out or None)
    print(json.dumps(info, ensure_ascii=False))
    ok = info["rows"] == args.n and info["done"] == args.n and f"{args.n} ranks ✓" in str(info["header"])
    if args.live_out:
        ok = ok and bool(info.get("live_widget")) and f"running {args.n}" in str(info.get("live_header"))
    if not ok:
        print("the widget did not show what it should", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
