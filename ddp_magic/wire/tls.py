"""The control channel encrypted: a per-pool TLS key, the ranks pinned to its certificate, and one relay thread per process.

Used when ranks run on other hosts (a Slurm pool whose nodes are not this machine), or
always with ``DDP_MAGIC_FORCE_TLS=1`` (the suite runs its two-node case so). Both ends
still prove the pool's secret (protocol.py's HMAC, both ways) inside the TLS channel;
the rank also checks that the kernel's certificate is the one whose SHA-256 it was given
(in the step's env), so nobody in between can pose as the kernel.

The key is made per pool by ``openssl`` in a private temporary folder, loaded, and its
files removed at once: it never sits on a shared home. An OpenSSL connection must not
be read and written from two threads at once, and the rank reads its control socket in
one thread while another sends; so neither side hands a TLS socket to its code. A
``Relay`` thread owns every TLS socket of the process, and the code gets the plain end
of a socketpair (``wrap``): the rank's fds 1 and 2, the hub's poll loop, everything
else stays as it is over plain TCP. Costs: one more pass of each byte through the relay
(tls_relay.py, which also drains a rank's last bytes before it exits), and the AES.
A small message skips the relay's thread when it can: the sender encrypts it itself
(``send_direct``, ``send``), and a reader that waits on the TLS socket decrypts what came
itself, straight into its own buffer (``source``, ``reading``); each hop to another thread
costs a wake and the GIL, and a hop through the socketpair two syscalls.
"""
from __future__ import annotations

import atexit
import functools
import hashlib
import os
import select
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
from typing import Callable, Dict, Optional, Tuple, Union

from . import liveness
from .tls_relay import Relay
from .tls_ways import Fill, Pair

FORCE_ENV = "DDP_MAGIC_FORCE_TLS"  # "1": TLS even when every rank is on this host (tests, measurements)


class TlsError(RuntimeError):
    """TLS could not be set up; the message names what is missing."""


def forced(environ: Optional[Dict[str, str]] = None) -> bool:
    return (environ if environ is not None else os.environ).get(FORCE_ENV, "") == "1"


class ServerKey:
    """The kernel's per-pool key and self-signed certificate, as a server context and the fingerprint ranks pin."""

    def __init__(self) -> None:
        openssl = shutil.which("openssl")
        if openssl is None:
            raise TlsError("ranks on other hosts need TLS and this machine has no openssl command: install openssl (apt-get install openssl)")
        folder = tempfile.mkdtemp(prefix="ddp_magic-tls-")  # 0700, on this host only
        key, cert = os.path.join(folder, "key.pem"), os.path.join(folder, "cert.pem")
        try:
            done = subprocess.run(
                [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "7",
                 "-subj", "/CN=ddp_magic pool", "-keyout", key, "-out", cert],
                capture_output=True, text=True, timeout=30,
            )
            if done.returncode:
                raise TlsError(f"openssl could not make the pool's TLS key: {done.stderr.strip()[-300:]}")
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.minimum_version = ssl.TLSVersion.TLSv1_3
            self.context.load_cert_chain(cert, key)
            with open(cert) as f:
                self.fingerprint = hashlib.sha256(ssl.PEM_cert_to_DER_cert(f.read())).hexdigest()
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def client_context() -> ssl.SSLContext:
    """The rank's side: no CA (the certificate is pinned by fingerprint instead, ``check_peer``)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def check_peer(sock: ssl.SSLSocket, fingerprint: str) -> None:
    """The kernel's certificate must be the pinned one: anything else is someone posing as the kernel."""
    der = sock.getpeercert(binary_form=True) or b""
    if hashlib.sha256(der).hexdigest() != fingerprint.lower():
        raise ConnectionError("the kernel's TLS certificate is not the pool's (fingerprint mismatch): refusing to talk to it")


def wrap_server(sock: socket.socket, key: ServerKey, timeout: float) -> socket.socket:
    """Kernel side: the TLS handshake on an accepted socket, then the plain twin the admission and hub use."""
    sock.settimeout(timeout)
    liveness.arm(sock, data_too=False)  # arm_control adds the rest once the peer says it is a control socket
    tls = key.context.wrap_socket(sock, server_side=True)
    return Relay.get().add(tls)


def arm_control(plain: socket.socket) -> None:
    """Kernel side: the TLS socket behind ``plain`` carries a rank's control channel: its full liveness check."""
    tls = Relay.get().tls_of(plain)
    if tls is not None:
        liveness.arm(tls)


def filler(sock: socket.socket) -> Optional[Callable[[memoryview, int], Optional[Fill]]]:
    """For the hub's reader of ``sock``: how to have this process's relay decrypt the rest of a big buffer straight into
    it (tls_relay.Relay.fill); None for a socket the relay does not carry."""
    relay = Relay.current()
    if relay is None or relay.tls_of(sock) is None:
        return None
    return functools.partial(relay.fill, sock)


def note_fd() -> Optional[int]:
    """The descriptor that turns readable when the relay finished a fill (None: no relay in this process)."""
    relay = Relay.current()
    return relay.note_fd() if relay is not None else None


