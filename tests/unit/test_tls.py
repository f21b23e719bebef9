"""The encrypted control channel (wire/tls.py) with the real admission: both ends prove the secret inside TLS, the rank
pins the kernel's certificate, and bytes cross intact both ways through the relay threads."""
from __future__ import annotations

import fcntl
import os
import select
import socket
import struct
import termios
import threading
import time

import pytest

from ddp_magic.kernel.admission import Admission
from ddp_magic.wire import protocol as P
from ddp_magic.wire import tls

pytestmark = pytest.mark.skipif(tls.shutil.which("openssl") is None, reason="no openssl command to make the pool's key")


@pytest.fixture(scope="module")
def key() -> tls.ServerKey:
    return tls.ServerKey()


def _take(admission: Admission, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        select.select([admission.fileno()], [], [], 0.2)
        joined = admission.take()
        if joined:
            return joined
    return []


def test_a_rank_joins_over_tls_and_bytes_cross_both_ways(key):
    secret = P.new_secret()
    rejected = []
    admission = Admission("127.0.0.1", secret, 8, lambda: rejected.append(1), key)
    try:
        rank = tls.connect(("127.0.0.1", admission.port), key.fingerprint)
        P.client_handshake(rank, secret)  # raises unless the kernel proves the secret too
        P.send(rank, P.message(P.HELLO, rank=0))
        [(kernel_side, hello)] = _take(admission)
        assert hello["rank"] == 0 and not rejected
        assert kernel_side.family == socket.AF_UNIX, "the hub gets the relay's plain twin, never the TLS socket"
        big = os.urandom(16 << 20)
        threading.Thread(target=lambda: P.send(rank, P.message(P.DONE, blob=big)), daemon=True).start()
        kernel_side.settimeout(30)
        assert P.recv(kernel_side)["blob"] == big
        P.send(kernel_side, P.message(P.RUN, source="1"))
        rank.settimeout(30)
        assert P.recv(rank)["source"] == "1"
        rank.close()
        assert kernel_side.recv(1) == b"", "the rank's close reaches the kernel as EOF"
        kernel_side.close()
    finally:
        admission.close()


def test_a_kernel_with_another_certificate_is_refused(key):
    other = tls.ServerKey()
    admission = Admission("127.0.0.1", P.new_secret(), 8, lambda: None, other)
    try:
        with pytest.raises(ConnectionError, match="fingerprint mismatch"):
            tls.connect(("127.0.0.1", admission.port), key.fingerprint)
    finally:
        admission.close()


def test_plain_tcp_and_a_wrong_secret_are_rejected(key):
    secret = P.new_secret()
    rejected = []
    admission = Admission("127.0.0.1", secret, 8, lambda: rejected.append(1), key)
    try:
        plain = socket.create_connection(("127.0.0.1", admission.port), timeout=10)
        plain.sendall(b"\x00" * 64)  # not a TLS handshake: the kernel drops it
        plain.close()
        wrong = tls.connect(("127.0.0.1", admission.port), key.fingerprint)
        with pytest.raises(ConnectionError):  # the kernel finds our proof wrong and hangs up before proving anything
            P.client_handshake(wrong, P.new_secret())
        wrong.close()
        deadline = time.monotonic() + 10
        while len(rejected) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(rejected) == 2 and admission.take() == []
    finally:
        admission.close()


EXITS_AT_ONCE = r"""
import os, sys
from ddp_magic.wire import protocol as P, tls
port, fingerprint, secret, size = int(sys.argv[1]), sys.argv[2], bytes.fromhex(os.environ["SECRET"]), int(sys.argv[3])
sock = tls.connect(("127.0.0.1", port), fingerprint)
P.client_handshake(sock, secret)
P.send(sock, P.message(P.HELLO, rank=3))
sock.sendall(P.encode(P.message(P.DONE, blob=b"last words" * (size // 10))))
os._exit(7)  # at once: the relay thread has not sent it yet
"""


@pytest.mark.parametrize("size", [100, 4 << 20])
def test_what_a_rank_wrote_just_before_it_exits_still_reaches_the_kernel(key, size):
    import subprocess
    import sys

    secret = P.new_secret()
    admission = Admission("127.0.0.1", secret, 8, lambda: None, key)
    try:
        for _attempt in range(2):
            proc = subprocess.Popen([sys.executable, "-c", EXITS_AT_ONCE, str(admission.port), key.fingerprint, str(size)],
                                    env=dict(os.environ, SECRET=secret.hex()))
            [(kernel_side, hello)] = _take(admission)
            assert hello["rank"] == 3
            kernel_side.settimeout(30)
            assert P.recv(kernel_side)["blob"] == b"last words" * (size // 10), "the relay sent it before the process went"
            assert kernel_side.recv(1) == b"", "then EOF"
            assert proc.wait(timeout=30) == 7, "os._exit's code is kept"
            kernel_side.close()
    finally:
        admission.close()


def test_results_cross_the_relays_whole_from_two_ranks_at_once_and_big_frames_go_back(key):
    """Two ranks each return a result with a buffer past the relay's chunk and round (out of band, as from another
    host: the rank's Channel hands it to the relay from the tensor's memory) and then a small message, while the
    kernel sends each a big frame: every byte crosses both relays intact, in order, both ways."""
    import pickle

    from ddp_magic.procs.worker import Channel
    from ddp_magic.wire import tls_ways

    def result(r: int) -> None:
        chan = Channel(ranks[r])
        chan.send(P.RESULT, rank=r, blob=pickle.PickleBuffer(payload[r]), after=r)
        chan.send(P.READY, rank=r)

    secret = P.new_secret()
    admission = Admission("127.0.0.1", secret, 8, lambda: None, key)
    size = tls_ways.ROUND_BYTES + tls_ways.CHUNK + 12345
    try:
        ranks = []
        for r in range(2):
            sock = tls.connect(("127.0.0.1", admission.port), key.fingerprint)
            P.client_handshake(sock, secret)
            P.send(sock, P.message(P.HELLO, rank=r))
            ranks.append(sock)
        joined = []
        while len(joined) < 2:
            joined += _take(admission)
        kernel = {hello["rank"]: s for s, hello in joined}
        payload = [bytes([r + 1]) * size for r in range(2)]
        senders = [threading.Thread(target=result, args=(r,)) for r in range(2)]
        for t in senders:
            t.start()
        for r in range(2):
            P.send(kernel[r], P.message(P.RUN, source="x" * size))
        for r in range(2):
            kernel[r].settimeout(60)
            ranks[r].settimeout(60)
            got = P.recv(kernel[r])
            assert got["rank"] == r and got["after"] == r and bytes(got["blob"]) == payload[r]
            assert P.recv(kernel[r]) == P.message(P.READY, rank=r), "what the rank wrote after the handed-over buffer comes after it"
            assert P.recv(ranks[r])["source"] == "x" * size
        for t in senders:
            t.join()
        for s in ranks + list(kernel.values()):
            s.close()
    finally:
        admission.close()


@pytest.mark.parametrize("via", ["the socketpair", "the TLS socket (tls.source)"])
def test_the_kernels_relay_decrypts_a_big_result_straight_into_the_readers_memory(key, via):
    """The hub's reader hands the rest of a big buffer to the relay (tls.filler) once the socketpair is empty; the relay's
    note wakes it. Two big results and small messages around them arrive whole and in order, whether the reader reads
    the socketpair or (as the hub does) decrypts what comes itself between the fills."""
    import pickle

    from ddp_magic.procs.worker import Channel

    secret = P.new_secret()
    admission = Admission("127.0.0.1", secret, 8, lambda: None, key)
    try:
        rank = tls.connect(("127.0.0.1", admission.port), key.fingerprint)
        P.client_handshake(rank, secret)
        P.send(rank, P.message(P.HELLO, rank=0))
        [(kernel_side, _)] = _take(admission)
        real, fills = tls.filler(kernel_side), []
        assert real is not None and tls.filler(socket.socket()) is None, "only a relayed socket is handed over"

        def handover(view, got):
            fills.append(real(view, got))
            return fills[-1]

        payloads = [os.urandom(24 << 20), os.urandom(17 << 20)]

        def results() -> None:
            chan = Channel(rank)
            for i, blob in enumerate(payloads):
                chan.send(P.READY, rank=i)
                chan.send(P.RESULT, rank=i, blob=pickle.PickleBuffer(blob))
            chan.send(P.DONE, rank=9)

        threading.Thread(target=results, daemon=True).start()
        kernel_side.setblocking(False)
        source = kernel_side if via == "the socketpair" else tls.source(kernel_side)
        waits = [kernel_side, tls.note_fd()] + ([source.fd] if isinstance(source, tls.TlsSource) else [])
        reader, scratch, got = P.FrameReader(), bytearray(1 << 20), []
        deadline = time.monotonic() + 60
        while len(got) < 5 and time.monotonic() < deadline:
            select.select(waits if not reader.relayed else waits[:2], [], [], 1.0)  # the hub: not the TLS socket while the relay fills
            try:
                os.read(tls.note_fd(), 4096)
            except BlockingIOError:
                pass
            try:
                msgs = reader.recv(source, scratch, handover)
            except BlockingIOError:
                continue
            assert msgs is not None, "no EOF before the last message"
            got += msgs
        assert [m["op"] for m in got] == [P.READY, P.RESULT, P.READY, P.RESULT, P.DONE]
        assert bytes(got[1]["blob"]) == payloads[0] and bytes(got[3]["blob"]) == payloads[1]
        assert any(f is not None and f.got > 0 for f in fills), "the relay filled at least one buffer in place"
        rank.close()
        kernel_side.close()
    finally:
        admission.close()


def _joined(key, secret, admission, rank: int = 0):
    sock = tls.connect(("127.0.0.1", admission.port), key.fingerprint)
    P.client_handshake(sock, secret)
    P.send(sock, P.message(P.HELLO, rank=rank))
    [(kernel_side, _)] = _take(admission)
    return sock, kernel_side


def test_small_messages_skip_the_relays_thread_both_ways(key, monkeypatch):
    """The sender encrypts a small message itself (tls.send_direct), and a reader that waits on the TLS socket decrypts
    it itself (tls.source, tls.reading): round trips of small messages wake no relay thread."""
    from ddp_magic.kernel.conns import ReadBuffer, wait_ready
    from ddp_magic.procs.rank_channel import Channel
    from ddp_magic.wire.tls_relay import Relay

    secret = P.new_secret()
    admission = Admission("127.0.0.1", secret, 8, lambda: None, key)
    try:
        rank, kernel_side = _joined(key, secret, admission)
        kernel_side.setblocking(False)
        hub_source = tls.source(kernel_side)
        source = tls.reading(rank)
        assert isinstance(hub_source, tls.TlsSource) and isinstance(source, tls.PullReader)
        fd = hub_source.fd
        relay = Relay.get()
        deadline = time.monotonic() + 10
        while (relay.kicked or relay.added) and time.monotonic() < deadline:  # the relay took the pairs' new interest
            time.sleep(0.01)
        time.sleep(0.05)
        pumps = []
        real = Relay._pump
        monkeypatch.setattr(Relay, "_pump", lambda self, pair: (pumps.append(pair), real(self, pair)))
        chan, reader, rbuf = Channel(rank), P.FrameReader(), ReadBuffer()
        for i in range(50):
            assert tls.send_direct(kernel_side, P.encode(P.message(P.RUN, cell=i)))
            assert P.recv(source) == P.message(P.RUN, cell=i)
            chan.send(P.DONE, cell=i)
            got: list = []
            while not got:
                assert wait_ready(kernel_side, 10, also=fd)
                try:
                    got = reader.feed(rbuf.recv(hub_source))
                except BlockingIOError:
                    pass
            assert got == [P.message(P.DONE, cell=i)]
        assert len(pumps) < 10, f"the relay's thread moved {len(pumps)} of 100 small messages"
        rank.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the rank's close reaches the kernel's reader as EOF, through pull too
            wait_ready(kernel_side, 1, also=fd)
            try:
                if rbuf.recv(hub_source) == b"":
                    break
            except BlockingIOError:
                continue
        else:
            raise AssertionError("no EOF")
        kernel_side.close()
    finally:
        admission.close()


def _drained(sock: socket.socket, seconds: float = 5.0) -> None:
    """Until the relay has taken all ``sock`` wrote into its socketpair (SIOCOUTQ: bytes the peer has not read), and a moment more."""
    deadline = time.monotonic() + seconds
    while struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0] and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(0.02)


def test_a_direct_write_waits_its_turn_behind_what_was_written_before(key):
    """A small message never overtakes bytes written before it that still wait (in the socketpair, the relay's buffer,
    a buffer handed over): then it goes the usual way; and concurrent writers, some through fd writes, some direct,
    each arrive whole and in their own order."""
    from ddp_magic.procs.rank_channel import Channel

    secret = P.new_secret()
    admission = Admission("127.0.0.1", secret, 8, lambda: None, key)
    try:
        rank, kernel_side = _joined(key, secret, admission)
        kernel_side.settimeout(60)
        big = os.urandom(24 << 20)  # more than the socketpair, the relay's buffer and TCP's together: it waits
        small = P.encode(P.message(P.READY, rank=0))
        ways = {"handed to the relay": lambda: Channel(rank).send(P.DONE, blob=big),
                "through the socketpair": lambda: rank.sendall(P.encode(P.message(P.DONE, blob=big)))}
        for way, send_big in ways.items():
            sender = threading.Thread(target=send_big, daemon=True)
            sender.start()
            time.sleep(0.3)  # the kernel reads nothing yet: the big frame is stuck part way
            assert not tls.send_direct(rank, small), f"a small message must not overtake a big one {way}"
            assert P.recv(kernel_side)["blob"] == big
            sender.join(30)
        assert tls.send_direct(rank, small), "nothing waits now: it goes directly"
        assert P.recv(kernel_side) == P.message(P.READY, rank=0)

        start, total = tls.bytes_written(rank), 0
        for i in range(0, 200, 2):  # written to the socketpair (fd 1's way), then at once a direct one: it must not overtake
            total += os.write(rank.fileno(), P.encode(P.message(P.READY, n=i)))
            frame = P.encode(P.message(P.READY, n=i + 1))
            if not tls.send_direct(rank, frame):
                rank.sendall(frame)
            total += len(frame)
        assert [P.recv(kernel_side)["n"] for _ in range(200)] == list(range(200))
        assert start is not None and tls.bytes_written(rank) == start + total, "the capture's count sees every way out"

        directs, order = [], iter(range(600))

        def fd_writer() -> None:  # as a rank's prints: straight to the socketpair
            for i in range(300):
                with lock:  # one frame at a time, numbered in the order written
                    os.write(rank.fileno(), P.encode(P.message(P.READY, n=next(order))))
                if i % 3 == 0:
                    time.sleep(0.001)  # the relay catches up now and then: the other writer's next may go directly

        def direct_writer() -> None:  # as a rank's markers and messages: directly when nothing written before waits
            for i in range(300):
                with lock:
                    if i % 30 == 0:  # now and then the relay catches up first (on a loaded machine it may never, unasked)
                        _drained(rank)
                    frame = P.encode(P.message(P.READY, n=next(order)))
                    directs.append(tls.send_direct(rank, frame))
                    if not directs[-1]:
                        rank.sendall(frame)

        lock = threading.Lock()
        writers = [threading.Thread(target=fd_writer), threading.Thread(target=direct_writer)]
        for t in writers:
            t.start()
        for t in writers:
            t.join(30)
        assert [P.recv(kernel_side)["n"] for _ in range(600)] == list(range(600)), "every frame whole, none overtook"
        assert any(directs), "some went directly"
        rank.close()
        kernel_side.close()
    finally:
        admission.close()
