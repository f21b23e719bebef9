"""The control port's one admission thread: handshakes side by side, a HELLO read to its exact length, slow peers dropped."""
from __future__ import annotations

import socket
import threading
import time
from typing import List, Tuple

import pytest

from ddp_magic.kernel import admission as A
from ddp_magic.wire import protocol as P

SECRET = b"k" * 32


def _taken(adm: A.Admission, count: int, seconds: float = 10.0) -> List[Tuple[socket.socket, dict]]:
    out: List[Tuple[socket.socket, dict]] = []
    deadline = time.monotonic() + seconds
    while len(out) < count and time.monotonic() < deadline:
        out += adm.take()
        time.sleep(0.01)
    return out


def _peer(port: int, rank: int, then: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    P.client_handshake(sock, SECRET)
    sock.sendall(P.encode(P.message(P.HELLO, rank=rank, pid=rank, host="h", device="cpu")) + then)
    return sock


def test_what_follows_the_hello_is_left_for_the_hub() -> None:
    adm = A.Admission("127.0.0.1", SECRET, 8, lambda: None)
    try:
        ready = P.encode(P.message(P.READY, rank=0, device="cpu"))
        peer = _peer(adm.port, 0, then=ready)  # HELLO and READY in one write, as a fast rank sends them
        [(sock, hello)] = _taken(adm, 1)
        assert hello["rank"] == 0
        sock.settimeout(5)
        assert P.recv(sock) == P.message(P.READY, rank=0, device="cpu")
        sock.close()
        peer.close()
    finally:
        adm.close()


def test_a_silent_peer_holds_nobody_up_and_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(A, "HANDSHAKE_S", 0.5)
    rejected: List[int] = []
    adm = A.Admission("127.0.0.1", SECRET, 8, lambda: rejected.append(1))
    try:
        silent = socket.create_connection(("127.0.0.1", adm.port), timeout=5)  # connects, never answers the challenge
        peers = [_peer(adm.port, r) for r in range(3)]
        assert sorted(h["rank"] for _, h in _taken(adm, 3)) == [0, 1, 2] and rejected == []
        silent.settimeout(5)
        deadline = time.monotonic() + 5
        while not rejected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rejected == [1]
        assert silent.recv(100).startswith(P.MAGIC) and silent.recv(100) == b""  # the challenge, then the port's EOF
        for s in peers + [silent]:
            s.close()
    finally:
        adm.close()


def test_two_hundred_peers_join_through_one_thread() -> None:
    adm = A.Admission("127.0.0.1", SECRET, 512, lambda: None)
    try:
        before = threading.active_count()
        socks: List[socket.socket] = []
        errors: List[BaseException] = []

        def dial(ranks: range) -> None:
            try:
                socks.extend(_peer(adm.port, r) for r in ranks)
            except BaseException as e:  # noqa: B036 - reported below
                errors.append(e)

        dialers = [threading.Thread(target=dial, args=(range(i, 200, 4),)) for i in range(4)]
        for t in dialers:
            t.start()
        taken = _taken(adm, 200)
        for t in dialers:
            t.join()
        assert not errors and sorted(h["rank"] for _, h in taken) == list(range(200))
        assert threading.active_count() <= before  # the four dialers are gone; the port added none per peer
        for s, _ in taken:
            s.close()
        for s in socks:
            s.close()
    finally:
        adm.close()


def test_a_wrong_secret_or_an_oversized_hello_is_rejected() -> None:
    rejected: List[int] = []
    adm = A.Admission("127.0.0.1", SECRET, 8, lambda: rejected.append(1))
    try:
        wrong = socket.create_connection(("127.0.0.1", adm.port), timeout=5)
        with pytest.raises((P.AuthenticationError, ConnectionError)):  # the port closes on a wrong answer
            P.client_handshake(wrong, b"w" * 32)
        big = socket.create_connection(("127.0.0.1", adm.port), timeout=5)
        P.client_handshake(big, SECRET)
        big.sendall(P.HEADER.pack(A.MAX_HELLO + 1))
        deadline = time.monotonic() + 5
        while len(rejected) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert rejected == [1, 1] and adm.take() == []
        wrong.close()
        big.close()
    finally:
        adm.close()
