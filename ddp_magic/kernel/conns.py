"""A rank's sockets as the kernel holds them: the control connection and the two raw output streams.

The hub (hub.py) owns them; these are the small pieces it is built from.
"""
from __future__ import annotations

import codecs
import select
import socket

from ..logs import log
from ..wire import protocol as P
from ..wire.capture import MarkerScanner


class Conn:
    """A rank's control socket: framed messages."""

    def __init__(self, rank: int, sock: socket.socket) -> None:
        self.rank = rank
        self.sock = sock
        self.reader = P.FrameReader()


class OutConn:
    """A rank's raw stdout or stderr socket (its fd 1 or 2), with sync markers in the bytes."""

    def __init__(self, rank: int, stream: str, sock: socket.socket) -> None:
        self.rank = rank
        self.stream = stream
        self.sock = sock
        self.scanner = MarkerScanner()
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.synced = -1  # the last cell whose marker has been read
        self.eof = False


def close_socket(sock: socket.socket) -> None:
    """Close a rank's socket; one that is already gone is fine (logged)."""
    try:
        sock.close()
    except OSError:
        log.debug("closing a rank socket failed", exc_info=True)


def peer_open(sock: socket.socket) -> bool:
    """Whether the other end still holds the connection (a remote rank that has not exited yet)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def send_all_nonblocking(sock: socket.socket, frame: bytes) -> None:
    """Send a whole frame on a non-blocking socket, waiting for room when its buffer is full."""
    view = memoryview(frame)
    while view:
        try:
            n = sock.send(view)
        except BlockingIOError:
            select.select([], [sock], [], 1.0)
            continue
        view = view[n:]
