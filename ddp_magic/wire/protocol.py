"""Framing, authentication and encoding of the kernel <-> worker control channel.

Nothing is unpickled before the peer has proved it knows the pool's secret
(HMAC challenge in both directions), so a stranger who connects to the port can
neither run code in a worker nor make the kernel unpickle anything. Frames are
unpickled here (``recv``, ``FrameReader``) and only after the handshake; the
values inside them (results, notebook names) are unpickled by transfer.py, from
frames that already passed it. The handshake's steps are also here without I/O
(``challenge``/``check_answer``, ``answer_challenge``/``check_proof``), for a
peer that runs them on a non-blocking socket.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import socket
import struct
from enum import Enum
from typing import Any, Optional, Tuple

MAGIC = b"DDPM1"
NONCE_SIZE = 32
DIGEST_SIZE = 32
HEADER = struct.Struct("!Q")
MAX_FRAME = 1 << 40  # a sanity bound: a corrupted length must not allocate the world

# Message kinds (the "op" field of every message dict).
HELLO = "hello"          # worker -> kernel: rank, pid, host, device (first frame of the control socket)
HELLO_OUT = "hello_out"  # worker -> kernel: first frame of a raw stdout/stderr socket
READY = "ready"          # worker -> kernel: process group initialised (or skipped)
INIT_FAILED = "init_failed"
RUN = "run"              # kernel -> worker: execute a cell
DONE = "done"            # worker -> kernel: the cell finished on this rank
DECIDE = "decide"        # kernel -> worker: how to return a pending result
RESULT = "result"        # worker -> kernel: a result sent after DECIDE
INTERRUPT = "interrupt"  # kernel -> worker: stop the running cell
STACK = "stack"          # kernel -> worker (request) and back (reply): where is the main thread (with an id: %ddp stacks, procs/rank_stacks.py)
ENV = "env"              # kernel -> worker (request) and back (reply): the env as the rank sees it
SHUTDOWN = "shutdown"    # kernel -> worker: exit cleanly
KILL = "kill"            # kernel -> worker: exit now, whatever the main thread is stuck in
INPUT = "input"          # worker -> kernel: read a line for this rank (id, prompt, password); kernel -> worker: the reply (id, text or eof)
DEBUG = "debug"          # worker -> kernel: the rank entered (on=True) or left its debugger
HOLD = "hold"            # kernel -> worker: some rank debugs or waits for input (on): collective waits do not count as hangs
ABORT = "abort"          # kernel -> worker: release every collective wait by aborting the process group (why)
REFORM = "reform"        # kernel -> worker: form a new default group (gen, store); worker -> kernel: done (ok, seconds, swapped, stale)
METRICS = "metrics"      # worker -> kernel: rows of ddp_magic.log(step, **scalars), buffered, in order (procs/rank_metrics.py)
PROFILE = "profile"      # kernel -> worker: run the next cell under torch.profiler (procs/rank_profile.py); its DONE carries the trace
MEMORY = "memory"        # worker -> kernel: the rank's memory now (procs/rank_memory.py), sampled; kernel -> worker: read it now
PEEK = "peek"            # kernel -> worker: run a short read-only cell on the peek thread (id, source); worker -> kernel: its answer

# The cell %ddp_debug runs on every rank: pdb on ``rank``'s kept traceback, nothing on the others (procs/rank_debug.py).
POST_MORTEM_SOURCE = '__import__("ddp_magic.procs.rank_debug", fromlist=["post_mortem"]).post_mortem({rank})'


class CellStatus(str, Enum):
    """The "status" field of DONE: how the cell ended on one rank (sent as its plain value)."""

    OK = "ok"
    ERROR = "error"  # the cell raised, or a notebook variable could not be loaded
    INTERRUPTED = "interrupted"  # KeyboardInterrupt: Ctrl-C or the kernel's INTERRUPT

    def __str__(self) -> str:
        return self.value


class AuthenticationError(ConnectionError):
    """The peer does not know the pool's secret."""


