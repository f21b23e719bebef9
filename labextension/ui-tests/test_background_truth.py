"""A background job stays true on screen, in real JupyterLab and Notebook 7 (headless Chromium): what the status bar,
the DDP panel and the cell say of it is what the kernel knows.

The notebook: ``%load_ext ddp_magic``; ``%ddp stop`` (each round starts its own pool); a 2-rank background cell that
logs a step every 50 ms while a gate file exists (the test removes it to let the job end); a foreground ``%%ddp``
cell run while the job holds the pool (it waits in the queue); ``job.cancel()``; a cell that prints ``repr(job)`` and
``job.elapsed``. Each round, twice:

- the pool's first start: the status bar's ``starting …`` (JupyterLab) and the cell's ``start …`` are one clock, that
  never goes back, never stands still for a second, and agree within the snapshot's throttle;
- while the job runs: the panel's Restart is disabled and its tooltip says which job holds the pool (no dialog);
- the queued cell: the status bar names it while it waits; once it ran, no "queued behind" notice is left in the panel;
- ``job.cancel()``: the cell, the panel's last cell and ``repr(job)`` read ``cancelled by job.cancel(): ranks 0-1
  stopped at step N; state kept``, N the last step the ranks logged (``job.metrics``);
- the job's run time: the cell's final ``✓ X`` is ``job.elapsed`` (seconds on the ranks), and the bar's clock was the
  cell's, not the pool's start added to it.

After both rounds the notebook is opened again (a new page on the same kernel): the panel and the status bar say the
pool is ready, and no "queued behind" notice of the cell that ran long ago comes back with them.
"""
from __future__ import annotations

import os
import re
import tempfile
import time
from typing import Any, Dict, Iterator, List

import pytest
from ui_pages import front_page, open_notebook, prompt_number, run_cell, shrink, wait_prompt
from ui_server import OUT, ROOT, Server

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.timeout(1800)]
playwright_api = pytest.importorskip("playwright.sync_api", reason="Python Playwright is in requirements-dev.txt")

GATE = os.path.join(tempfile.gettempdir(), f"ddp-ui-gate-{os.getpid()}")
BG = f"""%%ddp --bg --out job -n 2
import os, time, ddp_magic
step = 0
while os.path.exists({GATE!r}) and step < 4000:
    time.sleep(0.05)
    step += 1
    ddp_magic.log(step=step, x=1.0)
print('bg end', step, flush=True)"""
QUEUED = "%%ddp\nprint('queued ran')"
TELL = "print(repr(job)); print(job.elapsed); print(max(job.metrics['step']))"
CELLS = ["%load_ext ddp_magic", "%ddp stop", BG, QUEUED, "job.cancel()", TELL]
ROUNDS = 2
SECONDS_RE = r"(<1 ms|\d+ ms|\d+\.\d+ s)"

PROBE_JS = """(i) => {
  const q = s => document.querySelector(s);
  const cell = document.querySelectorAll('.jp-Notebook .jp-CodeCell')[i];
  const view = cell ? cell.querySelector('.ddp-status') : null;
  const sb = q('.jp-ddp-StatusItem');
  const btn = q('.jp-ddp-Panel-button-restart');
  return {
    t: Date.now() / 1000,
    bar: sb ? (sb.offsetParent ? sb.textContent : '') : null,
    summary: q('.jp-ddp-Panel-summary') ? q('.jp-ddp-Panel-summary').textContent : '',
    lastCell: q('.jp-ddp-Panel-lastCell') ? q('.jp-ddp-Panel-lastCell').textContent : '',
    notices: [...document.querySelectorAll('.jp-ddp-Panel-notice')].map(n => n.textContent),
    facts: q('.jp-ddp-Panel-facts') ? q('.jp-ddp-Panel-facts').textContent : '',
    viewText: view ? (view.innerText.split('\\n').find(l => /\\d+ ranks? /.test(l)) || '') : '',
    outputText: cell ? [...cell.querySelectorAll('.jp-OutputArea-output')].map(o => o.innerText).join('\\n') : '',
    restartDisabled: btn ? btn.disabled : null,
    restartTitle: btn ? btn.title : '',
    dialogs: document.querySelectorAll('.jp-Dialog').length,
  };
}"""


