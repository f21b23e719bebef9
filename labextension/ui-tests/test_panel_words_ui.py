"""The DDP panel's Stacks view, rank states and Interrupt, whole and dated, in real JupyterLab and Notebook 7.

A 2-rank foreground cell where rank 1 waits in a function with a long name while rank 0 waits in ``all_reduce``: the
panel's Stacks, read while the cell runs, wraps its frames at the panel's edge (no line runs past it, where the old
view cut ``in all_reduce #1 (waited up to 9.`` with no visible scrollbar), under ``taken at HH:MM:SS (N s ago)``; once
the cell has ended it says the stacks are stale. Then a cell where rank 1 SIGKILLs itself: the panel's state of rank 1
is whole (``killed (SIGKILL)``; the old column cut it to ``killed (S…``) and its tooltip says it too; the next cell,
which starts rank 1 again alone, says ``rank 1 restarted in N ms``. Last, a cell queued behind a background job and
taken out by the panel's *Interrupt* says so (it said ``(Ctrl-C)``, a key nobody pressed).
"""
from __future__ import annotations

import base64
import os
import re
import tempfile
from typing import Any, Iterator

import pytest
from ui_pages import front_page, no_errors, run_cell, wait_prompt
from ui_server import Server

pytestmark = [pytest.mark.slow, pytest.mark.browser]
playwright_api = pytest.importorskip("playwright.sync_api", reason="Python Playwright is in requirements-dev.txt")
expect = playwright_api.expect

GATE = os.path.join(tempfile.gettempdir(), f"ddp_panel_words_gate_{os.getpid()}")
WAIT = f"""%%ddp -n 2
import os, time, torch, torch.distributed as dist
def rank_one_waits_here_in_a_function_whose_name_is_long_enough_to_reach_the_panels_edge():
    while os.path.exists({GATE!r}):
        time.sleep(0.05)
t = torch.ones(1)
if dist.get_rank() == 1:
    rank_one_waits_here_in_a_function_whose_name_is_long_enough_to_reach_the_panels_edge()
dist.all_reduce(t)
t.item()"""
HOLD = os.path.join(tempfile.gettempdir(), f"ddp_panel_words_hold_{os.getpid()}")
BG = f"%%ddp -n 2 --bg --out job\nimport os, time\nwhile os.path.exists({HOLD!r}):\n    time.sleep(0.05)"
QUEUED = "%%ddp -n 2\nprint('the queued cell ran')"
AGAIN = "%%ddp -n 2\n2"  # after KILL: rank 1 is started again alone
# rank 1 logs a step more than rank 0, the same loss on the steps both logged; rank 0 is the slower by 60 ms a step.
# The y axis runs 0.125…2.0: its middle, 1.0625, is a tie at 3 decimals ("1.062" as Python rounds, "1.063" as toFixed)
CHART = """%%ddp -n 2 --bg --out chart
import time, torch.distributed as dist, ddp_magic
rank = dist.get_rank()
for step in range(8 + rank):
    time.sleep(0.02 + 0.06 * (rank == 0))
    ddp_magic.log(step=step, loss=[2.0, 1.5, 1.0, 0.75, 0.5, 0.25, 0.2, 0.125, 1.0][step])"""
CHARTS_JS = """(i) => {
  const cell = document.querySelectorAll('.jp-Notebook .jp-CodeCell')[i];
  const mine = cell.querySelector('.jp-OutputArea-output > .ddp-metrics');
  const panel = document.querySelector('.jp-ddp-Panel .jp-ddp-Metrics');
  return {
    cell: mine ? {svgs: [...mine.querySelectorAll('img')].map(m => m.src), text: mine.innerText} : null,
    panel: panel && panel.querySelector('svg') ? {svgs: [...panel.querySelectorAll('svg')].map(v => v.outerHTML), text: panel.innerText} : null,
  };
}"""


