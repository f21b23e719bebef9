"""A page reloaded while a background cell runs gets the cell back (JupyterLab and Notebook 7, headless Chromium).

The notebook: ``%load_ext ddp_magic``, a 2-rank cell that logs 5 steps (its final chart is the panel's until the
job logs), and a ``%%ddp --bg`` cell that prints ``r{rank} step {i}`` and logs a loss every 0.25 s for 80 steps
(20 s), waiting at a gate (a file) before step 30. While it logs, the panel's chart is the job's (its cell's prompt,
live, its steps growing), not the cell before's. A few steps in, the notebook is saved (as JupyterLab's autosave
does) and the page reloaded; the gate opens once the page is back, and the job goes on for 12.5 s after. The reloaded page must show the truth: the bg cell gets
its lines back (the ones printed while the page was away, from the kernel's copy of the cell's outputs) and keeps
getting new ones; the panel (and the status bar in JupyterLab) names the job by the cell's prompt with a step the
cell has printed; at the end the cell holds every line exactly once, its status view settled (each rank ``done``)
and the job's chart (``steps 0-79``), the panel and status bar say ``ready``. No console error. The round runs twice:
in the light theme, then in ``JupyterLab Dark`` (the same truths, and the settled chart dark, not a white card).
Shots of the bg cell after the reload (live) and settled go to ``$DDP_MAGIC_UI_OUT/bg-reloaded-*.png`` and, with
``DDP_MAGIC_UPDATE_DOCS_IMG=1``, to docs/img/ui/.
"""
from __future__ import annotations

import os
import re
from typing import Any, Dict, Iterator, List

import pytest
from ui_pages import front_page, is_dark, keep_shot, luminance, prompt_number, run_cell, set_theme, wait_prompt, wait_ready
from ui_probes import SAMPLE_JS
from ui_server import Server

pytestmark = [pytest.mark.slow, pytest.mark.browser]
pytest.importorskip("playwright.sync_api", reason="Python Playwright is in requirements-dev.txt")

STEPS, GATE_AT = 80, 30
BG = """%%ddp --bg --out job -n 2
import os, time, torch.distributed as dist, ddp_magic
rank = dist.get_rank()
for step in range({steps}):
    while step == {at} and os.path.exists({gate!r}):
        time.sleep(0.05)
    time.sleep(0.25)
    print(f"r{{rank}} step {{step}}", flush=True)
    ddp_magic.log(step=step, loss=1.0 / (step + 1) + 0.01 * rank)"""
FOREGROUND = "%%ddp -n 2\nimport ddp_magic\nfor step in range(5):\n    ddp_magic.log(step=step, x=float(step))"
BG_CELL = 2
PANEL_CHART_JS = """() => { const m = document.querySelector('.jp-ddp-Panel .jp-ddp-Metrics');
  const head = m ? m.querySelector('.jp-ddp-Metrics-head') : null;
  return m && head ? {cell: m.dataset.cell, final: m.dataset.final, head: head.textContent} : null; }"""
JOB_LINE = r"background: cell \[(\d+)\] running \d+:\d\d:\d\d, step ([\d,]+)"
ROUNDS = 2
DARK = 1  # the round that runs in JupyterLab Dark (the issue saw the reloaded cell lost in Lab, Notebook 7 and dark alike)

CELL_JS = """(i) => {
  const cell = document.querySelectorAll('.jp-Notebook .jp-CodeCell')[i];
  const outs = cell ? [...cell.querySelectorAll('.jp-OutputArea-output')] : [];
  return {
    text: outs.map(o => o.textContent).join('\\n'),
    ranks: cell ? Object.fromEntries([...cell.querySelectorAll('.ddp-status tr[data-rank][data-state]')].map(r => [r.dataset.rank, r.dataset.state])) : {},
    charts: cell ? [...cell.querySelectorAll('.jp-OutputArea-output > .ddp-metrics')].map(c => c.textContent.slice(0, 200)) : [],
    live: !!(cell && cell.querySelector('.ddp-status-live')),
    widgetError: !!(cell && /Error displaying widget/.test(cell.textContent)),
  };
}"""


def steps_shown(text: str, rank: int) -> List[int]:
    return [int(s) for s in re.findall(rf"\br{rank} step (\d+)\b", text)]


def shot(page: Any, kind: str, what: str) -> None:
    cell = page.locator(".jp-Notebook .jp-CodeCell").nth(BG_CELL)
    # live: the cell's top (its view, its first lines); settled: the job's chart at the end of its output
    keep_shot(page, cell if what == "live" else cell.locator(".jp-OutputArea-output > .ddp-metrics"), f"bg-reloaded-{what}-{kind}.png")


