"""Debugging a rank from the cell, in a real kernel: input(), breakpoint(), %ddp_debug, the peers and interrupts.

The test plays the notebook's front end: it answers the kernel's input_request
messages (jupyter_client's stdin channel), as an input box would.
"""
from __future__ import annotations

import re
import time
from typing import Callable, Dict, List, Optional

import pytest

from conftest import wait_until
from kernel_helper import Kernel

pytestmark = pytest.mark.kernel
PG_TIMEOUT = 3.0


@pytest.fixture(scope="module")
def dbg(kernel: Kernel) -> Kernel:
    """A pool of 2 with a short process-group timeout (the peers of a debugged rank must outlast it)."""
    kernel.run(f"%%ddp -n 2 --pg-timeout {PG_TIMEOUT:g}\nimport torch, torch.distributed as dist\n", timeout=180).ok()
    return kernel


def script(*replies: str) -> Callable[[str, bool], str]:
    """An answerer that gives these replies in order and remembers nothing else."""
    left = list(replies)
    return lambda prompt, password: left.pop(0)


def test_input_on_a_rank_asks_the_notebook(dbg):
    for _ in range(2):  # the second run of the cell too
        ex = dbg.run("%%ddp\nname = input('name? ') if dist.get_rank() == 1 else 'zero'\nname", answer=script("Ada"), timeout=60).ok()
        assert ex.prompts == [("[rank 1] name? ", False)]
        assert dbg.value("list(_)") == ["zero", "Ada"]


def test_two_ranks_asking_at_once_get_their_own_answers_in_rank_order(dbg):
    asked: List[str] = []

    def answer(prompt: str, password: bool) -> str:
        asked.append(prompt)
        return f"reply to {prompt.split(']')[0]}]"

    dbg.run("%%ddp\nimport getpass\ngot = (input(f'r{dist.get_rank()}? '), getpass.getpass('pw? '))\ngot", answer=answer, timeout=60).ok()
    assert asked[:2] == ["[rank 0] r0? ", "[rank 1] r1? "]  # rank order, one at a time
    assert sorted(asked[2:]) == ["[rank 0] pw? ", "[rank 1] pw? "]
    assert dbg.value("[list(v) for v in _]") == [["reply to [rank 0]"] * 2, ["reply to [rank 1]"] * 2]


def test_without_stdin_a_rank_gets_eoferror_at_once(dbg):
    ex = dbg.run("%%ddp\ntry:\n    input('x? ')\nexcept EOFError as e:\n    print('EOF', e)\n", allow_stdin=False, timeout=60).ok()
    assert ex.stdout.count("EOF this front end does not allow input") == 2, ex.stdout
    assert not ex.prompts


def test_breakpoint_on_rank_1_steps_and_continues(dbg):
    sent: List[str] = []

    def answer(prompt: str, password: bool) -> str:
        assert prompt == "[rank 1] (Pdb) ", prompt
        sent.append(["p x", "n", "p y", "l", "c"][len(sent)])
        return sent[-1]

    cell = "%%ddp\nx = 40 + dist.get_rank()\nif dist.get_rank() == 1:\n    breakpoint()\ny = x + 1\nt = torch.ones(1)\ndist.all_reduce(t)\n(y, t.item())"
    for _ in range(2):
        sent.clear()
        ex = dbg.run(cell, answer=answer, timeout=90).ok()
        assert sent == ["p x", "n", "p y", "l", "c"]
        assert "[rank 1] 41" in ex.stdout and "[rank 1] 42" in ex.stdout, ex.stdout
        assert "<ddp-cell-" in ex.stdout and "y = x + 1" in ex.stdout  # where it stands, from the cell's own source
        assert dbg.value("[tuple(v) for v in _]") == [(41, 2.0), (42, 2.0)]


