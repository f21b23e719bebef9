"""A Slurm pool's start clock in real JupyterLab (headless Chromium) on the one-host Slurm (tests/slurm/): the status
bar's clock runs on from the queue wait into the start, never back, and is the cell's.

The issue saw the bar go ``starting 23.92 s`` -> ``starting 3.62 s`` while the cell said ``start 24.2 s``: the bar
counted from the allocation, the cell from the pool's start. Here a job of our own holds both nodes for a few seconds,
so the cell's job waits in the queue, then starts. About 10 times a second the status bar and the cell's status view
are read in one go in the page, from the cell's run until it has returned:

- the bar's clock (``starting X`` while salloc asks, ``waited X`` while the job is queued, ``starting X`` after) never
  goes back, so its ``starting`` after the queue is at least its last ``waited``: the wait counts, as in the cell's
  ``start``;
- read at the same moment, the bar's ``starting X`` and the cell's ``start X`` agree within a second (a snapshot's
  throttle on a loaded machine);
- the cell's own clock never goes back either.

JupyterLab only: Notebook 7 has no status bar. Each round stops the pool first (``%ddp stop``), so each start queues;
two rounds. Run it under the Slurm lock (``flock /tmp/ddp_slurm.lock``): the one-host Slurm is shared.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from typing import Any, Dict, Iterator, List, Optional

import pytest
from ui_pages import front_page, prompt_number, run_cell, wait_prompt
from ui_server import ROOT, SECONDS, Server

sys.path.append(os.path.join(ROOT, "tests", "slurm"))
import slurm_fixtures  # noqa: E402  (the one-host Slurm's fixtures, shared with tests/slurm)

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.slurm, pytest.mark.timeout(900)]
pytest.importorskip("playwright.sync_api", reason="Python Playwright is in requirements-dev.txt")
slurm_cluster = slurm_fixtures.slurm_cluster  # the fixtures, by name in this module

CELL = "%%ddp --slurm --nodes 2 --ntasks-per-node 1\nimport torch.distributed as dist\ndist.get_rank()"
CELLS = ["%load_ext ddp_magic", "%ddp stop", CELL]
HOLD_S = 8  # how long our own job holds both nodes: the cell's job waits in the queue for the rest of it
ROUNDS = 2
PROBE_JS = """() => {
  const cell = document.querySelectorAll('.jp-Notebook .jp-CodeCell')[2];
  const view = cell ? cell.querySelector('.ddp-status') : null;
  const sb = document.querySelector('.jp-ddp-StatusItem');
  return {t: Date.now() / 1000, bar: sb ? sb.textContent : '', view: view ? view.innerText : '',
          prompt: cell ? cell.querySelector('.jp-InputPrompt').textContent : ''};
}"""


def seconds(text: str) -> float:
    n, unit = re.match(r"(<1|[\d.]+) (ms|s)", text).groups()  # type: ignore[union-attr]
    return 0.0 if n == "<1" else float(n) / (1000 if unit == "ms" else 1)


def bar_clock(bar: str) -> Optional[tuple]:
    """('queued'|'starting', seconds) of a status bar that shows the pool's start; None otherwise."""
    m = re.search(r"· waited (" + SECONDS + r")$", bar) or re.search(r"· starting (" + SECONDS + r")$", bar)
    return ("queued" if "waited" in m.group(0) else "starting", seconds(m.group(1))) if m else None


def cell_clock(view: str) -> Optional[tuple]:
    """('queued'|'starting', seconds) of the cell's status view while the pool starts; None otherwise."""
    m = re.search(r"queued: job \d+ [^\n]*waited (" + SECONDS + r")", view)
    if m:
        return ("queued", seconds(m.group(1)))
    m = re.search(r"\bstart (\d+\.\d) s\b", view)
    return ("starting", float(m.group(1))) if m else None


def hold_nodes() -> str:
    """A job of our own on both nodes for HOLD_S seconds (running when this returns); its id."""
    job = subprocess.run(["sbatch", "--parsable", "--job-name=ui-hold", "--output=/dev/null", "-N2", "--exclusive", "--wrap", f"sleep {HOLD_S}"],
                         capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=20).stdout.strip()
        if state == "RUNNING":
            return job
        time.sleep(0.2)
    subprocess.run(["scancel", job], capture_output=True, timeout=20)
    raise AssertionError(f"our holding job {job} did not start within 30 s")


