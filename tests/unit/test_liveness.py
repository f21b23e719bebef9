"""The liveness check's pure parts: which errors and socket records mean "the peer went silent", which ranks share a
silent node, and what the user reads (a node gone silent; a node that cannot reach the control port; ranks that never
joined a Slurm pool; a node still silent when its ranks are due to start again). The OS's side of it (keepalive, the
user timeout) runs for real in tests/kernel/test_lost_link.py and tests/cluster/test_faults.py."""
from __future__ import annotations

import errno
import socket
import struct
import time
from typing import Dict, Optional, Sequence

import pytest

from conftest import LOST_LINK
from ddp_magic.errors import CellError, NodeUnreachable, RankFailure
from ddp_magic.kernel.failures import forensics
from ddp_magic.kernel.launchers.base import Launcher
from ddp_magic.kernel.launchers.slurm_steps import _event
from ddp_magic.kernel.ranks import RankInfo
from ddp_magic.kernel.failures.unreachable import (ANSWER_S, cannot_reach_text, never_joined_text, node_key, raise_if_restart_silent,
                                                   raise_if_start_silent, raise_if_still_silent, silent_siblings, still_silent_text,
                                                   stop_note)
from ddp_magic.states import FailureKind, RankState
from ddp_magic.wire import liveness


def test_silence_is_a_timeout_or_an_unreachable_host_never_a_close() -> None:
    assert liveness.is_silence(TimeoutError(errno.ETIMEDOUT, "Connection timed out"))
    assert liveness.is_silence(OSError(errno.EHOSTUNREACH, "No route to host"))
    for not_silent in (ConnectionResetError(errno.ECONNRESET, "reset"), BrokenPipeError(errno.EPIPE, "pipe"), None, ValueError("x")):
        assert not liveness.is_silence(not_silent)


class _Recorded:
    """A socket whose TCP_INFO is given: its state and how long ago the peer last acknowledged (ms)."""

    family = socket.AF_INET

    def __init__(self, state: int, last_ack_ms: int) -> None:
        self.info = bytes([state]) + bytes(55) + struct.pack("I", last_ack_ms) + bytes(44)

    def getsockopt(self, level: int, opt: int, size: int) -> bytes:
        assert (level, opt) == (socket.IPPROTO_TCP, socket.TCP_INFO)
        return self.info[:size]


@pytest.mark.parametrize("state, last_ack_ms, silent", [
    (liveness.TCP_CLOSE, liveness.SILENCE_S * 1000 + 300, True),  # timed out: nothing heard for the window
    (liveness.TCP_CLOSE, (liveness.SILENCE_S - liveness.INTERVAL_S) * 1000, True),  # the last probe's tick
    (liveness.TCP_CLOSE, 40, False),  # a reset, just now
    (8, liveness.SILENCE_S * 5000, False),  # CLOSE_WAIT: the peer closed (a FIN), however quiet before
    (1, liveness.SILENCE_S * 5000, False),  # still established
])
def test_the_os_record_tells_silence_from_a_close(state: int, last_ack_ms: int, silent: bool) -> None:
    sock = _Recorded(state, last_ack_ms)
    assert liveness.went_silent(sock) is silent  # type: ignore[arg-type]
    assert liveness.lost_to_silence(sock) is silent  # type: ignore[arg-type]


def test_a_relay_marks_the_plain_end_it_serves() -> None:
    a, b = socket.socketpair()
    try:
        assert not liveness.lost_to_silence(a)
        liveness.mark_silent(a)
        assert liveness.lost_to_silence(a) and not liveness.lost_to_silence(b)
    finally:
        a.close()
        b.close()


