"""A lease held for a kernel on another host (procs/lease.py with ``bind``, procs/lease_door.py) and the kernel's host
watching it (procs/lease_watch.py), over real TCP and TLS on loopback: the watch holds the liveness lock and mirrors
the record; a wrong secret, a wrong certificate and a peer that never speaks get nothing and stall nobody; the lease's
end is written with its reason, ``off`` removes everything, a holder that vanishes is said to have gone away.
The whole of it across hosts: tests/cluster/test_box_keep.py."""
from __future__ import annotations

import json
import os
import select
import socket
import threading
import time
from typing import Callable, Iterator, Optional

import pytest

from ddp_magic.procs.lease import Lease
from ddp_magic.procs.lease_watch import LeaseWatch
from ddp_magic.wire import kept

SECRET = bytes(range(32))


class Held:
    """A Lease on loopback, its loop in a thread (as its template runs it); ``then`` runs a step in that loop."""

    def __init__(self, node_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("JUPYTER_RUNTIME_DIR", node_dir)  # the holder's own files: its ddp-held/
        self.lease = Lease({"id": "5eed0001", "where": "", "bind": "127.0.0.1", "idle": 3600, "max": 7200, "kernel": "k", "pid": 1,
                            "info": {"nproc": 2, "notebook": "t.ipynb", "shm_prefix": "", "job": "job"}}, SECRET, lambda: {})
        self.steps: "list[Callable[[Lease], None]]" = []
        self.running = True
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while self.running and not self.lease.door.closed:  # keep --off closes it (the template then drops the lease)
            ready, _, _ = select.select(self.lease.fds(), [], [], 0.05)
            for fd in ready:
                if fd in self.lease.fds():
                    self.lease.handle(fd)
            while self.steps:
                self.steps.pop(0)(self.lease)

    def then(self, step: Callable[[Lease], None]) -> None:
        self.steps.append(step)

    def stop(self) -> None:
        self.running = False
        self.thread.join(5)


@pytest.fixture
def held(tmp_path, monkeypatch) -> Iterator[Held]:
    h = Held(str(tmp_path / "node"), monkeypatch)
    yield h
    h.stop()


def _wait(cond: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.02)


def _watch(held: Held, kernel_dir: str) -> LeaseWatch:
    watch = LeaseWatch({"lease": held.lease.at, "secret": SECRET.hex(), "id": held.lease.id, "where": kernel_dir, "node": "n1"})
    watch.start()
    _wait(lambda: kept.is_held(watch.lock))
    return watch


def _record(kernel_dir: str) -> dict:
    return kept.read(kept.discovery_path("5eed0001", kernel_dir))


def test_the_watch_holds_the_lock_and_mirrors_the_record(held: Held, tmp_path) -> None:
    kernel_dir = str(tmp_path / "kernel")
    os.makedirs(kernel_dir)
    watch = _watch(held, kernel_dir)
    first = _record(kernel_dir)
    assert first["state"] == "kept" and first["lease"] == held.lease.at and first["holder"] == "n1" and first["secret"] == SECRET.hex()
    assert held.lease.at["host"] == "127.0.0.1" and held.lease.dir.startswith(str(tmp_path / "node" / "ddp-held"))
    assert oct(os.stat(kept.discovery_path("5eed0001", kernel_dir)).st_mode & 0o777) == "0o600"
    held.then(lambda lease: lease.note("rank 1 (pid 42) died (signal SIGKILL)", rank=1, kind="died"))
    _wait(lambda: _record(kernel_dir).get("meanwhile"))
    held.then(lambda lease: lease.end("its lease's --max (2 h) ran out"))
    _wait(watch.over.is_set)
    ended = _record(kernel_dir)
    assert ended["state"] == "ended" and ended["why"] == "its lease's --max (2 h) ran out" and ended["meanwhile"][0]["rank"] == 1
    assert not kept.is_held(watch.lock), "the allocation follows that lock: it is released now"
    assert not os.listdir(os.path.join(str(tmp_path / "node"), "ddp-held")), "nothing of the lease left on its node"


def test_keep_off_removes_the_files_here(held: Held, tmp_path) -> None:
    kernel_dir = str(tmp_path / "kernel")
    os.makedirs(kernel_dir)
    watch = _watch(held, kernel_dir)
    held.then(lambda lease: lease.off())
    _wait(watch.over.is_set)
    assert not os.path.exists(kept.discovery_path("5eed0001", kernel_dir)) and not os.path.exists(watch.lock)


def test_a_holder_that_vanishes_is_said_to_have_gone(held: Held, tmp_path) -> None:
    kernel_dir = str(tmp_path / "kernel")
    os.makedirs(kernel_dir)
    watch = _watch(held, kernel_dir)

    def vanish(lease: Lease) -> None:  # its template SIGKILLed: every connection closes, no word said
        for peer in list(lease.peers.values()):
            peer.sock.close()
        lease.peers.clear()

    held.then(vanish)
    _wait(watch.over.is_set)
    assert _record(kernel_dir)["why"] == "its lease holder on n1 went away (its node, its template or the network)"
    assert not kept.is_held(watch.lock)


def _info(at: kept.LeaseAt, secret: bytes) -> Optional[dict]:
    sock = kept.dial_lease(at, secret, timeout=5)
    try:
        sock.sendall(b'{"op": "info"}\n')
        return json.loads(sock.makefile().readline())
    finally:
        sock.close()


def test_who_cannot_prove_the_secret_gets_nothing_and_stalls_nobody(held: Held) -> None:
    at = held.lease.at
    silent = socket.create_connection((at["host"], at["port"]))  # connects, never says a word (no TLS hello)
    try:
        info = _info(at, SECRET)
        assert info is not None and info["id"] == "5eed0001"
        silent.setblocking(False)
        with pytest.raises(BlockingIOError):  # not b"": the lease still waits for its hello (HANDSHAKE_S), after answering ours
            silent.recv(1)
        with pytest.raises(ConnectionError):
            kept.dial_lease(at, bytes(32), timeout=5)
        with pytest.raises(ConnectionError, match="fingerprint"):
            kept.dial_lease(dict(at, fp="00" * 32), SECRET, timeout=5)
    finally:
        silent.close()
