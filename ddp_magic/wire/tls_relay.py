"""The TLS relay: one thread that moves bytes between every TLS socket of a process and the plain socket its code uses.

An OpenSSL connection must not be read and written from two threads at once, and a rank
reads its control socket in one thread while another sends; so no code of ours holds a
TLS socket. The relay owns them all, and the code gets the plain end of a socketpair
(tls.py's ``wrap_server`` and ``connect``).

What it costs is what a result from another host pays (docs/bench/cluster.md). How the
bytes go (each direction's buffer, a big result handed over in place at both ends) is
tls_ways.py. A socket's interest in the selector changes only when what it waits for
does. Whoever uses a pair's TLS socket holds its lock: the relay's thread, or a thread of
the code's that sends or reads a small message itself (``direct``, ``read``), or hands a
buffer over (``fill``: a finished fill is told on a pipe the hub watches, ``note_fd``).

The relay is a thread of the process, so what the code wrote last still sits in the
socketpair or the relay's buffer when the process ends: over plain TCP the OS sends a
dead process's last bytes, through the relay they would be lost (a rank that prints its
error and exits at once). So a process that dialled out over TLS drains its relay before
it exits (tls.py ``drain_before_exit``): ``os._exit`` (every exit path of a rank) and interpreter
exit wait, up to DRAIN_S, until nothing the code wrote is left unsent. A rank killed by a
signal it cannot catch (SIGKILL) still loses what the relay had not sent.
"""
from __future__ import annotations

import os
import selectors
import socket
import ssl
import threading
import time
import weakref
from typing import Dict, List, Optional, Union

from ..logs import log
from . import liveness
from .tls_ways import HANDED_MIN, Fill, Handed, Pair, decrypt_into, fail, fill_in, held, move, send_handed, take_over, unread, write_direct

PAIR_BUFFER = 4 << 20  # SO_SNDBUF/SO_RCVBUF of the socketpair: a big result crosses it in few rounds
DRAIN_S = 3.0  # how long an exiting process waits for its relay to send what its code wrote


