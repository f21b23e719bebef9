"""The Jupyter server of the browser tests (ui_fixtures.py starts one for the whole session).

The server is ``jupyter lab`` on a free port with a temporary root dir, settings, workspaces and data
dir (so no notebook is trusted by an earlier run); it serves JupyterLab at ``/lab`` and, with the
``notebook`` package installed, Notebook 7 at ``/notebooks``. The extension is the one built in this
tree (``ddp_magic/labextension``), ahead of any installed copy. Python Playwright drives Debian's
``/usr/bin/chromium``; no browser is ever downloaded (never ``playwright install``).
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any, Dict, List, Pattern

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.path.join(ROOT, "tests") not in sys.path:
    sys.path.append(os.path.join(ROOT, "tests"))  # tests/format_patterns.py: one home for what a formatted time may read
import format_patterns  # noqa: E402  (the tests' own helper module, found once tests/ is on the path)

SECONDS = format_patterns.SECONDS  # any time the status bar may show (format.ts fmtSeconds mirrors fmt_seconds)
BUILT = os.path.join(ROOT, "ddp_magic", "labextension")
CHROMIUM = os.environ.get("DDP_MAGIC_CHROMIUM", "/usr/bin/chromium")
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
OUT = os.environ.get("DDP_MAGIC_UI_OUT", os.path.join(ROOT, "build", "ui-tests"))


# Errors a page logs that are JupyterLab's own and no fault of ours, each with why; anything else fails a test.
# (Each was seen with the ddp-magic extension disabled as well.)
KNOWN_NOISE: List[Pattern[str]] = [
    # Notebook 7 (7.6) throws this on every notebook page it opens, extensions or not
    re.compile(r"^pageerror: Cannot read properties of undefined \(reading 'schema'\)$"),
    # Notebook 7 restores the file browser JupyterLab left in the same workspace, on a page that has none
    re.compile(r"^pageerror: Command 'filebrowser:open-path' not registered\.$"),
    # Chromium refuses JupyterLab's "leave the page?" dialog when a test reloads a page nobody clicked in
    re.compile(r"^error: Blocked attempt to show a 'beforeunload' confirmation panel for a frame that never had a user gesture"),
    # ipywidgets 8.1 (jupyterlab_widgets 3.0): a Box view creates its children's views asynchronously, then posts each
    # a resize message without asking whether it was disposed meanwhile; a disposed view's Lumino widget has no view
    # left and throws on it. It happens whenever a Box widget's display is replaced before its children's views are
    # made: ~30 ms on a warm page, longer on a page just reloaded (the controls module loads then). The status view is
    # such a Box, replaced by its static form when the cell ends: a job that ends just after its view went live. The
    # page shows everything right; the console logs this. (Run a cell that displays a VBox and replaces its display
    # 10 ms later: the same line.)
    re.compile(r"^error: TypeError: Cannot read properties of null \(reading 'processLuminoMessage'\)\n\s+at [\w$]+\.processMessage "
               r"\(\S+/@jupyter-widgets/jupyterlab-manager/static/"),
]

# Kernel output that belongs to no cell (JupyterLab puts it in its log console, with a red badge in the status bar):
# a comm message's error, "No such comm", a warning from a thread. Recorded in the page, with whether the comm it
# names is one this extension opened (connection.ts commIds), and the target the page opened it to (its comm_open).
ORPHAN_OUTPUT_JS = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  if (!w || !w.sessionContext || w.__ddpOrphans) { return; }
  w.__ddpOrphans = [];
  const targets = {};
  const follow = kernel => {
    if (!kernel) { return; }
    for (const [id, c] of (kernel._comms || new Map())) { targets[id] = c.targetName; }  // opened before we followed
    kernel.anyMessage.connect((_, a) => {
      if (a.direction === 'send' && a.msg.header.msg_type === 'comm_open') { targets[a.msg.content.comm_id] = a.msg.content.target_name; }
    });
  };
  follow(w.sessionContext.session && w.sessionContext.session.kernel);
  w.sessionContext.kernelChanged.connect((_, change) => follow(change.newValue));
  w.sessionContext.iopubMessage.connect((_, m) => {
    const parent = m.parent_header || {};
    if ((m.header.msg_type === 'stream' || m.header.msg_type === 'error') && parent.msg_type !== 'execute_request') {
      const text = m.content.text || m.content.evalue || '';
      const named = /No such comm: (\\S+)/.exec(text);
      const ours = !!named && window.jupyterapp.ddpMagic.tracker.connections.some(c => c.commIds.includes(named[1]));
      const kernel = w.sessionContext.session && w.sessionContext.session.kernel;
      const live = named && kernel && kernel._comms && kernel._comms.get(named[1]);  // one opened before we followed
      w.__ddpOrphans.push({parent: parent.msg_type || '', text, ours, target: named ? (targets[named[1]] || (live && live.targetName) || '') : ''});
    }
  });
}"""

