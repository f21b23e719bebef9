"""One cell with both ``%load_ext ddp_magic`` and ``%ddp attach``: the attach waits a moment for the page's hello.

``%ddp attach`` replays each kept rank from what the page says it received (kernel/keep/front.py), and the page
says it in the ``ddp_magic`` comm's hello (ui/labcomm.py). The page opens that comm once it finds our target, and a
target registered by this very cell is found only while the cell runs: the extension asks over a kernel subshell
while a cell that names ddp_magic runs (labextension/src/busy_probe.ts), then opens the comm over JupyterLab's comm
subshell, handled on that subshell's thread while the attach waits on the main one. So the attach waits, at most
``WAIT_S``, and only when all of these hold:

- ddp_magic was loaded in this very cell (a page had no chance before it; after an earlier cell its comm is open);
- no comm of ours opened since the load (no hello came yet);
- a front end of ours is plausible: the kernel has subshells (ipykernel >= 7: without them the page cannot reach it
  while the cell runs) and the request came from a notebook page (JupyterLab and Notebook 7 send ``cellId`` in an
  execute request's metadata; nbclient does not), or a subshell is open (our probe's).

A front end that is not ours (VS Code, nbclient) pays at most ``WAIT_S``, and only in that same-cell case: the
attach then goes on from the kernel's own count, as before (docs/keep.md). A page of ours that is asking (a subshell
is open: its probe's) but slow to open the comm on a loaded machine gets ``MORE_S`` more, once.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Optional

from ..logs import log

WAIT_S = 2.0  # the most an attach waits for a page's hello
MORE_S = 3.0  # and then, while a page of ours is asking (a subshell is open), at most this more

_opened = threading.Event()  # a comm of ours opened since the last load (its hello was heard first)
_loaded_in: Optional[str] = None  # the msg_id of the execute request whose cell loaded ddp_magic
last_wait: Optional[float] = None  # the seconds the last attach waited (None: it did not)


def _parent(kernel: Any) -> dict:
    get_parent = getattr(kernel, "get_parent", None)
    try:
        parent = get_parent("shell") if get_parent is not None else None
    except Exception:
        log.debug("lab_hello: no parent request", exc_info=True)
        parent = None
    return parent if isinstance(parent, dict) else {}


def _msg_id(parent: dict) -> Optional[str]:
    return (parent.get("header") or {}).get("msg_id") or None


def loaded(kernel: Any) -> None:
    """ddp_magic was (re)loaded (labcomm.register): no page has heard it yet."""
    global _loaded_in
    _opened.clear()
    _loaded_in = _msg_id(_parent(kernel))


def opened() -> None:
    """A page opened a comm of ours; what its hello said was taken before this (labcomm._on_open)."""
    _opened.set()


def _asking(kernel: Any) -> bool:
    """Whether a subshell is open: the probe of a page that uses them (ours asks for the target over one)."""
    try:
        return bool(kernel.shell_channel_thread.manager.list_subshell())
    except Exception:
        log.debug("lab_hello: could not list the subshells", exc_info=True)
        return False


def _plausible(kernel: Any, parent: dict) -> bool:
    """Whether a page with our extension may be there to say hello while this cell runs."""
    if not getattr(kernel, "_supports_kernel_subshells", False):
        return False
    return "cellId" in (parent.get("metadata") or {}) or _asking(kernel)


def should_wait(kernel: Any) -> bool:
    """The same-cell case with no hello yet and a page of ours plausible (the module's docstring)."""
    parent = _parent(kernel)
    return _loaded_in is not None and _msg_id(parent) == _loaded_in and not _opened.is_set() and _plausible(kernel, parent)


def wait_for_hello(shell: Any, timeout: float = WAIT_S) -> Optional[float]:
    """Before ``%ddp attach``: wait for the page's hello where the same-cell case says to; the seconds waited (None:
    no wait; also kept as ``last_wait``, what a test reads). Whether it came, ``heard`` tells."""
    global last_wait
    kernel = getattr(shell, "kernel", None)
    last_wait = None
    if kernel is None or not should_wait(kernel):
        return None
    t0 = time.monotonic()
    came = _opened.wait(timeout) or (_asking(kernel) and _opened.wait(MORE_S))
    waited = time.monotonic() - t0
    log.debug("lab_hello: %s after %.2f s", "the page's hello came" if came else "no hello", waited)
    last_wait = waited
    return waited


def heard() -> bool:
    """Whether a comm of ours opened since the load."""
    return _opened.is_set()