def test_arming_a_tcp_socket_sets_the_window_and_a_socketpair_is_left_alone() -> None:
    with socket.socket() as s:
        liveness.arm(s)
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        # the window the docs promise, as numbers: probed after 2 s idle, a probe a second, given up after 8 s
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 2
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 1
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 8
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 8_000
    with socket.socket() as s:
        liveness.arm(s, data_too=False, silence=liveness.RANK_SILENCE_S)  # an output stream: no user timeout
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 0
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 16  # a rank's own end: 16 probes, 16 s
    a, b = socket.socketpair()
    liveness.arm(a)  # not TCP: nothing to arm, nothing raised
    a.close()
    b.close()


@pytest.mark.parametrize("join, connect", [(30, 10.0), (180, 30.0), (3, 3.0), (600, 30.0)])
def test_a_rank_gives_up_connecting_well_inside_the_join_timeout(join: float, connect: float) -> None:
    assert liveness.connect_timeout(join) == connect


def _ranks(layout: Dict[int, str], dead: Sequence[int] = ()) -> Dict[int, RankInfo]:
    out = {r: RankInfo(rank=r, node_name=n, host=n, state=RankState.RUNNING) for r, n in layout.items()}
    for r in dead:
        out[r].state = RankState.DEAD
    return out


def test_a_silent_rank_takes_its_node_with_it_and_nobody_else() -> None:
    ranks = _ranks({0: "n1", 1: "n1", 2: "n2", 3: "n2", 4: "n2"}, dead=[4])
    assert silent_siblings(ranks, 2) == [3]  # 4 is gone already; n1's ranks are healthy
    assert silent_siblings(_ranks({0: "vm", 1: "vm"}), 1) == [0]
    hosts = {0: RankInfo(rank=0, host="a"), 1: RankInfo(rank=1, host="b")}
    assert node_key(hosts[0]) == "a" and silent_siblings(hosts, 0) == []


def test_a_silent_node_is_the_first_line_with_all_its_ranks() -> None:
    why = liveness.silence_words()  # what kernel/failures/deaths.py gives a rank lost to silence
    lost = [RankFailure(rank=r, kind=FailureKind.DIED, pid=100 + r, message=why, node="n2") for r in (3, 2)]
    released = RankFailure(rank=0, kind=FailureKind.INTERRUPTED)
    text = CellError(lost + [released], notes=["ranks 2-3 will be started again at the next cell"]).render()
    assert text.splitlines()[0] == f"ranks 2-3 on n2 are unreachable: {LOST_LINK}"
    assert "pid" not in text and "failed the same way" not in text
    assert RankFailure(rank=2, kind=FailureKind.DIED, pid=7, message=why, node="n2").headline() == f"rank 2 on n2 is unreachable: {why}"


def test_survivors_one_call_apart_after_a_node_went_away_are_not_a_mismatch() -> None:
    calls = {0: {"op": "all_reduce", "seq": 270}, 1: {"op": "all_reduce", "seq": 269}, 2: None, 3: None}
    gone = {2: "died", 3: "unreachable"}
    assert forensics.verdicts([0, 1, 2, 3], calls, gone) == ["ranks 2-3 never arrived at all_reduce #270 (rank 2 died; rank 3 unreachable)"]
    assert any("mismatched" in v for v in forensics.verdicts([0, 1, 2, 3], calls, {2: "at cell line 3", 3: "at cell line 3"}))
    far = {0: {"op": "all_reduce", "seq": 270}, 1: {"op": "broadcast", "seq": 269}, 2: None, 3: None}
    assert any("mismatched" in v for v in forensics.verdicts([0, 1, 2, 3], far, gone))  # another collective still is one


def test_the_template_step_reads_a_rank_that_cannot_reach_the_kernel() -> None:
    line = '{"event": "unreachable", "rank": 2, "node": "n2", "addr": "198.51.100.10:40513", "why": "no answer"}'
    assert _event(line) == {"event": "unreachable", "rank": 2, "node": "n2", "addr": "198.51.100.10:40513", "why": "no answer"}


