"""No leftovers, private files: every file a pool makes in /dev/shm is 0600 and goes on every path.

/dev/shm is listed before and after each scenario (normal stop, restart, kernel shutdown,
kernel SIGKILL with busy ranks, a rank SIGKILLed mid-cell, the template killed): no
ddp_magic file made during the scenario may remain.
"""
from __future__ import annotations

import os
import signal
import stat
import time
from typing import Iterator, Set

import pytest

from conftest import pid_alive, wait_until, worker_pids_of
from ddp_magic.wire import shm
import kernel_helper
from kernel_helper import Kernel

pytestmark = pytest.mark.kernel

START = "%%ddp -n 2\nimport os, signal, torch, torch.distributed as dist\n"
# On a rank: a large result packed as the worker packs it, left in /dev/shm as if the kernel had not read it yet.
IN_FLIGHT = (
    "%%ddp\nfrom ddp_magic.wire import shm, transfer\n"
    "packed = transfer.pack(torch.ones(1 << 19), prefix=shm.result_prefix(dist.get_rank()))\npacked['shm']"
)
NEXT = "%%ddp\nimport torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()"


def ours() -> Set[str]:
    """Every ddp_magic file in /dev/shm now."""
    return {n for n in os.listdir(shm.SHM_DIR) if n.startswith(shm.SHM_PREFIX)}


def kernel_files(k: Kernel) -> Set[str]:
    """The files of the kernel's pools (their prefix names its pid)."""
    mark = f"{shm.SHM_PREFIX}{shm.pid_namespace()}-{k.pid}-"
    return {n for n in ours() if n.startswith(mark)}


def assert_private(names: Set[str]) -> None:
    for name in names:
        try:
            mode = stat.S_IMODE(os.stat(os.path.join(shm.SHM_DIR, name)).st_mode)
        except FileNotFoundError:  # a result read (and unlinked) by the kernel meanwhile
            continue
        assert mode == 0o600, f"{name} is {oct(mode)}"


def started_files() -> Set[str]:
    """The files of every kernel this test process started, dead ones too (other test processes' pools run meanwhile)."""
    marks = tuple(f"{shm.SHM_PREFIX}{shm.pid_namespace()}-{pid}-" for pid in kernel_helper.STARTED)
    return {n for n in ours() if n.startswith(marks)}


@pytest.fixture()
def no_leftovers() -> Iterator[None]:
    """/dev/shm before and after the scenario: nothing its kernels made remains."""
    before = started_files()
    yield
    left = lambda: started_files() - before  # noqa: E731
    assert wait_until(lambda: not left(), 15), f"left in /dev/shm: {sorted(left())}"


@pytest.fixture(scope="module")
def k() -> Iterator[Kernel]:
    k = Kernel()
    k.run("%load_ext ddp_magic").ok()
    yield k
    k.shutdown()


def test_every_file_is_private_while_the_pool_runs_then_stop_removes_them(k, no_leftovers):
    k.run(START, timeout=180).ok()
    files = kernel_files(k)
    assert any("-store-" in n for n in files), files
    k.run(IN_FLIGHT).ok()
    paths = k.value("list(_)")
    assert all(os.path.basename(p).startswith(f"{shm.SHM_PREFIX}{shm.pid_namespace()}-{k.pid}-") for p in paths), paths
    assert all(os.path.exists(p) for p in paths)
    # a group a cell destroyed around the deferral is re-formed on a fresh store (".1")
    k.run("%%ddp\ndist.destroy_process_group.__wrapped__()\n").ok()
    k.run("%%ddp\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()").ok()
    files = kernel_files(k)
    assert any(n.endswith(".1") for n in files), files
    assert_private(files)
    assert len(files) >= 4  # the store, its re-formed successor, two results in flight
    k.run("%ddp stop").ok()
    assert kernel_files(k) == set()


def test_restart_removes_the_old_pools_files(k, no_leftovers):
    k.run(START, timeout=180).ok()
    k.run(IN_FLIGHT).ok()
    old = kernel_files(k)
    k.run("%ddp restart", timeout=180).ok()
    now = kernel_files(k)
    assert not (old & now), old & now
    assert any("-store-" in n for n in now)
    assert_private(now)
    k.run(NEXT).ok()  # a restarted pool: fresh ranks, no names
    assert k.value("list(_)") == [2.0, 2.0]
    k.run("%ddp stop").ok()
    assert kernel_files(k) == set()


