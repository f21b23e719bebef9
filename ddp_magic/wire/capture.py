"""File-descriptor-level capture of a worker's stdout and stderr, straight into the kernel's sockets.

fds 1 and 2 become authenticated sockets to the kernel, so output from
Python, from C/C++ code (gloo, NCCL) and from child processes all lands there,
with no forwarding thread in between: once ``write()`` returns, the bytes are
in the kernel's socket buffer, and a rank that dies a microsecond later still
has its last words delivered.

A cell's output must reach the kernel before the cell's result, but the two
travel on different sockets; ``sync(token)`` writes a marker into both streams,
and the kernel holds the cell's DONE until it has read both markers.
"""
from __future__ import annotations

import io
import os
import socket
import sys
from typing import Dict, List, Tuple

SYNC_PREFIX = b"\x00\x1bddp-sync:"
SYNC_END = b"\x00"


class FdCapture:
    """Rank side: fds 1 and 2 become the kernel's output sockets; ``sync`` marks a cell's end in both."""

    def __init__(self, streams: Dict[str, socket.socket]) -> None:
        for fd, name in ((1, "stdout"), (2, "stderr")):
            os.dup2(streams[name].fileno(), fd)
            streams[name].close()
        # Line-buffered text streams on the captured fds (tqdm flushes after each \r redraw).
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True)
        # Code that writes to sys.__stdout__ must reach the kernel too;
        # typeshed marks these names Final, but assigning them is what this class is for.
        sys.__stdout__ = sys.stdout  # type: ignore[misc]
        sys.__stderr__ = sys.stderr  # type: ignore[misc]

    def sync(self, token: int) -> None:
        """Flush Python's buffers and put a marker after everything written so far."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        marker = SYNC_PREFIX + str(token).encode() + SYNC_END
        for fd in (1, 2):
            try:
                _write_all(fd, marker)
            except OSError:
                pass


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


class MarkerScanner:
    """Kernel side: split a raw output stream into text bytes and sync tokens."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> Tuple[bytes, List[int]]:
        buf = self._buf + data
        out: List[bytes] = []
        tokens: List[int] = []
        while True:
            i = buf.find(SYNC_PREFIX)
            if i < 0:
                keep = _partial_marker_len(buf)
                out.append(buf[: len(buf) - keep])
                buf = buf[len(buf) - keep :]
                break
            j = buf.find(SYNC_END, i + len(SYNC_PREFIX))
            if j < 0:
                out.append(buf[:i])
                buf = buf[i:]
                break
            out.append(buf[:i])
            try:
                tokens.append(int(buf[i + len(SYNC_PREFIX) : j]))
            except ValueError:
                out.append(buf[i : j + 1])
            buf = buf[j + 1 :]
        self._buf = buf
        return b"".join(out), tokens

    def rest(self) -> bytes:
        """What is held back at EOF (a partial marker that never completed is plain text)."""
        rest, self._buf = self._buf, b""
        return rest


def _partial_marker_len(buf: bytes) -> int:
    """Length of the longest tail of buf that could be the start of a sync marker."""
    for k in range(min(len(buf), len(SYNC_PREFIX) - 1), 0, -1):
        if SYNC_PREFIX.startswith(buf[-k:]):
            return k
    return 0