def test_a_node_that_cannot_reach_the_control_port_is_named_once_with_its_ranks() -> None:
    events = [{"rank": r, "node": n, "addr": "198.51.100.10:40513", "why": "no answer"} for r, n in ((3, "n2"), (2, "n2"), (5, "n3"))]
    text = cannot_reach_text(events, 2, 6, "Slurm job 7 was released")
    assert text == (
        "ranks 2-3 on n2 cannot reach the kernel at 198.51.100.10:40513 (no answer); rank 5 on n3 cannot reach the kernel at "
        "198.51.100.10:40513 (no answer): a firewall between the nodes and this machine? --control-addr ADDR chooses another "
        "address. 2 of 6 ranks joined; Slurm job 7 was released."
    )


class _Placed(Launcher):
    """A launcher that placed ranks 2 a node (as Slurm's does); nothing else of it is used."""

    def node_of(self, rank: int) -> str:
        return f"n{rank // 2 + 1}"

    launch = adopt = live_pids = poll = alive = close = lambda *a, **k: None  # type: ignore[assignment]


def test_ranks_that_never_joined_a_slurm_pool_are_counted_and_placed() -> None:
    text = never_joined_text(_Placed(b"s"), [2, 3], 4, 30, "198.51.100.10:40513")
    assert text.startswith("2 ranks of 4 never reached the kernel at 198.51.100.10:40513 within 30s (ranks 2-3 on n2). Slurm started them")
    assert "Run the command printed above" not in text


class _Pinged(Launcher):
    """A launcher whose nodes in ``deaf`` do not answer a ping, ranks placed two a node (n1, n2, ...); it records what it
    was asked."""

    remote_ranks = True

    def __init__(self, deaf: Sequence[str], since: Optional[Dict[str, float]] = None) -> None:
        super().__init__(b"s")
        self.deaf, self.asked = list(deaf), []  # type: ignore[var-annotated]
        self.silent_since.update(since or {})

    def unanswered(self, nodes: list, within: float) -> list:
        self.asked.append((list(nodes), within))
        return [n for n in nodes if n in self.deaf]

    def placement(self, plan: object) -> Dict[int, str]:
        return {r: f"n{r // 2 + 1}" for r in range(4)}

    launch = adopt = live_pids = poll = alive = close = lambda *a, **k: None  # type: ignore[assignment]


def test_a_node_still_silent_fails_the_cell_before_anything_runs_naming_it() -> None:
    ranks = _ranks({0: "n1", 1: "n1", 2: "n2", 3: "n2"}, dead=[2, 3])
    for r in (2, 3):
        ranks[r].silent = True
    since = {"n2": 1_700_000_000.0}
    launcher = _Pinged(["n2"], since)
    with pytest.raises(NodeUnreachable) as got:
        raise_if_still_silent(launcher, ranks, [2, 3])
    clock = time.strftime("%H:%M:%S", time.localtime(since["n2"]))
    assert str(got.value) == (
        f"ranks 2-3 on n2 are still unreachable (no answer since {clock}, nor to a ping just now): nothing ran, ranks 0-1 keep "
        'their variables. Run the cell again once n2 is back, or %ddp stop and start a pool without it (--slurm-args "--exclude=n2").'
    )
    assert launcher.asked == [(["n2"], ANSWER_S)] and launcher.silent_since == since  # still silent: still remembered
    back = _Pinged([], since)
    raise_if_still_silent(back, ranks, [2, 3])  # n2 answers: its ranks are started again as before, and n2 is forgotten
    assert back.silent_since == {}
    ranks[3].silent = ranks[2].silent = False
    quiet = _Pinged(["n2"], since)
    raise_if_still_silent(quiet, ranks, [2, 3])  # ranks that died on their own: no node to ask
    assert quiet.asked == []


class _Pool:
    """The part of a pool a restart's and a stop's checks read; ``refresh`` counts the reaps."""

    def __init__(self, launcher: Launcher, ranks: Dict[int, RankInfo]) -> None:
        self.launcher, self.ranks, self.plan, self.started, self.refreshed = launcher, ranks, None, True, 0

    def refresh(self) -> None:
        self.refreshed += 1


