"""A kept pool in real JupyterLab and Notebook 7 (headless Chromium): the DDP panel offers it after a kernel restart (docs/keep.md).

A notebook sets a variable on its two ranks and keeps the pool (``%ddp keep``); the kernel restarts and loads the
extension again. The DDP panel then lists this notebook's kept pool with an *Attach* button; a click puts
``%ddp attach ID --out job`` in a new cell and runs it: its output says it attached that pool, with its two ranks, and
the next ``%%ddp`` cell sees the variable set before the restart. Keep, restart and attach run twice (a notebook user
does it again), then ``%ddp stop`` ends the pool; a pool the test left kept is stopped from the terminal.

After a SIGKILL the page says what it received: a ``--bg --keep`` job prints ticks, the test SIGKILLs its kernel
(the server starts a new one), and the panel's *Attach* replays each rank after the last line the page holds: the
ticks of the job's cell and of the attach cell are 0…N−1, each exactly once (docs/keep.md, "Shown exactly once").
The same where the page's word used not to reach the attach, with the kernel's own count made wrong so that only
that word can get it right: a page that went away while the job printed and came back (it shows the job's cell
again from the kernel's copy), a page reloaded after the SIGKILL (the tab's storage), and one cell with both
``%load_ext ddp_magic`` and ``%ddp attach --out job`` (the page finds ddp_magic while that cell runs).

Runs with the other browser tests (ui_fixtures.py's server and browser); Python Playwright drives /usr/bin/chromium.
"""
from __future__ import annotations

import contextlib
import glob
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any, Iterator, List

import pytest
from ui_pages import KERNEL_STATUS_JS, append_and_run, front_page, no_errors, prompt_number, run_cell, wait_kernel_idle, wait_prompt, wait_ready
from ui_server import ROOT, Server

NOTEBOOK = "ddp_keep_ui.ipynb"
SET = "%%ddp -n 2\nimport torch\nmarker = 41 + torch.distributed.get_rank()"
READ = "%%ddp -n 2\nprint('marker is', marker)"

pytestmark = [pytest.mark.slow, pytest.mark.browser]
playwright_api = pytest.importorskip("playwright.sync_api", reason="Python Playwright is in requirements-dev.txt")
expect = playwright_api.expect

TICKS = ("%%ddp --bg --out job --keep\nimport os, time\nfor i in range({n}):\n    print('tick', i, flush=True)\n"
         "    while i == {at} and os.path.exists({gate!r}):\n        time.sleep(0.02)\n    time.sleep(0.02)\n")
N, AT, EARLY = 40, 25, 12
HELLO = "__import__('ddp_magic.ui.lab_hello', fromlist=['_'])"
TICK = re.compile(r"\[rank (\d+)\] tick (\d+)\n")
STDOUT_JS = ("(i) => { const cell = document.querySelectorAll('.jp-Notebook .jp-CodeCell')[i];"  # none yet: a page just reloaded
             " return cell ? [...cell.querySelectorAll('.jp-OutputArea-output[data-mime-type=\"application/vnd.jupyter.stdout\"]')]"
             ".map(e => e.textContent).join('\\n') : ''; }")
OUTPUT_JS = "(i) => document.querySelectorAll('.jp-Notebook .jp-CodeCell')[i].querySelector('.jp-OutputArea').innerText"


@pytest.fixture(scope="module", params=["lab", "notebook"])
def page(request: Any, server: Server, browser: Any) -> Iterator[Any]:
    kind = request.param
    if kind == "notebook":
        pytest.importorskip("notebook", reason="Notebook 7 (pip install notebook) is in requirements-dev.txt")
    name = NOTEBOOK.replace(".ipynb", f"_{kind}.ipynb")  # a kept pool belongs to its notebook
    with front_page(server, browser, name, ["%load_ext ddp_magic", SET, "%ddp keep"], 900, panel=True, kind=kind) as pg:
        yield pg


def output(page: Any, index: int) -> str:
    return str(page.evaluate(OUTPUT_JS, index))


