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
else stays as it is over plain TCP. Costs: one more copy of each byte, and the AES.

The relay is a thread of the process, so what the code wrote last still sits in the
socketpair or the relay's buffer when the process ends: over plain TCP the OS sends a
dead process's last bytes, through the relay they would be lost (a rank that prints its
error and exits at once). So a process that dialled out over TLS drains its relay before
it exits: ``os._exit`` (every exit path of a rank) and interpreter exit wait, up to
DRAIN_S, until nothing the code wrote is left unsent. A rank killed by a signal it cannot
catch (SIGKILL) still loses what the relay had not sent.
"""
from __future__ import annotations

import atexit
import fcntl
import hashlib
import os
import struct
import termios
import time
import selectors
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import weakref
from typing import Callable, Dict, Optional, Tuple

from ..logs import log
from . import liveness

FORCE_ENV = "DDP_MAGIC_FORCE_TLS"  # "1": TLS even when every rank is on this host (tests, measurements)
CHUNK = 1 << 18
HIGH_WATER = 8 << 20  # stop reading a side while this much waits to be written to the other
DRAIN_S = 3.0  # how long an exiting process waits for its relay to send what its code wrote


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


class _Pair:
    """One TLS socket and the plain socket the code uses instead, with what waits to go each way."""

    def __init__(self, tls: ssl.SSLSocket, plain: socket.socket, twin: socket.socket) -> None:
        self.tls, self.plain = tls, plain
        self.twin = weakref.ref(twin)  # the code's end: told when the TLS peer went silent (wire/liveness.py)
        self.to_plain = bytearray()  # decrypted, not yet handed to the code
        self.to_tls = bytearray()  # from the code, not yet encrypted
        self.tls_eof = self.plain_eof = self.plain_shut = False


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
        self.rounds = 0  # select rounds done: a drain sees the relay between two of them
        threading.Thread(target=self._loop, name="ddp-tls-relay", daemon=True).start()

    @classmethod
    def get(cls) -> "Relay":
        with cls._lock:
            if cls._instance is None:
                cls._instance = Relay()
            return cls._instance

    def add(self, tls: ssl.SSLSocket) -> socket.socket:
        """Take over ``tls`` (handshake done); returns the plain socket to use instead."""
        mine, theirs = socket.socketpair()
        tls.setblocking(False)
        mine.setblocking(False)
        with self.mutex:
            self.added.append(_Pair(tls, mine, theirs))
        self.wake_w.send(b"x")
        return theirs

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
            if pair.to_tls or (not pair.plain_eof and _unread(pair.plain)):
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
        for key, _ in self.sel.select(timeout=1.0):
            pair = key.data
            if pair is None:
                self._take_new()
            elif id(pair) in self.pairs:
                self._pump(pair)
        for pair in list(self.pairs.values()):
            if pair.tls.pending():
                self._pump(pair)

    def _take_new(self) -> None:
        try:
            self.wake_r.recv(4096)
        except BlockingIOError:
            pass
        with self.mutex:
            new, self.added = self.added, []
        for pair in new:
            self.pairs[id(pair)] = pair
            self._watch(pair)
            self._pump(pair)

    def _watch(self, pair: _Pair) -> None:
        """Register both sockets for what they need now: reading unless the other side is backed up, writing when bytes wait."""
        for sock, reading, waiting in ((pair.tls, not pair.tls_eof and len(pair.to_plain) < HIGH_WATER, pair.to_tls),
                                       (pair.plain, not pair.plain_eof and len(pair.to_tls) < HIGH_WATER, pair.to_plain)):
            events = (selectors.EVENT_READ if reading else 0) | (selectors.EVENT_WRITE if waiting else 0)
            try:
                if _registered(self.sel, sock):
                    if events:
                        self.sel.modify(sock, events, pair)
                    else:
                        self.sel.unregister(sock)
                elif events:
                    self.sel.register(sock, events, pair)
            except (ValueError, OSError):
                log.debug("tls relay: a socket went while being watched", exc_info=True)

    def _pump(self, pair: _Pair) -> None:
        try:
            self._read_tls(pair)
            self._read_plain(pair)
            _flush(pair.plain, pair.to_plain)
            _flush(pair.tls, pair.to_tls)
        except (OSError, ValueError) as e:
            log.debug("tls relay: a connection failed", exc_info=True)
            if liveness.is_silence(e) or liveness.went_silent(pair.tls):
                liveness.mark_silent(pair.twin())
            pair.tls_eof = pair.plain_eof = True
            pair.to_plain.clear()
            pair.to_tls.clear()
        if pair.tls_eof and not pair.to_plain and not pair.plain_shut:  # the kernel (or rank) closed: the code reads EOF
            pair.plain_shut = True
            try:
                pair.plain.shutdown(socket.SHUT_WR)
            except OSError:
                log.debug("tls relay: shutdown failed", exc_info=True)
        if pair.plain_eof and not pair.to_tls:  # the code closed its end: it reads no more either
            self._drop(pair)
            return
        self._watch(pair)

    def _read_tls(self, pair: _Pair) -> None:
        while not pair.tls_eof and len(pair.to_plain) < HIGH_WATER:
            try:
                data = pair.tls.recv(CHUNK)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                return
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError, ConnectionError):
                data = b""
            if not data:
                pair.tls_eof = True
                if liveness.went_silent(pair.tls):  # a timeout reads as an EOF through OpenSSL
                    liveness.mark_silent(pair.twin())
                return
            pair.to_plain += data

    def _read_plain(self, pair: _Pair) -> None:
        while not pair.plain_eof and len(pair.to_tls) < HIGH_WATER:
            try:
                data = pair.plain.recv(CHUNK)
            except BlockingIOError:
                return
            except ConnectionError:
                data = b""
            if not data:
                pair.plain_eof = True
                return
            pair.to_tls += data

    def _drop(self, pair: _Pair) -> None:
        self.pairs.pop(id(pair), None)
        for sock in (pair.tls, pair.plain):
            if _registered(self.sel, sock):
                self.sel.unregister(sock)
            try:
                sock.close()
            except OSError:
                log.debug("tls relay: close failed", exc_info=True)


def _unread(sock: socket.socket) -> int:
    """Bytes waiting to be read on ``sock`` (FIONREAD); 0 when it is closed."""
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
    except (OSError, ValueError):
        return 0


_EXIT: Optional[Callable[[int], None]] = None  # os._exit as it was, once a client connection made us wrap it


def _drain_before_exit() -> None:
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


def _registered(sel: selectors.BaseSelector, sock: socket.socket) -> bool:
    try:
        sel.get_key(sock)
        return True
    except (KeyError, ValueError):
        return False


def _flush(sock: socket.socket, buf: bytearray) -> None:
    """Write what waits, as far as the socket takes it now."""
    while buf:
        try:
            n = sock.send(bytes(buf[:CHUNK]))  # a copy: a memoryview still exported when send raises would pin the buffer
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
            return
        del buf[:n]


def wrap_server(sock: socket.socket, key: ServerKey, timeout: float) -> socket.socket:
    """Kernel side: the TLS handshake on an accepted socket, then the plain twin the admission and hub use."""
    sock.settimeout(timeout)
    liveness.arm(sock, data_too=False)  # arm_control adds the rest once the peer says it is a control socket
    tls = key.context.wrap_socket(sock, server_side=True)
    return Relay.get().add(tls)


def arm_control(plain: socket.socket) -> None:
    """Kernel side: the TLS socket behind ``plain`` carries a rank's control channel: its full liveness check."""
    relay = Relay.get()
    with relay.mutex:
        pairs = list(relay.pairs.values()) + list(relay.added)
    for pair in pairs:
        if pair.twin() is plain:
            liveness.arm(pair.tls)
            return


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
    _drain_before_exit()
    return Relay.get().add(tls)
