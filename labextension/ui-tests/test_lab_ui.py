"""Browser tests of the JupyterLab extension: real JupyterLab, headless Chromium from Debian.

The session's one server and browser (ui_fixtures.py), one page for the whole module; the tests run in order on the same notebook and
kernel, like a user would: run a ``%%ddp -n 2`` cell and watch the status bar
and the DDP panel follow it, restart the pool from the panel and see new pids,
ask for a restart while a cell runs (it waits for the cell, and says so), show
%ddp_env, check the highlighting of a %%ddp cell, stop the pool. Screenshots go
to ``$DDP_MAGIC_UI_OUT`` (default ``build/ui-tests/``); with
``DDP_MAGIC_UPDATE_DOCS_IMG=1`` the representative one is copied to
``docs/img/labextension.png``.

Python Playwright drives ``/usr/bin/chromium`` (``apt-get install -y chromium``);
no browser is ever downloaded (never ``playwright install``).
"""
from __future__ import annotations

import os
import re
import shutil
from typing import Any, Dict, Iterator, List

import pytest
from ui_pages import append_and_run, open_notebook, shut_down, wait_kernel_idle, wait_kernel_status
from ui_server import OUT, ROOT, SECONDS, ConsoleWatch, Server, code_cell

NOTEBOOK = "ddp_ui.ipynb"
CELL = """%%ddp -n 2 --no-widget
import time, torch.distributed as dist
for step in range(8):
    print(f"step {step} on rank {dist.get_rank()}", flush=True)
    time.sleep(0.5)
dist.get_rank()"""

pytestmark = [pytest.mark.slow, pytest.mark.browser]

playwright_api = pytest.importorskip("playwright.sync_api", reason="Python Playwright is in requirements-dev.txt")
expect = playwright_api.expect


class Lab:
    """A JupyterLab page on the shared server (ui_fixtures.py), and the screenshots it saved."""

    def __init__(self, server: Server, browser: Any) -> None:
        self.server = server
        self.shots: Dict[str, str] = {}
        server.write_notebook(NOTEBOOK, [code_cell("%load_ext ddp_magic"), code_cell(CELL)])
        self.context = browser.new_context(viewport={"width": 1400, "height": 820}, device_scale_factor=1)
        self.page = self.context.new_page()
        self.watch = ConsoleWatch(self.page)

    def shot(self, name: str, **kw: Any) -> str:
        os.makedirs(OUT, exist_ok=True)
        path = os.path.join(OUT, name)
        self.page.mouse.move(700, 5)
        self.page.screenshot(path=path, **kw)
        self.shots[name] = path
        return path

    def close(self) -> None:
        self.context.close()


@pytest.fixture(scope="module")
def lab(server: Server, browser: Any) -> Iterator[Lab]:
    lab = Lab(server, browser)
    try:
        page = lab.page
        open_notebook(page, lab.watch, server, "lab", NOTEBOOK)
        page.evaluate("() => window.jupyterapp.commands.execute('application:toggle-left-area')")
        yield lab
    finally:
        # the kernel of this notebook is not needed by the other test files: shut it down with its workers
        try:
            shut_down(lab.page)
        finally:
            lab.close()
    if os.environ.get("DDP_MAGIC_UPDATE_DOCS_IMG") == "1" and "live.png" in lab.shots:
        shutil.copyfile(lab.shots["live.png"], os.path.join(ROOT, "docs", "img", "labextension.png"))


def _status(page: Any) -> Any:
    return page.locator(".jp-ddp-StatusItem")


def _pids(page: Any) -> List[str]:
    return page.locator(".jp-ddp-Panel .jp-ddp-Rank .jp-ddp-Rank-pid").all_inner_texts()


def _states(page: Any) -> List[str]:
    return page.locator(".jp-ddp-Panel .jp-ddp-Rank .jp-ddp-Rank-state").all_inner_texts()


def _run_all(page: Any) -> None:
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")  # do not wait for the run


def _run_code(page: Any, code: str) -> None:
    """Append a code cell with ``code`` at the end of the notebook and run it (without waiting)."""
    append_and_run(page, code)


def _hide_toasts(page: Any) -> None:
    page.add_style_tag(content=".Toastify { display: none !important; }")


