"""The ddp_magic.log chart in real JupyterLab (headless Chromium): live while a training cell runs, static after it.

A notebook with ``%load_ext ddp_magic`` and a ``%%ddp -n 2`` cell that logs a loss and a throughput for ~8 s. While
it runs, the chart (one line per rank per metric, and its table) is shown live above the output; the shot of that
moment goes to ``$DDP_MAGIC_UI_OUT/metrics_live.png`` and, with ``DDP_MAGIC_UPDATE_DOCS_IMG=1``, to
``docs/img/metrics_chart.png``. When the cell ends the static chart stays in the cell's output: an <img> of an SVG
per metric, which renders in an untrusted notebook too (test_saved_chart.py opens one).

The DDP panel shows the same data (ui/labcomm.py's ``metrics`` message): a Metrics section under the ranks, a chart per
metric with a polyline per rank in the cell chart's rank colours, and the summary table; live while the cell runs, the
final picture after it, kept through a cell that logs nothing, gone after a kernel restart. Its shot, in the light
theme, is ``docs/img/ui/lab-metrics-panel-light.png`` (with ``DDP_MAGIC_UPDATE_DOCS_IMG=1``).

Runs with the other browser tests (ui_fixtures.py's server and browser); Python Playwright drives /usr/bin/chromium.
"""
from __future__ import annotations

import os
import re
import shutil
import time
from typing import Any, Dict, Iterator, List

import pytest
from ui_pages import front_page, no_errors, run_cell, set_theme, shrink, wait_kernel_idle
from ui_probes import CONTRAST_JS
from ui_server import OUT, ROOT, SECONDS, Server

NOTEBOOK = "ddp_metrics.ipynb"
CELL = """%%ddp -n 2
import math, time, torch, ddp_magic
rank = torch.distributed.get_rank()
for step in range(80):
    t0 = time.perf_counter()
    time.sleep(0.1 + 0.02 * rank)                       # rank 1 a little slower
    loss = 2.0 * math.exp(-step / 25) + 0.05 * math.sin(step / 3 + rank) + 0.1
    ddp_magic.log(step=step, loss=loss, samples_per_s=64 / (time.perf_counter() - t0))"""

pytestmark = [pytest.mark.slow, pytest.mark.browser]
playwright_api = pytest.importorskip("playwright.sync_api", reason="Python Playwright is in requirements-dev.txt")
expect = playwright_api.expect


@pytest.fixture(scope="module")
def page(server: Server, browser: Any) -> Iterator[Any]:
    with front_page(server, browser, NOTEBOOK, ["%load_ext ddp_magic", CELL], 860, panel=False) as pg:
        yield pg


def test_the_chart_is_live_while_the_cell_runs_and_stays_after(page: Any) -> None:
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")  # do not wait for the run
    cell = page.locator(".jp-Cell").nth(1)
    toggle = cell.locator(".ddp-status-live .widget-toggle-button", has_text="▾")
    expect(toggle).to_be_visible(timeout=120_000)  # the status view went live
    toggle.click()  # open its body: the ranks, the env, and the Metrics section
    live = cell.locator(".ddp-status .ddp-status-section[data-title='Metrics'] .ddp-metrics svg polyline")
    expect(live).to_have_count(4, timeout=120_000)  # loss and samples_per_s, a line per rank, while the cell runs
    page.wait_for_timeout(2500)  # a few redraws later: the lines have grown
    running = cell.locator(".ddp-status-live .ddp-status-header[data-state='running']").count()
    os.makedirs(OUT, exist_ok=True)
    shot = os.path.join(OUT, "metrics_live.png")
    page.mouse.move(600, 5)
    cell.screenshot(path=shot)
    assert running == 1, "the shot shows the chart while the cell runs"
    if os.environ.get("DDP_MAGIC_UPDATE_DOCS_IMG") == "1":
        shutil.copyfile(shot, os.path.join(ROOT, "docs", "img", "metrics_chart.png"))
    static = cell.locator(".jp-OutputArea-output > .ddp-metrics")
    expect(static).to_have_count(1, timeout=120_000)  # the cell ended: the static chart after its output
    expect(static.locator("img[src^='data:image/svg+xml;base64,']")).to_have_count(2)  # loss and samples_per_s
    expect(static).to_contain_text("ddp_magic metrics: loss, samples_per_s from 2 ranks, steps 0-79")
    cell.screenshot(path=os.path.join(OUT, "metrics_static.png"))
    no_errors(page)  # the ▾ opened while the cell ran: no "No such comm" when the view settled


