"""The control channel's liveness check: a peer whose host went silent is found within seconds, at no cost to a cell.

Both ends of every control connection (kernel <-> rank) ask the OS to check the peer:
TCP keepalive probes after ``IDLE_S`` without traffic, one every ``INTERVAL_S``, and
``TCP_USER_TIMEOUT``: once nothing from the peer has been acknowledged for ``SILENCE_S``
(probes unanswered, or data sent and never acknowledged), the connection fails with
ETIMEDOUT. A node whose link went down, or whose traffic a firewall drops, is so found
within ``SILENCE_S`` plus a probe interval; Slurm would take its node timeout (often
minutes) and then blame a rank on a healthy node.

Why the OS and not a heartbeat message from a thread of the rank: the probes are answered
by the peer's TCP stack, not by its Python. A rank whose main thread holds the GIL for an
hour inside one C call (a long kernel, a blocking collective), or prints nothing for an
hour, still answers, so a healthy busy rank is never ended; an application heartbeat would
need the GIL at every beat, and a stalled beat would be taken for a lost host. And a warm
cell pays nothing: no message is added to the hot path, and probes go only over a
connection that has been idle for ``IDLE_S``. What it does not find: a rank whose host is
up but whose process hangs or is stopped (SIGSTOP) - its host still answers; that is a
hang, the cell's timeout and hang forensics are for it (kernel/failures/forensics.py).

With TLS the TCP socket is the relay's (wire/tls_relay.py) and the code holds a socketpair end:
the relay records which plain end lost its peer to silence (``mark_silent``), and
``lost_to_silence`` reads it, so the kernel can say "unreachable" rather than "exited".
"""
from __future__ import annotations

import errno
import socket
import struct
import threading
import weakref
from typing import Optional

from ..logs import log

IDLE_S = 2  # a control connection idle this long is probed
INTERVAL_S = 1  # then a probe a second
SILENCE_S = 8  # nothing acknowledged by the peer for this long: the connection fails (ETIMEDOUT)
RANK_SILENCE_S = 2 * SILENCE_S  # a rank's own end waits longer: the kernel names the node first, then the rank goes
CONNECT_ENV = "DDP_MAGIC_CONNECT_TIMEOUT"  # in a rank's env: how long its first connect to the kernel may take
TCP_CLOSE = 7  # tcpi_state of a connection ended by a timeout or a reset (a FIN leaves it in CLOSE_WAIT)
SILENT_ERRNOS = (errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN)

_silent: "weakref.WeakSet[socket.socket]" = weakref.WeakSet()  # plain ends whose TLS peer went silent
_silent_lock = threading.Lock()


def arm(sock: socket.socket, data_too: bool = True, silence: int = SILENCE_S) -> None:
    """Ask the OS to check the peer of ``sock`` (a TCP socket): keepalive probes, and with ``data_too`` a user timeout.

    Only control sockets get the user timeout (``data_too``): it also ends a connection whose
    receiver has not read for ``SILENCE_S`` (a full window) on kernels before Linux 5.11, and the
    kernel does not read a rank's output between cells.
    """
    opts = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    timings = [("TCP_KEEPIDLE", IDLE_S), ("TCP_KEEPINTVL", INTERVAL_S), ("TCP_KEEPCNT", silence // INTERVAL_S)]
    for name, value in timings + ([("TCP_USER_TIMEOUT", silence * 1000)] if data_too else []):
        if hasattr(socket, name):  # Linux has all four; elsewhere keepalive with the OS's timings
            opts.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, opt, value in opts:
        try:
            sock.setsockopt(level, opt, value)
        except OSError:  # not a TCP socket (a socketpair end in a test): nothing to arm
            log.debug("liveness option %s not set", opt, exc_info=True)
            return


def connect_timeout(join_timeout: float) -> float:
    """How long a rank waits for the kernel's port to answer: well inside the pool's join timeout (the rank is forked
    after its node's template imported torch), so a blocked port is reported by the rank before the kernel gives up."""
    return round(min(30.0, max(3.0, join_timeout / 3)), 1)


def is_silence(exc: Optional[BaseException]) -> bool:
    """Whether a socket error means the peer's host stopped answering (not that the peer closed or reset)."""
    return isinstance(exc, OSError) and (isinstance(exc, TimeoutError) or exc.errno in SILENT_ERRNOS)


def went_silent(sock: socket.socket, silence: int = SILENCE_S) -> bool:
    """Whether ``sock`` (TCP, closed by an error or a timeout) heard nothing from its peer for the check's window.

    What an error says is not enough: through OpenSSL a timed-out read surfaces as an EOF. The kernel's own record
    (TCP_INFO) does not lie: the connection is closed (not half-closed by a FIN) and the peer's last acknowledgement
    is ``silence`` seconds old (less a probe), where a reset or a FIN arrived just now."""
    if not hasattr(socket, "TCP_INFO"):
        return False
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    except OSError:
        return False
    if len(info) < 60:
        return False
    state, last_ack_recv = info[0], struct.unpack_from("I", info, 56)[0]  # struct tcp_info: tcpi_state, tcpi_last_ack_recv (ms)
    return state == TCP_CLOSE and last_ack_recv >= (silence - INTERVAL_S) * 1000


def mark_silent(plain: Optional[socket.socket]) -> None:
    """The relay's word: the TLS peer of ``plain`` went silent (its socket is about to read EOF)."""
    if plain is not None:
        with _silent_lock:
            _silent.add(plain)


def lost_to_silence(sock: socket.socket, exc: Optional[BaseException] = None) -> bool:
    """Whether ``sock``'s connection was lost because its peer went silent: its own error or record, or its relay's."""
    if is_silence(exc) or (sock.family in (socket.AF_INET, socket.AF_INET6) and went_silent(sock)):
        return True
    with _silent_lock:
        return sock in _silent


def silence_words() -> str:
    """How a lost link reads to the user (one home: the cell's error, the docs' examples)."""
    return f"no answer on the control channel for {SILENCE_S}s (its link is down, or a firewall drops its traffic)"
