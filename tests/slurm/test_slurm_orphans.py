"""No orphans on the cluster: a kernel that restarts, shuts down or is SIGKILLed mid-cell leaves no job and no rank behind.

The allocation is tied to a process that dies with the kernel (salloc's command, the
holder, watching the kernel; salloc itself gets SIGTERM when the kernel goes), not to
cleanup code: the SIGKILL case proves it. Each case runs twice.
"""
from __future__ import annotations

import os
import signal
import time

import pytest

import slurm_fixtures
from slurm_fixtures import our_jobs, wait_no_jobs
from slurm_helpers import Kernel, alive, on_this_host, slurm_ranks

pytestmark = [pytest.mark.kernel, pytest.mark.slow, pytest.mark.slurm]
slurm_cluster = slurm_fixtures.slurm_cluster  # the fixtures, by name in this module
no_jobs_left = slurm_fixtures.no_jobs_left

START = "%%ddp --slurm --nodes 2 --ntasks-per-node 1\nimport os\nos.getpid()"


def _gone(pids, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids) and not our_jobs():
            return True
        time.sleep(0.1)
    return False


def test_kernel_restart_and_shutdown_release_the_allocation(slurm_cluster, no_jobs_left):
    k = Kernel()
    try:
        for _attempt in range(2):
            k.run("%load_ext ddp_magic").ok()
            k.run(START, timeout=180).ok()
            ranks = k.value("list(_)")
            assert len(our_jobs()) == 1 and all(alive(p) for p in ranks)
            k.km.restart_kernel(now=False)  # what the notebook's Restart does
            k.kc.wait_for_ready(timeout=60)
            assert _gone(ranks), f"after a kernel restart: ranks {[p for p in ranks if alive(p)]} or jobs {our_jobs()} left"
        k.run("%load_ext ddp_magic").ok()
        k.run(START, timeout=180).ok()
        ranks = k.value("list(_)")
    finally:
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=False)
    assert _gone(ranks), "after the kernel shut down: something was left"


def test_sigkilled_kernel_mid_cell_leaves_nothing(slurm_cluster, no_jobs_left):
    for _attempt in range(2):
        k = Kernel()
        try:
            k.run("%load_ext ddp_magic").ok()
            k.run(START, timeout=180).ok()
            ranks = k.value("list(_)")
            k.kc.execute("%%ddp\nimport time\nprint('working', flush=True)\ntime.sleep(120)")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # until a rank says it works: the cell runs
                msg = k.kc.get_iopub_msg(timeout=60)
                if msg["msg_type"] == "stream" and "working" in msg["content"]["text"]:
                    break
            os.kill(k.pid, signal.SIGKILL)
            t0 = time.monotonic()
            assert _gone(ranks, 15), f"after SIGKILL: ranks {[p for p in ranks if alive(p)]}, jobs {our_jobs()}, procs {slurm_ranks()}"
            print(f"SIGKILLed kernel: ranks and job gone in {time.monotonic() - t0:.2f} s")
            assert not slurm_ranks()
        finally:
            k.kc.stop_channels()
            k.km.shutdown_kernel(now=True)
    assert wait_no_jobs() == []


def _ours(name: bytes) -> list:
    """Pids of this host's processes whose command line holds ``name`` and ddp_magic's holder (salloc, the holder)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(name) and b"ddp_magic.procs.slurm_hold" in argv and on_this_host(int(entry)):
            pids.append(int(entry))
    return pids


def test_a_sigkilled_kernel_leaves_no_salloc_when_the_controller_is_gone(slurm_cluster, no_jobs_left):
    """salloc releases through slurmctld and retries while it cannot reach it: the holder's watchdog ends it, and cancels
    the job once the controller answers again."""
    import local_slurm
    from ddp_magic.procs import slurm_hold

    for _attempt in range(2):
        k = Kernel()
        try:
            k.run("%load_ext ddp_magic").ok()
            k.run(START, timeout=180).ok()
            [salloc] = _ours(b"salloc")
            job = our_jobs()[0].split()[0]
            local_slurm.stop_pid(local_slurm.CTLD_PID)  # the controller goes: salloc cannot release
            os.kill(k.pid, signal.SIGKILL)
            deadline = time.monotonic() + slurm_hold.RELEASE_GRACE_S + 10
            while alive(salloc) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not alive(salloc), "salloc outlived its kernel with the controller gone"
            assert not _ours(b"salloc") and not slurm_ranks()
        finally:
            k.kc.stop_channels()
            k.km.shutdown_kernel(now=True)
            local_slurm.start()
        deadline = time.monotonic() + slurm_hold.SCANCEL_EVERY_S + 15
        while any(j.startswith(job + " ") for j in our_jobs()) and time.monotonic() < deadline:  # the watchdog's next scancel
            time.sleep(0.5)
        assert wait_no_jobs(5) == [], "the watchdog cancelled the job once the controller was back"
