"""The browser story: what a person sees in JupyterLab and in Notebook 7, in every state of a cell, is true.

One story per frontend, on the session's one server (ui_fixtures.py), recorded once (``story``) and checked by the
tests below it. The notebook: ``%load_ext ddp_magic`` and a 4-rank cell (``CELL``) that starts the pool, prints,
runs a tqdm loop logging ``samples_per_s=15900`` (and an ``lr`` of 0.0002628 up) with ddp_magic.log, and fails
on rank 1 while the others wait in ``all_reduce`` (a failure the pool recovers from):

1. light theme, a fresh kernel, Run All; the live view's ▾ is clicked while the cell runs;
2. the page is reloaded (the panel must come back by itself, with the kernel's chart);
3. a cell with ``--timeout 2`` whose rank 1 sleeps while rank 0 waits in ``dist.barrier()`` (``HANG``);
4. the palette's *Show %ddp_env* and *Restart DDP Pool*: their toasts (the restart clears the old pool's chart);
5. the 4-rank cell again (the second run of a cell), which must clear the restart's message from the panel;
6. dark theme, Restart Kernel and Run All: both cells again, followed from the kernel's first moment.

At every sample (about 3 a second) the status bar, the panel and the cell's view are read in one go in the page. What
is checked is what a person would say: which rank is named (rank 1, also when rank 0 is the one left waiting), which
number is shown for a known input (15900 reads 15.9k), which cell (the prompt number), that no text is cut or broken
inside a word, that the console holds no error and the kernel said nothing outside a cell ("No such comm").
Screenshots of each state (starting, running, failed, reloaded, timeout; untrusted) in both themes go to
``docs/img/ui/`` with DDP_MAGIC_UPDATE_DOCS_IMG=1 (small palette PNGs). A shipped notebook, opened untrusted (the
server's trust database is new), must render its saved status view with its colours.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any, Dict, Iterator, List, Optional

import pytest
from ui_probes import CONTRAST_JS, LAYOUT_JS, NO_POOL_JS
from ui_server import ROOT, Server
from views_front import Front, coarse, disagreement, panel_states, prompt_number

pytestmark = [pytest.mark.slow, pytest.mark.browser]
playwright_api = pytest.importorskip("playwright.sync_api", reason="Python Playwright is in requirements-dev.txt")

CELL = """%%ddp -n 4
import time, torch, torch.distributed as dist, ddp_magic
from tqdm.auto import tqdm
rank = dist.get_rank()
print(f"hello from rank {rank}", flush=True)
for step in tqdm(range(12), desc=f"rank {rank}"):
    time.sleep(0.25)
    ddp_magic.log(step=step, samples_per_s=15900.0, loss=1.0 / (step + 1), lr=0.0002628 * (1 + step / 100))
if rank == 1:
    raise ValueError("bad shard on rank 1")
dist.all_reduce(torch.ones(1))"""
HANG = """%%ddp --timeout 2
import time, torch.distributed as dist
if dist.get_rank() == 1:
    time.sleep(60)
