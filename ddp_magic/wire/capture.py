"""File-descriptor-level capture of a worker's stdout and stderr, straight into the kernel's sockets.

fds 1 and 2 become authenticated sockets to the kernel, so output from
Python, from C/C++ code (gloo, NCCL) and from child processes all lands there,
with no forwarding thread in between: once ``write()`` returns, the bytes are
in the kernel's socket buffer, and a rank that dies a microsecond later still
has its last words delivered.

A cell's output must reach the kernel before the cell's result, but the two
travel on different sockets; ``sync(token)`` writes a marker into a stream,
and the kernel holds the cell's DONE until it has read the markers the DONE names.
A stream nothing was written to since its last marker needs no new one: its DONE
names that older marker, which the kernel has read already (it held an earlier DONE
for it), so a quiet cell's DONE counts at once, without two more reads per rank.
"Nothing written" is the socket's own count of bytes written (TCP's bytes acked plus
its send queue), which sees C code and child processes too; through a TLS relay's
socketpair, what the relay took from it plus what it still holds (tls.bytes_written).
"""
from __future__ import annotations

import fcntl
import io
import os
import socket
import struct
import sys
import termios
from typing import Dict, List, Optional, Tuple

from . import tls

SYNC_PREFIX = b"\x00\x1bddp-sync:"
SYNC_END = b"\x00"
SPOOL_BODY = b"spool="  # a kept rank's spool starts: SYNC_PREFIX + SPOOL_BODY + its offset + SYNC_END (``spool_marker``)
_TCP_INFO_ACKED = 120  # offset of tcpi_bytes_acked in Linux's struct tcp_info (since 4.1)


class FdCapture:
    """Rank side: fds 1 and 2 become the kernel's output sockets; ``sync`` marks a cell's end where it is needed."""

    def __init__(self, streams: Dict[str, socket.socket]) -> None:
        for fd, name in ((1, "stdout"), (2, "stderr")):
            os.dup2(streams[name].fileno(), fd)
        self._socks = streams  # kept open (close-on-exec) to read what went through fds 1 and 2
        self._marked: Dict[str, int] = {}  # stream -> the token of its last marker
        self._written_at_mark: Dict[str, Optional[int]] = {}  # stream -> the bytes written when that marker went
        # Line-buffered text streams on the captured fds (tqdm flushes after each \r redraw).
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True)
        # Code that writes to sys.__stdout__ must reach the kernel too;
        # typeshed marks these names Final, but assigning them is what this class is for.
        sys.__stdout__ = sys.stdout  # type: ignore[misc]
        sys.__stderr__ = sys.stderr  # type: ignore[misc]

    def sync(self, token: int, named: bool = False) -> Dict[str, int]:
        """Flush Python's buffers and make sure a marker follows everything written so far; returns, per
        stream, the token of the marker the kernel must have read before the DONE that carries it counts.
        ``named``: the kernel reads those tokens (its RUN said so); else every stream gets a marker now."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        marks: Dict[str, int] = {}
        for fd, name in ((1, "stdout"), (2, "stderr")):
            written = bytes_written(self._socks[name])
            if named and written is not None and name in self._marked and written == self._written_at_mark.get(name):
                marks[name] = self._marked[name]  # nothing since that marker: the kernel has read all of it
                continue
            try:
                self._mark(fd, self._socks[name], SYNC_PREFIX + str(token).encode() + SYNC_END)
            except OSError:
                pass
            self._marked[name], self._written_at_mark[name] = token, bytes_written(self._socks[name])
            marks[name] = token
        return marks


    @staticmethod
    def _mark(fd: int, sock: socket.socket, marker: bytes) -> None:
        """Write a marker after everything written to ``fd``: over TLS from this thread when ``fd`` is still that
        socket (tls.send_direct; a kept rank's fd is a pipe to its spool, whose bytes must go first), else to ``fd``."""
        try:
            same = os.path.samestat(os.fstat(fd), os.fstat(sock.fileno()))
        except (OSError, ValueError):
            same = False
        if not (same and tls.send_direct(sock, marker)):
            _write_all(fd, marker)


def bytes_written(sock: socket.socket) -> Optional[int]:
    """How many bytes were ever written to a TCP socket (acked plus still queued); None where that cannot be told.

    Read as acked, queued, acked again: an ACK between the two reads would move bytes from the queue
    to the acked count, so the sum counts only when both reads of the acked count agree. Right after a marker
    went, its ACK often lands inside the reads (a loaded machine): read again a few times before giving up, since
    None costs the next quiet cell a marker and a read on every stream."""
    for _ in range(4):
        try:
            acked = _acked(sock)
            queued = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]  # SIOCOUTQ
            again = _acked(sock)
        except (OSError, struct.error, AttributeError):  # not TCP (a TLS relay's socketpair: its relay counts), older, not Linux
            return tls.bytes_written(sock)
        if acked == again:
            return acked + queued
    return None


def _acked(sock: socket.socket) -> int:
    return int(struct.unpack_from("Q", sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_ACKED + 8), _TCP_INFO_ACKED)[0])


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def spool_marker(offset: int) -> bytes:
    """Rank side: "what follows on this socket is my spool's bytes from ``offset``" (procs/rank_keep.py). What came before
    it went straight to the socket, never to the spool: the kernel counts none of it as the spool's."""
    return SYNC_PREFIX + SPOOL_BODY + str(int(offset)).encode() + SYNC_END


class MarkerScanner:
    """Kernel side: split a raw output stream into text bytes and sync tokens (and a spool's start: ``spool``)."""

    def __init__(self) -> None:
        self._buf = b""
        self.spool: Optional[Tuple[int, int]] = None  # the last feed's spool marker: (its offset, the bytes of that feed after it)

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
            body = buf[i + len(SYNC_PREFIX) : j]
            try:
                if body.startswith(SPOOL_BODY):  # what follows it is all this feed's: a kept buffer holds no whole marker
                    self.spool = (int(body[len(SPOOL_BODY):]), len(buf) - j - 1)
                else:
                    tokens.append(int(body))
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