# ---------------------------------------------------------------- the same chart in the DDP panel
PANEL_NOTEBOOK = "ddp_metrics_panel.ipynb"
PANEL_CELL = """%%ddp -n 2
import math, time, torch, ddp_magic
rank = torch.distributed.get_rank()
for i in range(20):
    time.sleep(0.25)
    ddp_magic.log(step=i, loss=1.0 + math.exp(-i / 6) + 0.05 * rank)"""
QUIET_CELL = "%%ddp -n 2\nx = 1"  # logs nothing: the panel keeps the last chart, as %ddp metrics keeps its data
DOCS_IMG = os.environ.get("DDP_MAGIC_UPDATE_DOCS_IMG") == "1"  # else a test run leaves the tree clean
PANEL_SHOT = os.path.join(ROOT, "docs", "img", "ui", "lab-metrics-panel-light.png") if DOCS_IMG else os.path.join(OUT, "lab-metrics-panel-light.png")

METRICS_JS = """() => {
  const box = document.querySelector('.jp-ddp-Panel .jp-ddp-Metrics');
  const panel = document.querySelector('.jp-ddp-Panel');
  const shown = !!(box && box.offsetParent);
  const lines = box ? [...box.querySelectorAll('.jp-ddp-Metric[data-name="loss"] svg polyline')] : [];
  const row = box ? box.querySelector('tr.jp-ddp-MetricsRow[data-name="loss"]') : null;
  const name = box ? box.querySelector('tr.jp-ddp-MetricsName[data-name="loss"]') : null;
  const note = box ? box.querySelector('tr.jp-ddp-MetricsNote[data-name="loss"]') : null;
  const right = Math.max(0, ...(box ? [...box.querySelectorAll('*')] : []).map(e => e.getBoundingClientRect().right));
  return {
    shown, final: box ? box.dataset.final : null, cell: box ? box.dataset.cell : null,
    head: box && box.querySelector('.jp-ddp-Metrics-head') ? box.querySelector('.jp-ddp-Metrics-head').textContent : '',
    lines: lines.map(l => ({rank: l.dataset.rank, points: l.getAttribute('points').split(' ').length, stroke: getComputedStyle(l).stroke})),
    row: row ? [name ? name.textContent : null, ...[...row.querySelectorAll('td')].map(td => td.textContent)] : null,
    note: note ? note.textContent : null,
    overflow: panel.scrollWidth - panel.clientWidth,
    sticksOut: right - panel.getBoundingClientRect().right,
    prompt: document.querySelectorAll('.jp-Notebook .jp-CodeCell')[1].querySelector('.jp-InputPrompt').textContent,
  };
}"""

PANEL_CLIP_JS = """() => {
  const panel = document.querySelector('.jp-ddp-Panel').getBoundingClientRect();
  const bottom = Math.max(...[...document.querySelectorAll('.jp-ddp-Panel > *')].map(e => e.getBoundingClientRect().bottom));
  return {x: panel.left, y: panel.top, width: panel.width, height: Math.min(panel.height, bottom - panel.top + 8)};
}"""


@pytest.fixture(scope="module")
def panel_page(server: Server, browser: Any) -> Iterator[Any]:
    with front_page(server, browser, PANEL_NOTEBOOK, ["%load_ext ddp_magic", PANEL_CELL, QUIET_CELL], 900, panel=True) as pg:
        yield pg


