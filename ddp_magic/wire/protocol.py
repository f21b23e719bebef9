"""Framing, authentication and encoding of the kernel <-> worker control channel.

Nothing is unpickled before the peer has proved it knows the pool's secret
(HMAC challenge in both directions), so a stranger who connects to the port can
neither run code in a worker nor make the kernel unpickle anything. Frames are
unpickled here (``recv``, ``FrameReader``) and only after the handshake; the
values inside them (results, notebook names) are unpickled by transfer.py, from
frames that already passed it. The handshake's steps are also here without I/O
(``challenge``/``check_answer``, ``answer_challenge``/``check_proof``), for a
peer that runs them on a non-blocking socket.

A frame is an 8-byte length and a pickled message. A message that holds large buffers (a
result's tensors, ``pickle.PickleBuffer``) is pickled with protocol 5 and its buffers go
out of band, after the pickle, flagged in the length (``OOB``): the sender writes them
from the tensor's own memory and the receiver reads them straight into the memory the
result will live in (``FrameReader.recv``). Across hosts a result has no /dev/shm to
take, and each copy of 256 MiB in the way cost about as much as the network itself.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import socket
import mmap
import struct
from enum import Enum
from typing import Any, Callable, List, Optional, Protocol, Tuple, Union

MAGIC = b"DDPM1"
NONCE_SIZE = 32
DIGEST_SIZE = 32
HEADER = struct.Struct("!Q")
MAX_FRAME = 1 << 40  # a sanity bound: a corrupted length must not allocate the world
OOB = 1 << 63  # in HEADER: the body is COUNT, COUNT sizes, the pickle, then that many out-of-band buffers
COUNT = struct.Struct("!I")
SIZE = struct.Struct("!Q")
MAX_BUFFERS = 1 << 16
LAZY_BUFFER = 1 << 20  # a buffer this large is an anonymous map: its pages are touched by the read that fills them, not by a memset first

# Message kinds (the "op" field of every message dict).
HELLO = "hello"          # worker -> kernel: rank, pid, host, device (first frame of the control socket)
HELLO_OUT = "hello_out"  # worker -> kernel: first frame of a raw stdout/stderr socket
READY = "ready"          # worker -> kernel: process group initialised (or skipped)
INIT_FAILED = "init_failed"
RUN = "run"              # kernel -> worker: execute a cell; "named_marks": DONE may name its quiet streams' earlier markers
DONE = "done"            # worker -> kernel: the cell finished on this rank; "sync": stream -> the marker it follows (wire/capture.py)
DONE_SEEN = "done_seen"  # kernel -> worker: a kept pool's DONE of this cell is counted; until then a kernel's death leaves it for the next
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
VERSIONS = "versions"    # kernel -> worker: the versions of these modules (names; None: all); worker -> kernel: name -> [file, sha(, sha run)] (autoreload)
KEEP = "keep"            # kernel -> worker: outlive the kernel (on, socket, dir: procs/rank_keep.py) or not; worker -> kernel: done
SAFE_POINT = "safe_point"  # both ways: a save at the ranks' next safe point while a cell runs (wire/safe_point.py says each message)

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


def encode_parts(msg: dict) -> List[Union[bytes, memoryview]]:
    """One frame as the pieces to write in order: the header and pickle, then each out-of-band buffer's own memory."""
    buffers: List[pickle.PickleBuffer] = []
    body = pickle.dumps(msg, protocol=5, buffer_callback=buffers.append)
    if not buffers:
        return [HEADER.pack(len(body)) + body]
    raws = [b.raw() for b in buffers]
    prefix = COUNT.pack(len(raws)) + b"".join(SIZE.pack(r.nbytes) for r in raws)
    total = len(prefix) + len(body) + sum(r.nbytes for r in raws)
    return [HEADER.pack(total | OOB) + prefix + body, *raws]


def encode(msg: dict) -> bytes:
    """One frame as bytes (a copy of any out-of-band buffer: for small messages; ``send`` writes big ones in place)."""
    return b"".join(encode_parts(msg))


def send(sock: socket.socket, msg: dict) -> None:
    for part in encode_parts(msg):
        sock.sendall(part)


def new_buffer(size: int) -> Union[bytearray, mmap.mmap]:
    """Memory for an out-of-band buffer, ours to keep (a tensor is built over it)."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE) if size >= LAZY_BUFFER else bytearray(size)


def _layout(total: int, prefix: bytes) -> Tuple[List[int], int]:
    """An OOB frame's buffer sizes and pickle length, from its COUNT and sizes; a frame that does not add up is refused."""
    (count,) = COUNT.unpack_from(prefix)
    sizes = [SIZE.unpack_from(prefix, COUNT.size + SIZE.size * i)[0] for i in range(count)]
    plen = total - COUNT.size - SIZE.size * count - sum(sizes)
    if plen < 0:
        raise ConnectionError("frame layout is not credible")
    return sizes, plen


def _frame_size(word: int) -> int:
    size = word & ~OOB
    if size > MAX_FRAME:
        raise ConnectionError(f"frame of {size} bytes is not credible")
    return size


