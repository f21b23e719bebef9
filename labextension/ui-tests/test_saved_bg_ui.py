"""A notebook saved while a background cell ran, opened after the job ended (JupyterLab and Notebook 7, headless Chromium).

JupyterLab autosaves every 120 s: a background cell is saved with its live status view, an ipywidgets reference
beside its HTML form. The notebook: ``%load_ext ddp_magic`` and a 2-rank ``%%ddp --bg`` cell that prints
``r{rank} step {i}`` and logs a loss every 0.25 s for 60 steps (15 s). A few steps in, the notebook is saved and its
page closed; the job goes on for more than 10 s. Once it ended, the notebook is opened again:

- its kernel still running (the same session): the cell shows the job's last true state, from the kernel's copy of
  the cell's outputs: every line once, the status view settled (each rank ``done``), the job's chart;
- the notebook made untrusted (its saved signature no longer matches) and opened in a new kernel: the cell shows
  the saved HTML form of its status view (the view as the cell began) with a line that says so, its saved lines,
  and no "Error displaying widget: model not found".

Neither page logs a console error (``widget model not found`` among them). Each case runs twice: in the light theme,
then in ``JupyterLab Dark``. The loss is the same on both ranks (as DDP keeps it): the chart draws one line and says
``ranks 0-1 identical``. Shots of the reopened cell (its view, its chart; untrusted: its saved view) go to
``$DDP_MAGIC_UI_OUT/{lab,notebook}-bg-reopened*-{light,dark}.png`` and, with ``DDP_MAGIC_UPDATE_DOCS_IMG=1``, to docs/img/ui/.
"""
from __future__ import annotations

import base64
import json
import os
import re
import time
from typing import Any, Callable, Dict, Iterator, List

import pytest
from ui_pages import is_dark, keep_shot, open_notebook, prompt_number, run_cell, set_theme, shut_down, wait_prompt
from ui_probes import SAMPLE_JS
from ui_server import ConsoleWatch, Server, code_cell

pytestmark = [pytest.mark.slow, pytest.mark.browser]
pytest.importorskip("playwright.sync_api", reason="Python Playwright is in requirements-dev.txt")

STEPS = 48  # 12 s: long enough to save and close the page mid-job under load, short for the suite's time
BG = f"""%%ddp --bg --out job -n 2
import time, torch.distributed as dist, ddp_magic
rank = dist.get_rank()
for step in range({STEPS}):
    time.sleep(0.25)
    print(f"r{{rank}} step {{step}}", flush=True)
    ddp_magic.log(step=step, loss=1.0 / (step + 1))
dist.barrier()
if rank == 0:
    open(DONE, "w").close()  # the test waits for the job's end, not a guess of it"""
ROUNDS = 2
DARK = 1  # the round run in JupyterLab Dark
CELL_JS = """(i) => {
  const cell = document.querySelectorAll('.jp-Notebook .jp-CodeCell')[i];
  return {
    text: [...cell.querySelectorAll('.jp-OutputArea-output')].map(o => o.textContent).join('\\n'),
    charts: [...cell.querySelectorAll('.jp-OutputArea-output > .ddp-metrics')].map(c => c.textContent.slice(0, 200)),
    pictures: [...cell.querySelectorAll('.jp-OutputArea-output > .ddp-metrics img')].map(i => i.src),
    views: [...cell.querySelectorAll('.jp-OutputArea-output .ddp-status')].map(v => v.dataset.state || ''),
    widgetError: /Error displaying widget/.test(cell.textContent),
    trusted: window.jupyterapp.shell.currentWidget.content.model.cells.get(i).trusted,
  };
}"""


def steps_shown(text: str, rank: int) -> List[int]:
    return [int(s) for s in re.findall(rf"\br{rank} step (\d+)\b", text)]


SETTLE_MS = 2500  # after the cell shows its end: what a late render or console error would add in the meantime
SETTLE_LIMIT_S = 30.0


