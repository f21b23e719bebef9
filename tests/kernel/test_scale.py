"""Pools of 256 ranks: the kernel side for real (pool, hub, admission, policy, recovery, forensics), the ranks simulated.

The ranks are bench/simranks' (the real wire protocol, hundreds per process, no
torch), so 256 of them fit on a small machine. Each test runs its cell twice, as
a notebook user re-runs cells; what is checked is arithmetic (every rank's value,
every rank's lines, a buffer's sum), never the figures of a run.
"""
from __future__ import annotations

import re
import sys
import threading
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from ddp_magic.kernel import Listener
from ddp_magic.states import FailureKind, RankState
from format_patterns import SECONDS

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import simranks  # noqa: E402

pytestmark = pytest.mark.kernel
N = 256


class Lines(Listener):
    """Every rank's output, by rank and stream."""

    def __init__(self) -> None:
        self.text: Dict[Tuple[int, str], str] = {}

    def on_output(self, rank: int, stream: str, text: str) -> None:
        self.text[(rank, stream)] = self.text.get((rank, stream), "") + text


class Notices(Listener):
    def __init__(self) -> None:
        self.texts: List[str] = []

    def on_notice(self, text: str) -> None:
        self.texts.append(text)


@pytest.fixture(scope="module")
def pool() -> Iterator[object]:
    p = simranks.sim_pool(N, per_host=N // 2)  # two host processes
    try:
        p.start()
        yield p
    finally:
        p.stop()


def test_a_pool_of_256_starts_with_every_socket_admitted(pool) -> None:
    for _ in range(2):  # a first start, then a restart: a fresh port, every rank joins again
        assert pool.alive and pool.start_seconds is not None
        assert sorted(pool.hub.conns) == list(range(N)) and len(pool.hub.outs) == 2 * N
        assert all(info.state == RankState.READY for info in pool.ranks.values())
        assert pool.rejected_peers == 0
        port = pool.control_port
        pool.restart()
        assert pool.control_port != port or pool.generation > 1


def test_a_cell_on_256_ranks_gives_every_value_and_every_line(pool) -> None:
    for _ in range(2):
        lines = Lines()
        out = pool.run("sim.print(2)\nsim.print(1, own=True)\n7", listener=lines)
        assert out.ok and out.values == [7] * N
        assert all(lines.text[(r, "stdout")] == f"line 0\nline 1\nrank {r} line 0\n" for r in range(N))


def test_results_from_256_ranks_small_and_through_shared_memory(pool) -> None:
    for size in (64, 1 << 20):  # inline in DONE, then a /dev/shm file per rank
        for _ in range(2):
            out = pool.run(f"sim.buffer({size})")
            assert out.ok and len(out.values) == N
            assert all(v.nbytes == size and int(v.sum()) == size for v in out.values)  # every byte is 1


def test_one_rank_raises_while_255_wait_in_all_reduce(pool) -> None:
    for _ in range(2):
        out = pool.run('sim.error("ValueError", "boom", ranks=[100])\nsim.collective("all_reduce", 3)')
        root = out.failures[0]
        assert (root.rank, root.kind, root.type, root.message) == (100, FailureKind.ERROR, "ValueError", "boom")
        released = [f for f in out.failures[1:] if f.kind == FailureKind.INTERRUPTED]
        assert sorted(f.rank for f in released) == [r for r in range(N) if r != 100]
        assert any("never arrived at all_reduce #3" in n and "rank 100 raised" in n for n in out.notes)
        assert any(re.match(r"the process group was re-formed in " + SECONDS + r"; your variables are intact", n) for n in out.notes), out.notes[-3:]
        assert pool.run("5").values == [5] * N  # the next cell runs on every rank, in the same pool


def test_the_grace_ends_once_every_other_rank_is_seen_stuck(pool) -> None:
    """With a grace of an hour the cell still ends: the policy sees the 255 others wait in all_reduce #3, which rank 100 never
    issued (its DONE's seq), and releases them at once (kernel/failures/probe.py). A watchdog cancels the cell if it does not."""
    grace, pool.grace = pool.grace, 3600.0
    try:
        for _ in range(2):
            cancel = threading.Event()
            watchdog = threading.Timer(120.0, cancel.set)
            watchdog.start()
            try:
                out = pool.run('sim.error("ValueError", "boom", ranks=[100])\nsim.collective("all_reduce", 3)', cancel=cancel)
            finally:
                watchdog.cancel()
            assert not cancel.is_set() and not any("interrupted by the user" in n for n in out.notes), out.notes[:3]
            assert (out.failures[0].rank, out.failures[0].type) == (100, "ValueError")
            assert sorted(f.rank for f in out.failures[1:] if f.kind == FailureKind.INTERRUPTED) == [r for r in range(N) if r != 100]
            assert pool.run("5").values == [5] * N
    finally:
        pool.grace = grace


def test_a_rank_that_never_arrives_is_named_by_the_forensics(pool) -> None:
    src = 'sim.sleep(60, ranks=[7])\nsim.collective("broadcast", 5, ranks=[9])\nsim.collective("all_reduce", 5, skip=[7, 9])'
    for _ in range(2):
        out = pool.run(src, timeout=1.0)
        assert out.failures[0].kind == FailureKind.TIMEOUT
        notes = "\n".join(out.notes)
        assert "rank 9 is in broadcast #5 while ranks" in notes and "are in all_reduce #5: mismatched collective" in notes
        assert re.search(r"rank 7 never arrived at all_reduce #5 \(rank 7 at cell line 1: sim\.sleep\(60, ranks=\[7\]\)\)", notes), notes[:2000]
        assert pool.run("1").values == [1] * N


def test_a_dead_rank_is_started_again_alone(pool) -> None:
    for rank in (17, 200):
        out = pool.run(f"sim.die(3, ranks=[{rank}])\nsim.sleep(0.05)\n1")
        dead = [f for f in out.failures if f.kind == FailureKind.DIED]
        assert [f.rank for f in dead] == [rank] and dead[0].exit_code == 3
        notices = Notices()
        again = pool.run("2", listener=notices)
        assert again.ok and again.values == [2] * N
        assert any(re.match(rf"rank {rank} \(pid \d+\) exited with code 3: started it again", n) for n in notices.texts), notices.texts


class Rows(Listener):
    def __init__(self) -> None:
        self.rows: Dict[int, List[tuple]] = {}

    def on_metrics(self, rank: int, rows: List[Tuple[int, float, Dict[str, float]]]) -> None:
        self.rows.setdefault(rank, []).extend(rows)


def test_metrics_rows_and_every_rank_s_env_from_256_ranks(pool) -> None:
    for _ in range(2):
        rows = Rows()
        out = pool.run("sim.log(step=3, loss=0.5)\n1", listener=rows)
        assert out.ok and sorted(rows.rows) == list(range(N))
        assert all([(step, values) for step, _, values in rows.rows[r]] == [(3, {"loss": 0.5})] for r in range(N))
        env = pool.live_env()
        assert sorted(env) == list(range(N)) and all(env[r]["env"]["RANK"] == str(r) for r in range(N))


@pytest.fixture(scope="module")
def sim_kernel() -> Iterator[object]:
    """A real Jupyter kernel whose %%ddp pools are simulated ranks."""
    from kernel_helper import simulated_kernel

    k = simulated_kernel(per_host=N // 2)
    try:
        yield k
    finally:
        k.shutdown()


def test_ddp_cells_on_256_ranks_in_a_kernel(sim_kernel) -> None:
    for _ in range(2):
        ex = sim_kernel.run(f"%%ddp -n {N}\nsim.print(1, own=True)\n3", timeout=120).ok()
        assert sorted(ln for ln in ex.stdout.splitlines() if ln) == sorted(f"[rank {r}] rank {r} line 0" for r in range(N))  # in arrival order
        assert ex.result is not None and ex.result.startswith(f"RankResults({N} ranks)") and "stopped updating" not in ex.stderr
    for _ in range(2):
        ex = sim_kernel.run(f'%%ddp -n {N}\nsim.error("ValueError", "boom", ranks=[100])\nsim.collective("all_reduce", 3)', timeout=120)
        assert ex.error is not None and ex.error[1].startswith("rank 100 raised ValueError: boom")
        assert sim_kernel.run(f"%%ddp -n {N}\n4", timeout=120).ok().result.startswith(f"RankResults({N} ranks)")