def one_round(page: Any) -> Dict[str, Any]:
    run_cell(page, 1)
    wait_prompt(page, 1, 120)
    holder = hold_nodes()
    try:
        run_cell(page, 2)
        probes: List[Dict[str, Any]] = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < 240:
            probes.append(page.evaluate(PROBE_JS))
            if re.match(r"^\s*\[\d+\]", probes[-1]["prompt"]):
                break
            page.wait_for_timeout(100)
        prompt_number(wait_prompt(page, 2, 10))
    finally:
        subprocess.run(["scancel", holder], capture_output=True, timeout=20)
    return {"probes": probes}


@pytest.fixture(scope="module")
def story(server: Server, browser: Any, slurm_cluster: str) -> Iterator[Dict[str, Any]]:
    slurm_fixtures.cancel_our_jobs()  # an earlier test's leftover: that test already failed for it
    with front_page(server, browser, "slurm_start_lab.ipynb", CELLS, 900, panel=True, kind="lab", width=1300) as page:
        run_cell(page, 0)
        wait_prompt(page, 0)
        try:
            rounds = [one_round(page) for _ in range(ROUNDS)]
        finally:
            run_cell(page, 1)  # %ddp stop: the allocation goes back to Slurm
            wait_prompt(page, 1, 120)
        left = slurm_fixtures.wait_no_jobs()
        slurm_fixtures.cancel_our_jobs()
        yield {"rounds": rounds, "errors": page.ddp_watch.errors(), "left": left}


@pytest.mark.parametrize("n", range(ROUNDS))
def test_the_bar_s_start_clock_runs_on_from_the_queue_and_is_the_cell_s(story: Dict[str, Any], n: int) -> None:
    rec = story["rounds"][n]
    probes = rec["probes"]
    bar = [(p["t"], c) for p in probes for c in [bar_clock(p["bar"])] if c]
    phases = [ph for _, (ph, _) in bar]
    assert "queued" in phases and "starting" in phases, f"the bar showed the queue and the start: {[p['bar'] for p in probes][::10]}"
    last_queued = max(i for i, ph in enumerate(phases) if ph == "queued")  # starting (salloc asked), queued, starting
    assert "starting" in phases[last_queued:], f"the start after the queue: {phases}"
    clock = [s for _, (_, s) in bar]
    assert clock == sorted(clock), f"the bar's start clock went back: {[(ph, s) for _, (ph, s) in bar]}"
    waited = max(s for _, (ph, s) in bar if ph == "queued")
    assert waited >= 1.0, f"the job waited in the queue while ours held the nodes: waited {waited} s"
    cell = [c for p in probes for c in [cell_clock(p["view"])] if c]
    assert [s for _, s in cell] == sorted(s for _, s in cell), f"the cell's start clock went back: {cell}"
    together = [(i, b, c) for i, p in enumerate(probes) for b, c in [(bar_clock(p["bar"]), cell_clock(p["view"]))]
                if b and c and b[0] == c[0] == "starting"]
    queued_at = max(i for i, p in enumerate(probes) if (bar_clock(p["bar"]) or ("",))[0] == "queued")
    after = [(b, c) for i, b, c in together if i > queued_at]
    assert len(after) >= 3, f"the bar and the cell both showed the start after the queue: {[(p['bar'], p['view'][:80]) for p in probes][::10]}"
    for _, b, c in together:  # one clock: the same start time, read at the same moment
        assert abs(b[1] - c[1]) <= 1.0, f"bar starting {b[1]} s, cell start {c[1]} s"
    for _, c in after:
        assert c[1] >= waited - 1.0, f"the cell's start counts the queue wait too: start {c[1]} s after waiting {waited} s"


def test_no_console_error_and_no_job_left(story: Dict[str, Any]) -> None:
    assert not story["errors"], "\n".join(story["errors"][:10])
    assert story["left"] == [], f"%ddp stop released the allocation: jobs left in squeue: {story['left']}"