def settled(page: Any, watch: ConsoleWatch, seen: int, shown: Callable[[Dict[str, Any]], bool]) -> Dict[str, Any]:
    """What the reopened notebook's bg cell shows once the widget manager, our comm and the kernel's copy are in: once
    it ``shown`` its end (or SETTLE_LIMIT_S passed: the assertions then say what it lacks), and SETTLE_MS more."""
    deadline = time.monotonic() + SETTLE_LIMIT_S
    while time.monotonic() < deadline and not shown(page.evaluate(CELL_JS, 1)):
        page.wait_for_timeout(250)
    page.wait_for_timeout(SETTLE_MS)
    return {"cell": page.evaluate(CELL_JS, 1), "sample": page.evaluate(SAMPLE_JS, 1), "errors": watch.errors()[seen:], "dark": is_dark(page)}


def the_jobs_end(cell: Dict[str, Any]) -> bool:
    return cell["views"] == ["finished"] and bool(cell["charts"]) and all(steps_shown(cell["text"], r)[-1:] == [STEPS - 1] for r in (0, 1))


def the_saved_view(cell: Dict[str, Any]) -> bool:
    return len(cell["views"]) == 1 and "saved while the cell ran" in cell["text"]


def shoot(page: Any, kind: str, case: str, dark: bool) -> None:
    """The reopened bg cell's top (its view, its first lines) and, where it has one, its chart."""
    theme = "dark" if dark else "light"
    cell = page.locator(".jp-Notebook .jp-CodeCell").nth(1)
    keep_shot(page, cell, f"{kind}-bg-reopened{case}-{theme}.png", height=420)
    chart = cell.locator(".jp-OutputArea-output > .ddp-metrics")
    if not case and chart.count():
        keep_shot(page, chart.first, f"{kind}-bg-chart-identical-{theme}.png")


def svgs(pictures: List[str]) -> List[str]:
    """The saved chart's pictures (data: URLs of SVGs), decoded."""
    prefix = "data:image/svg+xml;base64,"
    return [base64.b64decode(p[len(prefix):]).decode() for p in pictures if p.startswith(prefix)]


def one_round(server: Server, browser: Any, kind: str, n: int) -> Dict[str, Any]:
    dark = n == DARK
    name = f"saved_bg_{kind}_{n}.ipynb"
    done = os.path.join(server.nbdir, name + ".done")
    bg = BG.replace("DONE", repr(name + ".done"))  # the kernel and its ranks run in the notebook's folder
    server.write_notebook(name, [code_cell("%load_ext ddp_magic"), code_cell(bg)])
    rec: Dict[str, Any] = {}
    context = browser.new_context(viewport={"width": 1300, "height": 900}, device_scale_factor=1)
    try:
        page = context.new_page()
        watch = page.ddp_watch = ConsoleWatch(page)
        open_notebook(page, watch, server, kind, name)
        set_theme(page, dark)  # the server's setting: every page after opens in it, until set back below
        run_cell(page, 0)
        wait_prompt(page, 0)
        run_cell(page, 1)
        rec["number"] = prompt_number(wait_prompt(page, 1))
        page.wait_for_function("() => /r1 step 5\\b/.test(document.querySelectorAll('.jp-Notebook .jp-CodeCell')[1].textContent)", timeout=120_000)
        page.wait_for_function("() => !!document.querySelectorAll('.jp-Notebook .jp-CodeCell')[1].querySelector('.ddp-status-live')", timeout=60_000)
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_timeout(1500)
        with open(os.path.join(server.nbdir, name)) as f:
            saved = json.load(f)
        rec["saved_widget"] = any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in saved["cells"][1]["outputs"])
        page.close()  # the page goes; the kernel and its job go on
        page = context.new_page()
        watch = page.ddp_watch = ConsoleWatch(page)
        deadline = time.monotonic() + 120
        while not os.path.exists(done) and time.monotonic() < deadline:  # the job ends meanwhile
            time.sleep(0.2)
        assert os.path.exists(done), "the job did not end within 120 s"
        open_notebook(page, watch, server, kind, name)  # the same kernel session
        rec["same_kernel"] = settled(page, watch, 0, the_jobs_end)
        shoot(page, kind, "", dark)
        shut_down(page)
        page.wait_for_timeout(1500)
        page.close()
        saved["cells"][1]["metadata"]["edited"] = True  # the signature no longer matches: the notebook opens untrusted
        with open(os.path.join(server.nbdir, name), "w") as f:
            json.dump(saved, f)
        page = context.new_page()
        watch = page.ddp_watch = ConsoleWatch(page)
        open_notebook(page, watch, server, kind, name)  # a new kernel
        rec["new_kernel"] = settled(page, watch, 0, the_saved_view)
        shoot(page, kind, "-untrusted", dark)
        shut_down(page)
    finally:
        try:
            set_theme(context.pages[-1] if context.pages else context.new_page(), False)  # the next test's pages open light
        finally:
            context.close()
    return rec