def test_status_bar_and_panel_follow_a_ddp_cell(lab: Lab) -> None:
    page = lab.page
    expect(_status(page)).to_be_hidden()  # no pool yet: nothing in the status bar
    expect(page.locator(".jp-ddp-ToolbarButton")).to_be_hidden()  # nor in the toolbar (ddp_magic not loaded yet)
    _run_all(page)
    expect(_status(page)).to_have_text(re.compile(rf"^DDP 2×gloo · (starting|running)( {SECONDS})?$"), timeout=90_000)
    _status(page).click()  # opens the panel
    panel = page.locator("#ddp-magic-panel")
    expect(panel).to_be_visible()
    expect(_status(page)).to_have_text(re.compile(rf"^DDP 2×gloo · running {SECONDS}$"), timeout=60_000)
    expect(panel.locator(".jp-ddp-Rank")).to_have_count(2)
    expect(panel.locator(".jp-ddp-Rank-last").nth(1)).to_have_text(re.compile(r"step [1-7] on rank 1"), timeout=20_000)
    assert _states(page) == ["running", "running"]
    assert all(p.isdigit() for p in _pids(page))
    assert [d.strip() for d in panel.locator(".jp-ddp-Rank-device").all_inner_texts()] == ["cpu", "cpu"]
    expect(panel.locator(".jp-ddp-Env-verdict")).to_have_text(re.compile(r"^✓ \d+ checks passed$"))  # the cell's words (checks_verdict)
    assert panel.locator(".jp-ddp-Env-verdict").inner_text() == f"✓ {panel.locator('.jp-ddp-Env-all li').count()} checks passed"
    expect(page.locator(".jp-ddp-ToolbarButton")).to_be_visible()
    # the clock moves between the kernel's messages
    first = _status(page).inner_text()
    page.wait_for_timeout(1200)
    assert _status(page).inner_text() != first
    lab.shot("running.png")
    expect(_status(page)).to_have_text("DDP 2×gloo · ready", timeout=60_000)
    assert _states(page) == ["done", "done"]
    expect(panel.locator(".jp-ddp-Rank-lastText").nth(0)).to_have_text("step 7 on rank 0")
    lab.shot("done.png")
    # the same cell again, now that the comm is open: the shot for the README
    page.evaluate(
        "() => { const nb = window.jupyterapp.shell.currentWidget.content; nb.activeCellIndex = 1;"
        " window.jupyterapp.commands.execute('notebook:run-cell'); }"
    )
    expect(panel.locator(".jp-ddp-Rank-last").nth(1)).to_have_text(re.compile(r"step [3-6] on rank 1"), timeout=30_000)
    assert re.match(rf"DDP 2×gloo · running {SECONDS}$", _status(page).inner_text())
    lab.shot("live.png")
    expect(_status(page)).to_have_text("DDP 2×gloo · ready", timeout=60_000)


def test_restart_from_the_panel_gives_new_pids(lab: Lab) -> None:
    page = lab.page
    before = _pids(page)
    page.locator(".jp-ddp-Panel-button-restart").click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("a restart loses them")  # names the %%ddp cell defined live on the workers
    dialog.locator(".jp-Dialog-button", has_text="Restart").click()
    expect(page.locator(".jp-ddp-Panel .jp-ddp-Rank-pid").first).not_to_have_text(before[0], timeout=60_000)
    expect(_status(page)).to_have_text("DDP 2×gloo · ready", timeout=30_000)
    after = _pids(page)
    assert len(after) == 2 and all(p.isdigit() for p in after)
    assert set(after).isdisjoint(before), (before, after)
    assert _states(page) == ["ready", "ready"]
    expect(page.locator(".jp-ddp-Panel-message")).to_contain_text("ready in")
    lab.shot("restarted.png")


