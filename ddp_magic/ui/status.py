"""The status view's entry point: which mode this front end gets, and showing the view of one cell.

The view itself: status_render.py (the summary line and the words, pure functions
of a snapshot), status_tables.py (the rank table, the env, the whole page),
status_display.py (widget, html, text or off: where it goes), status_view.py
(``StatusView``, the pool Listener that presents; extra sections plug in through
``status_view.SECTION_FACTORIES``), ticker.py (the one thread that renders live
views), progress.py (each rank's live line and tqdm bar) and colours.py.
The magics call ``show_status``; the names others use are importable from here.

Importing this module does not import ipywidgets; showing a widget does.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Mapping, Optional

from ..logs import log
from .status_display import WIDGET_MIME
from .status_render import state_label
from .status_view import StatusView

__all__ = ["OFF_VALUES", "WIDGET_MIME", "StatusView", "choose_mode", "show_status", "state_label"]

OFF_VALUES = ("0", "off", "false", "no")


def choose_mode(enabled: bool = True, environ: Mapping[str, str] = os.environ) -> str:
    """widget in a kernel with ipywidgets, html in a kernel without, text in plain IPython, off when disabled."""
    if not enabled or str(environ.get("DDP_MAGIC_WIDGET", "1")).strip().lower() in OFF_VALUES:
        return "off"
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return "off"
    if shell is None:
        return "off"
    if getattr(shell, "kernel", None) is None:
        return "text"
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return "html"
    return "widget"


def show_status(pool: Any, enabled: bool = True, **options: Any) -> Optional[StatusView]:
    """Create and display the status view of a cell for ``pool``; None when it is off or cannot be shown."""
    mode = choose_mode(enabled)
    if mode == "off":
        return None
    try:
        view = StatusView(pool.nproc, pool=pool, mode=mode, **options)
        return view.show()
    except Exception as e:  # the view is never worth failing a cell for
        log.debug("no status view", exc_info=True)
        print(f"ddp_magic: no status view ({type(e).__name__}: {e})", file=sys.stderr)
        return None
