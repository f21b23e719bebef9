"""The cell's status view holds still: live and settled, its line is as high, its text starts where it started.

A %%ddp cell's view goes live (ipywidgets: a ▸/▾ toggle and the header line, ddp_magic/ui/status_display.py) and,
when the cell ends, is replaced by its static form (a <details> whose summary is the same line,
ddp_magic/ui/status_tables.py); labextension/style/cell.css gives both the same geometry. Measured here in real
JupyterLab and Notebook 7 (headless Chromium), the cell run twice as a notebook user re-runs it:

- the line is 20 px high live (closed and open) and settled, so nothing below it jumps;
- the header's first word (``%%ddp``) is at the same x and y live, open, and settled;
- the toggle is one 16 px glyph box at the line's left: one glyph shows (▸ closed, ▾ open: the state, like the
  settled marker), never a pressed pair, and the glyph's box is inside the toggle's, the toggle's inside the line;
- the settled marker is the same glyph in the same box.

Screenshots go to ``$DDP_MAGIC_UI_OUT`` (default ``build/ui-tests/``).
"""
from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List

import pytest
from ui_pages import READY_JS, notebook_url, shut_down, wait_kernel_idle
from ui_server import OUT, Server, code_cell

pytestmark = [pytest.mark.slow, pytest.mark.browser]
pytest.importorskip("playwright.sync_api", reason="Python Playwright is in requirements-dev.txt")

CELL = "%%ddp -n 2\nimport time\nfor i in range(14):\n    time.sleep(0.25)\n"
EPS = 0.75  # px: layout rounds to quarter pixels

# The geometry of the view in the current notebook's second cell (the %%ddp one): boxes as {x, y, w, h}.
MEASURE = """() => {
  const cell = window.jupyterapp.shell.currentWidget.node.querySelectorAll('.jp-CodeCell')[1];
  const box = e => { const b = e.getBoundingClientRect(); return {x: b.x, y: b.y, w: b.width, h: b.height}; };
  const textBox = e => { const r = document.createRange(); r.selectNodeContents(e); return box(r); };
  const out = cell.querySelector('.jp-OutputArea-output');
  const word = cell.querySelector('.ddp-status-header > b');
  const res = {output: out && box(out), word: word && textBox(word), word_text: word && word.textContent};
  const live = cell.querySelector('.ddp-status-live');
  if (live) {
    const line = live.firstElementChild;
    const toggle = live.querySelector('.widget-toggle-buttons');
    res.live = true;
    res.line = box(line);
    res.toggle = box(toggle);
    res.buttons = Array.from(toggle.querySelectorAll('button')).map(b => ({
      text: b.textContent, active: b.classList.contains('mod-active'), box: box(b), glyph: textBox(b),
      shown: getComputedStyle(b).opacity !== '0' && getComputedStyle(b).visibility !== 'hidden',
      top: document.elementFromPoint(box(toggle).x + box(toggle).w / 2, box(toggle).y + box(toggle).h / 2) === b,
    }));
    const body = live.lastElementChild;
    res.body_h = box(body).h;
  } else {
    const summary = cell.querySelector('details.ddp-status-details > summary');
    const before = getComputedStyle(summary, '::before');
    res.live = false;
    res.line = box(summary);
    res.marker = {content: before.content, left: parseFloat(before.left), width: parseFloat(before.width), font: before.fontSize};
    res.open = summary.parentElement.open;
  }
  return res;
}"""


class Page:
    """A notebook with a %%ddp cell on the shared server, in JupyterLab or Notebook 7."""

    def __init__(self, server: Server, browser: Any, kind: str) -> None:
        self.kind = kind
        self.name = f"geometry_{kind}.ipynb"
        server.write_notebook(self.name, [code_cell("%load_ext ddp_magic"), code_cell(CELL)])
        self.context = browser.new_context(viewport={"width": 1200, "height": 720}, device_scale_factor=1)
        self.page = self.context.new_page()
        self.errors: List[str] = []  # uncaught errors of ours (ddp-magic's bundle in the stack); Notebook 7 has its own
        self.page.on("pageerror", lambda e: self.errors.append(f"{e}\n{e.stack}") if "ddp" in f"{e}{e.stack}".lower() else None)
        self.page.goto(notebook_url(server, kind, self.name), timeout=60_000)
        self.page.wait_for_function(READY_JS, timeout=90_000)

    def run_all(self) -> None:
        self.page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")  # do not wait for the run

    def measure(self) -> Dict[str, Any]:
        return self.page.evaluate(MEASURE)

    def click_toggle(self) -> None:
        m = self.measure()
        t = m["toggle"]
        self.page.mouse.click(t["x"] + t["w"] / 2, t["y"] + t["h"] / 2)  # where a person clicks: the glyph
        self.page.wait_for_timeout(300)

    def shot(self, name: str) -> None:
        os.makedirs(OUT, exist_ok=True)
        self.page.mouse.move(600, 5)
        self.page.locator(".jp-CodeCell").nth(1).screenshot(path=os.path.join(OUT, f"cell-geometry-{self.kind}-{name}.png"))

    def close(self) -> None:
        try:
            shut_down(self.page)
        finally:
            self.context.close()


