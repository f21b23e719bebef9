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
from typing import Dict, List, Optional, Set, Union

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
        self.source: Union[socket.socket, tls.TlsSource] = sock  # what is read (``watch``): over TLS, decrypted by the hub
        self.pull_fd: Optional[int] = None  # over TLS: its TLS socket, which the hub's thread reads itself (``watch``)
        self.pulling = False  # that socket is watched (not while the relay fills a buffer of ours)


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
        self.awaiting_spool = False  # a kept pool: KEEP went to the rank, whose spool marker has not been read yet
        self.source: Union[socket.socket, tls.TlsSource] = sock
        self.pull_fd: Optional[int] = None
        self.pulling = False


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
        if fd not in self.fds:
            return  # removed already (a lost rank's connection is dropped by its reader and by the pool)
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

    def recv(self, source: Union[socket.socket, tls.TlsSource]) -> bytes:
        """What ``source`` has (b"" at EOF); BlockingIOError when nothing is there. Over TLS (``watch``), decrypted by this
        thread straight into this buffer."""
        n = source.recv_into(self._buf)
        return bytes(self._view[:n])

    def frames(self, conn: Conn) -> Optional[list]:
        """The messages one read of ``conn``'s socket completes (None at EOF; BlockingIOError when nothing is there): a
        result's out-of-band buffers are read straight into their own memory, the rest through this buffer."""
        return conn.reader.recv(conn.source, self._buf, conn.handover)


def watch(poller: Poller, by_fd: Dict[int, Union[Conn, OutConn]], sock: socket.socket, conn: Union[Conn, OutConn]) -> None:
    """Watch a rank's socket; over TLS its TLS socket too, which the hub's thread then reads itself when it turns
    readable (``conn.source``: decrypted straight into the hub's buffer): no relay thread, no socketpair hop."""
    by_fd[sock.fileno()] = conn
    poller.add(sock.fileno())
    conn.source = tls.source(sock)
    conn.pull_fd = conn.source.fd if isinstance(conn.source, tls.TlsSource) else None
    watch_pulled(poller, by_fd, conn, True)


def unwatch(poller: Poller, by_fd: Dict[int, Union[Conn, OutConn]], sock: socket.socket) -> None:
    """Before the socket closes (a closed fd's number may be the next socket's)."""
    fd = sock.fileno()
    conn = by_fd.pop(fd, None) if fd >= 0 else None
    if conn is not None:
        poller.remove(fd)
        watch_pulled(poller, by_fd, conn, False)


def watch_pulled(poller: Poller, by_fd: Dict[int, Union[Conn, OutConn]], conn: Union[Conn, OutConn], on: bool) -> None:
    """Watch ``conn``'s TLS socket (``on``) or not. Not while the relay fills a buffer of the connection's: the relay
    reads it then, and a watch would wake the hub in vain. The relay closes a TLS socket that failed: a number taken
    by a newer socket is left alone."""
    fd = conn.pull_fd
    if fd is None or conn.pulling == on:
        return
    conn.pulling = on
    if on:
        by_fd[fd] = conn
        poller.add(fd)
    elif by_fd.get(fd) is conn:
        del by_fd[fd]
        poller.remove(fd)


def close_socket(sock: socket.socket) -> None:
    """Close a rank's socket; one that is already gone is fine (logged)."""
    try:
        sock.close()
    except OSError:
        log.debug("closing a rank socket failed", exc_info=True)


def peer_open(sock: socket.socket) -> bool:
    """Whether the other end still holds the connection (a remote rank that has not exited yet)."""
    tls.pull(sock)  # over TLS: the peer's EOF reaches ``sock`` once someone reads its TLS socket
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def wait_ready(sock: socket.socket, seconds: float, write: bool = False, also: Optional[int] = None) -> bool:
    """Whether ``sock`` (or the descriptor ``also``) is readable (or writable) within ``seconds``: poll(), since select()
    refuses fds past 1,023. ``also``: a connection's TLS socket, which the hub reads itself (``watch``).

    A pool of 1,024 ranks holds 3,072 sockets, so a rank's descriptor is often above select()'s limit.
    """
    poller = select.poll()
    for fd in (sock.fileno(), also):
        if fd is not None:
            poller.register(fd, select.POLLOUT if write else select.POLLIN)
    return bool(poller.poll(max(0.0, seconds) * 1000))


def send_all_nonblocking(sock: socket.socket, frame: bytes) -> None:
    """Send a whole frame on a non-blocking socket, waiting for room when its buffer is full."""
    try:
        sent = sock.send(frame)  # the usual case, 1,024 times a cell: one call takes it all
    except BlockingIOError:
        sent = 0
    if sent == len(frame):
        return
    view = memoryview(frame)[sent:]
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