dist.barrier()"""
LOGGED = "15.9k"  # samples_per_s=15900.0 as every view must write it (never "1.59k")
SHIPPED = "01_quickstart.ipynb"
AGREE_WITHIN_S = 1.5  # snapshots are throttled to 4 a second, the cell's view to its own pace: they may differ this long

# ---------------------------------------------------------------- the story, once per frontend
@pytest.fixture(scope="module", params=["lab", "notebook"])
def story(request: Any, server: Server, browser: Any) -> Iterator[Dict[str, Any]]:
    kind = request.param
    if kind == "notebook":
        pytest.importorskip("notebook", reason="Notebook 7 (pip install notebook) is in requirements-dev.txt")
    front = Front(kind, server, browser, CELL)
    rec: Dict[str, Any] = {"front": front}
    try:
        front.open(front.notebook)
        front.theme(dark=False)
        rec["no_pool"] = front.page.evaluate(NO_POOL_JS)
        rec["light"] = front.follow(1, lambda: front.command("notebook:run-all-cells"), "light", "failed")
        rec["outputs"] = front.saved_outputs()
        rec["layout"] = front.page.evaluate(LAYOUT_JS)
        front.reload()
        rec["reloaded"] = front.sample()
        front.record("light", "reloaded", rec["reloaded"])
        rec["hang"] = front.follow(2, lambda: front.append_and_run(HANG), "light", "timeout")
        rec["env_toast"] = front.toast_after("ddp-magic:show-env", r"%ddp_env")
        front.page.keyboard.press("Escape")
        rec["restart_toast"] = front.toast_after("ddp-magic:restart-pool", r"ready in|restart failed")
        rec["after_restart"] = front.sample()
        rec["again"] = front.follow(1, lambda: front.run_cell(1), None, "failed")
        front.theme(dark=True)
        front.page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()")
        front.wait_kernel_idle()
        rec["after_kernel_restart"] = front.sample()
        rec["dark"] = front.follow(1, lambda: front.command("notebook:run-all-cells"), "dark", "failed")
        rec["hang_dark"] = front.follow(2, lambda: front.run_cell(2), "dark", "timeout")  # Run All stopped at cell 1's error
        front.theme(dark=False)
        rec["errors"] = front.watch.errors()
        rec["orphans"] = front.watch.collect()
        yield rec
    finally:
        front.close()


# ---------------------------------------------------------------- the checks
MAIN_RUNS = ["light", "again", "dark"]  # the 4-rank cell that logs, and fails on rank 1
HANG_RUNS = ["hang", "hang_dark"]  # the cell whose rank 1 never arrives


def _ended(samples: List[Dict[str, Any]]) -> Dict[str, Any]:
    end = samples[-1]
    assert not end["running"] and re.match(r"^\s*\[\d+\]", end["prompt"]), f"the cell never ended: {end['prompt']!r}"
    return end


def _blamed(end: Dict[str, Any]) -> Dict[str, Any]:
    """Which ranks each view names as failed once the cell has ended."""
    return {
        "cell": {int(r) for r, s in end["cellRanks"].items() if coarse(s) == "failed"},
        "panel": {int(r) for r, (label, css, last, _) in end["panelRanks"].items() if last == "root" or css == "bad"},
        "panel_notes": {int(r): note for r, (_, _, _, note) in end["panelRanks"].items() if note},
    }


@pytest.mark.parametrize("run", MAIN_RUNS + HANG_RUNS)
def test_status_bar_panel_and_cell_view_agree_at_every_moment(story: Dict[str, Any], run: str) -> None:
    samples = story[run]
    assert any(s["cellRanks"] for s in samples), "the cell never showed its status view"
    if run in MAIN_RUNS:
        assert any(coarse(v) == "running" for s in samples for v in s["cellRanks"].values()), "no sample caught the ranks running"
    bad_since: Optional[float] = None
    worst: List[str] = []
    for s in samples:
        why = disagreement(s)
        if why is None:
            bad_since = None
            continue
        bad_since = bad_since if bad_since is not None else s["t"]
        if s["t"] - bad_since > AGREE_WITHIN_S:
            worst.append(f"{s['t'] - bad_since:.1f}s: {why}")
    assert not worst, f"{story['front'].kind}/{run}: the views disagreed for longer than {AGREE_WITHIN_S}s:\n" + "\n".join(worst[:8])


@pytest.mark.parametrize("run", MAIN_RUNS + HANG_RUNS)
def test_every_view_names_rank_1_and_the_cell_by_its_prompt(story: Dict[str, Any], run: str) -> None:
    """Rank 1 raised (or, with --timeout, never arrived while rank 0 waited in dist.barrier): every view names rank 1
    and only rank 1; the pool is whole again, so it is ready, and the cell is named by the number beside it."""
    end = _ended(story[run])
    n = prompt_number(end)
    blamed = _blamed(end)
    assert blamed["panel"] == {1}, f"the panel blames {sorted(blamed['panel'])}: {end['panelRanks']}"
    word = "raised" if run in MAIN_RUNS else "timed out"
    assert blamed["panel_notes"] == {1: f"In[{n}]: {word}"}, blamed["panel_notes"]
    want = f"DDP 4×gloo · ready · In[{n}]: rank 1 failed, recovered"
    assert end["summary"] == want
    if story["front"].kind == "lab":
        assert end["statusBar"] == want
    assert end["lastCell"].startswith(f"last cell In[{n}]: ") and "recovered" in end["lastCell"], end["lastCell"]
    said = end["outputText"]
    assert f"In[{n}]" in said, f"the traceback names another cell than [{n}]: {said[-600:]}"
    if run in HANG_RUNS:
        assert re.search(r"rank 1\b[^\n]*never arrived", said), said[-600:]
        assert "rank 1" in end["lastCell"] and "rank 0" not in end["lastCell"], end["lastCell"]
    else:
        assert "rank 1 raised ValueError: bad shard on rank 1" in end["lastCell"], end["lastCell"]
    assert blamed["cell"] == {1}, f"the cell's view marks {sorted(blamed['cell'])} failed: {end['cellRanks']}"


@pytest.mark.parametrize("run", MAIN_RUNS)
def test_the_panel_shows_the_number_logged(story: Dict[str, Any], run: str) -> None:
    """samples_per_s=15900.0 on every rank: last, min and mean are all 15.9k, in the panel and in the cell's chart."""
    samples = story[run]
    end = _ended(samples)
    assert end["metrics"].get("samples_per_s") == [LOGGED] * 3, end["metrics"]
    # lr from 0.0002628 to 0.0002628 * 1.11: its smallest value whole (it was cut to "002628" at the axis, wrapped in the table)
    assert end["metrics"].get("lr", [None, None])[1] == "0.0002628", end["metrics"]
    assert end["metricsFinal"] == "true"
    assert re.search(rf"\b{re.escape(LOGGED)}\b", end["outputText"]), "the cell's chart writes 15900 as 15.9k"
    assert "1.59k" not in end["outputText"] + json.dumps(end["metrics"])
    live = [s for s in samples if s["running"] and s["metricsFinal"] == "false"]
    assert live, "the panel showed the chart while the cell ran"
    assert any(s["chartSeen"] for s in live), "the live chart is in sight in the panel, not below its fold"
    assert all(s["metrics"].get("samples_per_s", [LOGGED])[0] == LOGGED for s in live), [s["metrics"] for s in live][:3]


