"""The TLS relay's ways: each direction's buffer, the buffers the code hands over, and the moves between them.

A direction (``Way``) reads into its buffer while the buffer is empty and writes from it
until it is: the relay copies each byte once, a TLS write gets up to ``CHUNK`` bytes
(OpenSSL cuts its records from it), and a TLS read gathers many 16 KiB records before one
write to the socketpair. The buffer is a map whose pages are touched only when used, so a
thousand idle ranks' pairs cost no memory.

A big result need not cross the socketpair at all. On the rank, the code hands the relay
the tensor's own memory (``Handed``), which is encrypted from there once everything the
code wrote before it has gone. In the kernel, the hub hands the relay the memory a
frame's buffer will live in (``Fill``), once the socketpair and the relay's buffer have
given it what they held; the relay decrypts the rest straight into it. Either way the
bytes cross the process boundary once, as they do over plain TCP.
"""
from __future__ import annotations

import fcntl
import mmap
import socket
import ssl
import struct
import termios
import threading
import weakref
from collections import deque
from typing import Callable, Deque, Dict, Optional, Union

CHUNK = 1 << 20  # one direction's buffer: the most one TLS write gets, the most one socketpair write gets
ROUND_BYTES = 8 << 20  # the most one direction moves in one round, so one busy connection cannot starve the others
HANDED_MIN = 1 << 20  # a buffer this large is handed over (sent or filled in place); a smaller one goes through the socketpair
SSL_WAIT = (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError)
SSL_END = (ssl.SSLZeroReturnError, ssl.SSLEOFError, ConnectionError)


class Way:
    """One direction of a pair: a buffer, read into while empty and written from until it is."""

    def __init__(self) -> None:
        self.buf: Optional[Union[mmap.mmap, bytearray]] = None
        self.view: Optional[memoryview] = None
        self.start = self.end = 0  # what waits to be written: view[start:end]
        self.eof = False  # its source is at EOF

    def space(self) -> memoryview:
        """The buffer to read into (it is empty); made on first use."""
        if self.view is None:
            self.buf = mmap.mmap(-1, CHUNK, flags=mmap.MAP_PRIVATE)
            self.view = memoryview(self.buf)
        self.start = self.end = 0
        return self.view

    @property
    def waiting(self) -> bool:
        return self.start < self.end

    def clear(self) -> None:
        self.start = self.end = 0


class Handed:
    """A buffer the code handed the relay to encrypt from where it lies (``Relay.send``), and how far it went."""

    def __init__(self, data: memoryview) -> None:
        self.view, self.sent = data, 0
        self.done = threading.Event()
        self.error: Optional[BaseException] = None

    def finish(self, error: Optional[BaseException] = None) -> None:
        self.error = error
        self.done.set()


class Fill:
    """The memory a frame's buffer will live in, handed to the relay to decrypt the rest of it into (``Relay.fill``)."""

    def __init__(self, view: memoryview, got: int) -> None:
        self.view, self.got = view, got  # view[:got] is in
        self.done = self.failed = False  # set by the relay (got first): full, or the connection ended first


class Pair:
    """One TLS socket and the plain socket the code uses instead, with what waits to go each way."""

    def __init__(self, tls: ssl.SSLSocket, plain: socket.socket, twin: socket.socket) -> None:
        self.tls, self.plain = tls, plain
        self.twin = weakref.ref(twin)  # the code's end: told when the TLS peer went silent (wire/liveness.py)
        self.up = Way()  # from the code (plain) to the peer (tls)
        self.down = Way()  # from the peer (tls) to the code (plain)
        self.direct: Deque[Handed] = deque()  # handed over by ``Relay.send``: sent after everything on ``plain`` before it
        self.fill: Optional[Fill] = None  # handed over by ``Relay.fill``: the next bytes from the peer go there
        self.lock = threading.Lock()  # held by whoever uses ``tls`` (the relay's thread; the hub's, to hand a Fill over)
        self.plain_shut = False
        self.pulled = False  # the code's thread decrypts what comes (``Relay.pull``); the relay reads only to fill a buffer
        self.taken = 0  # bytes the code wrote that left ``plain`` (taken by the relay, sent directly or handed over)
        self.events: Dict[int, int] = {}  # fd -> the events it is registered for (0: not registered)

    def take(self, view: memoryview) -> int:
        """Read what the code wrote to ``plain`` (the up way's source), counted (``Relay.written``)."""
        n = self.plain.recv_into(view)
        self.taken += n
        return n


def held(pair: Pair) -> bool:
    """Decrypted bytes OpenSSL holds for a pair that can take them: no select wakes us for those. A pair another thread
    uses now (a direct write, a pull) is not asked: OpenSSL's state is that thread's until it lets go."""
    if not pair.lock.acquire(blocking=False):
        return False
    try:
        return bool(pair.tls.pending()) and not pair.down.waiting and not pair.down.eof
    finally:
        pair.lock.release()