def seconds(text: str) -> float:
    n, unit = re.match(r"(<1|[\d.]+) (ms|s)", text).groups()  # type: ignore[union-attr]
    return 0.0 if n == "<1" else float(n) / (1000 if unit == "ms" else 1)


DOCS_IMG = os.path.join(ROOT, "docs", "img", "ui")


class Story:
    """One front end's page on the notebook, and what it showed at each step."""

    def __init__(self, kind: str, page: Any) -> None:
        self.kind, self.page = kind, page
        self.shots = True  # the first round's states, to $DDP_MAGIC_UI_OUT (and docs/img/ui with DDP_MAGIC_UPDATE_DOCS_IMG=1)

    def shoot(self, state: str) -> None:
        if not self.shots:
            return
        os.makedirs(OUT, exist_ok=True)
        name = f"{self.kind}-bg-{state}-light.png"
        path = os.path.join(OUT, name)
        self.page.screenshot(path=path)
        if os.environ.get("DDP_MAGIC_UPDATE_DOCS_IMG") == "1":
            self.page.screenshot(path=os.path.join(DOCS_IMG, name))
            shrink(os.path.join(DOCS_IMG, name))

    def probe(self, index: int) -> Dict[str, Any]:
        return self.page.evaluate(PROBE_JS, index)

    def until(self, index: int, pred: Any, timeout: float = 120.0, every: float = 0.1) -> List[Dict[str, Any]]:
        """Probe cell ``index`` until ``pred`` holds of a probe; every probe taken, the last one satisfying it."""
        seen: List[Dict[str, Any]] = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            seen.append(self.probe(index))
            if pred(seen[-1]):
                return seen
            self.page.wait_for_timeout(int(every * 1000))
        raise AssertionError(f"{self.kind}: waited {timeout} s; last probe: {seen[-1] if seen else None}")

    def run(self, index: int) -> None:
        run_cell(self.page, index)

    def round(self) -> Dict[str, Any]:
        rec: Dict[str, Any] = {}
        self.run(1)
        wait_prompt(self.page, 1)
        open(GATE, "w").close()
        self.run(2)
        starting = self.until(2, lambda p: re.search(r"start [1-9]\d*\.\d s", p["viewText"]) is not None or "running" in p["viewText"], 180, 0.1)
        self.shoot("starting")
        rec["start"] = starting + self.until(2, lambda p: "running" in p["viewText"] and "step" in (p["bar"] or p["summary"]), 180, 0.1)
        rec["bg_prompt"] = prompt_number(wait_prompt(self.page, 2))
        rec["holding"] = self.probe(2)
        self.page.evaluate("() => window.jupyterapp.commands.execute('ddp-magic:restart-pool')")  # refused before any dialog
        self.page.wait_for_timeout(800)
        rec["after_restart"] = self.probe(2)
        self.page.locator(".jp-ddp-Panel-button-restart").hover(force=True)
        self.page.wait_for_timeout(300)
        self.shoot("running-restart-refused")
        self.run(3)  # waits in the queue behind the job
        rec["queued"] = self.until(3, lambda p: any("queued behind" in n for n in p["notices"]) and "queued" in (p["bar"] or p["summary"]), 60)[-1]
        self.shoot("queued")
        os.unlink(GATE)
        wait_prompt(self.page, 3)
        rec["queued_ran"] = self.until(3, lambda p: "queued ran" in p["outputText"] and "background:" not in p["summary"], 60)[-1]
        rec["queued_prompt"] = prompt_number(wait_prompt(self.page, 3))
        self.shoot("queued-ran")
        rec["bg_done"] = self.until(2, lambda p: "bg end" in p["outputText"] and "✓" in p["viewText"], 60)[-1]
        self.run(5)
        wait_prompt(self.page, 5)
        rec["told_done"] = self.probe(5)["outputText"]
        self.shoot("done")
        open(GATE, "w").close()  # a second job, cancelled mid-run
        self.run(2)
        self.until(2, lambda p: re.search(r"step (\d{2,})", p["bar"] or p["summary"]) is not None, 120)
        rec["cancel_prompt"] = prompt_number(wait_prompt(self.page, 2))
        self.run(4)
        wait_prompt(self.page, 4)
        rec["cancelled"] = self.until(  # the widget's line comes first; the traceback (JobCancelled: ...) a moment later
            2, lambda p: "JobCancelled: cancelled by job.cancel()" in p["outputText"] and "cancelled" in p["lastCell"], 60)[-1]
        self.run(5)
        wait_prompt(self.page, 5)
        rec["told_cancel"] = self.probe(5)["outputText"]
        self.shoot("cancelled")
        self.shots = False
        if os.path.exists(GATE):
            os.unlink(GATE)
        return rec


    def reopen(self, server: Server, name: str) -> Dict[str, Any]:
        """The notebook opened again on its kernel (the page loaded anew), its panel shown; what it says once settled."""
        open_notebook(self.page, self.page.ddp_watch, server, self.kind, name)
        if self.kind == "lab":
            self.page.evaluate("() => { const s = window.jupyterapp.shell; if (!s.leftCollapsed) { s.collapseLeft(); } }")
        self.page.evaluate("() => window.jupyterapp.commands.execute('ddp-magic:show-panel')")
        self.page.add_style_tag(content=".Toastify { display: none !important; }")
        self.until(3, lambda p: " ready" in p["summary"], 60)
        self.page.wait_for_timeout(2000)  # whatever else the kernel sends a page that comes back (pool, chart, notices)
        return self.probe(3)