def cells(page: Any) -> int:
    return int(page.evaluate("() => document.querySelectorAll('.jp-Notebook .jp-CodeCell').length"))


def terminal(server: Server, *argv: str) -> str:
    """``python -m ddp_magic ...`` as the server's kernels see the runtime dir (its JUPYTER_DATA_DIR's runtime/)."""
    env = dict(os.environ, PYTHONPATH=ROOT, JUPYTER_DATA_DIR=os.path.join(server.tmp, "data"))
    env.pop("JUPYTER_RUNTIME_DIR", None)
    return subprocess.run([sys.executable, "-m", "ddp_magic", *argv], env=env, capture_output=True, text=True, timeout=60).stdout


def test_the_panel_attaches_a_kept_pool_after_a_restart(page: Any, server: Server) -> None:
    kept: List[str] = []
    try:
        for _ in range(2):
            run_cell(page, 0)
            wait_prompt(page, 0)
            run_cell(page, 1)
            wait_prompt(page, 1, timeout=180)
            run_cell(page, 2)  # %ddp keep
            wait_prompt(page, 2)
            m = re.search(r"kept pool ([0-9a-f]+)", output(page, 2))
            assert m, output(page, 2)
            pool_id = m.group(1)
            kept.append(pool_id)
            assert pool_id in terminal(server, "kept")  # where the fallback below looks

            page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()")
            wait_kernel_idle(page)
            run_cell(page, 0)  # %load_ext again: the panel hears this kernel
            wait_prompt(page, 0)
            row = page.locator(f".jp-ddp-Panel-kept .jp-ddp-Panel-keptRow[data-id='{pool_id}']")
            expect(row).to_be_visible(timeout=60_000)
            expect(row).to_contain_text("2 ranks")
            button = row.locator("button.jp-ddp-Panel-button-attach")
            expect(button).to_have_text("Attach")
            expect(button).to_be_enabled()
            expect(button).to_have_attribute("title", f"runs %ddp attach {pool_id} --out job in a new cell", timeout=30_000)  # loaded
            before = cells(page)
            button.click()  # a new cell below the active one (cell 0) runs %ddp attach ID --out job
            page.wait_for_function(f"() => document.querySelectorAll('.jp-Notebook .jp-CodeCell').length === {before + 1}", timeout=30_000)
            source = page.evaluate("() => window.jupyterapp.shell.currentWidget.content.widgets[1].model.sharedModel.getSource()")
            assert source == f"%ddp attach {pool_id} --out job", source
            wait_prompt(page, 1)
            said = output(page, 1)
            assert f"attached the kept pool {pool_id}" in said and "2 ranks alive" in said, said
            assert re.search(rf"attached the kept pool {pool_id} of ddp_keep_ui_\w+\.ipynb in ", said), "the notebook by its file name, as --list says it"
            expect(page.locator(".jp-ddp-Panel-kept")).to_be_hidden(timeout=30_000)  # the pool is this kernel's now

            append_and_run(page, READ)
            last = cells(page) - 1
            wait_prompt(page, last, timeout=180)
            seen = output(page, last)
            assert "marker is 41" in seen and "marker is 42" in seen, seen
            page.evaluate("(i) => { const m = window.jupyterapp.shell.currentWidget.content.model.sharedModel;"
                          " m.deleteCellRange(i, i + 1); m.deleteCellRange(1, 2); }", last)  # the attach and READ cells
            assert cells(page) == 3  # as the round began: load_ext, SET, keep
        append_and_run(page, "%ddp stop")
        wait_prompt(page, 3)
        assert "stopped the pool" in output(page, 3), output(page, 3)
        kept.clear()
        assert "no kept pool" in terminal(server, "kept")
        no_errors(page)
    finally:
        for pool_id in kept:  # a pool this test kept and did not stop (it failed half-way): nothing outlives the test
            terminal(server, "stop", pool_id)


