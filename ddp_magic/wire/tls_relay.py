"""The TLS relay: one thread that moves bytes between every TLS socket of a process and the plain socket its code uses.

An OpenSSL connection must not be read and written from two threads at once, and a rank
reads its control socket in one thread while another sends; so no code of ours holds a
TLS socket. The relay owns them all, and the code gets the plain end of a socketpair
(tls.py's ``wrap_server`` and ``connect``).

What it costs is what a result from another host pays (docs/bench/cluster.md): each
pair has one buffer a direction, a map whose pages are touched only when used (a
thousand idle ranks' pairs cost no memory). A direction reads into its buffer while the
buffer is empty and writes from it until it is, so the bytes are copied once by the
relay (not three times through growing bytearrays), a TLS write gets up to ``CHUNK``
bytes at once (OpenSSL cuts its records from it), and a TLS read gathers many 16 KiB
records before one write to the socketpair. The socketpair's buffers are large, so the
hub's reads take few rounds. A socket's interest in the selector changes only when what
it waits for does. A rank's big result skips the socketpair altogether: ``send`` hands
the relay the tensor's own memory, which it encrypts from there once everything the
code wrote before has gone (the caller holds the socket's write lock and waits).

The relay is a thread of the process, so what the code wrote last still sits in the
socketpair or the relay's buffer when the process ends: over plain TCP the OS sends a
dead process's last bytes, through the relay they would be lost (a rank that prints its
error and exits at once). So a process that dialled out over TLS drains its relay before
it exits (``drain_before_exit``): ``os._exit`` (every exit path of a rank) and interpreter
exit wait, up to DRAIN_S, until nothing the code wrote is left unsent. A rank killed by a
signal it cannot catch (SIGKILL) still loses what the relay had not sent.
"""
from __future__ import annotations

import atexit
import fcntl
import mmap
import os
import selectors
import socket
import ssl
import struct
import termios
import threading
import time
import weakref
from collections import deque
from typing import Callable, Deque, Dict, List, Optional, Union

from ..logs import log
from . import liveness

CHUNK = 1 << 20  # one direction's buffer: the most one TLS write gets, the most one socketpair write gets
PAIR_BUFFER = 4 << 20  # SO_SNDBUF/SO_RCVBUF of the socketpair: a big result crosses it in few rounds
ROUND_BYTES = 8 << 20  # the most one direction moves in one round, so one busy connection cannot starve the others
DRAIN_S = 3.0  # how long an exiting process waits for its relay to send what its code wrote
DIRECT_MIN = 1 << 20  # ``send`` hands the relay a buffer this large; a smaller one goes through the socketpair
_SSL_WAIT = (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError)
_SSL_END = (ssl.SSLZeroReturnError, ssl.SSLEOFError, ConnectionError)


class _Way:
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


class _Direct:
    """A buffer the code handed the relay to encrypt from where it lies (``Relay.send``), and how far it went."""

    def __init__(self, data: memoryview) -> None:
        self.view, self.sent = data, 0
        self.done = threading.Event()
        self.error: Optional[BaseException] = None

    def finish(self, error: Optional[BaseException] = None) -> None:
        self.error = error
        self.done.set()


class _Pair:
    """One TLS socket and the plain socket the code uses instead, with what waits to go each way."""

    def __init__(self, tls: ssl.SSLSocket, plain: socket.socket, twin: socket.socket) -> None:
        self.tls, self.plain = tls, plain
        self.twin = weakref.ref(twin)  # the code's end: told when the TLS peer went silent (wire/liveness.py)
        self.up = _Way()  # from the code (plain) to the peer (tls)
        self.down = _Way()  # from the peer (tls) to the code (plain)
        self.direct: Deque[_Direct] = deque()  # handed over by ``Relay.send``: sent after everything on ``plain`` before it
        self.plain_shut = False
        self.events: Dict[int, int] = {}  # fd -> the events it is registered for (0: not registered)