# Such output that is no fault of ours. ipywidgets' page opens a "jupyter.widget.control" comm to every kernel it
# meets (to restore widgets); a kernel that has not imported ipywidgets yet refuses it, and then the page's first
# message on it: a comm the page opened (a dashed uuid; a widget model's id, made by the kernel, has none), not ours.
# A kernel that has ipywidgets may answer that first message "No such comm" too, when it reads it before the comm_open
# (ipykernel 7 reads comm messages on a subshell of their own): the comm's target, seen in the page's comm_open, says so.
# The control comm may be opened before the probe follows the kernel and closed before that answer comes (fc21: its
# target unknown, ''): a comm that is not ours and was open at neither moment is such a comm. Ours are known by id, and
# by target whenever they were open as the probe began or opened after.
WIDGET_CONTROL = re.compile(r"^No such comm target registered: jupyter\.widget\.control\n?$")
NOT_OUR_COMM = re.compile(r"^No such comm: [0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\n?$")
# ipykernel 7.4 stopped for a restart while a shell message (the page's comm_info_request, which it sends as the kernel
# restarts) waited its turn: its handler's task is destroyed pending, and asyncio says so on the dying kernel's stderr.
# A bare ipykernel does it too (test_noise_rules.py restarts one while comm_info_requests wait).
_SHELL_TASK = r"(?:Kernel\.shell_channel_thread_main|Kernel\.shell_main|_async_in_context\.<locals>\.run_in_context)"
RESTART_TASK = re.compile(r"^Task was destroyed but it is pending!\ntask: <Task pending name='Task-\d+' coro=<" + _SHELL_TASK
                          + r"\(\) running at \S+/ipykernel/\w+\.py:\d+>")
RESTART_CORO = re.compile(r"^\S+/asyncio/base_events\.py:\d+: RuntimeWarning: coroutine '" + _SHELL_TASK + r"' was never awaited\n")


def known_kernel_noise(orphan: Dict[str, Any], seen: List[Dict[str, Any]]) -> bool:
    text = orphan.get("text", "")
    if WIDGET_CONTROL.match(text):
        return True
    if orphan.get("parent") != "execute_request" and (RESTART_TASK.match(text) or RESTART_CORO.match(text)):
        return True
    if orphan.get("target") in ("jupyter.widget.control", "") and not orphan.get("ours") and NOT_OUR_COMM.match(text):
        return True
    refused = any(WIDGET_CONTROL.match(o.get("text", "")) for o in seen)
    return refused and not orphan.get("ours") and NOT_OUR_COMM.match(text) is not None