@pytest.fixture(scope="module", params=["lab", "notebook"])
def story(request: Any, server: Server, browser: Any) -> Iterator[Dict[str, Any]]:
    kind = request.param
    if kind == "notebook":
        pytest.importorskip("notebook", reason="Notebook 7 (pip install notebook) is in requirements-dev.txt")
    yield {"kind": kind, "rounds": [one_round(server, browser, kind, n) for n in range(ROUNDS)]}


@pytest.mark.parametrize("n", range(ROUNDS))
def test_reopened_in_its_kernel_it_shows_the_jobs_end(story: Dict[str, Any], n: int) -> None:
    rec = story["rounds"][n]
    assert rec["saved_widget"], "the notebook was saved with the live widget's reference (what makes the case)"
    cell, sample = rec["same_kernel"]["cell"], rec["same_kernel"]["sample"]
    assert not cell["widgetError"], cell["text"][:300]
    for r in (0, 1):
        assert steps_shown(cell["text"], r) == list(range(STEPS)), f"rank {r}: every line once: {steps_shown(cell['text'], r)}"
    assert cell["views"] == ["finished"] and sample["cellRanks"] == {"0": "done", "1": "done"}, (cell["views"], sample["cellRanks"])
    assert len(cell["charts"]) == 1 and f"steps 0-{STEPS - 1}" in cell["charts"][0], cell["charts"]
    (svg,) = svgs(cell["pictures"])  # one metric, the loss: one line for both ranks, and the chart says why
    assert svg.count("<polyline") == 1 and ">ranks 0-1 identical<" in svg, svg[:300]
    errors = rec["same_kernel"]["errors"]
    assert not errors, errors[:5]


@pytest.mark.parametrize("n", range(ROUNDS))
def test_each_round_opened_in_its_theme(story: Dict[str, Any], n: int) -> None:
    rec = story["rounds"][n]
    assert rec["same_kernel"]["dark"] is (n == DARK) and rec["new_kernel"]["dark"] is (n == DARK), "light, then JupyterLab Dark"


@pytest.mark.parametrize("n", range(ROUNDS))
def test_reopened_untrusted_in_a_new_kernel_it_shows_the_saved_view(story: Dict[str, Any], n: int) -> None:
    rec = story["rounds"][n]
    cell = rec["new_kernel"]["cell"]
    assert cell["trusted"] is False, "the edited copy opens untrusted"
    assert not cell["widgetError"], cell["text"][:300]
    assert len(cell["views"]) == 1, f"the status view's saved HTML form (sanitized: no data attributes): {cell['views']}"
    assert "saved while the cell ran: its view as the cell began, and the lines saved with it; how it ended is not in this notebook" in cell["text"]
    shown = steps_shown(cell["text"], 0)
    assert shown and shown == list(range(len(shown))), f"the saved lines, in order, once: {shown}"
    errors = rec["new_kernel"]["errors"]
    assert not errors, errors[:5]
