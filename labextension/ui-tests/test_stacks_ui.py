"""The DDP panel's Stacks action in real JupyterLab (headless Chromium), while a foreground %%ddp cell runs.

The notebook: ``%load_ext ddp_magic``, a cell that starts the pool (its stacks read once between cells), and a 3-rank
foreground cell where rank 1 sits in ``slow_part()`` (it waits at a
gate, a file the test removes) while ranks 0 and 2 wait in ``all_reduce``. While the cell runs (its prompt ``[*]``),
the panel's Stacks button asks the kernel, which answers from the comm's subshell thread while the main thread pumps
the cell (ui/labrequests.py, kernel/stacks.py): the text shows rank 1's group first with ``slow_part`` and the others'
with ``all_reduce`` and the cell's line, and the cell then completes with the right value. Each round runs twice, the
cell run again, as a user re-runs cells.
"""
from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, Iterator, List

import pytest
from ui_pages import front_page, no_errors, prompt, prompt_number, run_cell, wait_prompt
from ui_probes import SAMPLE_JS
from ui_server import Server

pytestmark = [pytest.mark.slow, pytest.mark.browser]
playwright_api = pytest.importorskip("playwright.sync_api", reason="Python Playwright is in requirements-dev.txt")

GATE = os.path.join(tempfile.gettempdir(), f"ddp_stacks_ui_gate_{os.getpid()}")
CELL = f"""%%ddp -n 3
import os, time, torch, torch.distributed as dist
def slow_part():
    while os.path.exists({GATE!r}):
        time.sleep(0.05)
t = torch.ones(1)
if dist.get_rank() == 1:
    slow_part()
dist.all_reduce(t)
t.item()"""
ROUNDS = 2
TEXT_JS = "() => { const p = document.querySelector('.jp-ddp-Panel-stacksText'); return p ? p.textContent : null; }"


def stacks_text(page: Any) -> str:
    """Click the panel's Stacks; the text once the kernel has answered."""
    page.click(".jp-ddp-Panel-button-stacks")
    page.wait_for_function("() => { const n = document.querySelector('.jp-ddp-Panel-stacks');"
                           " return n && n.dataset.state && n.dataset.state !== 'asking'; }", timeout=60_000)
    return str(page.evaluate(TEXT_JS))


def round_(page: Any) -> Dict[str, Any]:
    open(GATE, "w").close()
    try:
        run_cell(page, 1)
        page.wait_for_function("() => /\\*/.test(document.querySelectorAll('.jp-Notebook .jp-CodeCell')[1]"
                               ".querySelector('.jp-InputPrompt').textContent)", timeout=30_000)
        reads: List[str] = []
        for _ in range(240):  # until the ranks are where the cell puts them (the pool starts on the first round)
            text = stacks_text(page)
            reads.append(text)
            if "--- rank 1 ---" in text and "--- ranks 0, 2 (2) ---" in text:
                break
            page.wait_for_timeout(500)
        running = prompt(page, 1)
    finally:
        os.unlink(GATE)
    done = wait_prompt(page, 1, 180)
    return {"text": reads[-1], "running": running, "done": done, "sample": page.evaluate(SAMPLE_JS, 1)}


@pytest.fixture(scope="module")
def story(server: Server, browser: Any) -> Iterator[Dict[str, Any]]:
    with front_page(server, browser, "stacks_lab.ipynb", ["%load_ext ddp_magic", CELL, "%%ddp -n 3\n1"], 900, panel=True, width=1300) as page:
        for i in (0, 2):  # the extension, then the pool
            run_cell(page, i)
            wait_prompt(page, i, 240)
        assert "--- ranks 0-2 (3) ---" in stacks_text(page)  # between cells: every rank idle
        rounds = [round_(page) for _ in range(ROUNDS)]
        no_errors(page)
        yield {"rounds": rounds}


@pytest.mark.parametrize("n", range(ROUNDS))
def test_the_panels_stacks_show_the_groups_while_the_cell_runs(story: Dict[str, Any], n: int) -> None:
    rec = story["rounds"][n]
    text, number = rec["text"], prompt_number(rec["done"])
    assert "*" in rec["running"], f"the stacks were read while the cell ran: {rec['running']!r}"
    assert text.startswith("3 ranks in 2 stacks"), text
    assert text.index("--- rank 1 ---") < text.index("--- ranks 0, 2 (2) ---"), text  # the odd rank out first
    one, others = text.split("--- ranks 0, 2 (2) ---")
    assert f"Cell In[{number}], line 5, in slow_part" in one and "all_reduce" not in one, text
    assert f"Cell In[{number}], line 9" in others and "dist.all_reduce(t)" in others and " in all_reduce" in others, text


@pytest.mark.parametrize("n", range(ROUNDS))
def test_the_cell_goes_on_to_its_value(story: Dict[str, Any], n: int) -> None:
    out = story["rounds"][n]["sample"]["outputText"]
    assert "3.0" in out and "Error" not in out, out