def one_round(page: Any, kind: str, first: bool, gate: str, dark: bool) -> Dict[str, Any]:
    rec: Dict[str, Any] = {}
    set_theme(page, dark)
    with open(gate, "w"):
        pass
    page.evaluate("([i, code]) => window.jupyterapp.shell.currentWidget.content.model.cells.get(i).sharedModel.setSource(code)",
                  [BG_CELL, BG.format(steps=STEPS, at=GATE_AT, gate=gate)])
    run_cell(page, 1)
    rec["foreground"] = prompt_number(wait_prompt(page, 1))
    run_cell(page, BG_CELL)
    rec["number"] = prompt_number(wait_prompt(page, BG_CELL))
    page.wait_for_function("(i) => /r1 step 3\\b/.test(document.querySelectorAll('.jp-Notebook .jp-CodeCell')[i].textContent)", arg=BG_CELL,
                           timeout=120_000)
    rec["panel_chart"] = []
    for _ in range(2):  # before the reload: the panel's chart is the job's, live
        page.wait_for_timeout(1500)
        rec["panel_chart"].append(page.evaluate(PANEL_CHART_JS))
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_timeout(1000)
    page.reload(timeout=60_000)
    wait_ready(page, page.ddp_watch)
    page.add_style_tag(content=".Toastify { display: none !important; }")
    page.wait_for_timeout(1000)
    os.unlink(gate)  # the job goes on: 50 steps of 0.25 s after the page is back
    rec["after_reload"] = page.evaluate(CELL_JS, BG_CELL)
    rec["dark_after_reload"] = is_dark(page)
    reads = []
    for _ in range(2):
        page.wait_for_timeout(2000)
        reads.append({"cell": page.evaluate(CELL_JS, BG_CELL), "sample": page.evaluate(SAMPLE_JS, BG_CELL), "panel_chart": page.evaluate(PANEL_CHART_JS)})
    rec["reads"] = reads
    if first:
        shot(page, kind, "live")
    page.wait_for_function("(i) => document.querySelectorAll('.jp-Notebook .jp-CodeCell')[i].querySelector('.jp-OutputArea-output > .ddp-metrics')",
                           arg=BG_CELL, timeout=120_000)
    page.wait_for_timeout(2500)  # the last lines, the settled view, the snapshot after the job
    rec["end"] = page.evaluate(CELL_JS, BG_CELL)
    rec["end_sample"] = page.evaluate(SAMPLE_JS, BG_CELL)
    rec["prompt_end"] = prompt_number(wait_prompt(page, BG_CELL))
    rec["panel_chart_end"] = page.evaluate(PANEL_CHART_JS)
    rec["dark_end"] = is_dark(page)
    chart = page.locator(".jp-Notebook .jp-CodeCell").nth(BG_CELL).locator(".jp-OutputArea-output > .ddp-metrics :is(img, svg)").first
    chart.scroll_into_view_if_needed()
    rec["chart_luminance"] = luminance(chart.screenshot())
    if first:
        shot(page, kind, "settled")
    return rec


@pytest.fixture(scope="module", params=["lab", "notebook"])
def story(request: Any, server: Server, browser: Any) -> Iterator[Dict[str, Any]]:
    kind = request.param
    if kind == "notebook":
        pytest.importorskip("notebook", reason="Notebook 7 (pip install notebook) is in requirements-dev.txt")
    cells = ["%load_ext ddp_magic", FOREGROUND, "%%ddp --bg: written by each round"]
    with front_page(server, browser, f"reload_{kind}.ipynb", cells, 900, panel=True, kind=kind, width=1300) as page:
        run_cell(page, 0)
        wait_prompt(page, 0)
        try:
            rounds = [one_round(page, kind, n == 0, os.path.join(server.nbdir, f"gate_{kind}_{n}"), n == DARK) for n in range(ROUNDS)]
        finally:
            set_theme(page, False)  # the theme is the server's setting: the next test's pages open light
        yield {"kind": kind, "rounds": rounds, "errors": page.ddp_watch.errors(), "orphans": page.ddp_watch.collect(),
               "stacks": page.ddp_watch.stacks}