def chart_of(seen: dict) -> dict:
    """What one chart draws: its polylines, its y labels (the numbers anchored at their end), its words."""
    (markup,) = [base64.b64decode(s.split(",", 1)[1]).decode() if s.startswith("data:") else s for s in seen["svgs"]]
    texts = re.findall(r"<text[^>]*text-anchor=[\"']end[\"'][^>]*>([^<]*)</text>", markup)
    return {"lines": markup.count("<polyline"), "yTicks": sorted(t for t in texts if re.fullmatch(r"-?[\d.]+", t)),
            "text": seen["text"] + " " + " ".join(re.findall(r">([^<]+)<", markup))}
KILL = "%%ddp -n 2\nimport os, signal, torch.distributed as dist\nif dist.get_rank() == 1:\n    os.kill(os.getpid(), signal.SIGKILL)\n1"
SHOTS = os.environ.get("DDP_MAGIC_SHOTS", "")
STACKS_JS = """() => { const n = document.querySelector('.jp-ddp-Panel-stacks'); const p = n && n.querySelector('.jp-ddp-Panel-stacksText');
  const s = n && n.querySelector('.jp-ddp-Panel-stacksStamp');
  return n ? {state: n.dataset.state || '', stale: n.dataset.stale || '', text: p.textContent, stamp: s ? s.textContent : '',
              scroll: p.scrollWidth, client: p.clientWidth} : null; }"""
STATE_JS = """(r) => { const td = document.querySelector(`.jp-ddp-Ranks tr.jp-ddp-Rank[data-rank='${r}'] td.jp-ddp-Rank-state`);
  return td ? {text: td.textContent, title: td.title, scroll: td.scrollWidth, client: td.clientWidth} : null; }"""


def shot(page: Any, name: str) -> None:
    if SHOTS:
        os.makedirs(SHOTS, exist_ok=True)
        page.locator(".jp-ddp-Panel").screenshot(path=os.path.join(SHOTS, f"{name}_{'notebook' if '/notebooks/' in page.url else 'lab'}.png"))


@pytest.fixture(scope="module", params=["lab", "notebook"])
def page(request: Any, server: Server, browser: Any) -> Iterator[Any]:
    kind = request.param
    if kind == "notebook":
        pytest.importorskip("notebook", reason="Notebook 7 (pip install notebook) is in requirements-dev.txt")
    cells = ["%load_ext ddp_magic", "%%ddp -n 2\n1", WAIT, KILL, AGAIN, BG, QUEUED, CHART]
    with front_page(server, browser, f"panel_words_{kind}.ipynb", cells, 900, panel=True, kind=kind) as pg:
        for i in (0, 1):  # the extension, then the pool (its stacks are read once it runs)
            run_cell(pg, i)
            wait_prompt(pg, i, 240)
        yield pg


def test_the_stacks_wrap_say_when_they_were_taken_and_go_stale(page: Any) -> None:
    open(GATE, "w").close()
    try:
        run_cell(page, 2)
        got = None
        for _ in range(240):  # until both ranks are where the cell puts them (the pool starts first)
            expect(page.locator(".jp-ddp-Panel-button-stacks")).to_be_enabled(timeout=120_000)
            page.click(".jp-ddp-Panel-button-stacks")
            page.wait_for_function("() => { const n = document.querySelector('.jp-ddp-Panel-stacks');"
                                   " return n && n.dataset.state && n.dataset.state !== 'asking'; }", timeout=60_000)
            got = page.evaluate(STACKS_JS)
            if "--- rank 1 ---" in got["text"] and " in all_reduce" in got["text"]:
                break
            page.wait_for_timeout(500)
        shot(page, "42_stacks_running")
        assert got and got["scroll"] <= got["client"] + 1, f"a frame runs past the panel's edge: {got and (got['scroll'], got['client'])}"
        assert re.fullmatch(r"taken at \d\d:\d\d:\d\d \(\d+ s ago\)", got["stamp"]), got["stamp"]
    finally:
        os.unlink(GATE)
    wait_prompt(page, 2, 180)
    page.wait_for_function("() => document.querySelector('.jp-ddp-Panel-stacks').dataset.stale === 'true'", timeout=30_000)
    got = page.evaluate(STACKS_JS)
    assert "stale" in got["stamp"] and "has ended" in got["stamp"], got["stamp"]
    shot(page, "42_stacks_stale")
    no_errors(page)


