"""The page of test_views_agree.py's story in one front end (``Front``), and the words its views are compared in.

``Front`` opens the story's notebook in JupyterLab or Notebook 7 (ui_pages.py), samples the three views in one go
(ui_probes.SAMPLE_JS), follows a cell until it has ended and settled, and shoots each state once per theme with what
the page showed then (contrast, clipping, colours). ``coarse`` reduces a state to what every view must agree on.
"""
from __future__ import annotations

import json
import os
import re
import time
from typing import Any, Callable, Dict, List, Optional

from ui_pages import append_and_run, open_notebook, run_cell, set_theme, shrink, shut_down, wait_kernel_idle, wait_ready
from ui_probes import CLIP_JS, CLIP_ROOTS, COLOURS_JS, CONTRAST_JS, SAMPLE_JS
from ui_server import OUT, ROOT, ConsoleWatch, Server, code_cell

# the screenshots of each state: docs/img/ui/ with DDP_MAGIC_UPDATE_DOCS_IMG=1, else next to the other test shots (a test run leaves the tree clean)
IMG = os.path.join(ROOT, "docs", "img", "ui") if os.environ.get("DDP_MAGIC_UPDATE_DOCS_IMG") == "1" else os.path.join(OUT, "ui")
CELL_VIEW = ".jp-Notebook .jp-CodeCell .jp-OutputArea-child:first-child"
VIEWS = [".jp-ddp-Panel", ".jp-ddp-StatusItem", CELL_VIEW]


# ---------------------------------------------------------------- words to compare across views
def coarse(label: str, css: str = "") -> str:
    """A state as any view may word it, reduced to what must agree: starting, ready, running, done, failed, stopped."""
    label = label.strip().lower()
    if css == "idle" or label.startswith(("stopped", "released", "interrupted", "aborted")):
        return "stopped"
    if css == "bad" or label.startswith(("failed", "killed", "died", "dead", "timed out", "timeout")):
        return "failed"
    for word in ("starting", "connecting"):
        if label.startswith(word):
            return "starting"
    return label.split()[0] if label else ""


def panel_states(sample: Dict[str, Any]) -> Dict[int, str]:
    """The panel's word for each rank; once the cell is over and the pool ready again, the word of the last cell's
    failure on the rank it names (``root``: failed) or released (``stopped``), as the cell's own view keeps it."""
    out = {}
    for r, (label, css, last, _) in sample["panelRanks"].items():
        out[int(r)] = {"root": "failed", "stopped": "stopped"}.get(last) or coarse(label, css)
    return out


def disagreement(sample: Dict[str, Any]) -> Optional[str]:
    """Why the cell view and the panel (and the status bar) disagree in this sample; None when they agree."""
    # the two read the clock ms apart: any time ("<1 ms", "35 ms", "2.31 s", "3 m 05 s") is a clock
    clockless = lambda text: re.sub(r"<?\d+(\.\d+)? (ms|s|m \d+ s|h \d+ m)\b", "T", text or "")  # noqa: E731
    if sample["statusBar"] not in (None, "") and clockless(sample["statusBar"]) != clockless(sample["summary"]):
        return f"status bar {sample['statusBar']!r} vs panel {sample['summary']!r}"
    cell = {int(r): coarse(s) for r, s in sample["cellRanks"].items()}
    panel = panel_states(sample)
    if not cell:
        return None  # the cell has not shown its view yet
    if not panel:
        return f"the cell shows {cell}, the panel no ranks ({sample['summary']!r})"
    if cell != panel:
        return f"cell {cell} vs panel {panel}"
    return None


def prompt_number(sample: Dict[str, Any]) -> int:
    m = re.match(r"^\s*\[(\d+)\]", sample["prompt"])
    assert m, f"the cell has no prompt number: {sample['prompt']!r}"
    return int(m.group(1))


