"""Who may join a pool: the control port, open only while ranks join, and the peers it admits.

One admission thread runs every handshake at once on non-blocking sockets
(a selector over the port and the peers half-way through): each peer proves
it knows the pool's secret (HMAC both ways, wire/protocol.py's steps) before
one byte of payload is read, then sends its HELLO, read to its exact length
(what follows it is the hub's). A thousand ranks join in one thread, not a
thousand threads. Admitted sockets wait in a queue, and a byte on a pipe wakes
the pool's poll loop (``fileno``), which takes them with ``take`` and hands
them to the hub. Strangers, and peers that have not proved themselves within
``HANDSHAKE_S``, are dropped and counted. A pool with a TLS key (ranks on other
hosts: wire/tls.py) runs each peer's TLS handshake, then the same proof, on a
thread of its own (TLS handshakes block); the admitted socket is then the relay's
plain twin.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import queue
import selectors
import socket
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

from ..logs import log
from ..plan.net import address_family
from ..wire import protocol as P
from ..wire import liveness, tls

Joined = Tuple[socket.socket, dict]  # an authenticated socket and its HELLO
HANDSHAKE_S = 10  # a peer that has not proved itself by then is dropped
MAX_HELLO = 1 << 16  # a HELLO is a few fields: a longer frame is no peer of ours


class _Peer:
    """One connection half-way through the handshake: what it must send next, and by when."""

    def __init__(self, sock: socket.socket, nonce: bytes) -> None:
        self.sock, self.nonce = sock, nonce
        self.deadline = time.monotonic() + HANDSHAKE_S
        self.need = P.DIGEST_SIZE + P.NONCE_SIZE  # the answer to our challenge, then the HELLO's header, then its body
        self.buf = b""
        self.stage = 0  # 0: answer, 1: HELLO header, 2: HELLO body

    def feed(self, secret: bytes) -> Optional[dict]:
        """Read what is there, exactly up to what the stage needs; the HELLO once complete. Raises on a bad peer."""
        data = self.sock.recv(self.need - len(self.buf))
        if not data:
            raise ConnectionError("the peer closed the connection during the handshake")
        self.buf += data
        if len(self.buf) < self.need:
            return None
        got, self.buf = self.buf, b""
        if self.stage == 0:
            self.sock.sendall(P.check_answer(secret, self.nonce, got))  # 32 bytes into an empty buffer
            self.stage, self.need = 1, P.HEADER.size
            return None
        if self.stage == 1:
            (size,) = P.HEADER.unpack(got)
            if not 0 < size <= MAX_HELLO:
                raise P.AuthenticationError("no hello")
            self.stage, self.need = 2, size
            return None
        hello = pickle.loads(got)  # the peer proved the secret: its frames are ours to read
        if not isinstance(hello, dict) or hello.get("op") not in (P.HELLO, P.HELLO_OUT):
            raise P.AuthenticationError("no hello")
        return hello


class Admission:
    """The listening socket of one start, with its admission thread."""

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
            self._lsock.setblocking(False)
        except OSError:
            self._lsock.close()
            raise
        self.port: int = self._lsock.getsockname()[1]
        self._wake_r, self._wake_w = os.pipe()
        self._quit_r, self._quit_w = os.pipe()  # close() wakes the admission thread with a byte here
        for fd in (self._wake_r, self._wake_w, self._quit_r, self._quit_w):
            os.set_blocking(fd, False)
        threading.Thread(target=self._admit_loop, daemon=True, name="ddp-admit").start()

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
        with self._lock:  # the admission thread writes to the pipe only under it, and never once it is closed (its fd may be reused)
            if self._stop.is_set():  # closed already: its fds may belong to someone else by now
                return
            self._stop.set()
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
            with contextlib.suppress(OSError):
                os.write(self._quit_w, b"x")  # the thread closes the port, the half-admitted peers and its end of this pipe
            os.close(self._quit_w)
        for sock, _ in self._drain():
            sock.close()

    def _drain(self) -> List[Joined]:
        out = []
        while True:
            try:
                out.append(self._joined.get_nowait())
            except queue.Empty:
                return out

    def _admit_loop(self) -> None:
        """Accept, challenge and read every peer at once, until close()."""
        sel = selectors.DefaultSelector()
        sel.register(self._lsock, selectors.EVENT_READ)
        sel.register(self._quit_r, selectors.EVENT_READ)
        peers: Dict[int, _Peer] = {}
        try:
            while not self._stop.is_set():
                wait = min([p.deadline for p in peers.values()], default=time.monotonic() + 1.0) - time.monotonic()
                for key, _ in sel.select(max(0.0, wait)):
                    if key.fileobj is self._lsock:
                        self._accept(sel, peers)
                    elif key.fileobj != self._quit_r:
                        self._step(sel, peers, peers[key.fd])
                now = time.monotonic()
                for peer in [p for p in peers.values() if p.deadline <= now]:
                    log.debug("a peer on the control port did not prove itself within %ss", HANDSHAKE_S)
                    self._reject(sel, peers, peer)
        finally:
            for peer in list(peers.values()):
                self._forget(sel, peers, peer)
                peer.sock.close()
            sel.close()
            self._lsock.close()
            os.close(self._quit_r)

    def _accept(self, sel: selectors.BaseSelector, peers: Dict[int, _Peer]) -> None:
        while True:
            try:
                sock, _ = self._lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # the port was closed: start-up is over
                log.debug("accepting on the control port failed", exc_info=True)
                return
            if self.tls_key is not None:
                threading.Thread(target=self._admit_tls, args=(sock,), daemon=True, name="ddp-admit-tls").start()
                continue
            sock.setblocking(False)
            hello, nonce = P.challenge()
            try:
                sock.sendall(hello)  # 37 bytes into an empty buffer
            except OSError:
                log.debug("a peer went before its challenge", exc_info=True)
                sock.close()
                continue
            peers[sock.fileno()] = _Peer(sock, nonce)
            sel.register(sock, selectors.EVENT_READ)

    def _step(self, sel: selectors.BaseSelector, peers: Dict[int, _Peer], peer: _Peer) -> None:
        try:
            hello = peer.feed(self.secret)
        except BlockingIOError:
            return
        except Exception as e:  # a wrong secret, garbage, a closed socket: all the same to us
            log.warning("the control port refused %s: %s", _who(peer.sock), _why(e))
            self._reject(sel, peers, peer)
            return
        if hello is None:
            return
        self._forget(sel, peers, peer)
        peer.sock.settimeout(None)
        peer.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if hello.get("op") == P.HELLO:  # the control socket: a node that goes silent is found within seconds (wire/liveness.py)
            liveness.arm(peer.sock)
        self._admitted(peer.sock, hello)

    def _admit_tls(self, sock: socket.socket) -> None:
        """A TLS peer: the TLS handshake, then the proof of the secret and the HELLO over it, blocking, on its own thread."""
        assert self.tls_key is not None
        who = _who(sock)
        try:
            sock.settimeout(HANDSHAKE_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock = tls.wrap_server(sock, self.tls_key, HANDSHAKE_S)  # the relay's plain twin (a socketpair end)
            sock.settimeout(HANDSHAKE_S)
            P.server_handshake(sock, self.secret)
            hello = P.recv(sock)
            if hello.get("op") not in (P.HELLO, P.HELLO_OUT):
                raise P.AuthenticationError("no hello")
            sock.settimeout(None)
            if hello.get("op") == P.HELLO:
                tls.arm_control(sock)  # the control socket: a node that goes silent is found within seconds (wire/liveness.py)
        except Exception as e:  # a wrong secret, garbage, a timeout, a closed socket: all the same to us
            log.warning("the control port refused %s (TLS): %s", who, _why(e))
            self.on_reject()
            sock.close()
            return
        self._admitted(sock, hello)

    def _admitted(self, sock: socket.socket, hello: dict) -> None:
        """Queue a proven peer for the pool's loop, and wake it."""
        with self._lock:
            if self._stop.is_set():  # start-up is over (or failed): nobody will take it
                sock.close()
                return
            self._joined.put((sock, hello))
            with contextlib.suppress(BlockingIOError):  # a full pipe already says "wake up"
                os.write(self._wake_w, b"x")

    def _forget(self, sel: selectors.BaseSelector, peers: Dict[int, _Peer], peer: _Peer) -> None:
        peers.pop(peer.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(peer.sock)

    def _reject(self, sel: selectors.BaseSelector, peers: Dict[int, _Peer], peer: _Peer) -> None:
        self._forget(sel, peers, peer)
        peer.sock.close()
        self.on_reject()


def _who(sock: socket.socket) -> str:
    """A peer's address, for the log line that says it was refused."""
    try:
        host, port = sock.getpeername()[:2]
        return f"a peer at {host}:{port}"
    except OSError:
        return "a peer that had gone"


def _why(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:200] if str(e) else type(e).__name__


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