def test_a_restart_asked_while_a_cell_runs_waits_for_it(lab: Lab) -> None:
    page = lab.page
    before = _pids(page)
    ended = "the cell ended on pids"  # what the pool's ranks were when the running cell ended: the restart came after
    _run_code(page, f"import time; time.sleep(4); print({ended!r}, *get_ipython().magics_manager.registry['DDPMagics'].pool.pids)")
    wait_kernel_status(page, "busy", 20)
    expect(page.locator(".jp-ddp-Panel-button-restart")).to_have_text("Restart (waits)")
    page.locator(".jp-ddp-Panel-button-restart").click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("A cell is running")
    expect(dialog).to_contain_text("waits for the running cell to end")
    dialog.locator(".jp-Dialog-button", has_text="Restart after the cell").click()
    expect(page.locator(".jp-ddp-Panel-message")).to_contain_text("waits for the running cell")
    expect(_status(page)).to_contain_text("restart waits for the cell")
    lab.shot("waits.png")
    expect(page.locator(".jp-ddp-Panel .jp-ddp-Rank-pid").first).not_to_have_text(before[0], timeout=60_000)
    expect(_status(page)).to_have_text("DDP 2×gloo · ready", timeout=30_000)
    assert set(_pids(page)).isdisjoint(before)
    said = page.locator(".jp-Notebook .jp-CodeCell").last.locator(".jp-OutputArea-output", has_text=ended).inner_text()
    assert sorted(said.split(ended)[1].split()) == sorted(before), f"the pool was restarted before the cell ended: {said} (pids before: {before})"


def test_env_command_shows_the_live_report(lab: Lab) -> None:
    page = lab.page
    page.evaluate("() => window.jupyterapp.commands.execute('ddp-magic:show-env')")
    report = page.locator(".jp-Dialog .jp-ddp-EnvReport")
    expect(report).to_be_visible(timeout=30_000)
    expect(report.locator(".jp-ddp-EnvReport-verdict")).to_have_text(re.compile(r"^(✓ \d+ checks? passed|! \d+ warnings?, \d+ checks? passed)"))
    assert report.locator(".jp-ddp-Check").count() >= 3
    headers = report.locator(".jp-ddp-EnvReport-table th").all_inner_texts()
    assert "RANK" in headers and "MASTER_PORT" in headers
    _hide_toasts(page)
    lab.shot("env.png")
    page.locator(".jp-Dialog .jp-Dialog-button", has_text="Close").click()


def test_ddp_cells_are_highlighted_as_python(lab: Lab) -> None:
    page = lab.page
    cell = page.locator(".jp-Notebook .jp-CodeCell").nth(1)
    expect(cell.locator(".cm-ddp-magicLine .cm-ddp-magic")).to_have_text("%%ddp")
    colors = cell.evaluate(
        """(cell) => {
            const spans = [...cell.querySelectorAll('.cm-line span')];
            const kw = spans.find(s => s.textContent === 'import');
            const probe = document.createElement('span');
            probe.style.color = 'var(--jp-mirror-editor-keyword-color)';
            cell.appendChild(probe);
            const want = getComputedStyle(probe).color;
            probe.remove();
            return {keyword: kw ? getComputedStyle(kw).color : null, want, plain: getComputedStyle(cell.querySelector('.cm-line')).color};
        }"""
    )
    assert colors["keyword"] == colors["want"] != colors["plain"], colors


def test_palette_and_menu_hold_the_commands(lab: Lab) -> None:
    page = lab.page
    labels = page.evaluate(
        "() => ['ddp-magic:restart-pool', 'ddp-magic:stop-pool', 'ddp-magic:show-env', 'ddp-magic:show-panel']"
        ".map(c => window.jupyterapp.commands.label(c))"
    )
    assert labels == ["Restart DDP Pool", "Stop DDP Pool", "Show %ddp_env", "Show DDP Pool Panel"]
    page.locator(".jp-ddp-ToolbarButton").click()
    menu = page.locator(".lm-Menu.jp-ddp-Menu")
    expect(menu).to_be_visible()
    expect(menu).to_contain_text("Restart DDP Pool")
    page.keyboard.press("Escape")


def test_interrupt_from_the_panel_interrupts_every_rank(lab: Lab) -> None:
    page = lab.page
    _run_code(page, "%%ddp --no-widget\nimport time\nfor i in range(600):\n    print('tick', i, flush=True)\n    time.sleep(0.1)")
    expect(_status(page)).to_have_text(re.compile(r"^DDP 2×gloo · running"), timeout=30_000)
    expect(page.locator(".jp-ddp-Panel .jp-ddp-Rank-last").nth(1)).to_have_text(re.compile(r"tick \d+"), timeout=20_000)
    interrupt = page.locator(".jp-ddp-Panel-button-interrupt")
    expect(interrupt).to_be_enabled()
    interrupt.click()  # the kernel's own interrupt: the magic interrupts every rank
    expect(_status(page)).to_have_text(re.compile(r"^DDP 2×gloo · ready · In\[\d+\]: interrupted$"), timeout=30_000)
    assert _status(page).inner_text() == f"DDP 2×gloo · ready · In[{_prompt(page)}]: interrupted"
    assert _states(page) == ["ready", "ready"]  # released and ready for the next cell, their state kept
    stderr = page.locator(".jp-Notebook .jp-CodeCell").last.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    expect(stderr.last).to_contain_text("KeyboardInterrupt")
    lab.shot("interrupted.png")


