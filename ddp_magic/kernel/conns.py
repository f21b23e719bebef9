"""A rank's sockets as the kernel holds them: the control connection and the two raw output streams.

The hub (hub.py) owns them; these are the small pieces it is built from, with
the poller that watches them all (epoll: a wake costs what is ready, not what
is watched, so a thousand idle ranks cost a wake nothing) and the one read
buffer every socket is read into (a fresh 1 MiB ``recv`` buffer per read costs
an mmap and a munmap, ten times the read itself).
"""
from __future__ import annotations

import codecs
import select
import socket
from typing import List, Optional, Set

from ..logs import log
from ..wire import protocol as P
from ..wire import tls
from ..wire.capture import MarkerScanner


class Conn:
    """A rank's control socket: framed messages."""

    def __init__(self, rank: int, sock: socket.socket) -> None:
        self.rank = rank
        self.sock = sock
        self.reader = P.FrameReader()
        self.handover = tls.filler(sock)  # over TLS: the relay decrypts a big result straight into its memory


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
        self.unshown = 0  # a kept pool: bytes read after the last whole line, not counted as shown yet (hub_output.py)


class Poller:
    """The descriptors the hub waits on, registered once: epoll where Linux has it, poll() elsewhere."""

    def __init__(self) -> None:
        self._epoll = select.epoll() if hasattr(select, "epoll") else None
        self._poll = None if self._epoll is not None else select.poll()
        self.fds: Set[int] = set()

    def add(self, fd: int) -> None:
        """Watch ``fd`` for input; one already watched (or a closed one's number, reused) is fine."""
        try:
            if self._epoll is not None:
                self._epoll.register(fd, select.EPOLLIN)
            else:
                assert self._poll is not None
                self._poll.register(fd, select.POLLIN)
        except FileExistsError:
            pass
        self.fds.add(fd)

    def remove(self, fd: int) -> None:
        """Stop watching ``fd`` (before it is closed; a closed one left epoll already)."""
        self.fds.discard(fd)
        try:
            if self._epoll is not None:
                self._epoll.unregister(fd)
            else:
                assert self._poll is not None
                self._poll.unregister(fd)
        except (OSError, KeyError, ValueError):
            log.debug("fd %d was not watched any more", fd, exc_info=True)

    def wait(self, seconds: float) -> List[int]:
        """The watched descriptors that are readable (or closed), waiting up to ``seconds``."""
        if self._epoll is not None:
            return [fd for fd, _ in self._epoll.poll(max(0.0, seconds))]
        assert self._poll is not None
        return [fd for fd, _ in self._poll.poll(max(0.0, seconds) * 1000)]

    def close(self) -> None:
        if self._epoll is not None:
            self._epoll.close()
        self.fds.clear()


class ReadBuffer:
    """One buffer every socket of the hub is read into; ``recv`` returns a copy of just what came."""

    def __init__(self, size: int = 1 << 20) -> None:
        self._buf = bytearray(size)
        self._view = memoryview(self._buf)

    def recv(self, sock: socket.socket) -> bytes:
        """What ``sock`` has (b"" at EOF); BlockingIOError when nothing is there."""
        n = sock.recv_into(self._buf)
        return bytes(self._view[:n])

    def frames(self, conn: Conn) -> Optional[list]:
        """The messages one read of ``conn``'s socket completes (None at EOF; BlockingIOError when nothing is there): a
        result's out-of-band buffers are read straight into their own memory, the rest through this buffer."""
        return conn.reader.recv(conn.sock, self._buf, conn.handover)


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


def wait_ready(sock: socket.socket, seconds: float, write: bool = False) -> bool:
    """Whether ``sock`` is readable (or writable) within ``seconds``: poll(), since select() refuses fds past 1,023.

    A pool of 1,024 ranks holds 3,072 sockets, so a rank's descriptor is often above select()'s limit.
    """
    poller = select.poll()
    poller.register(sock, select.POLLOUT if write else select.POLLIN)
    return bool(poller.poll(max(0.0, seconds) * 1000))


def send_all_nonblocking(sock: socket.socket, frame: bytes) -> None:
    """Send a whole frame on a non-blocking socket, waiting for room when its buffer is full."""
    view = memoryview(frame)
    while view:
        try:
            n = sock.send(view)
        except BlockingIOError:
            wait_ready(sock, 1.0, write=True)
            continue
        view = view[n:]


def send_shutdown(conns: List["Conn"]) -> None:
    """SHUTDOWN to each rank's control socket, blocking a moment each (best effort: a rank that cannot take it is stopped)."""
    frame = P.encode(P.message(P.SHUTDOWN))
    for conn in conns:
        try:
            conn.sock.setblocking(True)
            conn.sock.settimeout(0.2)
            conn.sock.sendall(frame)
        except OSError:
            log.debug("SHUTDOWN to rank %s not sent", conn.rank, exc_info=True)
