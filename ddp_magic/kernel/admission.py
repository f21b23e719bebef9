"""Who may join a pool: the control port, open only while ranks join, and the peers it admits.

An accept thread takes connections; each peer gets an admit thread of its own
that proves it knows the pool's secret (HMAC both ways) before one byte of
payload is read, then reads its HELLO (over TLS first when the pool has a key:
wire/tls.py; the admitted socket is then the relay's plain twin). Admitted sockets wait in a queue, and a
byte on a pipe wakes the pool's poll loop (``fileno``), which takes them with
``take`` and hands them to the hub. Strangers are dropped and counted.
"""
from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
from typing import Callable, List, Optional, Tuple

from ..logs import log
from ..plan.net import address_family
from ..wire import protocol as P
from ..wire import tls

Joined = Tuple[socket.socket, dict]  # an authenticated socket and its HELLO
HANDSHAKE_S = 10  # a peer that has not proved itself by then is dropped


class Admission:
    """The listening socket of one start, with its accept and admit threads."""

    def __init__(self, addr: str, secret: bytes, backlog: int, on_reject: Callable[[], None], tls_key: Optional[tls.ServerKey] = None) -> None:
        self.secret = secret
        self.tls_key = tls_key
        self.on_reject = on_reject
        self._joined: "queue.Queue[Joined]" = queue.Queue()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._lsock = socket.socket(address_family(addr), socket.SOCK_STREAM)
        try:
            self._lsock.bind((addr, 0))
            self._lsock.listen(backlog)
        except OSError:
            self._lsock.close()
            raise
        self.port: int = self._lsock.getsockname()[1]
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
        threading.Thread(target=self._accept_loop, daemon=True, name="ddp-accept").start()

    def fileno(self) -> int:
        """Readable when an admitted peer waits to be taken."""
        return self._wake_r

    def take(self) -> List[Joined]:
        """The peers admitted since the last call (and clears the wake-up)."""
        if self._stop.is_set():
            return []
        with contextlib.suppress(OSError):  # nothing to read is the same as having read it
            os.read(self._wake_r, 4096)
        return self._drain()

    def close(self) -> None:
        """Stop admitting: close the port and the wake-up pipe. Peers admitted but not taken are closed."""
        with self._lock:  # no admit thread writes to the pipe once it is closed (its fd may be reused)
            if self._stop.is_set():  # closed already: its fds may belong to someone else by now
                return
            self._stop.set()
            with contextlib.suppress(OSError):
                self._lsock.close()
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
        for sock, _ in self._drain():
            sock.close()

    def _drain(self) -> List[Joined]:
        out = []
        while True:
            try:
                out.append(self._joined.get_nowait())
            except queue.Empty:
                return out

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self._lsock.accept()
            except OSError:  # the port was closed: start-up is over
                return
            threading.Thread(target=self._admit, args=(sock,), daemon=True, name="ddp-admit").start()

    def _admit(self, sock: socket.socket) -> None:
        """Authenticate a peer before reading one byte of payload; strangers are dropped."""
        try:
            sock.settimeout(HANDSHAKE_S)
            if sock.family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls_key is not None:
                sock = tls.wrap_server(sock, self.tls_key, HANDSHAKE_S)
                sock.settimeout(HANDSHAKE_S)
            P.server_handshake(sock, self.secret)
            hello = P.recv(sock)
            if hello.get("op") not in (P.HELLO, P.HELLO_OUT):
                raise P.AuthenticationError("no hello")
            sock.settimeout(None)
        except Exception:  # a wrong secret, garbage, a timeout, a closed socket: all the same to us
            log.debug("a peer on the control port was rejected", exc_info=True)
            self.on_reject()
            sock.close()
            return
        with self._lock:
            if self._stop.is_set():  # start-up is over (or failed): nobody will take it
                sock.close()
                return
            self._joined.put((sock, hello))
            with contextlib.suppress(BlockingIOError):  # a full pipe already says "wake up"
                os.write(self._wake_w, b"x")


def raise_fd_limit(needed: int) -> None:
    """Hundreds of ranks need more sockets than the usual soft limit of 1024; the hard limit allows it."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = len(os.listdir("/proc/self/fd")) + needed if os.path.isdir("/proc/self/fd") else needed + 256
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(want * 2, hard) if hard != resource.RLIM_INFINITY else want * 2, hard))
    except (ImportError, ValueError, OSError):
        log.debug("the open-file limit could not be raised", exc_info=True)
