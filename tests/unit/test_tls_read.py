"""A TLS connection read by the reader's own thread straight into its buffer (wire/tls.py's ``source`` and ``reading``,
tls_relay.Relay.read): small messages cross with no hop through the relay's socketpair, and order, record boundaries
and the socketpair's backlog are kept."""
from __future__ import annotations

import select
import time

import pytest

from ddp_magic.kernel.admission import Admission
from ddp_magic.kernel.conns import ReadBuffer, wait_ready
from ddp_magic.procs.rank_channel import Channel
from ddp_magic.wire import protocol as P
from ddp_magic.wire import tls, tls_relay
from ddp_magic.wire.tls_ways import unread

pytestmark = pytest.mark.skipif(tls.shutil.which("openssl") is None, reason="no openssl command to make the pool's key")


@pytest.fixture(scope="module")
def key() -> tls.ServerKey:
    return tls.ServerKey()


@pytest.fixture()
def joined(key):
    """A rank's TLS connection and the kernel's end of it, as the hub gets it from the admission."""
    secret = P.new_secret()
    admission = Admission("127.0.0.1", secret, 8, lambda: None, key)
    rank = tls.connect(("127.0.0.1", admission.port), key.fingerprint)
    P.client_handshake(rank, secret)
    P.send(rank, P.message(P.HELLO, rank=0))
    deadline, got = time.monotonic() + 10, []
    while not got and time.monotonic() < deadline:
        select.select([admission.fileno()], [], [], 0.2)
        got = admission.take()
    [(kernel_side, _)] = got
    kernel_side.setblocking(False)
    yield rank, kernel_side
    rank.close()
    kernel_side.close()
    admission.close()


def _settled(relay: tls_relay.Relay) -> None:
    """The relay's thread took the pairs' new interest (``source`` and ``reading`` kick it once)."""
    deadline = time.monotonic() + 10
    while (relay.kicked or relay.added) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)


def _pumps(monkeypatch: pytest.MonkeyPatch) -> list:
    """The pairs the relay's thread pumps from now on."""
    pumps: list = []
    real = tls_relay.Relay._pump

    def pump(self: tls_relay.Relay, pair: tls_relay.Pair) -> None:
        pumps.append(pair)
        real(self, pair)

    monkeypatch.setattr(tls_relay.Relay, "_pump", pump)
    return pumps


def _hub_read(source: tls.TlsSource, rbuf: ReadBuffer, reader: P.FrameReader) -> list:
    """As the hub reads: wait for either descriptor (epoll in the hub), then one read."""
    got: list = []
    deadline = time.monotonic() + 10
    while not got:
        assert time.monotonic() < deadline, "no message within 10 s, though a descriptor kept turning readable"
        assert wait_ready(source.sock, 10, also=source.fd), "the message came, yet neither descriptor turned readable"
        try:
            got = reader.feed(rbuf.recv(source))
        except BlockingIOError:
            pass
    return got


def test_small_messages_cross_without_the_socketpair_both_ways(joined, monkeypatch):
    """The hub's reader and the rank's decrypt straight into their own buffers: no byte of 100 small messages goes
    through a relay's socketpair (tls_relay.move on a pair's down way), and none wakes a relay's thread."""
    rank, kernel_side = joined
    hub_source, rank_source = tls.source(kernel_side), tls.reading(rank)
    assert isinstance(hub_source, tls.TlsSource) and isinstance(rank_source, tls.PullReader)
    relay = tls_relay.Relay.get()
    _settled(relay)
    pumps, hops, real_move = _pumps(monkeypatch), [], tls_relay.move
    downs = {id(p.down) for p in relay.pairs.values()}

    def move(way, read, write, gather):  # as tls_ways.move, counted
        if id(way) in downs:
            hops.append(way)
        return real_move(way, read, write, gather)

    monkeypatch.setattr(tls_relay, "move", move)
    chan, reader, rbuf = Channel(rank), P.FrameReader(), ReadBuffer()
    for i in range(50):
        assert tls.send_direct(kernel_side, P.encode(P.message(P.RUN, cell=i, source="x" * i)))
        assert P.recv(rank_source) == P.message(P.RUN, cell=i, source="x" * i)
        chan.send(P.DONE, cell=i)
        assert _hub_read(hub_source, rbuf, reader) == [P.message(P.DONE, cell=i)]
    assert not hops, f"{len(hops)} reads went through a socketpair"
    assert len(pumps) < 10, f"the relay's thread moved {len(pumps)} of 100 small messages"


def test_a_record_the_hub_read_in_part_is_not_left_inside_openssl(joined, monkeypatch):
    """One TLS record holding many frames, read a few bytes per wake: the hub's own thread puts the rest of the record
    where its poll sees it (the socketpair), not left in OpenSSL, where no poll would wake the hub (only the relay's
    thread, at its next round): every byte arrives, in order, and the relay's thread is not needed."""
    rank, kernel_side = joined
    source = tls.source(kernel_side)
    assert isinstance(source, tls.TlsSource)
    _settled(tls_relay.Relay.get())
    pumps = _pumps(monkeypatch)
    frames = b"".join(P.encode(P.message(P.READY, n=i)) for i in range(40))
    assert tls.send_direct(rank, frames), "one write: one record"
    got, small, deadline = bytearray(), bytearray(7), time.monotonic() + 10
    while len(got) < len(frames):
        assert time.monotonic() < deadline, f"{len(frames) - len(got)} bytes not read within 10 s"
        assert wait_ready(kernel_side, 10, also=source.fd), f"{len(frames) - len(got)} bytes sent are stuck"
        try:
            n = source.recv_into(small)
        except BlockingIOError:
            continue
        assert n
        got += small[:n]
    assert bytes(got) == frames
    assert source.pair not in pumps, "the relay's thread had to find what OpenSSL kept"


def test_what_the_socketpair_holds_is_read_before_what_comes_next(joined):
    """Bytes the relay passed into the socketpair before the reader took the TLS socket over (or while it filled a
    buffer) are read first; the direct reads follow them."""
    rank, kernel_side = joined
    early = [P.message(P.READY, n=i) for i in range(5)]
    for msg in early:
        P.send(rank, msg)
    deadline = time.monotonic() + 10
    size = sum(len(P.encode(m)) for m in early)
    while unread(kernel_side) < size and time.monotonic() < deadline:  # the relay's thread moved them
        time.sleep(0.01)
    source = tls.source(kernel_side)
    assert isinstance(source, tls.TlsSource)
    late = [P.message(P.DONE, n=i) for i in range(5)]
    chan = Channel(rank)
    for msg in late:
        chan.send(msg.pop("op"), **msg)
    reader, rbuf, got = P.FrameReader(), ReadBuffer(), []
    while len(got) < 10:
        got += _hub_read(source, rbuf, reader)
    assert [(m["op"], m["n"]) for m in got] == [(P.READY, i) for i in range(5)] + [(P.DONE, i) for i in range(5)]
