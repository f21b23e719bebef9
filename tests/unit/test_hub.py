"""The control port and the hub, over real sockets but without rank processes."""
from __future__ import annotations

import socket
import time
from typing import Dict, List, Optional, Tuple

from ddp_magic.kernel.admission import Admission
from ddp_magic.kernel.hub import Hub
from ddp_magic.kernel.ranks import Listener, RankInfo
from ddp_magic.states import RankState
from ddp_magic.wire import protocol as P
from ddp_magic.wire.capture import SYNC_END, SYNC_PREFIX

SECRET = b"s" * 32


def _wait(cond, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


def test_admission_takes_a_peer_with_the_secret_and_counts_strangers():
    rejected: List[int] = []
    adm = Admission("127.0.0.1", SECRET, 8, lambda: rejected.append(1))
    try:
        with socket.create_connection(("127.0.0.1", adm.port), timeout=5) as stranger:
            stranger.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"x" * 64)
            assert _wait(lambda: rejected == [1])
        peer = socket.create_connection(("127.0.0.1", adm.port), timeout=5)
        P.client_handshake(peer, SECRET)
        P.send(peer, P.message(P.HELLO, rank=0, pid=1, host="h", device="cpu"))
        taken: List[Tuple[socket.socket, dict]] = []
        assert _wait(lambda: bool(taken.extend(adm.take()) or taken))
        assert taken[0][1]["rank"] == 0 and rejected == [1]
        taken[0][0].close()
        peer.close()
    finally:
        adm.close()
    adm.close()  # twice is fine
    try:
        socket.create_connection(("127.0.0.1", adm.port), timeout=1).close()
    except OSError:
        pass  # the port is closed once start-up is over (or reused by someone else)


class FakeLauncher:
    """No processes: exits are learnt from lost connections, like ranks on other hosts."""

    reports_exits = False
    adopted: List[int] = []

    def fileno(self) -> Optional[int]:
        return None

    def poll(self, timeout: float = 0.0) -> list:
        return []

    def adopt(self, pid: int, rank: int, host: str) -> None:
        self.adopted.append(pid)

    def death_cause(self, rank: int) -> str:
        return ""


class Recorder(Listener):
    def __init__(self) -> None:
        self.out: List[Tuple[int, str, str]] = []
        self.states: List[Tuple[int, RankState]] = []

    def on_output(self, rank: int, stream: str, text: str) -> None:
        self.out.append((rank, stream, text))

    def on_state(self, info: RankInfo) -> None:
        self.states.append((info.rank, info.state))


def test_a_done_counts_once_both_streams_are_synced_and_a_lost_connection_is_a_death():
    deaths: List[Tuple[int, Optional[int]]] = []
    hub = Hub(FakeLauncher(), lambda rank, code: deaths.append((rank, code)))  # type: ignore[arg-type]
    hub.listener = rec = Recorder()
    ranks: Dict[int, RankInfo] = {0: RankInfo(rank=0)}
    hub.reset(ranks, None)
    ours: Dict[str, socket.socket] = {}
    for name in ("control", "stdout", "stderr"):
        theirs, ours[name] = socket.socketpair()
        hello = P.message(P.HELLO, rank=0, pid=42, host="h", device="cpu") if name == "control" else P.message(P.HELLO_OUT, rank=0, stream=name)
        hub.register(theirs, hello)
    assert ranks[0].state == RankState.CONNECTING and ranks[0].pid == 42 and FakeLauncher.adopted == [42]
    hub.begin_cell()
    ranks[0].state = RankState.RUNNING
    marker = SYNC_PREFIX + b"1" + SYNC_END
    ours["control"].sendall(P.encode(P.message(P.DONE, cell=1, status="ok", result=None)))
    ours["stdout"].sendall(b"hello\n" + marker)
    assert not hub.pump(lambda: 0 in hub.done, time.monotonic() + 0.3)  # stderr has not caught up
    ours["stderr"].sendall(b"warn\n" + marker)
    assert hub.pump(lambda: 0 in hub.done, time.monotonic() + 5)
    assert ranks[0].state == RankState.DONE and ranks[0].last_line == "warn"
    assert ("".join(t for _, s, t in rec.out if s == "stdout"), "".join(t for _, s, t in rec.out if s == "stderr")) == ("hello\n", "warn\n")
    ranks[0].state = RankState.RUNNING
    ours["control"].close()
    assert hub.pump(lambda: ranks[0].state == RankState.DEAD, time.monotonic() + 5)
    assert deaths == [(0, None)] and hub.death_failure(0).last_lines == ["hello", "warn"]
    hub.close_all()
    for s in ours.values():
        s.close()


def test_a_socket_past_select_s_limit_is_waited_on_and_drained() -> None:
    """A 1,024-rank pool holds 3,072 sockets: waiting on one numbered past 1,023 must work (select() raises there)."""
    import os
    import resource

    from ddp_magic.kernel.conns import wait_ready

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    high = 1500
    if hard != resource.RLIM_INFINITY and hard <= high:
        high = hard - 1
    assert high > 1023, f"this machine's fd limit ({hard}) cannot hold a descriptor past select()'s limit"
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, high + 1), hard))
    a, b = socket.socketpair()
    fd = os.dup2(b.fileno(), high)
    far = socket.socket(fileno=fd)
    try:
        assert not wait_ready(far, 0.01)
        a.sendall(b"last words\n")
        assert wait_ready(far, 1.0)
        assert far.recv(64) == b"last words\n"
        assert wait_ready(far, 0.01, write=True)
    finally:
        far.close()
        a.close()
        b.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_cells_listener_hears_each_wakes_states_at_once_and_in_order():
    """GuardedListener.holding (Pool.pump): states wait for the end of the wake, or for the next event of another kind."""
    from ddp_magic.kernel.ranks import GuardedListener

    heard: List[tuple] = []

    class Inner(Listener):
        def on_output(self, rank: int, stream: str, text: str) -> None:
            heard.append(("output", rank))

        def on_state(self, info: RankInfo) -> None:
            heard.append(("state", info.rank))

        def on_states(self, infos) -> None:
            heard.append(("states", [i.rank for i in infos]))

    guarded, infos = GuardedListener(Inner()), [RankInfo(rank=r) for r in range(4)]
    guarded.on_state(infos[0])  # not holding: at once
    with guarded.holding():
        wake = guarded.each_wake(lambda: heard.append(("tick",)))
        guarded.on_state(infos[1])
        guarded.on_state(infos[2])
        guarded.on_output(2, "stdout", "x")
        guarded.on_state(infos[3])
        wake()
        wake()  # nothing held: nothing told
        guarded.on_state(infos[0])
    assert heard == [("state", 0), ("states", [1, 2]), ("output", 2), ("states", [3]), ("tick",), ("tick",), ("states", [0])]
    guarded.on_state(infos[1])
    assert heard[-1] == ("state", 1) and not guarded.errors