def ticks(page: Any, index: int) -> dict:
    """Each rank's ticks in the stream output of cell ``index``, in the order shown (the status view's words aside)."""
    out: dict = {0: [], 1: []}
    for rank, i in TICK.findall(str(page.evaluate(STDOUT_JS, index)) + "\n"):
        out[int(rank)].append(int(i))
    return out


def wait_ticks(page: Any, index: int, upto: int, timeout: float = 120.0) -> None:
    page.wait_for_function(f"(i) => {{ const t = ({STDOUT_JS})(i); return t.includes('[rank 0] tick {upto}') && t.includes('[rank 1] tick {upto}'); }}",
                           arg=index, timeout=timeout * 1000)


def start_ticking(page: Any, server: Server, gate: str, upto: int, early: str = "") -> "tuple[int, str, int]":
    """Cells 0 and 1 (the pool), then a ``--bg --keep`` job that ticks (waiting at ``early`` after tick EARLY, if
    given, and at ``gate`` after tick AT): until ``upto`` is in the page. The job's cell index, its kept pool's id and
    the kernel's pid."""
    open(gate, "w").close()
    base = cells(page)
    run_cell(page, 0)
    wait_prompt(page, 0)
    run_cell(page, 1)  # SET: the pool of two ranks
    wait_prompt(page, 1, timeout=180)
    code = TICKS.format(n=N, at=AT, gate=gate)
    if early:
        wait = f"    while i == {EARLY} and os.path.exists({early!r}):\n        time.sleep(0.02)\n"
        code = code.replace("flush=True)\n", "flush=True)\n" + wait, 1)
    append_and_run(page, code)
    wait_ticks(page, base, upto)
    m = re.search(r"kept pool ([0-9a-f]+)", output(page, base))
    assert m, output(page, base)
    pid = re.search(m.group(1) + r"[^\n]*\n\s*attached to pid (\d+)", terminal(server, "kept"))  # its second line
    assert pid, terminal(server, "kept")
    return base, m.group(1), int(pid.group(1))


def sigkill(page: Any, pid: int) -> None:
    """SIGKILL the kernel, as the OOM killer would; until the server's new kernel is idle (its dialog closed)."""
    page.evaluate("() => { window.__ddpRestarted = false; window.jupyterapp.shell.currentWidget.sessionContext.statusChanged.connect("
                  "(_, s) => { if (s !== 'idle' && s !== 'busy') { window.__ddpRestarted = true; } }); }")
    os.kill(pid, signal.SIGKILL)
    page.wait_for_function(f"() => window.__ddpRestarted && {KERNEL_STATUS_JS} === 'idle'", timeout=120_000)
    dialog = page.locator(".jp-Dialog")  # "the kernel appears to have died; it will restart automatically"
    if dialog.count():
        dialog.locator(".jp-mod-accept").first.click()
        expect(dialog).to_have_count(0, timeout=10_000)


def attach_with_the_panel(page: Any, pool_id: str, base: int) -> str:
    """``%load_ext`` (the page's comm opens to the new kernel and says what it holds), then the panel's *Attach*: a
    new cell below cell 0 runs ``%ddp attach ID --out job``. What it printed."""
    run_cell(page, 0)
    wait_prompt(page, 0)
    row = page.locator(f".jp-ddp-Panel-kept .jp-ddp-Panel-keptRow[data-id='{pool_id}']")
    expect(row).to_be_visible(timeout=60_000)
    button = row.locator("button.jp-ddp-Panel-button-attach")
    expect(button).to_have_attribute("title", f"runs %ddp attach {pool_id} --out job in a new cell", timeout=30_000)  # ddp_magic heard
    button.click()
    page.wait_for_function(f"() => document.querySelectorAll('.jp-Notebook .jp-CodeCell').length === {base + 2}", timeout=30_000)
    wait_prompt(page, 1)
    return output(page, 1)