def test_a_reload_keeps_the_panel_open_with_the_pool_and_its_chart(story: Dict[str, Any]) -> None:
    before, after = _ended(story["light"]), story["reloaded"]
    assert after["panelShown"], "the panel closed on reload"
    assert after["summary"] == before["summary"], (before["summary"], after["summary"])
    assert after["metrics"].get("samples_per_s") == [LOGGED] * 3, f"the panel lost the kernel's chart on reload: {after['metrics']}"
    assert panel_states(after) == panel_states(before)


def test_a_pool_restart_clears_the_old_pool_s_chart_and_the_next_cell_brings_its_own(story: Dict[str, Any]) -> None:
    assert story["after_restart"]["metricsFinal"] is None and not story["after_restart"]["metrics"], story["after_restart"]["metrics"]
    assert _ended(story["again"])["metrics"].get("samples_per_s") == [LOGGED] * 3


def test_no_console_error_and_nothing_said_outside_a_cell(story: Dict[str, Any]) -> None:
    """No error in the page's console (ours or JupyterLab's, beyond ui_server.KNOWN_NOISE), no uncaught "Error: no
    answer", and no kernel output that belongs to no cell: "No such comm" after the live view was opened."""
    assert story["front"].clicked, "the live view's toggle was clicked while the cell ran"
    assert not story["errors"], "\n".join(story["errors"][:10] + story["front"].watch.stacks[:3])
    assert not story["orphans"], story["orphans"][:5]


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_nothing_is_cut_or_broken_inside_a_word_in_any_state(story: Dict[str, Any], theme: str) -> None:
    shots = story["front"].shots[theme]
    bad = {state: rec["clipping"]["bad"] for state, rec in shots.items() if rec["clipping"]["bad"]}
    assert all(rec["clipping"]["words"] > 10 and rec["clipping"]["labels"] for state, rec in shots.items() if state != "starting")
    assert not bad, json.dumps(bad, indent=1, ensure_ascii=False)[:3000]


def test_a_tqdm_loop_leaves_at_most_one_line_per_rank(story: Dict[str, Any]) -> None:
    text = "".join("".join(o.get("text", "")) for o in story["outputs"] if o.get("output_type") == "stream")
    shown = [line.split("\r")[-1] for line in text.split("\n")]  # what a reader sees: \r overwrites the line
    bars = [line for line in shown if re.search(r"\d+%\|", line)]
    per_rank = {r: sum(1 for line in bars if f"rank {r}" in line) for r in range(4)}
    assert all(n <= 1 for n in per_rank.values()), f"tqdm lines per rank in the saved output: {per_rank}"


