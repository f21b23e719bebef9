"""How the browser tests drive a notebook page, in JupyterLab or Notebook 7: one home for each step.

Open a notebook and wait until its kernel is idle and the extension is up (``open_notebook``, or ``front_page`` for a
whole page with its console watch, shut down after), run a cell without waiting (``run_cell``, ``append_and_run``),
wait until a cell has returned (``wait_prompt``), switch the theme, shrink a screenshot. ui_server.py is the server,
ui_probes.py what a page is asked.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
from typing import Any, Iterator, List

from ui_server import OUT, ROOT, ConsoleWatch, Server, code_cell

DOCS_IMG = os.path.join(ROOT, "docs", "img", "ui")  # where a shot is kept with DDP_MAGIC_UPDATE_DOCS_IMG=1

PATHS = {"lab": "lab/tree/{}", "notebook": "notebooks/{}"}  # JupyterLab's and Notebook 7's page of a notebook

READY_JS = (
    "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
    " const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;"
    " return k && k.status === 'idle' && !!window.jupyterapp.ddpMagic; }"
)
PROMPT_JS = "(i) => document.querySelectorAll('.jp-Notebook .jp-CodeCell')[i].querySelector('.jp-InputPrompt').textContent"


def notebook_url(server: Server, kind: str, name: str) -> str:
    """The page of notebook ``name``; JupyterLab's with ``?reset`` (no layout left by an earlier test)."""
    return server.url(PATHS[kind].format(name) + ("?reset" if kind == "lab" else ""))


def wait_ready(page: Any, watch: ConsoleWatch) -> None:
    """Until the notebook's kernel is idle and the extension is loaded; then follow what the kernel says outside cells."""
    page.wait_for_function(READY_JS, timeout=90_000)
    watch.follow_kernel()


def open_notebook(page: Any, watch: ConsoleWatch, server: Server, kind: str, name: str) -> None:
    page.goto(notebook_url(server, kind, name), timeout=60_000)
    wait_ready(page, watch)


def run_cell(page: Any, index: int) -> None:
    """Run cell ``index`` (the notebook's run-cell command), without waiting for it."""
    page.evaluate(
        "(i) => { const nb = window.jupyterapp.shell.currentWidget.content; nb.activeCellIndex = i;"
        " window.jupyterapp.commands.execute('notebook:run-cell'); }",
        index,
    )


def append_and_run(page: Any, code: str) -> None:
    """A new code cell with ``code`` at the end of the notebook, run without waiting for it."""
    page.evaluate(
        """(code) => {
            const app = window.jupyterapp;
            const nb = app.shell.currentWidget.content;
            nb.activeCellIndex = nb.widgets.length - 1;
            app.commands.execute('notebook:insert-cell-below').then(() => {
                nb.activeCell.model.sharedModel.setSource(code);
                app.commands.execute('notebook:run-cell');
            });
        }""",
        code,
    )


def prompt(page: Any, index: int) -> str:
    return str(page.evaluate(PROMPT_JS, index))


def wait_prompt(page: Any, index: int, timeout: float = 120.0) -> str:
    """Until cell ``index`` has returned (a number in its prompt, no ``*``); its prompt."""
    page.wait_for_function(f"(i) => {{ const p = ({PROMPT_JS})(i); return /\\[\\d+\\]/.test(p) && !/\\*/.test(p); }}",
                           arg=index, timeout=timeout * 1000)
    return prompt(page, index)


def prompt_number(text: str) -> int:
    m = re.match(r"^\s*\[(\d+)\]", text)
    assert m, f"the cell has no prompt number: {text!r}"
    return int(m.group(1))


# The current notebook's kernel status; each step may be null for a moment (a SIGKILL's restart has no session then)
KERNEL_STATUS_JS = "window.jupyterapp.shell.currentWidget?.sessionContext?.session?.kernel?.status"


def wait_kernel_status(page: Any, status: str, timeout: float = 120.0) -> None:
    page.wait_for_function(f"() => {KERNEL_STATUS_JS} === '{status}'", timeout=timeout * 1000)