@pytest.fixture(scope="module", params=["lab", "notebook"])
def story(request: Any, server: Server, browser: Any) -> Iterator[Dict[str, Any]]:
    if request.param == "notebook":
        pytest.importorskip("notebook", reason="Notebook 7 (pip install notebook) is in requirements-dev.txt")
    with front_page(server, browser, f"bg_truth_{request.param}.ipynb", CELLS, 1000, panel=True, kind=request.param, width=1400) as page:
        s = Story(request.param, page)
        s.run(0)
        wait_prompt(page, 0)
        try:
            rounds = [s.round() for _ in range(ROUNDS)]
        finally:
            if os.path.exists(GATE):
                os.unlink(GATE)
        reopened = s.reopen(server, f"bg_truth_{request.param}.ipynb")
        yield {"kind": request.param, "rounds": rounds, "reopened": reopened, "errors": page.ddp_watch.errors()}


@pytest.mark.parametrize("n", range(ROUNDS))
def test_the_start_clock_is_one_clock_that_never_goes_back_or_stands_still(story: Dict[str, Any], n: int) -> None:
    probes = story["rounds"][n]["start"]
    cell = [(p["t"], float(m.group(1))) for p in probes for m in [re.search(r"start (\d+\.\d) s", p["viewText"])] if m]
    assert len(cell) >= 3, f"the cell showed its start clock: {[p['viewText'] for p in probes][:5]}"
    assert [c for _, c in cell] == sorted(c for _, c in cell), f"the cell's start clock went back: {cell}"
    if story["kind"] != "lab":
        assert all(p["bar"] is None for p in probes), "Notebook 7 has no status bar"
        return
    bar = [(p["t"], seconds(m.group(1)), p) for p in probes for m in [re.search(r"· starting " + SECONDS_RE + "$", p["bar"] or "")] if m]
    assert len(bar) >= 3, f"the status bar showed the start: {[p['bar'] for p in probes][:8]}"
    assert [b for _, b, _ in bar] == sorted(b for _, b, _ in bar), f"the bar's start clock went back: {[b for _, b, _ in bar]}"
    for (t0, b0, _), (t1, b1, _) in zip(bar, bar[1:]):
        if t1 - t0 >= 0.8:
            assert b1 > b0, f"the bar's clock stood still for {t1 - t0:.1f} s at {b0} s"
    for _, b, p in bar:  # one clock: the bar and the cell, read at the same moment, say the same start time (within what
        m = re.search(r"start (\d+\.\d) s", p["viewText"])  # a widget update and a snapshot take to arrive on a busy machine)
        if m:
            assert abs(b - float(m.group(1))) <= 1.0, f"bar starting {b} s, cell start {m.group(1)} s"