@pytest.mark.parametrize("which", ["env_toast", "restart_toast"])
def test_no_toast_is_still_spinning_a_second_after_its_result(story: Dict[str, Any], which: str) -> None:
    toasts = story[which]["toasts"]
    assert not [t for t in toasts if t["spinning"]], toasts


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_text_contrast_is_at_least_4_5_in_every_state(story: Dict[str, Any], theme: str) -> None:
    shots = story["front"].shots[theme]
    want = {"starting", "running", "failed", "timeout"} | ({"reloaded"} if theme == "light" else set())
    assert set(shots) == want, sorted(shots)
    low = {phase: rec["contrast"]["low"] for phase, rec in shots.items() if rec["contrast"]["low"]}
    assert all(rec["contrast"]["checked"] for rec in shots.values())
    assert not low, json.dumps(low, indent=1, ensure_ascii=False)[:3000]


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_starting_has_the_cell_s_colour_in_the_panel(story: Dict[str, Any], theme: str) -> None:
    """A starting rank is the cell view's "info" tone in the panel too: the same rendered colour in the same theme
    (ddp_magic/ui/colours.py; tests/labextension/test_colours_mirror.py compares the source)."""
    colours = story["front"].shots[theme]["starting"]["colours"]
    assert colours["panel"] and colours["cell"], colours
    assert colours["panel"] == colours["cell"], colours


def test_the_panel_fits_says_the_start_method_and_clears_old_messages(story: Dict[str, Any]) -> None:
    assert not story["no_pool"]["ranksShown"], "no pool: no empty 'Ranks' heading"
    assert story["no_pool"]["commands"] == ["%load_ext ddp_magic", "%%ddp -n N"], story["no_pool"]
    assert not story["no_pool"]["broken"], f"a command broke across lines: {story['no_pool']['broken'][:5]}"
    layout = story["layout"]
    assert layout["scrollWidth"] <= layout["clientWidth"] + 1, layout
    assert "start method fork" in layout["facts"], layout["facts"]
    assert layout["icons"] == [True, True, True]
    assert "ready in" in story["after_restart"]["message"]
    assert _ended(story["again"])["message"] == "", "a later failure clears the restart's message"


def test_the_panel_knows_the_kernel_restarted_and_follows_the_start(story: Dict[str, Any]) -> None:
    after = story["after_kernel_restart"]
    assert not after["panelRanks"] and after["statusBar"] in (None, "") and not after["metrics"]
    starting = [s for s in story["dark"] if any(coarse(v) == "starting" for v in s["cellRanks"].values())]
    assert starting, "no sample caught the pool starting"
    assert any(s["panelRanks"] and all(coarse(st, css) == "starting" for st, css, _, _ in s["panelRanks"].values()) for s in starting)


def test_the_status_bar_item_is_level_with_its_neighbours(story: Dict[str, Any]) -> None:
    if story["front"].kind != "lab":
        pytest.skip("Notebook 7 has no status bar")
    layout = story["layout"]
    assert layout["item"] and layout["neighbour"], layout
    assert abs(layout["item"]["middle"] - layout["neighbour"]["middle"]) <= 1.0, layout
    assert layout["item"]["height"] == 24, layout


def test_a_shipped_notebook_opened_untrusted_keeps_its_status_colours(story: Dict[str, Any], server: Server) -> None:
    front = story["front"]
    name = f"shipped_{front.kind}_{SHIPPED}"
    shutil.copyfile(os.path.join(ROOT, "notebooks", SHIPPED), os.path.join(server.nbdir, name))
    front.open(name)
    front.page.wait_for_selector(".ddp-status", timeout=30_000)
    trusted = front.page.evaluate("() => window.jupyterapp.shell.currentWidget.content.model.cells.get(0).trusted")
    assert trusted is False, "the copy must open untrusted (a fresh trust database)"
    found = front.page.evaluate(
        """() => [...document.querySelectorAll('.ddp-status')].slice(0, 3).map(v => {
            const marks = [...v.querySelectorAll('.ddp-status-strip [data-rank], .ddp-status-strip [title^="rank "]')].map(e => {
              const r = e.getBoundingClientRect(); const bg = getComputedStyle(e).backgroundColor;
              return {w: r.width, h: r.height, bg};
            });
            return {marks, text: v.innerText.slice(0, 80)};
        })"""
    )
    assert found, "no saved status view rendered"
    marks = [m for v in found for m in v["marks"]]
    assert marks, found
    invisible = [m for m in marks if m["w"] < 4 or m["h"] < 4 or m["bg"] in ("rgba(0, 0, 0, 0)", "transparent")]
    assert not invisible, f"rank marks without their size or colour when untrusted: {invisible[:4]}"
    low = front.page.evaluate(CONTRAST_JS, [".ddp-status"])
    assert not low["low"], low["low"][:5]
    front.shot("untrusted-light")
    assert not front.watch.errors(), front.watch.errors()[:5]
