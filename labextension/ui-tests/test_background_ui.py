"""A background cell (``%%ddp --bg --out job``) in real JupyterLab and Notebook 7 (headless Chromium): issue 28.

The notebook: ``%load_ext ddp_magic``; a 2-rank background cell that trains ~100 steps with ``ddp_magic.log(step=…,
loss=…)`` and prints a line per rank at its start and end (``BG``); an ordinary cell that sleeps and prints
(``OTHER``). The bg cell returns at once; while the other cell runs (its prompt ``[*]``), the bg cell's live chart is
read twice, and the second read must have more points; the other cell completes with its own output; every line the
ranks print lands in the bg cell and none in the other. The DDP panel says ``background: cell [n] running …, step k``
(n: the bg cell's prompt) and so does the status bar in JupyterLab. Notebook 7 has no status bar (the item is not in
the page); its panel is the same right-sidebar widget, so the same words are asserted there. Each round runs twice,
the cells run again, as a user re-runs cells. VS Code cannot be driven here: labextension/README.md says what it
should show and that it is untested.
"""
from __future__ import annotations

import re
import time
from typing import Any, Dict, Iterator, List

import pytest
from ui_pages import front_page, prompt_number, run_cell, wait_prompt
from ui_probes import SAMPLE_JS
from ui_server import Server

pytestmark = [pytest.mark.slow, pytest.mark.browser]
playwright_api = pytest.importorskip("playwright.sync_api", reason="Python Playwright is in requirements-dev.txt")
expect = playwright_api.expect

BG = """%%ddp --bg --out job -n 2
import time, torch.distributed as dist, ddp_magic
rank = dist.get_rank()
print(f"bg start on rank {rank}", flush=True)
for step in range(100):
    time.sleep(0.2)
    ddp_magic.log(step=step, loss=1.0 / (step + 1) + 0.01 * rank)
print(f"bg end on rank {rank}", flush=True)"""
OTHER = """import time
time.sleep(4)
print("the other cell is done")"""
JOB_LINE = r"background: cell \[(\d+)\] running \d+:\d\d:\d\d, step ([\d,]+)"
ROUNDS = 2

# the bg cell's live chart (the status view's Metrics section) and its static one once the job ended
CHART_JS = """(index) => {
  const cell = document.querySelectorAll('.jp-Notebook .jp-CodeCell')[index];
  const lines = cell ? [...cell.querySelectorAll('.ddp-status .ddp-status-section[data-title="Metrics"] .ddp-metrics svg polyline')] : [];
  return {
    points: lines.map(l => (l.getAttribute('points') || '').trim().split(/\\s+/).filter(Boolean).length),
    live: !!(cell && cell.querySelector('.ddp-status-live')),
    final: cell ? cell.querySelectorAll('.jp-OutputArea-output > .ddp-metrics').length : 0,
    statusItem: !!document.querySelector('.jp-ddp-StatusItem'),
  };
}"""


class BgFront:
    """One front end's page on the background notebook (ui_pages.front_page)."""

    def __init__(self, kind: str, page: Any) -> None:
        self.kind = kind
        self.page = page

    def sample(self, index: int) -> Dict[str, Any]:
        return self.page.evaluate(SAMPLE_JS, index)

    def chart(self) -> Dict[str, Any]:
        return self.page.evaluate(CHART_JS, 1)

    def wait_prompt(self, index: int) -> Dict[str, Any]:
        """Until cell ``index`` has returned (a number in its prompt, no ``*``): what the page shows then."""
        wait_prompt(self.page, index)
        return self.sample(index)

    def open_live_chart(self) -> None:
        """The bg cell's live view, its body opened (▾) so that its Metrics section shows the chart."""
        cell = self.page.locator(".jp-Notebook .jp-CodeCell").nth(1)
        expect(cell.locator(".ddp-status-live")).to_be_visible(timeout=120_000)
        toggle = cell.locator(".ddp-status-live .widget-toggle-button:not(.mod-active)", has_text="▾")
        toggle.first.click()
        self.page.wait_for_function("(i) => { const c = document.querySelectorAll('.jp-Notebook .jp-CodeCell')[i];"
                                    " return c && c.querySelectorAll('.ddp-status-section[data-title=\"Metrics\"] svg polyline').length === 2; }",
                                    arg=1, timeout=120_000)

    def round(self) -> Dict[str, Any]:
        """Run the bg cell, then the other cell while the job trains; what the page showed then."""
        rec: Dict[str, Any] = {}
        run_cell(self.page, 1)
        rec["bg_returned"] = self.wait_prompt(1)
        self.open_live_chart()
        run_cell(self.page, 2)
        self.page.wait_for_function("() => /\\*/.test(document.querySelectorAll('.jp-Notebook .jp-CodeCell')[2].querySelector('.jp-InputPrompt').textContent)",
                                    timeout=30_000)
        reads: List[Dict[str, Any]] = []
        for _ in range(2):
            other = self.sample(2)
            reads.append({"chart": self.chart(), "other_running": other["running"], "bg": self.sample(1)})
            self.page.wait_for_timeout(1500)
        rec["reads"] = reads
        rec["other"] = self.wait_prompt(2)
        rec["bg_during_other"] = self.sample(1)
        t0 = time.monotonic()  # the job trains on, then ends: its static chart and its last lines arrive in its cell
        while time.monotonic() - t0 < 120 and not self.chart()["final"]:
            self.page.wait_for_timeout(500)
        self.page.wait_for_timeout(1500)  # the snapshot after the job
        rec["end_chart"] = self.chart()
        rec["bg_end"] = self.sample(1)
        rec["other_end"] = self.sample(2)
        return rec