class Relay:
    """One thread that moves bytes between every TLS socket of this process and its plain twin."""

    _instance: Optional["Relay"] = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.sel.register(self.wake_r, selectors.EVENT_READ, None)
        self.pairs: Dict[int, _Pair] = {}
        self.added: "list[_Pair]" = []
        self.mutex = threading.Lock()
        self._pair_of: "weakref.WeakKeyDictionary[socket.socket, _Pair]" = weakref.WeakKeyDictionary()  # the code's end -> its pair
        self.kicked: List[_Pair] = []  # pairs handed a buffer: pumped at the next wake
        self.rounds = 0  # select rounds done: a drain sees the relay between two of them
        threading.Thread(target=self._loop, name="ddp-tls-relay", daemon=True).start()

    @classmethod
    def get(cls) -> "Relay":
        with cls._lock:
            if cls._instance is None:
                cls._instance = Relay()
            return cls._instance

    @classmethod
    def current(cls) -> Optional["Relay"]:
        """This process's relay, if it has one (no TLS connection yet: None, and no thread started for it)."""
        return cls._instance

    def add(self, tls: ssl.SSLSocket) -> socket.socket:
        """Take over ``tls`` (handshake done); returns the plain socket to use instead."""
        mine, theirs = socket.socketpair()
        for sock in (mine, theirs):
            for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
                sock.setsockopt(socket.SOL_SOCKET, opt, PAIR_BUFFER)
        tls.setblocking(False)
        mine.setblocking(False)
        with self.mutex:
            pair = _Pair(tls, mine, theirs)
            self.added.append(pair)
            self._pair_of[theirs] = pair
        self.wake_w.send(b"x")
        return theirs

    def tls_of(self, plain: socket.socket) -> Optional[ssl.SSLSocket]:
        """The TLS socket behind the code's end ``plain`` (to set its socket options), or None."""
        with self.mutex:
            pair = self._pair_of.get(plain)
        return pair.tls if pair is not None else None

    def send(self, plain: socket.socket, data: Union[bytes, bytearray, memoryview]) -> None:
        """``plain.sendall(data)``, but a big buffer on a relayed socket is encrypted from where it lies (no socketpair,
        no copy), after everything written to ``plain`` before. The caller holds ``plain``'s write lock; returns once
        it is all sent, raises OSError when the connection fails first."""
        view = memoryview(data).cast("B")
        with self.mutex:
            pair = self._pair_of.get(plain) if view.nbytes >= DIRECT_MIN else None
            job = _Direct(view)
            if pair is not None:
                pair.direct.append(job)
                self.kicked.append(pair)
        if pair is None:
            plain.sendall(view)
            return
        self.wake_w.send(b"x")
        job.done.wait()
        if job.error is not None:
            raise job.error

    def _loop(self) -> None:
        while True:
            try:
                self._once()
            except Exception:  # the relay carries every TLS connection of the process: it must outlive any one of them
                log.warning("tls relay: unexpected error (the relay goes on)", exc_info=True)

    def drained(self) -> bool:
        """Whether nothing the code wrote waits to go out: no pair taken over yet, no unread byte on a plain end, nothing
        buffered for a TLS socket. (Read from another thread: ``drain`` asks twice, a relay round apart.)"""
        if self.added:
            return False
        for pair in list(self.pairs.values()):
            if pair.up.waiting or pair.direct or (not pair.up.eof and _unread(pair.plain)):
                return False
        return True

    def drain(self, timeout: float = DRAIN_S) -> bool:
        """Wait until the relay has sent what the code wrote (the process is about to exit); whether it has."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            before = self.rounds
            if self.drained():
                self.wake_w.send(b"x")  # one more round: bytes it read but had not buffered yet are sent in it
                while self.rounds == before and time.monotonic() < deadline:
                    time.sleep(0.002)
                if self.drained():
                    return True
            time.sleep(0.005)
        return False

    def _once(self) -> None:
        self.rounds += 1
        held = any(_held(pair) for pair in self.pairs.values())
        for key, _ in self.sel.select(timeout=0 if held else 1.0):
            pair = key.data
            if pair is None:
                self._take_new()
            elif id(pair) in self.pairs:
                self._pump(pair)
        for pair in list(self.pairs.values()):
            if _held(pair):
                self._pump(pair)

    def _take_new(self) -> None:
        try:
            self.wake_r.recv(4096)
        except BlockingIOError:
            pass
        with self.mutex:
            new, self.added = self.added, []
            kicked, self.kicked = self.kicked, []
        for pair in new:
            self.pairs[id(pair)] = pair
            self._pump(pair)
        for pair in kicked:
            if id(pair) in self.pairs:
                self._pump(pair)
            else:
                _fail(pair, ConnectionError("the control connection is closed"))

    def _pump(self, pair: _Pair) -> None:
        try:
            _move(pair.down, pair.tls.recv_into, pair.plain.send, gather=True)
            _move(pair.up, pair.plain.recv_into, pair.tls.send, gather=False)
            _send_direct(pair)
        except (OSError, ValueError) as e:
            log.debug("tls relay: a connection failed", exc_info=True)
            if liveness.is_silence(e):
                liveness.mark_silent(pair.twin())
            pair.up.eof = pair.down.eof = True
            pair.up.clear()
            pair.down.clear()
            _fail(pair, e if isinstance(e, OSError) else ConnectionError(str(e)))
        if pair.down.eof and not pair.down.waiting and not pair.plain_shut:  # the kernel (or rank) closed: the code reads EOF
            pair.plain_shut = True
            try:
                pair.plain.shutdown(socket.SHUT_WR)
            except OSError:
                log.debug("tls relay: shutdown failed", exc_info=True)
        if pair.up.eof and not pair.up.waiting:  # the code closed its end: it reads no more either
            self._drop(pair)
            return
        self._watch(pair)

    def _watch(self, pair: _Pair) -> None:
        """Register each socket for what it needs now: reading while its direction's buffer is free, writing while the
        other direction's waits. The selector is told only when that changes."""
        for sock, source, sink in ((pair.tls, pair.down, pair.up), (pair.plain, pair.up, pair.down)):
            writing = sink.waiting or (sock is pair.tls and bool(pair.direct))
            events = (selectors.EVENT_READ if not source.eof and not source.waiting else 0) | (selectors.EVENT_WRITE if writing else 0)
            fd = sock.fileno()
            if pair.events.get(fd, 0) == events:
                continue
            try:
                if not events:
                    self.sel.unregister(sock)
                elif pair.events.get(fd, 0):
                    self.sel.modify(sock, events, pair)
                else:
                    self.sel.register(sock, events, pair)
                pair.events[fd] = events
            except (ValueError, OSError, KeyError):
                log.debug("tls relay: a socket went while being watched", exc_info=True)

    def _drop(self, pair: _Pair) -> None:
        self.pairs.pop(id(pair), None)
        _fail(pair, ConnectionError("the control connection is closed"))
        for sock in (pair.tls, pair.plain):
            if pair.events.get(sock.fileno(), 0):
                try:
                    self.sel.unregister(sock)
                except (ValueError, OSError, KeyError):
                    log.debug("tls relay: unregister failed", exc_info=True)
            try:
                sock.close()
            except OSError:
                log.debug("tls relay: close failed", exc_info=True)