def move(way: Way, read: Callable[[memoryview], int], write: Callable[[memoryview], int], gather: bool) -> None:
    """Move bytes one way until its source has none, its sink takes no more, or ROUND_BYTES went. ``gather``: fill the
    buffer from many reads before writing (a TLS read returns one 16 KiB record)."""
    moved = 0
    while moved < ROUND_BYTES:
        if not way.waiting:
            if way.eof:
                return
            view = way.space()
            while way.end < CHUNK:
                try:
                    n = read(view[way.end:])
                except SSL_WAIT:
                    break
                except SSL_END:
                    n = 0
                if not n:
                    way.eof = True
                    break
                way.end += n
                if not gather:
                    break
            if not way.waiting:
                return
        assert way.view is not None
        try:
            n = write(way.view[way.start:way.end])  # a TLS write that must wait is retried with these same bytes
        except SSL_WAIT:
            return
        way.start += n
        moved += n


def send_handed(pair: Pair) -> None:
    """Encrypt the buffers handed over, from where they lie, once nothing the code wrote before them waits (the
    writer waits for them: nothing new comes on ``plain`` meanwhile). A TLS write that must wait is retried with the
    same slice."""
    while pair.direct and not pair.up.waiting and not pair.up.eof and not unread(pair.plain):
        job = pair.direct[0]
        try:
            n = pair.tls.send(job.view[job.sent : job.sent + CHUNK])
        except SSL_WAIT:
            return
        job.sent += n
        pair.taken += n
        if job.sent >= job.view.nbytes:
            pair.direct.popleft()
            job.finish()


def write_direct(pair: Pair, view: memoryview) -> bool:
    """A small message encrypted by the sender's own thread, under ``pair.lock``: no hand-off to the relay's thread. Only
    when nothing the code wrote before waits (the up buffer, a handed buffer, unread bytes on the socketpair), so order
    holds. False: it must go the usual way (through the socketpair). A TLS write that must wait leaves the message in
    the up buffer, as if the relay had read it: the relay retries it with the same bytes (the caller then kicks it)."""
    up = pair.up
    if up.waiting or up.eof or pair.direct or view.nbytes > CHUNK or unread(pair.plain):
        return False
    try:
        pair.tls.send(view)  # whole: Python's ssl does not enable partial writes
    except SSL_WAIT:
        space = up.space()
        space[: view.nbytes] = view
        up.end = view.nbytes
    pair.taken += view.nbytes
    return True


def decrypt_into(pair: Pair, view: memoryview) -> int:
    """Decrypt what the peer sent straight into the code's own buffer (``Relay.read``, under ``pair.lock``): records
    gathered until ``view`` is full or neither OpenSSL nor the socket holds more (asked first: a read that finds
    nothing costs an exception). 0: nothing came, or the peer's EOF (``pair.down.eof`` then)."""
    got = 0
    while got < view.nbytes:
        try:
            n = pair.tls.recv_into(view[got:])
        except SSL_WAIT:
            break
        except SSL_END:
            n = 0
        if not n:
            pair.down.eof = True
            break
        got += n
        if not pair.tls.pending() and not unread(pair.tls):
            break
    return got


def fill_in(pair: Pair) -> bool:
    """Decrypt into the buffer the hub handed over, as far as the peer has sent; True once it is finished (full, or the
    connection ended first), and the pair is back to the socketpair for what follows."""
    fill = pair.fill
    if fill is None:
        return False
    while fill.got < fill.view.nbytes:
        try:
            n = pair.tls.recv_into(fill.view[fill.got:])
        except SSL_WAIT:
            return False
        except SSL_END:
            n = 0
        if not n:
            pair.down.eof = fill.failed = True
            break
        fill.got += n
    pair.fill = None
    fill.done = True
    return True


def take_over(pair: Pair, plain: socket.socket, view: memoryview, got: int) -> Optional[Fill]:
    """The hub's side of a Fill, under ``pair.lock`` (so the relay passes nothing on meanwhile): what the socketpair
    holds goes into ``view`` first (never past its end: what follows stays there), then what the relay decrypted and
    has not passed on; then, unless that finished it, the relay is to decrypt the rest there. None: the pair cannot
    (a fill running, the peer gone): the hub reads on as before."""
    if pair.fill is not None or pair.down.eof:
        return None
    fill = Fill(view, got)
    while fill.got < view.nbytes:
        try:
            n = plain.recv_into(view[fill.got:])
        except BlockingIOError:
            break
        if not n:
            fill.failed = fill.done = True
            return fill
        fill.got += n
    down = pair.down
    if down.waiting and fill.got < view.nbytes:
        assert down.view is not None
        k = min(down.end - down.start, view.nbytes - fill.got)
        view[fill.got : fill.got + k] = down.view[down.start : down.start + k]
        down.start += k
        fill.got += k
    if fill.got == view.nbytes:  # it is full; what follows goes through the socketpair as before
        fill.done = True
        return fill
    pair.fill = fill
    return fill


def fail(pair: Pair, error: BaseException) -> None:
    """The buffers handed over for a connection that failed: their writers raise ``error``, their reader reads EOF."""
    while pair.direct:
        pair.direct.popleft().finish(error)
    if pair.fill is not None:
        pair.fill.failed = pair.fill.done = True
        pair.fill = None


def unread(sock: socket.socket) -> int:
    """Bytes waiting to be read on ``sock`` (FIONREAD); 0 when it is closed."""
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
    except (OSError, ValueError):
        return 0


