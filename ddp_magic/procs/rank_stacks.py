"""A rank's side of ``%ddp stacks`` and ``job.stacks()``: its threads' Python stacks now, read by a thread of its own.

The reader thread (worker.py) answers a STACK request that carries an ``id`` here, while
the main thread runs whatever it runs: a C collective, a long C op, a data loader's wait,
``time.sleep``. Each of those releases the GIL, so ``sys._current_frames`` reads the main
thread's frames at once; when it cannot (an interpreter without it, an error while
walking the frames), ``faulthandler.dump_traceback`` writes them to a temporary file and
the reply carries that text instead. The frames go as plain data (file, line, function,
source line) and the kernel groups and words them (kernel/stack_groups.py): ranks whose
stacks differ only in line numbers are shown once.

``native``: py-spy's native frames too, when py-spy is installed on the rank's host (an
option, not a dependency); it runs on a short thread of its own, so the reader stays free.
"""
from __future__ import annotations

import faulthandler
import linecache
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Any, Callable, Dict, List, Optional

from ..logs import log
from ..wire import protocol as P

# ddp_magic's own frames (the cell runner, the collective record's wrapper) are not the user's concern
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
NATIVE_TIMEOUT_S = 10.0  # py-spy's dump of one process, at most
NO_PY_SPY = "py-spy is not installed on this rank's host (pip install py-spy): only the Python frames are shown"
Frame = List[Any]  # [filename, lineno, function, source line]


def _frames(frame: Any, from_cell: bool) -> List[Frame]:
    """A thread's frames, outermost first, without ddp_magic's own; ``from_cell``: from the cell's first frame on."""
    stack: List[Frame] = []
    while frame is not None:
        code = frame.f_code
        stack.append([code.co_filename, frame.f_lineno, code.co_name])
        frame = frame.f_back
    stack.reverse()
    if from_cell:
        first = next((i for i, f in enumerate(stack) if str(f[0]).startswith("<ddp-cell")), None)
        stack = stack[first:] if first is not None else stack
    kept = [f for f in stack if not os.path.abspath(str(f[0])).startswith(_PACKAGE_DIR)]
    return [[f[0], f[1], f[2], linecache.getline(str(f[0]), int(f[1])).strip()] for f in kept]


def threads(main_ident: int, in_cell: bool, all_threads: bool) -> List[Dict[str, Any]]:
    """The main thread's stack (from the cell's first frame on; none when idle), and with ``all_threads`` every
    other thread's but ddp_magic's own (the reader, the peek thread, the memory sampler)."""
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    out: List[Dict[str, Any]] = [{"name": "main", "main": True, "frames": _frames(frames.get(main_ident), True) if in_cell else []}]
    if all_threads:
        for ident, frame in sorted(frames.items(), key=lambda kv: names.get(kv[0], "")):
            name = names.get(ident, f"thread {ident:#x}")
            if ident == main_ident or ident == threading.get_ident() or name.startswith("ddp-"):
                continue
            out.append({"name": name, "main": False, "frames": _frames(frame, False)})
    return out


def faulthandler_text(all_threads: bool) -> str:
    """The fallback: faulthandler's own dump of the threads (it needs no frame objects), as text."""
    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(file=f, all_threads=all_threads)
        f.seek(0)
        return f.read()


def native_text(pid: int) -> Dict[str, str]:
    """py-spy's dump of this process with native frames, or why there is none."""
    exe = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))  # a venv's, unactivated
    if exe is None:
        return {"native_error": NO_PY_SPY}
    try:
        done = subprocess.run([exe, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True, timeout=NATIVE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.debug("py-spy dump failed", exc_info=True)
        return {"native_error": f"py-spy dump failed: {e}"}
    if done.returncode != 0:
        return {"native_error": f"py-spy dump failed: {(done.stderr or done.stdout).strip()[-400:]}"}
    return {"native": done.stdout}


def answer(msg: dict, send: Callable[..., None], rank: int, main_ident: int, in_cell: bool, collective: Optional[dict]) -> None:
    """Reply to an on-demand STACK (``msg``: id, all_threads, native) from the reader thread; native frames on a thread of their own."""
    fields: Dict[str, Any] = {"id": msg["id"], "rank": rank, "in_cell": in_cell, "collective": collective}
    try:
        fields["threads"] = threads(main_ident, in_cell, bool(msg.get("all_threads")))
    except Exception:  # the frames could not be walked: faulthandler's text says where the threads are
        log.debug("rank %d: reading the stacks failed; faulthandler's dump instead", rank, exc_info=True)
        fields["text"] = faulthandler_text(bool(msg.get("all_threads")))
    if not msg.get("native"):
        send(P.STACK, **fields)
        return

    def with_native() -> None:
        fields.update(native_text(os.getpid()))
        send(P.STACK, **fields)

    threading.Thread(target=with_native, name="ddp-native-stacks", daemon=True).start()
