"""A kept Slurm pool (docs/keep.md, "Slurm"): its allocation and ranks outlive a SIGKILLed kernel, the next kernel
attaches them, and when the lease ends the allocation is released and nothing of it is left.

The local two-node Slurm (n1, n2 on this machine): the first node's template holds the lease, the second follows it;
the holder under salloc follows the lease's lock instead of the kernel. Each case runs twice.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import List

import pytest

import slurm_fixtures
from slurm_helpers import Kernel, alive, cmdline, env_of, squeue

pytestmark = [pytest.mark.kernel, pytest.mark.slow, pytest.mark.slurm]
slurm_cluster = slurm_fixtures.slurm_cluster  # the fixtures, by name in this module
no_jobs_left = slurm_fixtures.no_jobs_left

START = "%%ddp --slurm --nodes 2 --ntasks-per-node 1\nimport os, torch, torch.distributed as dist\nkept = 100 + dist.get_rank()\nos.getpid()"
NEXT = "%%ddp\nt = torch.ones(1) * (dist.get_rank() + 1)\ndist.all_reduce(t)\n(kept, t.item())"


def _ours(runtime: str) -> List[int]:
    """Every process of this test's Slurm pool on this machine (templates, ranks, holder, salloc's and srun's anchors):
    its env names the test's runtime directory (other sessions may run Slurm pools meanwhile)."""
    names = ("ddp_magic.procs.slurm_template", "ddp_magic.procs.slurm_hold", "ddp_magic.procs.anchor")
    mine = runtime.encode()
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and any(n in cmdline(int(p)) for n in names)
            and (env_of(int(p)) or {}).get(b"JUPYTER_RUNTIME_DIR") == mine]  # type: ignore[call-overload]


def _job_listed(job: str) -> bool:
    return bool(squeue("-j", job, "-o", "%T").strip())


def test_a_kept_slurm_pool_outlives_its_kernel_until_its_lease_ends(slurm_cluster, no_jobs_left):
    runtime = tempfile.mkdtemp(prefix="k33s-", dir="/tmp")  # short: the lease socket's path must fit AF_UNIX
    env = {"JUPYTER_RUNTIME_DIR": runtime, "JPY_SESSION_NAME": "slurm.ipynb"}
    try:
        for _attempt in range(2):
            k1 = Kernel(extra_env=env)
            try:
                k1.run("%load_ext ddp_magic").ok()
                k1.run(START, timeout=180).ok()
                ranks = k1.value("list(_)")
                assert "kept the pool" in k1.run("%ddp keep").ok().stdout
                job = k1.value("get_ipython().magics_manager.registry['DDPMagics'].session.pool.launcher.job_id()")
                os.kill(k1.pid, signal.SIGKILL)
                deadline = time.monotonic() + 10
                while alive(k1.pid) and time.monotonic() < deadline:
                    time.sleep(0.05)
                time.sleep(1.0)  # what would end a pool that is not kept (srun's and salloc's parent-death signals) has had its moment
                assert all(alive(p) for p in ranks) and _job_listed(job), "kept: the ranks and the allocation outlive the kernel"
            finally:
                k1.kc.stop_channels()
                k1.km.shutdown_kernel(now=True)
            k2 = Kernel(extra_env=env)
            try:
                k2.run("%load_ext ddp_magic").ok()
                ex = k2.run("%ddp attach", timeout=120).ok()
                assert "attached the kept pool" in ex.stdout and "2 ranks alive" in ex.stdout, ex.stdout
                for _run in range(2):
                    assert k2.run(NEXT, timeout=120).ok().result.splitlines()[1:] == ["  [0] (100, 3.0)", "  [1] (101, 3.0)"]
                assert "kept the pool" in k2.run("%ddp keep --idle 5s").ok().stdout
                pool_id, shm = k2.value("(lambda p: (p.kept.id, p.shm_prefix))(get_ipython().magics_manager.registry['DDPMagics'].session.pool)")
                os.kill(k2.pid, signal.SIGKILL)
                t0 = time.monotonic()
                while (_ours(runtime) or any(alive(p) for p in ranks)) and time.monotonic() - t0 < 30:
                    time.sleep(0.1)
                procs = time.monotonic() - t0
                while _job_listed(job) and time.monotonic() - t0 < 30:
                    time.sleep(0.1)
                assert not _ours(runtime) and not _job_listed(job), f"after the lease: job {job} {squeue('-j', job)}, processes {_ours(runtime)}"
                print(f"--idle 5s, then a SIGKILL: no process left at {procs:.1f} s, no job in squeue at {time.monotonic() - t0:.1f} s")
                assert not os.path.exists(os.path.join(runtime, f"ddp-kept-{pool_id}"))
                assert not [n for n in os.listdir("/dev/shm") if n.startswith(shm)]
                said = subprocess.run([sys.executable, "-m", "ddp_magic", "stop", pool_id], env=dict(os.environ, **env), capture_output=True,
                                      text=True, timeout=60).stdout
                assert f"the kept pool {pool_id} had ended already: no kernel attached and no job running for its lease's --idle" in said, said
            finally:
                k2.kc.stop_channels()
                k2.km.shutdown_kernel(now=True)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def test_ddp_stop_ends_a_kept_slurm_pool_and_releases_its_allocation(slurm_cluster, no_jobs_left):
    runtime = tempfile.mkdtemp(prefix="k33s-", dir="/tmp")
    k = Kernel(extra_env={"JUPYTER_RUNTIME_DIR": runtime, "JPY_SESSION_NAME": "slurm.ipynb"})
    try:
        k.run("%load_ext ddp_magic").ok()
        for _attempt in range(2):
            k.run(START, timeout=180).ok()
            assert "kept the pool" in k.run("%ddp keep").ok().stdout
            job = k.value("get_ipython().magics_manager.registry['DDPMagics'].session.pool.launcher.job_id()")
            stop = k.run("%ddp stop", timeout=60).ok().stdout.strip()
            assert stop == f"stopped the pool; its workers have exited; Slurm job {job} released: its nodes are free", stop
            deadline = time.monotonic() + 15
            while (_ours(runtime) or _job_listed(job)) and time.monotonic() < deadline:
                time.sleep(0.1)
            left = [n for n in os.listdir(runtime) if n.startswith("ddp-kept-")]
            assert not _ours(runtime) and not _job_listed(job) and not left, (_ours(runtime), left)
    finally:
        k.shutdown()
        shutil.rmtree(runtime, ignore_errors=True)