def test_rank_killed_mid_cell_leaves_nothing_after_the_next_cell(k, no_leftovers):
    k.run(START, timeout=180).ok()
    # rank 1 dies while writing a result: the half-written file has the pool's prefix
    ex = k.run(
        "%%ddp\nfrom ddp_magic.wire import shm\nif dist.get_rank() == 1:\n"
        "    with open(shm.SHM_DIR + '/' + shm.result_prefix(1) + 'half', 'wb', opener=lambda p, f: os.open(p, f, 0o600)) as f:\n"
        "        f.write(b'x' * 4096); f.flush()\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "dist.barrier()\n",
        timeout=120,
    )
    assert ex.error is not None
    old = kernel_files(k)
    assert any(n.endswith("half") for n in old), old
    k.run(NEXT, timeout=180).ok()
    assert k.value("list(_)") == [2.0, 2.0]
    now = kernel_files(k)
    assert not (old & now), old & now
    assert_private(now)
    k.run("%ddp stop").ok()
    assert kernel_files(k) == set()


def test_template_killed_then_the_next_cell(k, no_leftovers):
    k.run(START, timeout=180).ok()
    k.run(IN_FLIGHT).ok()
    old = kernel_files(k)
    templates = [p for p in worker_pids_of(k.pid) if _is_template(p)]
    assert len(templates) == 1, templates
    os.kill(templates[0], signal.SIGKILL)
    assert wait_until(lambda: not pid_alive(templates[0]), 10)
    k.run(NEXT, timeout=180).ok()
    now = kernel_files(k)
    assert not (old & now), old & now
    k.run("%ddp stop").ok()
    assert kernel_files(k) == set()


def test_kernel_shutdown_removes_the_files(no_leftovers):
    k = Kernel()
    try:
        k.run("%load_ext ddp_magic").ok()
        k.run(START, timeout=180).ok()
        k.run(IN_FLIGHT).ok()
        pid = k.pid
        assert kernel_files(k)
    finally:
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=False)  # a shutdown request: the kernel exits on its own
    mark = f"{shm.SHM_PREFIX}{shm.pid_namespace()}-{pid}-"
    assert wait_until(lambda: not any(n.startswith(mark) for n in ours()), 15), sorted(ours())


def test_kernel_sigkill_with_busy_ranks_removes_the_files(no_leftovers):
    k = Kernel()
    try:
        k.run("%load_ext ddp_magic").ok()
        k.run(START, timeout=180).ok()
        k.run(IN_FLIGHT).ok()
        workers = worker_pids_of(k.pid)
        files = kernel_files(k)
        assert files
        k.kc.execute("%%ddp\nimport time\nt = torch.ones(1)\nif dist.get_rank() == 0:\n    dist.all_reduce(t)\nelse:\n    time.sleep(60)\n")
        time.sleep(1.0)  # the cell is running: rank 0 in all_reduce, rank 1 asleep
        os.kill(k.pid, signal.SIGKILL)
        assert wait_until(lambda: not (files & ours()), 20), sorted(files & ours())
        assert wait_until(lambda: not any(pid_alive(p) for p in workers), 10)
    finally:
        k.shutdown()


def test_spawn_pool_of_a_sigkilled_kernel_is_swept_by_the_next_pool(k, no_leftovers):
    # spawn: no template outlives the kernel, so the next pool started on this host removes its files
    dead = Kernel()
    try:
        dead.run("%load_ext ddp_magic").ok()
        dead.run("%%ddp -n 2 --start-method spawn\nimport torch\n", timeout=240).ok()
        workers = worker_pids_of(dead.pid)
        files = kernel_files(dead)
        assert files
        assert_private(files)
        os.kill(dead.pid, signal.SIGKILL)
        assert wait_until(lambda: not any(pid_alive(p) for p in workers + [dead.pid]), 10)
        assert files & ours() == files  # nobody was left to remove them
    finally:
        dead.shutdown()
    k.run(START, timeout=180).ok()
    assert not (files & ours()), sorted(files & ours())
    k.run("%ddp stop").ok()


def _is_template(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return False
    return b"ddp_magic.procs.forkserver" in argv and not _is_forkserver(ppid)


def _is_forkserver(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"ddp_magic.procs.forkserver" in f.read()
    except OSError:
        return False