def new_secret() -> bytes:
    return os.urandom(32)


def _digest(secret: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, role + nonce, hashlib.sha256).digest()


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly n bytes or raise ConnectionError on EOF."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("connection closed by peer")
        got += k
    return bytes(buf)


def challenge() -> Tuple[bytes, bytes]:
    """Kernel side, step 1: (what to send, the nonce the answer must sign)."""
    nonce = os.urandom(NONCE_SIZE)
    return MAGIC + nonce, nonce


def check_answer(secret: bytes, nonce: bytes, answer: bytes) -> bytes:
    """Kernel side, step 2: the peer's answer checked; returns our proof to send. Raises AuthenticationError."""
    if len(answer) != DIGEST_SIZE + NONCE_SIZE or not hmac.compare_digest(answer[:DIGEST_SIZE], _digest(secret, b"worker", nonce)):
        raise AuthenticationError("peer failed the challenge")
    return _digest(secret, b"kernel", answer[DIGEST_SIZE:])


def answer_challenge(secret: bytes, hello: bytes) -> Tuple[bytes, bytes]:
    """Worker side, step 1: the kernel's challenge answered; returns (what to send, our nonce)."""
    if hello[: len(MAGIC)] != MAGIC:
        raise AuthenticationError("not a ddp_magic kernel")
    nonce = os.urandom(NONCE_SIZE)
    return _digest(secret, b"worker", hello[len(MAGIC):]) + nonce, nonce


def check_proof(secret: bytes, nonce: bytes, proof: bytes) -> None:
    """Worker side, step 2: the kernel's answer to our nonce. Raises AuthenticationError."""
    if not hmac.compare_digest(proof, _digest(secret, b"kernel", nonce)):
        raise AuthenticationError("kernel failed the challenge")


def server_handshake(sock: socket.socket, secret: bytes) -> None:
    """Kernel side: challenge the peer, then prove ourselves. Raises AuthenticationError."""
    hello, nonce = challenge()
    sock.sendall(hello)
    sock.sendall(check_answer(secret, nonce, recv_exact(sock, DIGEST_SIZE + NONCE_SIZE)))


def client_handshake(sock: socket.socket, secret: bytes) -> None:
    """Worker side: answer the kernel's challenge and check the kernel's answer to ours."""
    answer, nonce = answer_challenge(secret, recv_exact(sock, len(MAGIC) + NONCE_SIZE))
    sock.sendall(answer)
    check_proof(secret, nonce, recv_exact(sock, DIGEST_SIZE))


def encode(msg: dict) -> bytes:
    """One frame: 8-byte length, then the pickled message (plain data only)."""
    body = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(body)) + body


def send(sock: socket.socket, msg: dict) -> None:
    sock.sendall(encode(msg))


def recv(sock: socket.socket) -> dict:
    """Blocking read of one frame from an authenticated peer."""
    (size,) = HEADER.unpack(recv_exact(sock, HEADER.size))
    if size > MAX_FRAME:
        raise ConnectionError(f"frame of {size} bytes is not credible")
    return pickle.loads(recv_exact(sock, size))


class FrameReader:
    """Incremental decoder for a non-blocking socket: feed bytes, take whole messages."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._need: Optional[int] = None

    def feed(self, data: bytes) -> list:
        self._buf += data
        out = []
        while True:
            if self._need is None:
                if len(self._buf) < HEADER.size:
                    break
                (self._need,) = HEADER.unpack_from(self._buf)
                if self._need > MAX_FRAME:
                    raise ConnectionError("frame length is not credible")
                del self._buf[: HEADER.size]
            if len(self._buf) < self._need:
                break
            body = bytes(self._buf[: self._need])
            del self._buf[: self._need]
            self._need = None
            out.append(pickle.loads(body))
        return out


def message(op: str, **fields: Any) -> dict:
    fields["op"] = op
    return fields