# ---------------------------------------------------------------- one frontend's page
class Front:
    def __init__(self, kind: str, server: Server, browser: Any, cell: str) -> None:
        self.kind = kind
        self.server = server
        self.notebook = f"views_{kind}.ipynb"
        server.write_notebook(self.notebook, [code_cell("%load_ext ddp_magic"), code_cell(cell)])
        self.context = browser.new_context(viewport={"width": 1200, "height": 720}, device_scale_factor=1)
        self.page = self.context.new_page()
        self.watch = ConsoleWatch(self.page)
        self.shots: Dict[str, Dict[str, Dict[str, Any]]] = {}  # theme -> state -> its screenshot, sample, contrast, clipping
        self.clicked = 0  # how often the live view's toggle was clicked while its cell ran

    def open(self, name: str) -> None:
        open_notebook(self.page, self.watch, self.server, self.kind, name)
        if self.kind == "lab":
            self.page.evaluate("() => { const s = window.jupyterapp.shell; if (!s.leftCollapsed) { s.collapseLeft(); } }")
        self.command("ddp-magic:show-panel")

    def reload(self) -> None:
        """The page again, as a person presses F5: the kernel runs on; nothing is asked of the panel."""
        self.watch.collect()
        self.page.reload(timeout=60_000)
        wait_ready(self.page, self.watch)
        self.page.wait_for_function("() => !!document.querySelector('.jp-ddp-Panel-summary')", timeout=30_000)
        self.page.wait_for_timeout(2000)  # the comm opens, the kernel sends the pool and its chart

    def command(self, cid: str, args: Optional[dict] = None) -> None:
        self.page.evaluate("([c, a]) => { window.jupyterapp.commands.execute(c, a || {}); }", [cid, args])

    def theme(self, dark: bool) -> None:
        set_theme(self.page, dark)

    def wait_kernel_idle(self) -> None:
        wait_kernel_idle(self.page, 90)

    def sample(self, index: int = 1) -> Dict[str, Any]:
        return self.page.evaluate(SAMPLE_JS, index)

    def contrast(self) -> Dict[str, Any]:
        return self.page.evaluate(CONTRAST_JS, VIEWS)

    def clipping(self) -> Dict[str, Any]:
        return self.page.evaluate(CLIP_JS, CLIP_ROOTS)

    def shot(self, name: str) -> str:
        os.makedirs(IMG, exist_ok=True)
        path = os.path.join(IMG, f"{self.kind}-{name}.png")
        self.page.mouse.move(600, 5)
        self.page.screenshot(path=path)
        shrink(path)
        return path

    def record(self, theme: str, state: str, sample: Dict[str, Any]) -> None:
        """One state's screenshot, with what the page showed then: contrast, clipping."""
        self.shots.setdefault(theme, {})[state] = {
            "contrast": self.contrast(), "clipping": self.clipping(), "colours": self.page.evaluate(COLOURS_JS), "sample": sample,
            "shot": self.shot(f"{state}-{theme}"),
        }

    def run_cell(self, index: int) -> None:
        run_cell(self.page, index)

    def append_and_run(self, code: str) -> None:
        append_and_run(self.page, code)

    def _open_the_live_body(self) -> None:
        """Click the live view's toggle (the one not selected: ▾ opens the ranks and the env, ▸ closes them)."""
        toggle = self.page.locator(".jp-Notebook .jp-CodeCell").nth(1).locator(".ddp-status-live .widget-toggle-button:not(.mod-active)")
        if toggle.count():
            toggle.first.click()
            self.clicked += 1

    def follow(self, index: int, start: Optional[Callable[[], None]], theme: Optional[str], end: str,
               timeout: float = 150.0) -> List[Dict[str, Any]]:
        """Run ``start`` (a cell run; None: it runs already or is queued), sample cell ``index``'s views until it has
        ended and settled; with a theme, shoot each state once (``end``: the name of the settled one)."""
        samples: List[Dict[str, Any]] = []
        if start is not None:
            start()
        t0 = time.monotonic()
        ended_at: Optional[float] = None
        first_running: Optional[float] = None
        while time.monotonic() - t0 < timeout:
            s = self.sample(index)
            samples.append(s)
            states = {coarse(v) for v in s["cellRanks"].values()}
            ended = not s["running"] and time.monotonic() - t0 > 3 and re.match(r"^\s*\[\d+\]", s["prompt"]) is not None
            if ended:
                ended_at = ended_at or time.monotonic()
            if s["live"] and s["running"] and not self.clicked and index == 1:
                self._open_the_live_body()
            phase = ("running" if "running" in states else "starting" if "starting" in states else "") if s["running"] else (
                end if ended_at and time.monotonic() - ended_at > 1.0 else "")
            first_running = first_running or (s["t"] if phase == "running" else None)
            if phase == "running" and (s["t"] - first_running < 1.2 or end != "failed"):
                phase = ""  # shoot the running state once tqdm has moved (and only for the main cell)
            if phase == "starting" and end != "failed":
                phase = ""
            if theme and phase and phase not in self.shots.get(theme, {}):
                self.record(theme, phase, s)
            if ended_at and time.monotonic() - ended_at > 2.0:
                break
            self.page.wait_for_timeout(300)
        return samples

    def toast_after(self, cid: str, result: str, timeout: float = 60.0) -> Dict[str, Any]:
        """Run a command; when its result toast shows, wait 1 s: is any toast still spinning?"""
        self.command(cid)
        t0 = time.monotonic()
        seen_at = None
        while time.monotonic() - t0 < timeout:
            dialog = self.page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept")
            if dialog.count() and seen_at is None:
                dialog.last.click()  # "Restart" after "the workers hold names", or the env report's Close
            toasts = self.page.evaluate(
                "() => [...document.querySelectorAll('.Toastify__toast')].map(t => ({text: t.textContent, spinning: !!t.querySelector('.Toastify__spinner')}))"
            )
            if seen_at is None and any(re.search(result, t["text"]) and not t["spinning"] for t in toasts):
                seen_at = time.monotonic()
            if seen_at is not None and time.monotonic() - seen_at >= 1.0:
                return {"toasts": toasts, "after": time.monotonic() - t0}
            self.page.wait_for_timeout(100)
        raise AssertionError(f"no toast matching {result!r} within {timeout}s")

    def saved_outputs(self, index: int = 1) -> List[Dict[str, Any]]:
        self.command("docmanager:save")
        self.page.wait_for_timeout(1500)
        with open(os.path.join(self.server.nbdir, self.notebook)) as f:
            return json.load(f)["cells"][index]["outputs"]

    def close(self) -> None:
        try:
            shut_down(self.page)
        finally:
            self.context.close()