def test_a_peer_in_all_reduce_outlasts_the_pg_timeout_while_rank_1_debugs(dbg):
    waited: Dict[str, float] = {}

    def answer(prompt: str, password: bool) -> str:
        if not waited:
            time.sleep(2 * PG_TIMEOUT)  # the user reads the code; rank 0 sits in all_reduce meanwhile
            waited["s"] = 2 * PG_TIMEOUT
        return "c"

    ex = dbg.run("%%ddp\nt = torch.ones(1)\nif dist.get_rank() == 1:\n    ddp_magic_bp(rank=1)\ndist.all_reduce(t)\nt.item()".replace(
        "ddp_magic_bp", "__import__('ddp_magic').breakpoint"), answer=answer, timeout=120).ok()
    assert waited and dbg.value("list(_)") == [2.0, 2.0], ex.stderr
    # dist.breakpoint works too (torch's own reads /dev/stdin, which a rank does not have)
    dbg.run("%%ddp\ndist.breakpoint(rank=0)\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()", answer=script("c"), timeout=60).ok()
    assert dbg.value("list(_)") == [2.0, 2.0]


def test_ddp_debug_after_a_failure_prints_the_failing_frames_local(dbg):
    cell = "%%ddp\ndef step(batch):\n    width = 3 + 2 * dist.get_rank()\n    return torch.ones(width) + torch.ones(4)\nstep(0)"
    ex = dbg.run(cell, timeout=60)
    assert ex.error is not None
    ex = dbg.run("%ddp_debug", answer=script("p width", "q"), timeout=60).ok()
    root = int(ex.prompts[0][0][len("[rank "):].split("]")[0])  # both raised: the root cause is whichever did first
    assert ex.prompts == [(f"[rank {root}] (Pdb) ", False)] * 2
    assert f"[rank {root}] {3 + 2 * root}" in ex.stdout and f"post-mortem of rank {root}" in ex.stdout, ex.stdout
    dbg.run(cell, timeout=60)
    ex = dbg.run("%ddp_debug 1", answer=script("p width", "q"), timeout=60).ok()
    assert "[rank 1] 5" in ex.stdout, ex.stdout
    ex = dbg.run("%ddp_debug 1", answer=script("q"), timeout=60).ok()  # the frames went when pdb ended
    assert "has no failure to debug" in ex.stderr and not ex.prompts


def test_pdb_option_enters_the_post_mortem_on_failure(dbg):
    cell = "%%ddp --pdb\nsecret = 7 * (dist.get_rank() + 1)\nif dist.get_rank() == 1:\n    raise ValueError('boom')"
    ex = dbg.run(cell, answer=script("p secret", "q"), timeout=60)
    assert ex.error is not None and "boom" in "".join(ex.error[2])
    assert "[rank 1] 14" in ex.stdout and ex.prompts == [("[rank 1] (Pdb) ", False)] * 2, ex.stdout
    dbg.run("%pdb on").ok()  # IPython's own switch does the same for every %%ddp cell
    ex = dbg.run(cell.replace(" --pdb", ""), answer=script("p secret", "q"), timeout=60)
    dbg.run("%pdb off").ok()
    assert "[rank 1] 14" in ex.stdout and len(ex.prompts) == 2, ex.prompts  # and no second debugger of IPython's own


def test_quit_in_pdb_ends_the_cell_as_an_interrupt_and_no_rank_is_stuck(dbg):
    ex = dbg.run("%%ddp\nif dist.get_rank() == 1:\n    breakpoint()\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()", answer=script("q"), timeout=120)
    assert ex.error is not None and "KeyboardInterrupt" in "".join(ex.error[2]) + ex.error[1], ex.error
    # rank 0 waited in all_reduce (uninterruptible): the process group was aborted, rank 0 released, the group re-formed
    assert "rank 0 was in all_reduce" in ex.error[1] and "was released" in ex.error[1], ex.error[1]
    dbg.run("%%ddp\nimport torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()", timeout=120).ok()
    assert dbg.value("list(_)") == [2.0, 2.0]


def test_an_interrupt_while_a_rank_waits_for_input_ends_the_cell(dbg):
    for cell in ("%%ddp\nif dist.get_rank() == 1:\n    input('never answered? ')\n", "%%ddp\nif dist.get_rank() == 0:\n    breakpoint()\n1"):
        error = _interrupted(dbg, cell)
        assert error is not None and "Interrupt" in error["ename"] + error["evalue"] + "".join(error["traceback"]), error
        dbg.run("%%ddp\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()", timeout=120).ok()  # nothing is stuck
        assert dbg.value("list(_)") == [2.0, 2.0]


