"""File-descriptor-level capture of a worker's stdout and stderr.

fds 1 and 2 are replaced by pipes, so output from Python, from C/C++ code
(gloo, NCCL) and from child processes is all caught. A thread per pipe
forwards chunks as they come; ``sync()`` guarantees everything written before
it has been forwarded, so a cell's output always precedes its result.
"""
from __future__ import annotations

import io
import os
import sys
import threading
from typing import Callable, Dict

CHUNK = 1 << 16
_SYNC_PREFIX = b"\x00\x1bddp-sync:"


class FdCapture:
    def __init__(self, forward: Callable[[str, bytes], None]) -> None:
        self._forward = forward
        self._events: Dict[str, threading.Event] = {}
        self._tokens: Dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._counter = 0
        for fd, name in ((1, "stdout"), (2, "stderr")):
            r, w = os.pipe()
            os.dup2(w, fd)
            os.close(w)
            t = threading.Thread(target=self._pump, args=(r, name), name=f"ddp-capture-{name}", daemon=True)
            t.start()
        # Unbuffered text streams on the captured fds: prints appear at once, \r included.
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True)
        sys.__stdout__, sys.__stderr__ = sys.stdout, sys.stderr

    def _pump(self, fd: int, name: str) -> None:
        buf = b""
        while True:
            try:
                data = os.read(fd, CHUNK)
            except OSError:
                return
            if not data:
                if buf:
                    self._forward(name, buf)
                return
            buf += data
            while True:
                i = buf.find(_SYNC_PREFIX)
                if i < 0:
                    keep = _partial_marker_len(buf)
                    if len(buf) > keep:
                        self._forward(name, buf[: len(buf) - keep])
                    buf = buf[len(buf) - keep :]
                    break
                j = buf.find(b"\x00", i + len(_SYNC_PREFIX))
                if j < 0:
                    if i:
                        self._forward(name, buf[:i])
                    buf = buf[i:]
                    break
                if i:
                    self._forward(name, buf[:i])
                token, buf = buf[i + len(_SYNC_PREFIX) : j], buf[j + 1 :]
                with self._lock:
                    ev = self._events.get(name)
                    if ev is not None and self._tokens.get(name) == token:
                        ev.set()

    def sync(self, timeout: float = 5.0) -> None:
        """Return once everything written to fds 1 and 2 so far has been forwarded."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        with self._lock:
            self._counter += 1
            token = str(self._counter).encode()
            for name in ("stdout", "stderr"):
                self._events[name] = threading.Event()
                self._tokens[name] = token
        events = dict(self._events)
        for fd, name in ((1, "stdout"), (2, "stderr")):
            os.write(fd, _SYNC_PREFIX + token + b"\x00")
        for ev in events.values():
            ev.wait(timeout)


def _partial_marker_len(buf: bytes) -> int:
    """Length of the longest tail of buf that could be the start of a sync marker."""
    for k in range(min(len(buf), len(_SYNC_PREFIX) - 1), 0, -1):
        if _SYNC_PREFIX.startswith(buf[-k:]):
            return k
    return 0