@pytest.mark.parametrize("n", range(ROUNDS))
def test_restart_says_which_job_holds_the_pool_before_asking_anything(story: Dict[str, Any], n: int) -> None:
    rec = story["rounds"][n]
    for p in (rec["holding"], rec["after_restart"]):
        assert p["restartDisabled"] is True, p
        assert f"cell [{rec['bg_prompt']}] holds the pool (background job): job.cancel() or %ddp wait first" in p["restartTitle"], p["restartTitle"]
    assert rec["after_restart"]["dialogs"] == 0, "no dialog: a restart that the kernel would refuse is not offered"
    assert re.search(rf"background: cell \[{rec['bg_prompt']}\] running \d+:\d\d:\d\d, step \d+", rec["holding"]["summary"]), rec["holding"]


@pytest.mark.parametrize("n", range(ROUNDS))
def test_a_queued_cell_is_on_the_status_bar_while_it_waits_and_its_notice_goes_when_it_ran(story: Dict[str, Any], n: int) -> None:
    rec = story["rounds"][n]
    q = rec["queued"]
    if story["kind"] == "lab":
        assert re.search(rf"background: cell \[{rec['bg_prompt']}\] running .* · cell \[\d+\] queued$", q["bar"] or ""), q["bar"]
    assert any(f"queued behind cell [{rec['bg_prompt']}]" in x for x in q["notices"]), q["notices"]
    done = rec["queued_ran"]
    assert not [x for x in done["notices"] if "queued behind" in x], f"a stale queue notice: {done['notices']}"
    assert "queued" not in (done["bar"] or "") and "queued" not in done["summary"], done


@pytest.mark.parametrize("n", range(ROUNDS))
def test_the_job_s_run_time_is_its_seconds_on_the_ranks_in_every_view(story: Dict[str, Any], n: int) -> None:
    rec = story["rounds"][n]
    lines = rec["told_done"].strip().splitlines()
    elapsed = float(lines[1])  # what the kernel knows: job.elapsed
    m = re.search(r"2 ranks ✓ " + SECONDS_RE, rec["bg_done"]["viewText"])
    assert m and abs(seconds(m.group(1)) - elapsed) < 0.01, (rec["bg_done"]["viewText"], elapsed)
    clock = int(elapsed)
    assert lines[0] == f"<Job cell [{rec['bg_prompt']}]: done after {clock // 3600}:{clock // 60 % 60:02d}:{clock % 60:02d}, step {int(lines[2]):,}>", lines


@pytest.mark.parametrize("n", range(ROUNDS))
def test_a_cancel_reads_cancelled_by_job_cancel_in_the_cell_the_panel_and_the_repr(story: Dict[str, Any], n: int) -> None:
    rec = story["rounds"][n]
    told = rec["told_cancel"].strip().splitlines()
    text = f"cancelled by job.cancel(): ranks 0-1 stopped at step {int(told[2]):,}; state kept"
    p = rec["cancelled"]
    assert text in p["outputText"] and "Ctrl-C" not in p["outputText"] and "rank 0 was interrupted" not in p["outputText"], p["outputText"][-800:]
    assert p["lastCell"].endswith(text), p["lastCell"]
    assert p["summary"].endswith(f"ready · In[{rec['cancel_prompt']}]: cancelled"), p["summary"]  # not "interrupted"
    assert "JobCancelled: " + text in p["outputText"], p["outputText"][-400:]
    assert told[0].startswith(f"<Job cell [{rec['cancel_prompt']}]: {text} ("), told


def test_the_reopened_notebook_has_no_stale_queue_notice(story: Dict[str, Any]) -> None:
    p = story["reopened"]
    assert not [x for x in p["notices"] if "queued behind" in x], f"a stale queue notice after reopening: {p['notices']}"
    assert "queued" not in p["summary"] and "queued" not in (p["bar"] or ""), p
    last = story["rounds"][-1]["cancel_prompt"]  # the last %%ddp cell: the job cancelled in the last round
    assert p["summary"].endswith(f"ready · In[{last}]: cancelled"), f"the pool as the kernel left it: {p['summary']!r}"
    if story["kind"] == "lab":
        assert (p["bar"] or "").startswith("DDP 2×gloo · ready"), p["bar"]


def test_no_console_error(story: Dict[str, Any]) -> None:
    assert not story["errors"], "\n".join(story["errors"][:10])
