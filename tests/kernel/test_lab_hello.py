"""``%ddp attach`` in the cell that loads ddp_magic waits for a page's hello only where one may come (ui/lab_hello.py).

A real kernel, no page of ours: nbclient's execute request (no ``cellId``, no subshell open) never waits; a notebook
page's request (``cellId`` in its metadata, as JupyterLab, Notebook 7 and VS Code send) waits, bounded, hears no
hello and goes on with the kernel's own count (here: no kept pool, and it says so); an attach in a later cell never
waits. The page's side (its hello arriving while the cell runs) is labextension/ui-tests/test_keep_ui.py's. Each
case runs twice (``%reload_ext``: a user pastes the load again).
"""
from __future__ import annotations

import queue
import time
from typing import Any, Dict, Optional

from kernel_helper import ANSI, Kernel

CELL = "%reload_ext ddp_magic\n%ddp attach"
NONE_KEPT = "%ddp attach: no kept pool"
HELLO = "__import__('ddp_magic.ui.lab_hello', fromlist=['_'])"


def as_a_page(k: Kernel, code: str, timeout: float = 120.0) -> Dict[str, Any]:
    """Run ``code`` as a notebook page sends it: ``cellId`` in the request's metadata. Its error (ename, evalue), if any."""
    msg = k.kc.session.msg("execute_request", {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                                               "allow_stdin": False, "stop_on_error": True}, metadata={"cellId": "c0ffee"})
    k.kc.shell_channel.send(msg)
    deadline, out = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        try:
            m = k.kc.get_iopub_msg(timeout=0.5)
        except queue.Empty:
            continue
        if m["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
            continue
        if m["msg_type"] == "error":
            out = {"ename": m["content"]["ename"], "evalue": ANSI.sub("", m["content"]["evalue"])}
        if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
            return out
    raise TimeoutError(code)


def waited(k: Kernel) -> Optional[float]:
    """The seconds the last attach waited for a hello (None: it did not wait)."""
    value = k.value(f"str({HELLO}.last_wait)")
    return None if value == "None" else float(value)


def test_the_attach_in_the_loading_cell_waits_only_for_a_plausible_page(tmp_path: Any) -> None:
    k = Kernel(extra_env={"JUPYTER_RUNTIME_DIR": str(tmp_path), "JPY_SESSION_NAME": "hello.ipynb"})
    try:
        for _ in range(2):
            ex = k.run(CELL)  # nbclient, papermill: nothing of ours can say hello
            assert ex.error and NONE_KEPT in ex.error[1], ex.error
            assert waited(k) is None, "a front end that is not ours, without subshells: no wait"

            err = as_a_page(k, CELL)  # a page: it may be ours; none says hello here
            assert NONE_KEPT in err.get("evalue", ""), err
            assert waited(k) is not None, "a notebook page's cell that loads ddp_magic and attaches waits for its hello"
            assert k.value(f"str({HELLO}.heard())") == "False"

            err = as_a_page(k, "%ddp attach")  # a later cell: a page of ours had its chance, its comm would be open
            assert NONE_KEPT in err.get("evalue", ""), err
            assert waited(k) is None
    finally:
        k.shutdown()