@pytest.mark.parametrize("n", range(ROUNDS))
def test_the_reloaded_cell_keeps_getting_its_lines_and_the_panel_names_the_job(story: Dict[str, Any], n: int) -> None:
    rec = story["rounds"][n]
    first, second = rec["reads"]
    for r in (0, 1):
        a, b = steps_shown(first["cell"]["text"], r), steps_shown(second["cell"]["text"], r)
        assert a and b and max(b) > max(a), f"rank {r}'s lines keep coming after the reload: {a[-3:]} -> {b[-3:]}"
        assert a == list(range(len(a))), f"rank {r}: the lines printed while the page was away are back, in order, once: {a}"
    assert not second["cell"]["widgetError"]
    for read in rec["reads"]:
        s = read["sample"]
        m = re.search(JOB_LINE, s["summary"])
        assert m and int(m.group(1)) == rec["number"], f"the panel names the job's cell [{rec['number']}]: {s['summary']!r}"
        step = int(m.group(2).replace(",", ""))
        assert step <= max(steps_shown(read["cell"]["text"], 0) + steps_shown(read["cell"]["text"], 1)) + 8, (step, s["summary"])
        if story["kind"] == "lab":
            bar = re.match(r"^DDP 2×gloo · " + JOB_LINE + "$", s["statusBar"] or "")
            assert bar and int(bar.group(1)) == rec["number"], f"the status bar shows the job: {s['statusBar']!r}"


@pytest.mark.parametrize("n", range(ROUNDS))
def test_the_reloaded_cell_settles_as_without_the_reload(story: Dict[str, Any], n: int) -> None:
    rec = story["rounds"][n]
    end, sample = rec["end"], rec["end_sample"]
    for r in (0, 1):
        assert steps_shown(end["text"], r) == list(range(STEPS)), f"rank {r}: every line exactly once: {steps_shown(end['text'], r)}"
    assert len(end["charts"]) == 1 and f"steps 0-{STEPS - 1}" in end["charts"][0] and "loss from 2 ranks" in end["charts"][0], end["charts"]
    assert end["ranks"] == {"0": "done", "1": "done"}, f"the settled status view: {end['ranks']}"
    assert not end["live"] and not end["widgetError"]
    assert rec["prompt_end"] == rec["number"]
    assert "background:" not in sample["summary"], sample["summary"]
    if story["kind"] == "lab":
        assert (sample["statusBar"] or "").startswith("DDP 2×gloo · ready"), sample["statusBar"]


def panel_steps(chart: Dict[str, Any]) -> int:
    m = re.search(r", steps 0-(\d+)", chart["head"])
    assert m, chart
    return int(m.group(1))


@pytest.mark.parametrize("n", range(ROUNDS))
def test_the_panel_charts_the_job_while_it_logs(story: Dict[str, Any], n: int) -> None:
    rec = story["rounds"][n]
    live = rec["panel_chart"] + [read["panel_chart"] for read in rec["reads"]]
    for chart in live:
        assert chart and chart["cell"] == str(rec["number"]) and chart["final"] == "false", (
            f"the panel charts the job's cell [{rec['number']}] live, not cell [{rec['foreground']}]: {chart}")
        assert chart["head"].startswith(f"In[{rec['number']}]: loss from 2 ranks, steps 0-") and chart["head"].endswith("(live)"), chart
    before, after = [panel_steps(c) for c in rec["panel_chart"]], [panel_steps(r["panel_chart"]) for r in rec["reads"]]
    assert before[1] > before[0] and after[1] > after[0], f"its steps grow, before and after the reload: {before} {after}"
    for read in rec["reads"]:  # the steps it charts are steps the cell has printed (a second's lag at most)
        shown = max(steps_shown(read["cell"]["text"], 0) + steps_shown(read["cell"]["text"], 1))
        assert abs(panel_steps(read["panel_chart"]) - shown) <= 8, (read["panel_chart"], shown)
    end = rec["panel_chart_end"]
    assert end["cell"] == str(rec["number"]) and end["final"] == "true" and end["head"] == f"In[{rec['number']}]: loss from 2 ranks, steps 0-{STEPS - 1}"


@pytest.mark.parametrize("n", range(ROUNDS))
def test_the_round_ran_in_its_theme_and_the_settled_chart_is_in_it_too(story: Dict[str, Any], n: int) -> None:
    rec = story["rounds"][n]
    dark = n == DARK
    assert rec["dark_after_reload"] is dark and rec["dark_end"] is dark, "the theme survives the reload and the job's end"
    lum = rec["chart_luminance"]
    assert (lum < 0.3) if dark else (lum > 0.7), f"the settled chart's picture in the {'dark' if dark else 'light'} theme: luminance {lum:.2f}"


def test_no_console_error_and_nothing_said_outside_a_cell(story: Dict[str, Any]) -> None:
    assert not story["errors"], "\n".join(story["errors"][:10] + story["stacks"][:2])
    assert not story["orphans"], story["orphans"][:5]