def test_a_killed_ranks_state_is_whole_and_in_its_tooltip(page: Any) -> None:
    run_cell(page, 3)
    wait_prompt(page, 3, 180)
    page.wait_for_function(f"() => {{ const s = ({STATE_JS})(1); return s && s.text.startsWith('killed'); }}", timeout=60_000)
    got = page.evaluate(STATE_JS, 1)
    shot(page, "42_killed_state")
    assert got["scroll"] <= got["client"] + 1, f"the state is cut: {got}"
    assert got["text"] in got["title"], got
    page.evaluate("() => window.jupyterapp.shell.currentWidget.content.model.sharedModel.getCell(2).setSource('1')")  # the page's kernel goes on
    no_errors(page)


def test_the_cell_after_one_rank_died_says_it_restarted_that_rank(page: Any) -> None:
    """After KILL, the next cell starts rank 1 again alone: its view says so with that rank's time, not the pool's
    first start (it said ``pool started in 1.59 s`` for a rank restarted in 42 ms)."""
    run_cell(page, 4)
    wait_prompt(page, 4, 180)
    said = str(page.evaluate("(i) => document.querySelectorAll('.jp-Notebook .jp-CodeCell')[i].querySelector('.jp-OutputArea').innerText", 4))
    assert re.search(r"rank 1 restarted in \d+ ms", said) and "pool started" not in said, said
    no_errors(page)


def test_a_queued_cell_taken_out_by_the_panels_interrupt_says_so(page: Any) -> None:
    open(HOLD, "w").close()
    try:
        run_cell(page, 5)  # the job holds the pool
        wait_prompt(page, 5, 180)
        run_cell(page, 6)  # waits behind it
        page.wait_for_function("() => document.querySelectorAll('.jp-Notebook .jp-CodeCell')[6].innerText.includes('queued')", timeout=60_000)
        page.click(".jp-ddp-Panel-button-interrupt")
        wait_prompt(page, 6, 60)
        said = str(page.evaluate("(i) => document.querySelectorAll('.jp-Notebook .jp-CodeCell')[i].querySelector('.jp-OutputArea').innerText", 6))
    finally:
        os.unlink(HOLD)
    assert "taken out of the queue by the DDP panel's Interrupt before it ran" in said and "(Ctrl-C) before" not in said, said
    page.wait_for_function("() => !document.querySelectorAll('.jp-Notebook .jp-CodeCell')[5].innerText.includes('running')", timeout=60_000)
    no_errors(page)


def test_the_cell_and_the_panel_draw_and_round_a_chart_alike(page: Any) -> None:
    """A job whose rank 1 logged a step more than rank 0, the same loss on the steps both logged: the cell's chart and
    the panel's each draw one line and say ``ranks 0-1 identical`` (rank 0's line was hidden under rank 1's, unlabelled);
    their y labels are the same (the panel rounded the tie 1.0625 up: ``1.063`` beside the cell's ``1.062``), and so is
    the slowest rank's lag (``+0.06 s`` in the cell beside ``+60 ms`` in the panel)."""
    run_cell(page, 7)
    wait_prompt(page, 7, 180)
    page.wait_for_function(f"() => {{ const g = ({CHARTS_JS})(7); return g.cell && g.panel; }}", timeout=120_000)
    got = page.evaluate(CHARTS_JS, 7)
    shot(page, "42_chart_identical")
    cell, panel = chart_of(got["cell"]), chart_of(got["panel"])
    for where, seen in (("cell", cell), ("panel", panel)):
        assert seen["lines"] == 1 and "ranks 0-1 identical" in seen["text"], (where, seen)
    assert cell["yTicks"] == panel["yTicks"] == ["0.125", "1.062", "2.000", "8"], (cell["yTicks"], panel["yTicks"])  # "8": the last step
    lag = [re.search(r"rank 0 \(\+[^)]+\)", seen["text"]) for seen in (cell, panel)]
    assert all(lag) and lag[0].group(0) == lag[1].group(0), (lag, cell["text"], panel["text"])  # type: ignore[union-attr]
    no_errors(page)