def _held(pair: _Pair) -> bool:
    """Decrypted bytes OpenSSL holds for a pair that can take them: no select wakes us for those."""
    return bool(pair.tls.pending()) and not pair.down.waiting and not pair.down.eof


def _move(way: _Way, read: Callable[[memoryview], int], write: Callable[[memoryview], int], gather: bool) -> None:
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
                except _SSL_WAIT:
                    break
                except _SSL_END:
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
        except _SSL_WAIT:
            return
        way.start += n
        moved += n


def _send_direct(pair: _Pair) -> None:
    """Encrypt the buffers handed over, from where they lie, once nothing the code wrote before them waits (the
    writer waits for them: nothing new comes on ``plain`` meanwhile). A TLS write that must wait is retried with the
    same slice."""
    while pair.direct and not pair.up.waiting and not pair.up.eof and not _unread(pair.plain):
        job = pair.direct[0]
        try:
            n = pair.tls.send(job.view[job.sent : job.sent + CHUNK])
        except _SSL_WAIT:
            return
        job.sent += n
        if job.sent >= job.view.nbytes:
            pair.direct.popleft()
            job.finish()


def _fail(pair: _Pair, error: BaseException) -> None:
    """The buffers handed over for a connection that failed: their writers raise ``error``."""
    while pair.direct:
        pair.direct.popleft().finish(error)


def _unread(sock: socket.socket) -> int:
    """Bytes waiting to be read on ``sock`` (FIONREAD); 0 when it is closed."""
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
    except (OSError, ValueError):
        return 0


_EXIT: Optional[Callable[[int], None]] = None  # os._exit as it was, once a client connection made us wrap it


def drain_before_exit() -> None:
    """From now on this process drains its relay before it exits: os._exit (a rank's every exit path) and interpreter exit."""
    global _EXIT
    if _EXIT is not None:
        return
    _EXIT = real = os._exit

    def _exit(code: int) -> None:
        try:
            Relay.get().drain()
        finally:
            real(code)

    os._exit = _exit  # type: ignore[assignment]
    atexit.register(lambda: Relay.get().drain())