def _interrupted(k: Kernel, cell: str) -> Optional[dict]:
    """Run ``cell``, interrupt the kernel while its first input box shows (never answered); the error it ended with."""
    msg_id = k.kc.execute(cell, allow_stdin=True)
    k.kc.get_stdin_msg(timeout=60)  # the input box is showing
    k.km.interrupt_kernel()
    error = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        msg = k.kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "error":
            error = msg["content"]
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return error
    raise TimeoutError("the interrupted cell did not end")


def test_without_a_debugger_a_collective_missing_its_peer_still_ends_after_the_pg_timeout(dbg):
    """The pool's group waits long (for debugged peers); --pg-timeout is the ranks' watchdog's, which nothing holds here."""
    dbg.run("%%ddp\nimport torch, torch.distributed as dist\n", timeout=120).ok()
    ex = dbg.run("%%ddp --timeout 120\nif dist.get_rank() == 0:\n    dist.all_reduce(torch.ones(1))\n", timeout=180)
    assert ex.error is not None and "ran past --timeout" not in ex.error[1], ex.error[1]
    assert f"waited {PG_TIMEOUT:g}s (--pg-timeout) in torch.distributed.all_reduce" in ex.error[1] + ex.stderr, ex.error[1]
    dbg.run("%%ddp\nimport torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()", timeout=120).ok()


# ---------------------------------------------------------------- a background cell's questions (docs/background.md)
BG_INPUT = (
    "%%ddp --bg --out job\nname = input('name? ') if dist.get_rank() == 0 else 'one'\n"
    "t = torch.ones(1) * len(name)\ndist.all_reduce(t)\n(name, t.item())"
)
WAITS = "rank 0 waits for input: 'name? '"