@pytest.fixture(scope="module", params=["lab", "notebook"])
def page(request: Any, server: Server, browser: Any) -> Iterator[Page]:
    p = Page(server, browser, request.param)
    try:
        yield p
    finally:
        p.close()


def inside(inner: Dict[str, float], outer: Dict[str, float]) -> bool:
    return (inner["x"] >= outer["x"] - EPS and inner["y"] >= outer["y"] - EPS
            and inner["x"] + inner["w"] <= outer["x"] + outer["w"] + EPS and inner["y"] + inner["h"] <= outer["y"] + outer["h"] + EPS)


def assert_live_line(m: Dict[str, Any], glyph: str) -> None:
    """One line 20 px high; one glyph showing, the state's, whole inside its 16 px box; a click lands on the other button."""
    assert m["live"] and abs(m["line"]["h"] - 20) <= EPS, m["line"]
    assert abs(m["toggle"]["w"] - 16) <= EPS and abs(m["toggle"]["h"] - 20) <= EPS and inside(m["toggle"], m["line"]), m["toggle"]
    shown = [b for b in m["buttons"] if b["shown"]]
    assert [b["text"] for b in shown] == [glyph] and shown[0]["active"], m["buttons"]
    assert inside(shown[0]["glyph"], shown[0]["box"]) and inside(shown[0]["box"], m["toggle"]), shown[0]
    assert shown[0]["glyph"]["w"] > 3, "the glyph is drawn, not cut to nothing"
    clicked = [b for b in m["buttons"] if b["top"]]
    assert len(clicked) == 1 and not clicked[0]["active"], "a click presses the other state's (invisible) button"


def test_the_view_holds_still_from_live_to_settled(page: Page) -> None:
    for run in range(2):  # a notebook user re-runs the cell: the warm pool's run goes live and settles the same
        page.run_all()
        page.page.wait_for_function(
            "() => !!window.jupyterapp.shell.currentWidget.node.querySelector('.jp-CodeCell .ddp-status-live .widget-toggle-buttons button')",
            timeout=120_000,
        )
        page.page.wait_for_timeout(400)  # the widgets laid out
        live = page.measure()
        assert_live_line(live, "▸")
        assert live["body_h"] <= EPS, "closed: the body takes no height"
        if run == 0:
            page.shot("live")
        page.click_toggle()
        opened = page.measure()
        assert opened["live"], "the cell ran past the open: make CELL longer"
        assert_live_line(opened, "▾")
        assert opened["body_h"] > 20, "open: the rank table shows"
        assert abs(opened["word"]["x"] - live["word"]["x"]) <= EPS and abs(opened["word"]["y"] - live["word"]["y"]) <= EPS
        if run == 0:
            page.shot("live-open")
        page.click_toggle()
        closed = page.measure()
        assert closed["live"] and closed["body_h"] <= EPS
        page.page.wait_for_function(
            "() => !!window.jupyterapp.shell.currentWidget.node.querySelector(\".jp-CodeCell div.ddp-status[data-state='finished']\")",
            timeout=120_000,
        )
        page.page.wait_for_timeout(300)
        settled = page.measure()
        if run == 0:
            page.shot("settled")
        assert not settled["live"] and not settled["open"]
        assert abs(settled["line"]["h"] - live["line"]["h"]) <= EPS, (settled["line"], live["line"])
        assert abs(settled["output"]["h"] - live["output"]["h"]) <= EPS, "what is below the view does not jump"
        assert settled["word_text"] == live["word_text"] == "%%ddp"
        assert abs(settled["word"]["x"] - live["word"]["x"]) <= EPS, ("the header text starts where it did", settled["word"], live["word"])
        assert abs(settled["word"]["y"] - live["word"]["y"]) <= EPS, (settled["word"], live["word"])
        marker = settled["marker"]
        assert marker["content"] == '"▸"' and marker["left"] == 0 and abs(marker["width"] - live["toggle"]["w"]) <= EPS, marker
        assert abs(settled["line"]["x"] - live["toggle"]["x"]) <= EPS, "the marker's box is where the toggle was"
        wait_kernel_idle(page.page, 60)
    assert page.errors == [], "uncaught errors of ours:\n" + "\n".join(page.errors)
