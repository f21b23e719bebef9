"""A kept Slurm pool (docs/keep.md, "Slurm"): its allocation, ranks and running job outlive their kernel, whether it is
restarted, shut down or SIGKILLed; the next kernel attaches them, and a rank that dies then is forked again alone by its
node's template; when the lease ends the allocation is released and nothing of it is left.

The local two-node Slurm (n1, n2 on this machine): the first node's template holds the lease, the second follows it
(it holds a connection to the lease socket, the way an attached kernel's spawns reach it); the holder under salloc
follows the lease's lock instead of the kernel. Each case runs twice.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

import pytest

import slurm_fixtures
from kernel_helper import Execution
from keep_helper import TICKS, cell_texts, ticked, ticks
from slurm_helpers import Kernel, alive, cmdline, env_of, parent_of, squeue

pytestmark = [pytest.mark.kernel, pytest.mark.slow, pytest.mark.slurm]
slurm_cluster = slurm_fixtures.slurm_cluster  # the fixtures, by name in this module
no_jobs_left = slurm_fixtures.no_jobs_left

START = "%%ddp --slurm --nodes 2 --ntasks-per-node {per}\nimport os, time, torch, torch.distributed as dist\nkept = 100 + dist.get_rank()\nos.getpid()"
N, AT = 40, 20
AGAIN = ("%%ddp\nimport os, torch, torch.distributed as dist\nx = torch.ones(1) * (dist.get_rank() + 1)\ndist.all_reduce(x)\n"
         "had = globals().get('kept')\nkept = 100 + dist.get_rank()\n(had, x.item(), os.getpid())")
POOL = "get_ipython().magics_manager.registry['DDPMagics'].session.pool"


def _ours(runtime: str) -> List[int]:
    """Every process of this test's Slurm pool on this machine (templates, ranks, holder, salloc's and srun's anchors):
    its env names the test's runtime directory (other sessions may run Slurm pools meanwhile)."""
    names = ("ddp_magic.procs.slurm_template", "ddp_magic.procs.slurm_hold", "ddp_magic.procs.anchor")
    mine = runtime.encode()
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and any(n in cmdline(int(p)) for n in names)
            and (env_of(int(p)) or {}).get(b"JUPYTER_RUNTIME_DIR") == mine]  # type: ignore[call-overload]


def _job_listed(job: str) -> bool:
    return bool(squeue("-j", job, "-o", "%T").strip())


def _lease(runtime: str) -> List[str]:
    """The discovery files' words (what a failed check needs: why a lease ended)."""
    out = []
    for name in sorted(os.listdir(runtime)):
        if name.endswith(".json"):
            with open(os.path.join(runtime, name)) as f:
                out.append(f.read()[-600:])
    return out




def _ticking(k: Kernel, gate: str, ranks: int) -> Execution:
    """A kept background job that ticks and waits at the gate; returns once the kernel showed tick 5 of every rank."""
    ex = k.run(TICKS.format(n=N, at=AT, gate=gate), timeout=120).ok()
    assert "kept pool" in ex.stdout, ex.stdout
    ticked(k, ex, ranks)
    return ex