def test_a_restart_while_a_node_is_silent_is_refused_before_anything_stops() -> None:
    """%ddp restart (and a cell restarting a broken pool) asks the node first: still silent, nothing is stopped, and the
    error names the node, its ranks and what to do; a node that answers is forgotten and the restart goes on."""
    ranks = _ranks({0: "n1", 1: "n1", 2: "n2", 3: "n2"}, dead=[2, 3])
    for r in (2, 3):
        ranks[r].silent = True
    since = {"n2": 1_700_000_000.0}
    clock = time.strftime("%H:%M:%S", time.localtime(since["n2"]))
    tail = 'once n2 is back, or %ddp stop and start a pool without it (--slurm-args "--exclude=n2").'
    launcher = _Pinged(["n2"], since)
    with pytest.raises(NodeUnreachable) as got:
        raise_if_restart_silent(_Pool(launcher, ranks), "%ddp restart")  # type: ignore[arg-type]
    assert str(got.value) == (f"%ddp restart: ranks 2-3 on n2 are unreachable (no answer since {clock}, nor to a ping just now): the "
                              f"pool was not restarted, ranks 0-1 keep their variables. Run it again {tail}")
    assert launcher.asked == [(["n2"], ANSWER_S)]
    with pytest.raises(NodeUnreachable) as got:
        raise_if_restart_silent(_Pool(launcher, ranks), "")  # type: ignore[arg-type]
    assert str(got.value) == (f"ranks 2-3 on n2 are unreachable (no answer since {clock}, nor to a ping just now): nothing ran, and "
                              f"the pool was not restarted. Run the cell again {tail}")
    with pytest.raises(NodeUnreachable) as got:
        raise_if_start_silent(launcher, None)  # type: ignore[arg-type]
    assert str(got.value) == (f"ranks 2-3 on n2 are unreachable (no answer since {clock}, nor to a ping just now): the pool did not "
                              f"start; its allocation stays held for the next try (%ddp stop releases it). Run the cell again {tail}")
    pool = _Pool(launcher, ranks)
    assert stop_note(pool) == (f", except ranks 2-3 on n2, which could not be reached (no answer since {clock}): cut off "  # type: ignore[arg-type]
                               f"from the kernel, they end on their own within {liveness.RANK_SILENCE_S}s")
    assert pool.refreshed == 1  # what went silent while the pool was idle is found first
    fresh = _ranks({0: "n1", 1: "n1", 2: "n2", 3: "n2"}, dead=[])  # a pool that did not start there: no rank to name
    assert stop_note(_Pool(launcher, fresh)) == (f"; n2 could not be reached (no answer since {clock}): Slurm ends what ran there "  # type: ignore[arg-type]
                                                 "once it answers")
    back = _Pinged([], since)
    raise_if_restart_silent(_Pool(back, ranks), "%ddp restart")  # type: ignore[arg-type]
    assert back.silent_since == {} and stop_note(_Pool(back, ranks)) == ""  # type: ignore[arg-type]
    raise_if_start_silent(back, None)  # type: ignore[arg-type]
    assert back.asked == [(["n2"], ANSWER_S)]  # forgotten once it answered: asked once, not at every start
    healthy = _Pinged(["n2"])
    raise_if_restart_silent(_Pool(healthy, ranks), "%ddp restart")  # type: ignore[arg-type]
    assert healthy.asked == []  # no node went silent: nothing to ask, a restart costs no round trip


def test_two_silent_nodes_and_a_lone_survivor_read_right() -> None:
    text = still_silent_text({"n2": [2], "n3": [3, 4]}, {}, [0])
    assert text.startswith("rank 2 on n2 and ranks 3-4 on n3 are still unreachable (no answer to a ping just now): nothing ran, "
                           "rank 0 keeps its variables. Run the cell again once n2,n3 are back, or %ddp stop and start a pool "
                           'without them (--slurm-args "--exclude=n2,n3").'), text