class ConsoleWatch:
    """Every console error and uncaught exception of a page (ours or not), and the kernel output no cell owns."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.lines: List[str] = []
        self.orphans: List[Dict[str, str]] = []
        self.stacks: List[str] = []
        page.on("console", lambda m: self.lines.append(f"{m.type}: {m.text}") if m.type in ("error", "assert") else None)
        page.on("pageerror", self._uncaught)

    def _uncaught(self, error: Any) -> None:
        self.lines.append(f"pageerror: {error}")
        self.stacks.append(str(getattr(error, "stack", "") or "")[:1500])  # where it came from, for the failure message

    def follow_kernel(self) -> None:
        """Record the current notebook's kernel output that belongs to no cell (call again after each page load)."""
        self.collect()
        self.page.evaluate(ORPHAN_OUTPUT_JS)

    def collect(self) -> List[Dict[str, str]]:
        """The output no cell owns, recorded so far (kept here: a reload loses the page's list)."""
        got = self.page.evaluate(
            "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
            " if (!w || !w.__ddpOrphans) { return []; } return w.__ddpOrphans.splice(0); }"
        )
        self.orphans.extend(got)
        return [o for o in self.orphans if not known_kernel_noise(o, self.orphans)]

    def forget(self) -> None:
        """Drop what was reported, so that a page shared by a module's tests fails one test for it, not every later one
        (the known noise stays: whether the page's control comm was refused judges later lines)."""
        self.lines.clear()
        self.stacks.clear()
        self.orphans[:] = [o for o in self.orphans if known_kernel_noise(o, self.orphans)]

    def errors(self) -> List[str]:
        """The errors that are not JupyterLab's known noise (KNOWN_NOISE)."""
        return [line for line in self.lines if not any(p.match(line) for p in KNOWN_NOISE)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def code_cell(src: str) -> Dict[str, Any]:
    return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": src}


def descendants(pid: int) -> List[int]:
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Server:
    """A Jupyter server (JupyterLab, and Notebook 7 when installed) on a temporary notebook dir."""

    def __init__(self, tmp: str) -> None:
        self.tmp = tmp
        settings = os.path.join(tmp, "settings", "@jupyterlab", "apputils-extension")
        os.makedirs(settings)
        with open(os.path.join(settings, "notification.jupyterlab-settings"), "w") as f:
            json.dump({"fetchNews": "false", "checkForUpdates": False}, f)
        self.nbdir = os.path.join(tmp, "nb")
        os.makedirs(self.nbdir)
        jp = os.path.join(tmp, "jupyter", "labextensions")
        os.makedirs(jp)
        os.symlink(BUILT, os.path.join(jp, "ddp-magic"))
        self.port, self.token = free_port(), "ddp-ui-test"
        env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=os.path.join(tmp, "settings"), JUPYTERLAB_WORKSPACES_DIR=os.path.join(tmp, "ws"))
        env["JUPYTER_PATH"] = os.pathsep.join(p for p in (os.path.join(tmp, "jupyter"), env.get("JUPYTER_PATH", "")) if p)
        env["JUPYTER_DATA_DIR"] = os.path.join(tmp, "data")  # a fresh trust database: shipped notebooks open untrusted
        env["JUPYTER_RUNTIME_DIR"] = os.path.join(tmp, "data", "runtime")  # never an inherited one (the user's): kept pools' files
        env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
        env.pop("PYTEST_CURRENT_TEST", None)  # else ipykernel stops capturing child fds (see TOOLCHAIN.md)
        # debugpy's "frozen modules" warning at every kernel start is kernel output outside any cell, which the tests
        # refuse (ConsoleWatch): not ours, and debugpy's own switch silences it
        env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
        self.log_path = os.path.join(tmp, "server.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={self.port}", "--ip=127.0.0.1",
                f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.nbdir}",
                "--LabApp.expose_app_in_browser=True", "--JupyterNotebookApp.expose_app_in_browser=True",
                "--ServerApp.disable_check_xsrf=True",
            ],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=self.nbdir, start_new_session=True,
        )

    def url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"http://127.0.0.1:{self.port}/{path}{sep}token={self.token}"

    def write_notebook(self, name: str, cells: List[Dict[str, Any]]) -> str:
        nb = {
            "cells": cells,
            "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
        path = os.path.join(self.nbdir, name)
        with open(path, "w") as f:
            json.dump(nb, f)
        return path

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Jupyter server exited: {self.log_text()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api?token={self.token}", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"the Jupyter server did not answer: {self.log_text()}")

    def log_text(self) -> str:
        self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()[-4000:]

    def close(self) -> None:
        kids = descendants(self.proc.pid)  # kernels and their ddp workers
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(alive(p) for p in kids):
            time.sleep(0.1)
        for p in kids:  # only processes this test session started
            if alive(p):
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.log.close()