class Relay:
    """One thread that moves bytes between every TLS socket of this process and its plain twin."""

    _instance: Optional["Relay"] = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.sel.register(self.wake_r, selectors.EVENT_READ, None)
        self.pairs: Dict[int, Pair] = {}
        self.added: "list[Pair]" = []
        self.mutex = threading.Lock()
        self._pair_of: "weakref.WeakKeyDictionary[socket.socket, Pair]" = weakref.WeakKeyDictionary()  # the code's end -> its pair
        self.kicked: List[Pair] = []  # pairs handed a buffer: pumped at the next wake
        self.note_r, self.note_w = os.pipe()  # a byte: a Fill finished (the hub watches note_r)
        os.set_blocking(self.note_r, False)
        os.set_blocking(self.note_w, False)
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
            pair = Pair(tls, mine, theirs)
            self.added.append(pair)
            self._pair_of[theirs] = pair
        self.wake_w.send(b"x")
        return theirs

    def _pair(self, plain: socket.socket) -> Optional[Pair]:
        with self.mutex:
            return self._pair_of.get(plain)

    def tls_of(self, plain: socket.socket) -> Optional[ssl.SSLSocket]:
        """The TLS socket behind the code's end ``plain`` (to set its socket options), or None."""
        pair = self._pair(plain)
        return pair.tls if pair is not None else None

    def fill(self, plain: socket.socket, view: memoryview, got: int) -> Optional[Fill]:
        """The hub's thread: let the relay decrypt the rest of a frame's buffer (``view`` from ``got``) straight into it.
        It first reads what ``plain`` holds into ``view`` itself. None when it cannot (not a relayed socket, a small
        rest, the peer gone): read ``plain`` as usual. A Fill not ``done`` yet is told on ``note_fd`` when it is."""
        pair = self._pair(plain)
        if pair is None or view.nbytes - got < HANDED_MIN:
            return None
        with pair.lock:
            fill = take_over(pair, plain, view, got)
        if fill is not None and not fill.done:
            self._kick(pair)  # OpenSSL may hold bytes already: no select would wake us for them
        return fill

    def note_fd(self) -> int:
        """Readable when a Fill finished (drain it with ``os.read``)."""
        return self.note_r

    def send(self, plain: socket.socket, data: Union[bytes, bytearray, memoryview]) -> None:
        """``plain.sendall(data)``, but a big buffer on a relayed socket is encrypted from where it lies (no socketpair,
        no copy), after everything written to ``plain`` before. The caller holds ``plain``'s write lock; returns once
        it is all sent, raises OSError when the connection fails first."""
        view = memoryview(data).cast("B")
        if view.nbytes < HANDED_MIN:
            if not self.direct(plain, view):
                plain.sendall(view)
            return
        with self.mutex:
            pair = self._pair_of.get(plain)
            job = Handed(view)
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

    def direct(self, plain: socket.socket, data: Union[bytes, bytearray, memoryview]) -> bool:
        """Encrypt a small message to ``plain``'s peer from the caller's thread, when the pair is free and nothing
        written before it waits (tls_ways.write_direct): no hand-off to this relay's thread, which on a loaded machine
        waits for a core each time. False: not done, write it to ``plain`` as usual. Never blocks: a pair the relay is
        busy with is left to it."""
        pair = self._pair(plain)
        if pair is None or not pair.lock.acquire(blocking=False):
            return False
        try:
            done = write_direct(pair, memoryview(data).cast("B"))
            queued = done and pair.up.waiting
        except (OSError, ValueError):  # the connection failed: the usual way lets the relay find it and say so
            log.debug("tls relay: a direct write failed", exc_info=True)
            return False
        finally:
            pair.lock.release()
        if queued:  # the TLS socket was full: the relay sends the rest when it can take it
            self._kick(pair)
        return done

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
            if pair.up.waiting or pair.direct or (not pair.up.eof and unread(pair.plain)):
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
        holding = any(held(pair) for pair in self.pairs.values())
        for key, _ in self.sel.select(timeout=0 if holding else 1.0):
            pair = key.data
            if pair is None:
                self._take_new()
            elif id(pair) in self.pairs:
                self._pump(pair)
        for pair in list(self.pairs.values()):
            if held(pair):
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
                with pair.lock:
                    self._fail(pair, ConnectionError("the control connection is closed"))

    def _pump(self, pair: Pair) -> None:
        with pair.lock:
            self._pump_locked(pair)

    def _pump_locked(self, pair: Pair) -> None:
        ended = pair.down.eof
        try:
            if fill_in(pair):
                self._note()
            if pair.fill is None:
                move(pair.down, pair.tls.recv_into, pair.plain.send, gather=True)
            move(pair.up, pair.take, pair.tls.send, gather=False)
            send_handed(pair)
        except (OSError, ValueError) as e:
            self._broken(pair, e)
        self._settle(pair, ended)
        if pair.up.eof and not pair.up.waiting:  # the code closed its end: it reads no more either
            self._drop(pair)
            return
        self._watch(pair)

    def _broken(self, pair: Pair, e: Exception) -> None:
        """The TLS connection failed: both ways end, what was handed over fails, a silent peer is recorded as such."""
        log.debug("tls relay: a connection failed", exc_info=True)
        if liveness.is_silence(e) or liveness.went_silent(pair.tls):
            liveness.mark_silent(pair.twin())
        pair.up.eof = pair.down.eof = True
        pair.up.clear()
        pair.down.clear()
        self._fail(pair, e if isinstance(e, OSError) else ConnectionError(str(e)))

    def _settle(self, pair: Pair, ended: bool) -> None:
        """After a move: a peer that went silent is recorded (a timeout reads as an EOF through OpenSSL), and once the
        peer's EOF is passed on, the code reads EOF too."""
        if pair.down.eof and not ended and liveness.went_silent(pair.tls):
            liveness.mark_silent(pair.twin())
        if pair.down.eof and not pair.down.waiting and not pair.plain_shut:  # the kernel (or rank) closed: the code reads EOF
            pair.plain_shut = True
            try:
                pair.plain.shutdown(socket.SHUT_WR)
            except OSError:
                log.debug("tls relay: shutdown failed", exc_info=True)

    def written(self, plain: socket.socket) -> Optional[int]:
        """How many bytes the code ever wrote to ``plain`` (what left it plus what it still holds); None: not relayed.
        A rank's output capture needs no new marker for a stream that has not grown (wire/capture.py)."""
        pair = self._pair(plain)
        if pair is None:
            return None
        with pair.lock:
            return pair.taken + unread(pair.plain)

    def pulled(self, plain: socket.socket) -> Optional[Pair]:
        """From now on the code's own thread reads what comes for ``plain`` (``read``, ``pull``), and this relay watches its
        TLS socket (the descriptor to wait on) only while it fills a buffer handed over. None: not relayed."""
        with self.mutex:
            pair = self._pair_of.get(plain)
            if pair is None:
                return None
            pair.pulled = True
        self._kick(pair)  # its selector interest changes at its next pump
        return pair

    def pull(self, plain: socket.socket) -> None:
        """The code's thread, its TLS socket readable: decrypt what came into the socketpair, to be read from ``plain`` at
        once (no hand-off to this relay's thread). While a buffer is being filled the relay reads; then nothing is done."""
        pair = self._pair(plain)
        if pair is None:
            return
        with pair.lock:
            if pair.fill is not None or pair.down.eof:
                return
            kick = self._pull_locked(pair)
        if kick:
            self._kick(pair)

    def read(self, pair: Pair, twin: socket.socket, view: memoryview, keeps: bool) -> int:
        """The code's thread reads ``twin`` (after ``pulled``) as a non-blocking ``recv_into``: what the socketpair holds
        first (it came first), else decrypted straight into ``view`` (tls_ways.decrypt_into), with no socketpair hop.
        BlockingIOError: nothing came. ``keeps``: the caller reads again before it waits, so OpenSSL may keep a record's
        rest; else (an epoll would not see it) that goes to the socketpair. An EOF or failure is settled as in ``pull``."""
        n, kick = 0, False
        with pair.lock:
            if pair.fill is None and not pair.down.waiting and not pair.down.eof and not unread(twin):
                try:
                    n = decrypt_into(pair, view)
                except (OSError, ValueError) as e:
                    self._broken(pair, e)
                if pair.down.eof or (n and not keeps and pair.tls.pending()):
                    kick = self._pull_locked(pair)
                elif not n:
                    raise BlockingIOError("nothing came")
        if kick:
            self._kick(pair)
        return n or twin.recv_into(view, 0, socket.MSG_DONTWAIT)

    def _pull_locked(self, pair: Pair) -> bool:
        """Decrypt what came into the socketpair (under ``pair.lock``); whether the relay must follow up: a full
        socketpair, bytes OpenSSL still holds, or the connection's end (no select would wake it for those)."""
        try:
            move(pair.down, pair.tls.recv_into, pair.plain.send, gather=True)
        except (OSError, ValueError) as e:
            self._broken(pair, e)
        self._settle(pair, False)
        return bool(pair.down.waiting or pair.down.eof or pair.tls.pending())

    def _kick(self, pair: Pair) -> None:
        """Have the relay's thread pump ``pair`` at its next wake, and wake it."""
        with self.mutex:
            self.kicked.append(pair)
        self.wake_w.send(b"x")

    def _watch(self, pair: Pair) -> None:
        """Register each socket for what it needs now: reading while its direction's buffer is free, writing while the
        other direction's waits. The selector is told only when that changes."""
        for sock, source, sink in ((pair.tls, pair.down, pair.up), (pair.plain, pair.up, pair.down)):
            writing = sink.waiting or (sock is pair.tls and bool(pair.direct))
            reading = not source.eof and not source.waiting and not (sock is pair.tls and pair.pulled and pair.fill is None)
            events = (selectors.EVENT_READ if reading else 0) | (selectors.EVENT_WRITE if writing else 0)
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

    def _fail(self, pair: Pair, error: BaseException) -> None:
        filling = pair.fill is not None
        fail(pair, error)
        if filling:
            self._note()

    def _note(self) -> None:
        try:
            os.write(self.note_w, b"x")
        except BlockingIOError:  # the pipe is full of notes the hub has not read: it will look anyway
            pass

    def _drop(self, pair: Pair) -> None:
        self.pairs.pop(id(pair), None)
        self._fail(pair, ConnectionError("the control connection is closed"))
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