def late_text(k: Kernel, msg_id: str) -> str:
    """What a cell printed after it returned (a background cell's output)."""
    k.collect()
    return "".join(m["content"]["text"] for m in k.elsewhere if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream")


def test_input_in_a_bg_cell_waits_says_so_and_ddp_debug_answers_it(dbg):
    for name in ("Ada", "Grace"):
        dbg.elsewhere.clear()
        bg = dbg.run(BG_INPUT, timeout=60).ok()
        assert wait_until(lambda: dbg.value("str(job.waiting)") == WAITS, 60, 0.2)
        shown = dbg.run("print(repr(job))\n%ddp status").ok().stdout
        assert re.search(r"<Job cell \[\d+\]: running \d+:\d\d:\d\d(, RSS [^;]*)?; " + re.escape(WAITS) + r" \(%ddp_debug answers\)>", shown), shown
        assert re.search(r"background: cell \[\d+\] running \d+:\d\d:\d\d; " + re.escape(WAITS), shown), shown
        assert f"ddp_magic: {WAITS}: answer it with %ddp_debug" in late_text(dbg, bg.msg_id)  # said in the background cell
        assert dbg.value("str(job.state)") == "running" and dbg.run("1 + 1").ok().result == "2"  # the notebook is free
        ex = dbg.run("%ddp_debug", answer=script(name), timeout=60).ok()
        assert ex.prompts == [("[rank 0] name? ", False)] and WAITS in ex.stdout
        assert dbg.value("[tuple(v) for v in job.result(60)]") == [(name, len(name) + 3.0), ("one", len(name) + 3.0)]
        assert dbg.value("str(job.waiting)") == "None"


def test_job_answer_gives_a_rank_its_line_without_an_input_box(dbg):
    cell = "%%ddp --bg --out job\nlr = float(input('lr? ')) if dist.get_rank() == 1 else 0.5\nt = torch.tensor([lr])\ndist.all_reduce(t)\nt.item()"
    for lr in ("0.25", "1.5"):
        dbg.run(cell, timeout=60).ok()
        assert wait_until(lambda: dbg.value("str(job.waiting)") == "rank 1 waits for input: 'lr? '", 60, 0.2)
        assert dbg.run("job.answer('7', rank=0)").error[1].startswith("job.answer: rank 0 of cell")  # type: ignore[index]
        assert dbg.value(f"job.answer({lr!r})") == "rank 1 waits for input: 'lr? '"
        assert dbg.value("list(job.result(60))") == [float(lr) + 0.5] * 2


def test_breakpoint_in_a_bg_cell_ddp_debug_attaches_and_c_continues(dbg):
    cell = "%%ddp --bg --out job\nx = dist.get_rank() + 1\nif dist.get_rank() == 0:\n    breakpoint()\nt = torch.ones(1) * x\ndist.all_reduce(t)\n(x, t.item())"
    for _ in range(2):
        dbg.elsewhere.clear()
        bg = dbg.run(cell, timeout=60).ok()
        assert wait_until(lambda: dbg.value("str(job.waiting)") == "rank 0 waits in the debugger: '(Pdb) '", 60, 0.2)
        time.sleep(2 * PG_TIMEOUT)  # the user reads the code; rank 1 waits in all_reduce past --pg-timeout, held
        ex = dbg.run("%ddp_debug", answer=script("p x * 100", "c"), timeout=60).ok()
        assert ex.prompts == [("[rank 0] (Pdb) ", False)] * 2
        assert "[rank 0] 100" in ex.stdout, ex.stdout  # pdb's answer shows in the cell that debugs
        assert dbg.value("[tuple(v) for v in job.result(60)]") == [(1, 3.0), (2, 3.0)]
        assert "[rank 0] 100" not in late_text(dbg, bg.msg_id)


# ---------------------------------------------------------------- real JupyterLab in headless Chromium
LAB_CELL = (
    "%%ddp -n 2 --no-widget\nimport torch.distributed as dist\n"
    "answer = input('name? ') if dist.get_rank() == 1 else 'rank 0 did not ask'\nprint('got', answer)\nanswer"
)


@pytest.mark.slow
def test_input_box_in_jupyterlab(tmp_path, server, browser):
    """A %%ddp -n 2 cell calling input() on rank 1 shows JupyterLab's input box; typing an answer completes the cell.
    JupyterLab and Chromium are the browser tests' own (labextension/ui-tests/ui_fixtures.py: one Playwright a process)."""
    import json
    import os
    import shutil

    from ui_pages import notebook_url, shut_down

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cells = [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": s} for s in ("%load_ext ddp_magic", LAB_CELL)]
    with open(os.path.join(server.nbdir, "debug_input.ipynb"), "w") as f:
        json.dump({"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}}, "nbformat": 4, "nbformat_minor": 5}, f)
    page = browser.new_page(viewport={"width": 1100, "height": 700})
    try:
        page.goto(notebook_url(server, "lab", "debug_input.ipynb"), timeout=60_000)
        page.wait_for_function(
            "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
            " const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;"
            " return k && k.status === 'idle'; }", timeout=90_000,
        )
        page.evaluate("() => window.jupyterapp.commands.execute('application:toggle-left-area')")
        page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
        box = page.locator(".jp-Stdin-input").first
        box.wait_for(timeout=240_000)
        assert "[rank 1] name? " in page.locator(".jp-Stdin-prompt").first.inner_text()
        box.fill("Grace")
        cell = page.locator(".jp-CodeCell").nth(1)
        cell.screenshot(path=str(tmp_path / "debug-input.png"))
        box.press("Enter")
        page.wait_for_function("() => document.body.innerText.includes(\"'Grace'\")", timeout=120_000)
        assert "[rank 1] got Grace" in cell.inner_text()
        cell.screenshot(path=str(tmp_path / "debug-input-done.png"))
        shut_down(page)
    finally:
        page.close()
    if os.environ.get("DDP_MAGIC_UPDATE_DOCS_IMG") == "1":  # a test run leaves the tree clean
        shutil.copy(tmp_path / "debug-input.png", os.path.join(root, "docs", "img", "debug-input.png"))