def _prompt(page: Any) -> int:
    """The prompt number of the notebook's last cell, once it has run (the prompt may follow the status bar by a moment)."""
    prompt = page.locator(".jp-Notebook .jp-CodeCell").last.locator(".jp-InputPrompt")
    expect(prompt).to_have_text(re.compile(r"^\s*\[\d+\]:?\s*$"), timeout=30_000)
    m = re.match(r"^\s*\[(\d+)\]", prompt.inner_text())
    assert m
    return int(m.group(1))


def test_a_failing_rank_is_named_in_the_status_bar(lab: Lab) -> None:
    page = lab.page
    _run_code(page, "%%ddp --no-widget\nimport torch.distributed as dist\nif dist.get_rank() == 1:\n    raise ValueError('bad shard')\nprint('fine')")
    expect(_status(page)).to_have_text(re.compile(r"^DDP 2×gloo · ready · In\[\d+\]: rank 1 failed, recovered$"), timeout=30_000)
    n = _prompt(page)
    assert _status(page).inner_text() == f"DDP 2×gloo · ready · In[{n}]: rank 1 failed, recovered"  # the cell beside the error
    assert _states(page) == ["ready", "ready"]  # the pool recovered: both ranks run the next cell
    blamed = page.locator(".jp-ddp-Panel tr.jp-ddp-Rank[data-last-cause='root']")
    expect(blamed).to_have_count(1)
    assert blamed.get_attribute("data-rank") == "1"
    expect(page.locator(".jp-ddp-Panel .jp-ddp-Rank-lastNote")).to_have_text(f"In[{n}]: raised")
    lab.shot("failed.png")


def test_stop_then_nothing_in_the_status_bar_and_commands_say_why(lab: Lab) -> None:
    page = lab.page
    page.locator(".jp-ddp-Panel-button-stop").click()
    dialog = page.locator(".jp-Dialog")
    if dialog.count():  # only when the workers hold names
        dialog.locator(".jp-Dialog-button", has_text="Stop").click()
    expect(_status(page)).to_be_hidden(timeout=30_000)
    expect(page.locator(".jp-ddp-Panel-summary")).to_contain_text("No pool is running")
    restart = page.locator(".jp-ddp-Panel-button-restart")
    expect(restart).to_be_disabled()
    assert "no pool to restart" in (restart.get_attribute("title") or "")


def test_kernel_restart_forgets_the_pool_and_a_new_one_is_followed(lab: Lab) -> None:
    page = lab.page
    _run_code(page, "%%ddp -n 2 --no-widget\nprint('again')")
    expect(_status(page)).to_have_text("DDP 2×gloo · ready", timeout=90_000)
    page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()")
    expect(_status(page)).to_be_hidden(timeout=30_000)
    wait_kernel_idle(page, 60)
    expect(page.locator(".jp-ddp-Panel-summary")).to_contain_text("not loaded in this kernel")
    _run_all(page)  # %load_ext, then the %%ddp cell at once: followed live from its start
    expect(_status(page)).to_have_text(re.compile(rf"^DDP 2×gloo · running {SECONDS}$"), timeout=90_000)
    expect(_status(page)).to_have_text("DDP 2×gloo · ready", timeout=60_000)


def test_no_console_error_and_nothing_said_outside_a_cell(lab: Lab) -> None:
    """After all of the above: no error in the page's console (ui_server.KNOWN_NOISE aside), no kernel output that
    belongs to no cell (JupyterLab's log console)."""
    assert not lab.watch.errors(), "\n".join(lab.watch.errors()[:10])
    assert not lab.watch.collect(), lab.watch.collect()[:5]