def recv(sock: socket.socket) -> dict:
    """Blocking read of one frame from an authenticated peer."""
    (word,) = HEADER.unpack(recv_exact(sock, HEADER.size))
    size = _frame_size(word)
    if not word & OOB:
        return pickle.loads(recv_exact(sock, size))
    head = recv_exact(sock, COUNT.size)
    count = COUNT.unpack(head)[0]
    if count > MAX_BUFFERS:
        raise ConnectionError("frame layout is not credible")
    sizes, plen = _layout(size, head + recv_exact(sock, SIZE.size * count))
    body = recv_exact(sock, plen)
    buffers = []
    for n in sizes:
        buf = new_buffer(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = sock.recv_into(view[got:], n - got)
            if k == 0:
                raise ConnectionError("connection closed by peer")
            got += k
        view.release()
        buffers.append(buf)
    return pickle.loads(body, buffers=buffers)


class Readable(Protocol):
    """What FrameReader reads: a non-blocking socket, or a TLS connection read by the caller's thread (tls.TlsSource)."""

    def recv_into(self, buffer: Any, nbytes: int = ..., /) -> int: ...


class FrameReader:
    """Incremental decoder for a non-blocking socket: feed bytes (or let it read the socket), take whole messages.

    An out-of-band buffer is filled in place: ``recv`` reads into it directly once the frame's
    header and pickle are in, so a 256 MiB result is read once, into the memory it keeps.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._need: Optional[int] = None  # the current frame's body length (without the flag)
        self._oob = False
        self._filling = False  # an OOB frame's header and pickle are in: its buffers are being read
        self._pickle = b""  # an OOB frame's pickle, while its buffers come
        self._sizes: List[int] = []  # the sizes of its buffers still to come
        self._done: List[Union[bytearray, mmap.mmap]] = []  # its buffers filled so far
        self._fill: Optional[memoryview] = None  # the one being filled, and how much of it is
        self._got = 0
        self._relayed: Any = None  # a tls_ways.Fill: the TLS relay is filling the rest of ``_fill``

    def feed(self, data: Union[bytes, bytearray, memoryview]) -> list:
        if not self._buf and self._need is None and not self._filling and len(data) > HEADER.size:  # the usual read: exactly one whole frame
            (size,) = HEADER.unpack_from(data)
            if size + HEADER.size == len(data) and size <= MAX_FRAME:
                return [pickle.loads(data[HEADER.size:])]
        self._buf += data
        return self._parse()

    @property
    def relayed(self) -> bool:
        """Whether the TLS relay is filling a buffer of ours (tell us, ``recv``, when its note comes)."""
        return self._relayed is not None

    def recv(self, sock: Readable, scratch: bytearray, handover: Optional[Callable[[memoryview, int], Any]] = None) -> Optional[list]:
        """Read once from ``sock``: the messages it completed (None at EOF). BlockingIOError when nothing is there.

        ``handover`` (a relayed socket: tls.filler): the rest of a big buffer is given to the relay to decrypt into it,
        once the socketpair is empty; the relay's note then brings us back here."""
        if self._relayed is not None:
            if not self._relayed.done:
                raise BlockingIOError("the relay is filling the buffer")
            fill, self._relayed = self._relayed, None
            if fill.failed:
                return None
            self._got = fill.got
            return self._parse()
        if self._fill is not None and not self._buf:
            fill = handover(self._fill, self._got) if handover is not None else None
            if fill is not None:
                self._relayed = fill
                return self.recv(sock, scratch)
            n = sock.recv_into(self._fill[self._got:])
            if n == 0:
                return None
            self._got += n
            return self._parse()
        n = sock.recv_into(scratch)
        if n == 0:
            return None
        if not self._buf and self._need is None and not self._filling and n > HEADER.size:  # the usual read: one whole frame (feed's)
            (size,) = HEADER.unpack_from(scratch)
            if size + HEADER.size == n and size <= MAX_FRAME:
                return [pickle.loads(memoryview(scratch)[HEADER.size : n])]
        return self.feed(memoryview(scratch)[:n])

    def _parse(self) -> list:
        out = []
        while True:
            if self._filling:
                if not self._fill_buffers():
                    break
                out.append(pickle.loads(self._pickle, buffers=self._done))
                self._pickle, self._done, self._oob, self._filling = b"", [], False, False
                continue
            if self._need is None:
                if len(self._buf) < HEADER.size:
                    break
                (word,) = HEADER.unpack_from(self._buf)
                self._need, self._oob = _frame_size(word), bool(word & OOB)
                del self._buf[: HEADER.size]
            if self._oob:
                if not self._start_buffers():
                    break
                continue
            if len(self._buf) < self._need:
                break
            body = bytes(self._buf[: self._need])
            del self._buf[: self._need]
            self._need = None
            out.append(pickle.loads(body))
        return out

    def _start_buffers(self) -> bool:
        """An OOB frame's COUNT, sizes and pickle, once all are in; False while they are not."""
        assert self._need is not None
        if len(self._buf) < COUNT.size:
            return False
        (count,) = COUNT.unpack_from(self._buf)
        if count > MAX_BUFFERS:
            raise ConnectionError("frame layout is not credible")
        head = COUNT.size + SIZE.size * count
        if len(self._buf) < head:
            return False
        sizes, plen = _layout(self._need, bytes(self._buf[:head]))
        if len(self._buf) < head + plen:
            return False
        self._pickle = bytes(self._buf[head : head + plen])
        del self._buf[: head + plen]
        self._sizes, self._need, self._filling = sizes, None, True
        return True

    def _fill_buffers(self) -> bool:
        """Move what was read into the buffers being filled, opening the next as each fills; True once all are."""
        while True:
            if self._fill is None:
                if not self._sizes:
                    return True
                buf = new_buffer(self._sizes.pop(0))
                self._done.append(buf)
                self._fill, self._got = memoryview(buf), 0
            k = min(len(self._buf), len(self._fill) - self._got)
            if k:
                with memoryview(self._buf) as view:
                    self._fill[self._got : self._got + k] = view[:k]
                del self._buf[:k]
                self._got += k
            if self._got < len(self._fill):
                return False
            self._fill.release()
            self._fill = None


def message(op: str, **fields: Any) -> dict:
    fields["op"] = op
    return fields