@pytest.fixture(scope="module", params=["lab", "notebook"])
def story(request: Any, server: Server, browser: Any) -> Iterator[Dict[str, Any]]:
    if request.param == "notebook":
        pytest.importorskip("notebook", reason="Notebook 7 (pip install notebook) is in requirements-dev.txt")
    with front_page(server, browser, f"background_{request.param}.ipynb", ["%load_ext ddp_magic", BG, OTHER], 900, panel=True,
                    kind=request.param, width=1300) as page:
        front = BgFront(request.param, page)
        run_cell(page, 0)
        wait_prompt(page, 0)
        rounds = [front.round() for _ in range(ROUNDS)]
        yield {"kind": request.param, "rounds": rounds, "errors": page.ddp_watch.errors(), "orphans": page.ddp_watch.collect(),
               "stacks": page.ddp_watch.stacks}


@pytest.mark.parametrize("n", range(ROUNDS))
def test_the_bg_chart_grows_while_another_cell_runs(story: Dict[str, Any], n: int) -> None:
    reads = story["rounds"][n]["reads"]
    assert all(r["other_running"] for r in reads), f"both reads were taken while the other cell ran: {reads}"
    first, second = (r["chart"]["points"] for r in reads)
    assert len(first) == len(second) == 2, f"a line per rank in the bg cell's chart: {first} {second}"
    assert all(b > a for a, b in zip(first, second)), f"the chart grew between the two reads: {first} -> {second}"
    assert all(r["chart"]["live"] for r in reads), "the bg cell's view was live while the other cell ran"


@pytest.mark.parametrize("n", range(ROUNDS))
def test_each_cell_keeps_its_own_output(story: Dict[str, Any], n: int) -> None:
    rec = story["rounds"][n]
    assert re.match(r"^\s*\[\d+\]", rec["bg_returned"]["prompt"]), "the bg cell returned at once"
    assert rec["other"]["outputText"].strip() == "the other cell is done", rec["other"]["outputText"]
    assert "bg " not in rec["other_end"]["outputText"], f"no rank line in the other cell: {rec['other_end']['outputText']}"
    bg_text = rec["bg_end"]["outputText"]
    for rank in (0, 1):
        assert f"bg start on rank {rank}" in bg_text and f"bg end on rank {rank}" in bg_text, bg_text[:600]
    assert "the other cell is done" not in bg_text
    assert rec["end_chart"]["final"] == 1, f"the job's static chart is in the bg cell when it ends: {rec['end_chart']}"


@pytest.mark.parametrize("n", range(ROUNDS))
def test_the_panel_and_the_status_bar_show_the_job(story: Dict[str, Any], n: int) -> None:
    rec = story["rounds"][n]
    bg_cell = prompt_number(rec["bg_returned"]["prompt"])
    for read in rec["reads"]:
        s = read["bg"]
        assert s["panelShown"], f"the DDP panel is open in {story['kind']}"
        m = re.search(JOB_LINE, s["summary"])
        assert m and int(m.group(1)) == bg_cell, f"the panel names the bg cell [{bg_cell}]: {s['summary']!r}"
        if story["kind"] == "lab":
            bar = re.match(r"^DDP 2×gloo · " + JOB_LINE + "$", s["statusBar"] or "")
            assert bar and int(bar.group(1)) == bg_cell, f"the status bar shows the job: {s['statusBar']!r}"
        else:
            assert s["statusBar"] is None and not read["chart"]["statusItem"], "Notebook 7 has no status bar: no item"
    steps = [int(re.search(JOB_LINE, r["bg"]["summary"]).group(2).replace(",", "")) for r in rec["reads"]]  # type: ignore[union-attr]
    assert steps[1] > steps[0], f"the step the panel shows grows: {steps}"
    end = rec["bg_end"]
    assert "background:" not in end["summary"], f"the job ended: the panel says so ({end['summary']!r})"
    if story["kind"] == "lab":
        assert "background:" not in (end["statusBar"] or "") and (end["statusBar"] or "").startswith("DDP 2×gloo · ready"), end["statusBar"]


def test_no_console_error_and_nothing_said_outside_a_cell(story: Dict[str, Any]) -> None:
    assert not story["errors"], "\n".join(story["errors"][:10] + story["stacks"][:2])
    assert not story["orphans"], story["orphans"][:5]