def miscount(server: Server, pool_id: str, whole: bool, timeout: float = 60.0) -> None:
    """The kernel's own count of what it showed, set back (``whole``: to the spool's start, else to tick EARLY's line):
    a replay from it would show those ticks twice, so only the page's word can make them come out once. (A count
    ahead, as tests/kernel/test_keep.py also sets, tells nothing here: a rank replays from its spool's end at most,
    and the job waits at its gate.) First, until the kernel has counted all its ranks printed: a later count would
    set it right again."""
    from ddp_magic.wire.kept import ShownOffsets

    (where,) = glob.glob(os.path.join(server.tmp, "**", f"ddp-kept-{pool_id}"), recursive=True)
    spools = [os.path.join(where, f"r{rank}.out") for rank in (0, 1)]
    shown = ShownOffsets(os.path.join(where, "shown"), 2)
    try:
        deadline = time.monotonic() + timeout
        while any(shown.get(rank, "stdout") != os.path.getsize(spools[rank]) for rank in (0, 1)):
            assert time.monotonic() < deadline, "the kernel did not count what its ranks printed"
            time.sleep(0.1)
        for rank in (0, 1):
            with open(spools[rank], "rb") as f:
                text = f.read()
            back = 0 if whole else text.index(f"\ntick {EARLY}\n".encode()) + 1  # that line's first byte
            shown.set(rank, {"stdout": back})
    finally:
        shown.close()


def save(page: Any) -> None:
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)