def _end(k: Kernel, how: str, env: Dict[str, str], ex: Execution) -> "tuple[Kernel, str]":
    """End the kernel as a user or the system would (jupyter_client's restart and shutdown, or SIGKILL); the kernel that
    attaches next (the same one, restarted), and what the first one showed of the job ``ex``."""
    if how == "restart":
        k.km.restart_kernel(now=False)
        return k, cell_texts(k, ex)
    if how == "shutdown":
        k.km.shutdown_kernel(now=False)
        first = cell_texts(k, ex)
        k.kc.stop_channels()
    else:
        os.kill(k.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while alive(k.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # what would end a pool that is not kept (srun's and salloc's parent-death signals) has had its moment
        first = cell_texts(k, ex)
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=True)
    return Kernel(extra_env=env), first


def _recovers(k: Kernel, ranks: List[int], victims: List[int]) -> None:
    """Kill ``victims`` (ranks of the attached pool): the next cell forks each again alone, from its node's template,
    the others keep their variables, and the all_reduce counts every rank."""
    templates = {r: parent_of(ranks[r]) for r in victims}
    for r in victims:
        os.kill(ranks[r], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(re.search(rf"rank {r}: pid \d+ +dead", k.run("%ddp status").stdout) for r in victims):
        time.sleep(0.2)
    for _run in range(2):
        ex = k.run(AGAIN, timeout=180).ok()
        values = k.value("[tuple(v) for v in _]")
        total = float(sum(range(1, len(ranks) + 1)))
        assert all(v[1] == total for v in values), ("all_reduce over every rank, the new ones included", values)
        if _run == 0:
            assert "started it again" in ex.stdout and all(f"rank {r}" in ex.stdout for r in victims), ex.stdout
            assert [v[0] for v in values] == [None if r in victims else 100 + r for r in range(len(ranks))], values
            for r in victims:
                assert values[r][2] != ranks[r] and parent_of(values[r][2]) == templates[r], "its node's template forked it again"
                assert "ddp_magic.procs.slurm_template" in cmdline(templates[r])
            ranks[:] = [v[2] for v in values]
        else:
            assert [v[0] for v in values] == [100 + r for r in range(len(ranks))] and [v[2] for v in values] == ranks, values


def test_a_kept_slurm_pool_outlives_its_kernel_until_its_lease_ends(slurm_cluster, no_jobs_left):
    """In one allocation, a kept job through a restart, a shutdown and a SIGKILL of its kernel, each followed by an
    attach: the job's ticks shown exactly once (after a SIGKILL: none missing; docs/keep.md, "Shown exactly once"), its
    result, a variable kept, ranks on both nodes killed and forked again, the all_reduce right. Then ``--idle 5s`` and a
    SIGKILL: the lease ends, no process and no job is left."""
    runtime = tempfile.mkdtemp(prefix="k33s-", dir="/tmp")  # short: the lease socket's path must fit AF_UNIX
    env = {"JUPYTER_RUNTIME_DIR": runtime, "JPY_SESSION_NAME": "slurm.ipynb"}
    try:
        for _attempt in range(2):
            k = Kernel(extra_env=env)
            try:
                k.run("%load_ext ddp_magic").ok()
                k.run(START.format(per=2), timeout=180).ok()
                ranks = k.value("list(_)")
                job = k.value(f"{POOL}.launcher.job_id()")
                for phase, how in enumerate(("restart", "shutdown", "sigkill")):
                    gate = os.path.join(runtime, f"gate{phase}")
                    open(gate, "w").close()
                    ex1 = _ticking(k, gate, len(ranks))
                    k, first = _end(k, how, env, ex1)
                    assert all(alive(p) for p in ranks) and _job_listed(job), (f"kept through a {how}: the ranks and the allocation",
                                                                               [alive(p) for p in ranks], _ours(runtime), squeue("-j", job), _lease(runtime))
                    k.run("%load_ext ddp_magic").ok()
                    ex2 = k.run("%ddp attach --out job", timeout=120).ok()
                    assert "attached the kept pool" in ex2.stdout and f"{len(ranks)} ranks alive" in ex2.stdout, ex2.stdout
                    assert "is still running: its output follows" in ex2.stdout, (how, ex2.stdout, ex2.stderr, first[-2000:])
                    os.unlink(gate)
                    assert k.value("job.wait(120)") is True
                    result = k.run("job.result()", timeout=60).ok().result or ""
                    assert all(f"('done', {100 + r})" in result for r in range(len(ranks))), result
                    replayed = cell_texts(k, ex2)
                    assert "[rank 3 n2] tick" in replayed, "the attached kernel names each rank's node, as the first did"
                    shown, second = ticks(first), ticks(replayed)
                    for r in range(len(ranks)):
                        both = shown.get(r, []) + second.get(r, [])
                        whole = sorted(both) == list(range(N)) if how != "sigkill" else set(both) == set(range(N))
                        assert whole, f"{how}: rank {r}'s ticks, first kernel {shown.get(r)}, second {second.get(r)}"
                    _recovers(k, ranks, [1, 3])  # rank 1 on n1 (the lease holder's node), rank 3 on n2 (a follower's)
                assert "kept pool" in k.run("%ddp keep --idle 5s").ok().stdout
                pool_id, shm = k.value(f"(lambda p: (p.kept.id, p.shm_prefix))({POOL})")
                os.kill(k.pid, signal.SIGKILL)
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
                k.kc.stop_channels()
                k.km.shutdown_kernel(now=True)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def test_ddp_stop_ends_a_kept_slurm_pool_and_releases_its_allocation(slurm_cluster, no_jobs_left):
    runtime = tempfile.mkdtemp(prefix="k33s-", dir="/tmp")
    k = Kernel(extra_env={"JUPYTER_RUNTIME_DIR": runtime, "JPY_SESSION_NAME": "slurm.ipynb"})
    try:
        k.run("%load_ext ddp_magic").ok()
        for _attempt in range(2):
            k.run(START.format(per=1), timeout=180).ok()
            assert "kept pool" in k.run("%ddp keep").ok().stdout
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