def wait_kernel_idle(page: Any, timeout: float = 120.0) -> None:
    wait_kernel_status(page, "idle", timeout)


def set_theme(page: Any, dark: bool) -> None:
    name = "JupyterLab Dark" if dark else "JupyterLab Light"
    page.evaluate("(t) => window.jupyterapp.commands.execute('apputils:change-theme', {theme: t})", name)
    page.wait_for_function(f"() => document.body.dataset.jpThemeLight === '{'false' if dark else 'true'}'", timeout=30_000)
    page.wait_for_timeout(500)


def is_dark(page: Any) -> bool:
    """Whether the page shows a dark theme now (JupyterLab's and Notebook 7's body attribute)."""
    return bool(page.evaluate("() => document.body.dataset.jpThemeLight === 'false'"))


def shut_down(page: Any) -> None:
    """The notebook's kernel, with its workers (the other tests do not need it)."""
    page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")


def no_errors(page: Any) -> None:
    """No error in the page's console (ui_server.KNOWN_NOISE aside), no kernel output that belongs to no cell."""
    watch = page.ddp_watch
    errors, orphans, stacks = watch.errors(), watch.collect(), list(watch.stacks)
    if errors or orphans:
        watch.forget()
    assert not errors, "\n".join(errors[:10] + stacks[:2])
    assert not orphans, orphans[:5]


@contextlib.contextmanager
def front_page(server: Server, browser: Any, notebook: str, cells: List[str], height: int, panel: bool,
               kind: str = "lab", width: int = 1200) -> Iterator[Any]:
    """A page on ``notebook`` (these cells) in JupyterLab or Notebook 7, its kernel idle, JupyterLab's left area
    closed, toasts hidden; the DDP panel open when ``panel``; ``page.ddp_watch`` its console. Its kernel is shut down
    after."""
    server.write_notebook(notebook, [code_cell(c) for c in cells])
    context = browser.new_context(viewport={"width": width, "height": height}, device_scale_factor=1)
    pg = context.new_page()
    pg.ddp_watch = ConsoleWatch(pg)  # every console error of the page: the tests' last check (``no_errors``)
    try:
        open_notebook(pg, pg.ddp_watch, server, kind, notebook)
        if kind == "lab":
            pg.evaluate("() => { const s = window.jupyterapp.shell; if (!s.leftCollapsed) { s.collapseLeft(); } }")
        if panel:
            pg.evaluate("() => window.jupyterapp.commands.execute('ddp-magic:show-panel')")
        pg.add_style_tag(content=".Toastify { display: none !important; }")
        yield pg
    finally:
        try:
            shut_down(pg)
        finally:
            context.close()


def shrink(path: str) -> None:
    """A 128-colour palette PNG: the UI's flat colours survive; the file is a fraction of the size."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


def luminance(png: bytes) -> float:
    """The mean relative luminance (0 black .. 1 white) of a screenshot."""
    from PIL import Image, ImageStat

    with Image.open(io.BytesIO(png)) as im:
        return float(ImageStat.Stat(im.convert("L")).mean[0]) / 255.0


def keep_shot(page: Any, part: Any, name: str, docs: bool = True, height: int = 640) -> str:
    """A shot of ``part`` (a locator; its top ``height`` px) to ``$DDP_MAGIC_UI_OUT/name`` and, with
    ``DDP_MAGIC_UPDATE_DOCS_IMG=1`` and ``docs``, to docs/img/ui/ (a small palette PNG). Its path in OUT."""
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, name)
    part.scroll_into_view_if_needed()
    box = part.bounding_box()
    page.screenshot(path=path, clip={"x": box["x"], "y": max(0, box["y"]), "width": box["width"], "height": min(box["height"], height)})
    if docs and os.environ.get("DDP_MAGIC_UPDATE_DOCS_IMG") == "1":
        kept = os.path.join(DOCS_IMG, name)
        shutil.copyfile(path, kept)
        shrink(kept)
    return path