def send(sock: socket.socket, data: Union[bytes, bytearray, memoryview]) -> None:
    """``sock.sendall(data)``; on a relayed socket a big buffer goes from the caller's memory (tls_relay.Relay.send).
    The caller holds ``sock``'s write lock."""
    relay = Relay.current()
    if relay is None:
        sock.sendall(data)
    else:
        relay.send(sock, data)


def relaying() -> bool:
    """Whether this process has a TLS relay (no TLS connection yet: no ``send_direct`` can write anything)."""
    return Relay.current() is not None


def send_direct(sock: socket.socket, data: Union[bytes, bytearray, memoryview]) -> bool:
    """A small message written to ``sock``'s TLS peer from the caller's thread when it can be (tls_relay.Relay.direct);
    False: write it to ``sock`` as usual (not relayed, or something written before it still waits). Never blocks."""
    relay = Relay.current()
    return relay is not None and relay.direct(sock, data)


def bytes_written(sock: socket.socket) -> Optional[int]:
    """How many bytes were ever written to a relayed ``sock`` (tls_relay.Relay.written); None: not relayed."""
    relay = Relay.current()
    return relay.written(sock) if relay is not None else None


def pull(sock: socket.socket) -> None:
    """Decrypt what ``sock``'s TLS peer sent into ``sock``, from the caller's thread (after ``source``; a peek at ``sock``
    then sees it). Never blocks."""
    relay = Relay.current()
    if relay is not None:
        relay.pull(sock)


class TlsSource:
    """A relayed socket read as a non-blocking ``sock.recv_into`` reads it, by the reading thread itself: what ``sock``
    holds first, else decrypted from the TLS socket straight into the caller's buffer (tls_relay.Relay.read): no relay
    thread, no write and read through the socketpair. Wait on ``fd`` (the TLS socket) and ``sock`` before reading."""

    keeps = False  # an epoll waiter does not see a record's rest that OpenSSL keeps: that goes to ``sock``

    def __init__(self, sock: socket.socket, relay: Relay, pair: Pair) -> None:
        self.sock, self.relay, self.pair = sock, relay, pair
        self.fd = pair.tls.fileno()

    def recv_into(self, buf: Union[bytearray, memoryview], nbytes: int = 0) -> int:
        view = memoryview(buf).cast("B")
        return self.relay.read(self.pair, self.sock, view[:nbytes] if nbytes else view, self.keeps)


class PullReader(TlsSource):
    """A blocking reader of a relayed socket that decrypts what comes in its own thread: no wake of the relay's thread
    for each message, no socketpair hop. Reads as ``sock.recv_into`` does (protocol.recv needs no more)."""

    keeps = True  # it reads again before it waits

    def __init__(self, sock: socket.socket, relay: Relay, pair: Pair) -> None:
        super().__init__(sock, relay, pair)
        self.poller = select.poll()
        for watched in (sock.fileno(), self.fd):  # the relay may still pass bytes on through ``sock`` (an EOF, a backlog)
            self.poller.register(watched, select.POLLIN)

    def recv_into(self, buf: Union[bytearray, memoryview], nbytes: int = 0) -> int:
        while True:
            try:
                return super().recv_into(buf, nbytes)
            except BlockingIOError:
                self.poller.poll()


def source(sock: socket.socket) -> Union[socket.socket, TlsSource]:
    """What a non-blocking reader of ``sock`` reads it through: over TLS a ``TlsSource`` (from now on the relay's thread
    no longer reads for it); else ``sock`` itself."""
    relay = Relay.current()
    pair = relay.pulled(sock) if relay is not None else None
    return sock if pair is None or relay is None else TlsSource(sock, relay, pair)


def reading(sock: socket.socket) -> Union[socket.socket, PullReader]:
    """What a thread that blocks reading ``sock`` reads it through: over TLS a ``PullReader``; else ``sock`` itself."""
    relay = Relay.current()
    pair = relay.pulled(sock) if relay is not None else None
    return sock if pair is None or relay is None else PullReader(sock, relay, pair)


def connect(addr: Tuple[str, int], fingerprint: str, timeout: float = 30, control: bool = False) -> socket.socket:
    """Rank side: a TLS connection to the kernel, its certificate checked; returns the plain twin."""
    raw = socket.create_connection(addr, timeout=timeout)
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    liveness.arm(raw, data_too=control, silence=liveness.RANK_SILENCE_S)
    tls = client_context().wrap_socket(raw)
    try:
        check_peer(tls, fingerprint)
    except ConnectionError:
        tls.close()
        raise
    drain_before_exit()
    return Relay.get().add(tls)


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
    atexit.register(_drain_current)


def _drain_current() -> None:
    relay = Relay.current()  # a forked child that never dialled has none (and needs none)
    if relay is not None:
        relay.drain()


def _forget_in_child() -> None:
    """A forked child (a kept template's rank) has none of its parent's relay thread: it starts its own when it dials,
    and its os._exit waits for no relay until then."""
    global _EXIT
    Relay._instance = None
    Relay._lock = threading.Lock()
    if _EXIT is not None:
        os._exit = _EXIT  # type: ignore[assignment]
        _EXIT = None


os.register_at_fork(after_in_child=_forget_in_child)
