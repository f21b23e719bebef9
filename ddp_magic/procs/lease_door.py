"""Who talks to a kept pool's lease, and how they get in: the door (its socket, or TCP and TLS) and each peer on it.

The lease (procs/lease.py) lives in its template's single-threaded loop. On one host its door is a Unix socket in
a 0700 directory: only the same user reaches it, and each peer proves the pool's secret there and then (a rank
answers within milliseconds). A lease whose kernel's host is another (``bind``: this node's address) listens on
TCP, where anyone on the network may knock: the TLS handshake (a key made here, its fingerprint pinned by every
peer) and the proof of the secret run in a thread per knock, so a peer that never finishes them costs the loop
nothing; those who pass are handed over through a wake pipe.
"""
from __future__ import annotations

import json
import os
import socket
import threading
from typing import Any, Dict, List, Optional

from ..logs import log
from ..wire import kept, tls
from ..wire import protocol as P

HANDSHAKE_S = 5.0  # a peer of the lease proves the secret within this


class Peer:
    """One authenticated connection to the lease socket: a rank's, or a kernel's."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.rank: Optional[int] = None  # a rank's connection
        self.node: Optional[str] = None  # another Slurm node's template, following the lease (procs/template_keep.py)
        self.pid = 0  # its pid
        self.busy = False
        self.watch = False  # the kernel's host following a lease held on another host (procs/lease_watch.py)

    def send(self, obj: Dict[str, Any]) -> bool:
        try:
            self.sock.setblocking(True)
            self.sock.settimeout(2.0)
            self.sock.sendall((json.dumps(obj) + "\n").encode())
            return True
        except OSError:
            log.debug("a lease peer is gone", exc_info=True)
            return False

    def lines(self) -> Optional[List[Dict[str, Any]]]:
        """What it sent since the last call; None at EOF."""
        try:
            self.sock.setblocking(False)
            data = self.sock.recv(65536)
        except BlockingIOError:
            return []
        except OSError:
            data = b""
        if not data:
            return None
        self.buf += data
        out = []
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            out.append(json.loads(line))
        return out


class Door:
    """The lease's listening socket and its admission (see the module's docstring)."""

    def __init__(self, path: str, secret: bytes, bind: str = "") -> None:
        self.secret = secret
        self.key: Optional[tls.ServerKey] = tls.ServerKey() if bind else None
        self.admitted: List[Peer] = []  # through TLS and the proof, waiting for the loop
        self.lock = threading.Lock()
        self.closed = False
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        if self.key is not None:
            self.listener = socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET, socket.SOCK_STREAM)
            self.listener.bind((bind, 0))
            self.at: kept.LeaseAt = {"host": bind, "port": self.listener.getsockname()[1], "fp": self.key.fingerprint}
        else:
            if os.path.exists(path):
                os.unlink(path)
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old = os.umask(0o177)
            try:
                self.listener.bind(path)
            finally:
                os.umask(old)
            self.at = {"path": path}
        self.listener.listen(4096)  # a rank per connection, all at once at keep (the system caps it at somaxconn)
        self.listener.setblocking(False)

    def fds(self) -> List[int]:
        return [self.listener.fileno(), self.wake_r]

    def admit(self, fd: int) -> List[Peer]:
        """``fd`` (one of ``fds``) is readable: the peers admitted now."""
        if fd == self.wake_r:
            try:
                while os.read(self.wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
            with self.lock:
                out, self.admitted = self.admitted, []
            return out
        out = []
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:  # none left (BlockingIOError)
                return out
            if self.key is not None:
                threading.Thread(target=self._admit_tls, args=(sock,), name="ddp-lease-admit", daemon=True).start()
            elif self._proved(sock):
                out.append(Peer(sock))

    def _proved(self, sock: socket.socket) -> bool:
        try:
            sock.settimeout(HANDSHAKE_S)
            P.server_handshake(sock, self.secret)
            return True
        except Exception:  # a wrong secret, garbage, a timeout: not ours
            log.debug("a peer of the lease was rejected", exc_info=True)
            sock.close()
            return False

    def _admit_tls(self, sock: socket.socket) -> None:
        assert self.key is not None
        try:
            sock.settimeout(HANDSHAKE_S)
            plain = tls.wrap_server(sock, self.key, HANDSHAKE_S)  # the relay's plain twin (wire/tls.py)
        except Exception:  # not TLS, or not in time
            log.debug("a peer of the lease failed its TLS handshake", exc_info=True)
            sock.close()
            return
        if self._proved(plain):
            with self.lock:
                if self.closed:  # keep --off or the lease's end meanwhile
                    plain.close()
                    return
                self.admitted.append(Peer(plain))
                os.write(self.wake_w, b"x")

    def close(self) -> None:
        self.listener.close()
        with self.lock:
            self.closed = True
            for fd in (self.wake_r, self.wake_w):
                os.close(fd)