def wait_spooled(server: Server, pool_id: str, tick: int, timeout: float = 120.0) -> None:
    """Until each rank's spool (its output on disk) holds ``tick``: the job printed it, whether or not a page showed it."""
    (where,) = glob.glob(os.path.join(server.tmp, "**", f"ddp-kept-{pool_id}"), recursive=True)
    deadline = time.monotonic() + timeout

    def spooled(rank: int) -> str:
        try:
            with open(os.path.join(where, f"r{rank}.out"), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    while not all(f"tick {tick}\n" in spooled(rank) for rank in (0, 1)):
        assert time.monotonic() < deadline, f"tick {tick} is not in both spools of {where}"
        time.sleep(0.1)


def once(page: Any, server: Server, gate: str, job: int, attach: int) -> None:
    """The job goes on: the ticks of its cell and of the attach cell are 0…N−1, each once; then ``%ddp stop``."""
    os.unlink(gate)
    wait_ticks(page, attach, N - 1)
    first, second = ticks(page, job), ticks(page, attach)
    for rank in (0, 1):
        assert first[rank] and second[rank], (rank, first, second)
        assert first[rank] + second[rank] == list(range(N)), f"rank {rank}: the dead kernel's cell {first[rank]}, the attach cell {second[rank]}"
    # the last tick on screen is not yet the job's end (its DONE comes after; fc25 typed %ddp stop between the two, and
    # the stop was refused, rightly, for a job still running): the user's way is to wait for it
    append_and_run(page, "%ddp wait\n%ddp stop")
    last = cells(page) - 1
    wait_prompt(page, last)
    assert "stopped the pool" in output(page, last), output(page, last)


def quiet_403(page: Any, refused: List[str]) -> None:
    if refused and all("/static/" in url and url.endswith(".woff2") for url in refused):
        # Notebook 7 asks for a font of its own when its "the kernel died" dialog shows, and gets a 403: not ours
        page.ddp_watch.lines[:] = [line for line in page.ddp_watch.lines if "status of 403" not in line]


@contextlib.contextmanager
def sigkill_rounds(page: Any, server: Server, reloads: bool = False) -> Iterator[List[str]]:
    """The frame of a test that SIGKILLs its kernel: the pools it keeps (append each; stopped at the end if still
    kept), the page's 403s (Notebook 7's font behind its dialog) and, once the rounds are through, no error in the page."""
    kept: List[str] = []
    refused: List[str] = []
    on_response = lambda r: refused.append(r.url) if r.status == 403 else None  # noqa: E731
    page.on("response", on_response)
    try:
        yield kept
        quiet_403(page, refused)
        if reloads:
            quiet_reload(page)
        quiet_killed(page)
        no_errors(page)
    finally:
        page.remove_listener("response", on_response)
        for pool_id in kept:
            terminal(server, "stop", pool_id)


def attached_once(page: Any, server: Server, said: str, pool_id: str, gate: str, base: int, kept: List[str]) -> None:
    """The attach cell says it took the pool and goes on after what the page received; each tick is shown once; the
    pool is no longer this test's to stop."""
    assert f"attached the kept pool {pool_id}" in said and "its output follows after the last line this page received" in said, said
    once(page, server, gate, base + 1, 1)
    kept.clear()
    page.evaluate("(b) => { const m = window.jupyterapp.shell.currentWidget.content.model.sharedModel;"
                  " m.deleteCellRange(b + 1, b + 3); m.deleteCellRange(1, 2); }", base)  # ticks, stop, then the attach cell
    assert cells(page) == base


def quiet_killed(page: Any) -> None:
    """A kernel SIGKILLed (or restarted) while comms open cancels JupyterLab's own comm-subshell requests, whose
    rejections JupyterLab leaves unhandled (RESTART_CANCELED): every test in sigkill_rounds kills its kernel. Seen in a
    full run under load, ten at once in each of the four JupyterLab tests of this frame; never with this file alone."""
    page.ddp_watch.lines[:] = [line for line in page.ddp_watch.lines if not RESTART_CANCELED.match(line)]


def quiet_reload(page: Any) -> None:
    """JupyterLab's debugger asks each new kernel for its state; a page that reloads (or leaves) before the answer
    logs that it gave up: JupyterLab's own, on a reload only (the tests that reload nothing never see it)."""
    page.ddp_watch.lines[:] = [line for line in page.ddp_watch.lines if not line.startswith(
        "error: Could not restore the debugger state: Canceled future for debug_request message before replies were done")]


def test_ticks_show_once_over_a_sigkill(page: Any, server: Server, tmp_path: Any) -> None:
    with sigkill_rounds(page, server) as kept:
        for round_ in range(2):
            gate = str(tmp_path / f"gate{round_}")
            base, pool_id, pid = start_ticking(page, server, gate, 10)
            kept.append(pool_id)
            sigkill(page, pid)
            attached_once(page, server, attach_with_the_panel(page, pool_id, base), pool_id, gate, base, kept)


def test_ticks_show_once_over_a_reload_and_a_sigkill(page: Any, server: Server, tmp_path: Any) -> None:
    """A page reloaded since the last kept line it got still says what it shows (docs/keep.md). Round 0: the page goes
    away while the job prints (its kernel alive) and comes back: the job's cell is given back from the kernel's copy
    (rebind.ts), and the follow reply says how far its lines go (what the tab's storage held stops earlier). Round 1:
    the kernel is SIGKILLed, the notebook saved, the page reloaded: only the tab's storage knows. Then the panel's
    *Attach*. The kernel's own count is set back (to its start, then to tick EARLY): the page's word must be the
    one taken."""
    with sigkill_rounds(page, server, reloads=True) as kept:
        for round_ in range(2):
            gate, early = str(tmp_path / f"reload{round_}"), str(tmp_path / f"early{round_}")
            open(early, "w").close()
            base, pool_id, pid = start_ticking(page, server, gate, EARLY if round_ == 0 else AT, early=early if round_ == 0 else "")
            kept.append(pool_id)
            save(page)  # the job's cell is in the file
            if round_ == 0:
                url = page.url
                page.goto("about:blank")  # the page goes away; it wrote what it held to the tab's storage
                os.unlink(early)  # the job prints on to its gate, with no page to show it
                wait_spooled(server, pool_id, AT)
                miscount(server, pool_id, whole=True)
                page.goto(url, timeout=60_000)
            else:
                miscount(server, pool_id, whole=False)
                sigkill(page, pid)
                save(page)  # as autosave would: the cell's lines are in the file
                page.reload(timeout=60_000)
            wait_ready(page, page.ddp_watch)
            page.add_style_tag(content=".Toastify { display: none !important; }")
            page.evaluate("() => window.jupyterapp.commands.execute('ddp-magic:show-panel')")
            wait_ticks(page, base, AT)  # round 0: the reloaded page follows the job's cell; round 1: the file's lines
            if round_ == 0:
                sigkill(page, pid)
            attached_once(page, server, attach_with_the_panel(page, pool_id, base), pool_id, gate, base, kept)


def test_ticks_show_once_when_one_cell_loads_and_attaches(page: Any, server: Server, tmp_path: Any) -> None:
    """After the SIGKILL, one cell ``%load_ext ddp_magic`` + ``%ddp attach --out job`` (what a user pastes): the page
    finds ddp_magic while that cell runs (busy_probe.ts) and its hello reaches the attach, which waits for it
    (ui/lab_hello.py). The kernel's own count is set back, as above: to tick 12's line in JupyterLab, to the start in
    Notebook 7. One round a front end: in two full runs a second SIGKILL of the same page's kernel, after a one-cell
    attach, did not come back idle within 120 s once (Lab in one run, Notebook 7 in the other; never alone): not
    understood yet (docs/keep.md, Limits)."""
    with sigkill_rounds(page, server) as kept:
        for round_ in (1 if "/notebooks/" in page.url else 0,):
            gate = str(tmp_path / f"cell{round_}")
            base, pool_id, pid = start_ticking(page, server, gate, AT)
            kept.append(pool_id)
            miscount(server, pool_id, whole=round_ == 1)
            sigkill(page, pid)
            append_and_run(page, "%load_ext ddp_magic\n%ddp attach --out job")
            page.wait_for_function(f"() => document.querySelectorAll('.jp-Notebook .jp-CodeCell').length === {base + 2}", timeout=30_000)
            wait_prompt(page, base + 1)
            said = output(page, base + 1)
            assert f"attached the kept pool {pool_id}" in said and "its output follows after the last line this page received" in said, said
            once(page, server, gate, base, base + 1)
            kept.clear()
            append_and_run(page, f"print('waited', {HELLO}.last_wait, {HELLO}.heard())")
            wait_prompt(page, base + 3)
            print(f"[{round_}] the attach waited for the page's hello:", output(page, base + 3).strip())  # docs/keep.md's figure
            page.evaluate("(b) => window.jupyterapp.shell.currentWidget.content.model.sharedModel.deleteCellRange(b, b + 4)", base)
            assert cells(page) == base


SHOTS = os.environ.get("DDP_MAGIC_SHOTS", "")  # a folder: before/after shots of these stories
ROW_JS = """(id) => { const r = document.querySelector(`.jp-ddp-Panel-keptRow[data-id='${id}']`); if (!r) { return null; }
  const b = r.querySelector('button').getBoundingClientRect(); const f = r.querySelector('.jp-ddp-Panel-keptFacts');
  const fb = f ? f.getBoundingClientRect() : null;
  return {text: r.innerText, title: r.title, button: [b.left, b.right], facts: fb ? [fb.left, fb.right] : null,
          lines: f ? [...f.children].map(e => e.textContent) : []}; }"""
WIDGETS_JS = ("(i) => window.jupyterapp.shell.currentWidget.content.model.cells.get(i).outputs.toJSON()"
              ".filter(o => o.data && o.data['application/vnd.jupyter.widget-view+json']).length")


def shot(page: Any, name: str) -> None:
    if SHOTS:
        os.makedirs(SHOTS, exist_ok=True)
        page.screenshot(path=os.path.join(SHOTS, f"{name}_{'notebook' if '/notebooks/' in page.url else 'lab'}.png"))


def restart_checks(page: Any, pool_id: str, base: int) -> dict:
    """What the page shows after the restart, ddp_magic not loaded yet: each failed check, by what it is about."""
    problems: dict = {}
    row = page.locator(f".jp-ddp-Panel-kept .jp-ddp-Panel-keptRow[data-id='{pool_id}']")
    try:
        expect(row).to_be_visible(timeout=30_000)
    except AssertionError:
        problems["8: the panel lists the kept pool before %load_ext"] = page.locator(".jp-ddp-Panel-summary").inner_text()
    toolbar = page.locator(".jp-ddp-ToolbarButton")
    if not toolbar.is_visible():
        problems["15: the DDP toolbar button stays after a restart"] = "hidden"
    if page.locator(".jp-ddp-Panel-button-stacks").is_enabled():
        problems["15: Stacks is disabled while ddp_magic is not loaded"] = "enabled"
    page.wait_for_timeout(1000)  # the page has had its say about the dead kernel's widgets
    said, widgets = output(page, base), int(page.evaluate(WIDGETS_JS, base))
    if "kept:" not in said or "attach it to follow" not in said or widgets:
        problems["9: the job's cell says it was kept and how to follow it"] = f"{widgets} widget outputs; {said[-300:]!r}"
    shot(page, "42_restart_not_loaded")
    return problems


def layout_checks(page: Any, pool_id: str) -> dict:
    """The kept pool's row (ddp_magic loaded or not): short facts, each once, the button in a column of its own."""
    got = page.evaluate(ROW_JS, pool_id)
    problems: dict = {}
    if got is None:
        return {"8: the kept pool's row": "none"}
    text = got["text"]
    if not got["facts"] or got["button"][0] < got["facts"][1] or "/" in text or text.count("no kernel") > 1 or "unless" in text:
        problems["8: the row is laid out as the rank rows (no path, each fact once, the button beside)"] = got
    return problems


RESTART_CLOSE = re.compile(r"^error: Comm not found for comm id [0-9a-f]{32}$")
# JupyterLab's own comm subshells (CommHandler, "perCommTarget"): the restart cancels every request in flight, and
# JupyterLab leaves the rejection of the ones it made unhandled. Nothing else cancels a future, and ours
# (target_question.ts) are caught. Seen once in a full run of the suite, ten at once; never with this file alone.
RESTART_CANCELED = re.compile(r"^pageerror: Error: Canceled future for create_subshell_request message before replies were done$")


TIMES_JS = ("() => [...document.querySelectorAll('.jp-ddp-Panel tr.jp-ddp-Rank td.jp-ddp-Rank-time,"
            " .jp-ddp-Panel .jp-ddp-RankItem .jp-ddp-Rank-time')].map(e => e.textContent)")


def seconds_of(text: str) -> float:
    """A figure as format.ts's fmtSeconds writes it (``<1 ms``, ``7 ms``, ``1.70 s``, ``2 m 05 s``), in seconds."""
    m = re.fullmatch(r"\s*(?:(<)?([\d.]+) ms|([\d.]+) s|(\d+) m (\d+) s)\s*", text)
    assert m, text
    if m.group(2):
        return 0.0 if m.group(1) else float(m.group(2)) / 1000
    return float(m.group(3)) if m.group(3) else int(m.group(4)) * 60 + int(m.group(5))


def panel_clock(page: Any) -> "tuple[str, List[float]]":
    """The panel's ``pool started in`` fact and each rank row's run time, in seconds."""
    facts = re.search(r"pool started in [^·]+", page.locator(".jp-ddp-Panel-facts").inner_text())
    return (facts.group(0).strip() if facts else ""), [seconds_of(t) for t in page.evaluate(TIMES_JS)]


def clock_checks(page: Any, started: str, running_since: float) -> dict:
    """Item 7 in the page: once attached, the panel's rank rows count the job's run time on its ranks (it ran before
    ``running_since``, the test's clock), not from the attach, and ``pool started in`` is the pool's start as it was."""
    deadline, got = time.monotonic() + 30, ("", [])
    while time.monotonic() < deadline:
        floor = time.monotonic() - running_since - 1.5  # the rows tick each second: a figure may be a second behind
        got = panel_clock(page)
        if got[0] == started and len(got[1]) == 2 and min(got[1]) >= floor:
            return {}
        time.sleep(0.5)
    return {"7: the panel's clock after attach is the ranks' and the pool's": f"{got}; before the restart {started!r}, job running for ≥ {floor + 1.5:.1f} s"}


def quiet_restart_closes(page: Any, since: int) -> None:
    """The old kernel, detaching its kept pool as it shuts down, ends the running job's live view and closes its
    widgets' comms; those closes can reach the page after JupyterLab dropped the old kernel's comms at the restart,
    and it logs each ("Comm not found", a widget id: no dashes). Racy: seen in two of three runs here, none of them
    before the page's first look at the new kernel; only what the restart window logged is dropped. A page with plain
    live widgets (no ddp_magic) logged none over three restarts. Left to the kernel side (ui/keep.py's detach).
    Also JupyterLab's canceled subshell requests (RESTART_CANCELED): call again later, they may come after."""
    lines = page.ddp_watch.lines
    lines[since:] = [line for line in lines[since:] if not RESTART_CLOSE.match(line) and not RESTART_CANCELED.match(line)]


def test_a_restart_lists_the_kept_pool_and_its_cell_says_where_it_goes_on(page: Any, server: Server, tmp_path: Any) -> None:
    """A ``--bg --keep`` job ticks; the kernel restarts. Before ``%load_ext``: the panel lists
    the pool in a row of short facts with *Attach* beside them, the toolbar's DDP button stays, Stacks is refused, and
    the job's cell holds no dead widget but a note that it was kept and how to follow it. *Attach* (which loads
    ddp_magic in its cell) takes the pool on; the job's cell then says `continued in cell [N]`, N the attach cell's."""
    with sigkill_rounds(page, server) as kept:
        gate = str(tmp_path / "restart")
        base, pool_id, _ = start_ticking(page, server, gate, 10)
        running_since = time.monotonic()  # the job ran before this: its ticks 0-10 are in the page
        kept.append(pool_id)
        started = ""
        with contextlib.suppress(playwright_api.TimeoutError):
            page.wait_for_function("() => (document.querySelector('.jp-ddp-Panel-facts') || {}).innerText?.includes('pool started in')", timeout=30_000)
            started = panel_clock(page)[0]
        assert started, "the panel says how long the pool took to start"
        before = len(page.ddp_watch.lines)
        page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()")
        wait_kernel_idle(page)
        quiet_restart_closes(page, before)
        problems = restart_checks(page, pool_id, base)
        if "8: the panel lists the kept pool before %load_ext" in problems:
            run_cell(page, 0)  # the old way: %load_ext first, then the panel lists it
            wait_prompt(page, 0)
        row = page.locator(f".jp-ddp-Panel-kept .jp-ddp-Panel-keptRow[data-id='{pool_id}']")
        expect(row).to_be_visible(timeout=60_000)
        problems.update(layout_checks(page, pool_id))
        shot(page, "42_restart_kept_row")
        page.evaluate("() => { window.jupyterapp.shell.currentWidget.content.activeCellIndex = 0; }")
        row.locator("button.jp-ddp-Panel-button-attach").click()
        page.wait_for_function(f"() => document.querySelectorAll('.jp-Notebook .jp-CodeCell').length === {base + 2}", timeout=30_000)
        number = prompt_number(wait_prompt(page, 1))
        said = output(page, 1)
        try:
            page.wait_for_function(f"(i) => document.querySelectorAll('.jp-Notebook .jp-CodeCell')[i].innerText.includes('continued in cell [{number}]')",
                                   arg=base + 1, timeout=30_000)
        except playwright_api.TimeoutError:
            problems["9: the job's cell says `continued in cell [N]` once attached"] = output(page, base + 1)[-300:]
        problems.update(clock_checks(page, started, running_since))
        shot(page, "42_restart_attached")
        attached_once(page, server, said, pool_id, gate, base, kept)
        quiet_restart_closes(page, before)
    assert not problems, "\n".join(f"{what}: {str(seen)[-200:]!r}" for what, seen in problems.items())  # each one whole