def test_the_panel_shows_the_chart_live_keeps_it_after_the_cell_and_forgets_it_on_restart(panel_page: Any) -> None:
    page = panel_page
    run_cell(page, 0)  # %load_ext: the panel connects
    expect(page.locator(".jp-ddp-Panel-summary")).to_contain_text("No pool is running", timeout=60_000)
    expect(page.locator(".jp-ddp-Panel .jp-ddp-Metrics")).to_be_hidden()  # nothing logged yet: no empty section
    run_cell(page, 1)
    samples: List[Dict[str, Any]] = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < 180:
        s = page.evaluate(METRICS_JS)
        samples.append(s)
        if s["final"] == "true" and "*" not in s["prompt"]:
            break
        page.wait_for_timeout(200)
    live = [s for s in samples if s["final"] == "false"]
    assert live, "the panel showed the chart while the cell ran"
    grew = sorted({s["lines"][0]["points"] for s in live if s["lines"]})
    assert len(grew) >= 2, f"the live chart was redrawn as the ranks logged (rank 0's points seen: {grew})"
    end = page.evaluate(METRICS_JS)
    assert end["final"] == "true" and end["shown"], end
    assert [(ln["rank"], ln["points"]) for ln in end["lines"]] == [("0", 20), ("1", 20)], end["lines"]
    # the cell chart's rank colours (metrics_chart.PALETTE's first two)
    assert [ln["stroke"] for ln in end["lines"]] == ["rgb(31, 119, 180)", "rgb(255, 127, 14)"]
    # the summary row: last (mean over ranks), min, mean; the slowest rank on the line below it
    assert end["row"] and end["row"][0] == "loss" and len(end["row"]) == 4 and all(re.match(r"^[0-9.]+$", v) for v in end["row"][1:]), end
    assert re.match(rf"^slowest: (none stands out|rank 1 \(\+{SECONDS}\))( · last per rank: .*)?$", end["note"]), end["note"]
    assert "loss from 2 ranks, steps 0-19" in end["head"] and "live" not in end["head"], end["head"]
    assert end["overflow"] <= 0 and end["sticksOut"] <= 0.5, f"the Metrics section fits the default sidebar width: {end}"
    light = page.evaluate(CONTRAST_JS, [".jp-ddp-Metrics"])
    os.makedirs(os.path.dirname(PANEL_SHOT), exist_ok=True)
    page.mouse.move(600, 5)
    page.screenshot(path=PANEL_SHOT, clip=page.evaluate(PANEL_CLIP_JS))  # the panel down to its last line, not the empty rest
    shrink(PANEL_SHOT)
    set_theme(page, dark=True)
    dark = page.evaluate(CONTRAST_JS, [".jp-ddp-Metrics"])
    os.makedirs(OUT, exist_ok=True)
    page.screenshot(path=os.path.join(OUT, "lab-metrics-panel-dark.png"), clip=page.evaluate(PANEL_CLIP_JS))
    set_theme(page, dark=False)
    assert light["checked"] >= 10 and not light["low"], f"light theme: text under 4.5:1 {light}"
    assert dark["checked"] >= 10 and not dark["low"], f"dark theme: text under 4.5:1 {dark}"

    run_cell(page, 2)  # a cell that logs nothing
    page.wait_for_function("() => /\\[\\d+\\]/.test(document.querySelectorAll('.jp-Notebook .jp-CodeCell')[2].querySelector('.jp-InputPrompt').textContent)",
                           timeout=120_000)
    wait_kernel_idle(page)
    kept = page.evaluate(METRICS_JS)
    assert kept["shown"] and kept["cell"] == end["cell"] and len(kept["lines"]) == 2, kept

    page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()")
    wait_kernel_idle(page)
    expect(page.locator(".jp-ddp-Panel .jp-ddp-Metrics")).to_be_hidden(timeout=30_000)
    assert page.locator(".jp-ddp-Panel .jp-ddp-Metrics polyline").count() == 0
    no_errors(page)
