"""Which checks run when: ``plan_checks`` (a plan, before or while its pool runs) and ``live_checks``
(what a running pool's ranks report), and the one cache of check results.

``plan_checks`` is the one list the cell's status view, %ddp_env and the JupyterLab
panel count ('✓ 19 checks passed' everywhere for one plan), the plan's facts
included (each rank's GPU, the device mesh); ``live_checks`` is what %ddp_env adds,
said apart, on a running pool.

The status view and the JupyterLab panel ask for a pool's checks on every
refresh; some checks resolve names, bind ports and read torch's build files,
so ``plan_checks`` answers a repeated question about the kernel's own state
from a small cache keyed by everything it reads.
"""
from __future__ import annotations

import os
import sys
import threading
from collections import OrderedDict
from typing import Any, Hashable, List, Mapping, Optional, Sequence, Tuple

from .check import Check
from .checks_host import (
    check_backend_available,
    check_cuda_in_kernel,
    check_gpus,
    check_kernel_env,
    check_nccl_env,
    check_omp,
    check_socket_ifname,
)
from .checks_live import Live, check_interfaces, check_process_group, check_seen_settings
from .checks_net import check_master_addr_local, check_master_addr_resolves, check_port
from .checks_ranks import check_rank_envs
from .checks_slurm import check_task_vars, slurm_checks
from .gpus import BackendInfo, GPUInfo, backend_availability, cuda_initialised, detect_gpus, device_map
from .plan import Plan
from ..words import ranks_phrase

CACHE_SIZE = 16
_cache: "OrderedDict[Hashable, Tuple[Check, ...]]" = OrderedDict()
_cache_lock = threading.Lock()


def plan_checks(
    plan: Plan,
    environ: Mapping[str, str] = os.environ,
    gpus: Optional[GPUInfo] = None,
    *,
    started: bool = False,
    modules: Mapping[str, object] = sys.modules,
    backends: Optional[BackendInfo] = None,
    interfaces: Optional[Sequence[str]] = None,
    cpus: Optional[int] = None,
) -> List[Check]:
    """Every check that can be made in the kernel about a plan: before a pool starts, or (started=True) for one that runs.

    Asked again about the same plan, start state, env and torch state, it answers
    from the cache (a new list each time). Facts given by the caller (gpus,
    backends, interfaces, cpus: what tests inject) bypass the cache.
    """
    if (gpus, backends, interfaces, cpus) != (None, None, None, None):
        return _plan_checks(plan, environ, gpus, started, modules, backends, interfaces, cpus)
    key = _cache_key(plan, environ, started, modules)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return list(hit)
    checks = _plan_checks(plan, environ, None, started, modules, None, None, None)
    with _cache_lock:
        _cache[key] = tuple(checks)
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return checks


def _cache_key(plan: Plan, environ: Mapping[str, str], started: bool, modules: Mapping[str, object]) -> Hashable:
    """What plan_checks reads: the plan, the start state, the kernel's env and what of torch the kernel imported."""
    planned = (plan.run_id, plan.nproc, plan.nnodes, plan.backend, plan.master_addr, plan.master_port, plan.port_was_given, plan.omp_threads,
               plan.slurm, plan.ssh, plan.ray)
    torch = ("torch" in modules, "torch.distributed" in modules, cuda_initialised(modules))
    return (planned, started, tuple(sorted(environ.items())), torch)


def clear_cache() -> None:
    """Forget every cached answer (after a change the key does not see, e.g. a GPU added)."""
    with _cache_lock:
        _cache.clear()


def _plan_checks(
    plan: Plan,
    environ: Mapping[str, str],
    gpus: Optional[GPUInfo],
    started: bool,
    modules: Mapping[str, object],
    backends: Optional[BackendInfo],
    interfaces: Optional[Sequence[str]],
    cpus: Optional[int],
) -> List[Check]:
    gpus = gpus if gpus is not None else detect_gpus(environ)
    if plan.slurm is not None:  # every node's ranks are in the plan; MASTER_ADDR is the first node's, not this machine's
        checks = check_rank_envs(plan.all_envs()) + slurm_checks(plan.slurm)
    elif plan.ssh is not None or plan.ray is not None:  # the hosts' own checks are asked of them (ssh_probe.py; ray.py's driver)
        checks = check_rank_envs(plan.all_envs())
    else:
        checks = check_rank_envs(plan.all_envs(), nnodes=plan.nnodes)
        checks.append(check_port(plan.master_addr, plan.master_port, plan.port_was_given, started))
        checks.append(check_master_addr_resolves(plan.master_addr))
        checks.append(check_master_addr_local(plan.master_addr, plan.nnodes))
        checks.append(check_gpus(plan.backend, plan.nproc, gpus))
    checks.append(check_task_vars(environ, plan.slurm is not None))
    checks.append(check_backend_available(plan.backend, backends if backends is not None else backend_availability(modules)))
    checks.append(check_cuda_in_kernel(modules))
    checks.extend(check_kernel_env(environ, gpus))
    checks.append(check_omp(plan.omp_threads, plan.nproc, environ, cpus))
    checks.append(check_nccl_env(environ, plan.backend))
    checks.append(check_socket_ifname(environ, plan.backend, interfaces, elsewhere=plan.over_hosts))
    return checks + plan_facts(plan, environ)


def plan_facts(plan: Plan, environ: Mapping[str, str]) -> List[Check]:
    """What the plan gives the ranks, worth a line even when all is well: each rank's GPU (nccl), the device mesh."""
    facts = mesh_checks([plan.rank_env(0)])
    if plan.backend == "nccl":
        mapping = device_map(plan.nproc, environ)
        facts.append(Check("GPU per rank", True, ", ".join(f"rank {r} → {d}" for r, d in mapping.items()), level="info"))
    return facts


def mesh_checks(envs: Sequence[Mapping[str, str]]) -> List[Check]:
    """--mesh, in words: the DeviceMesh every rank finds as ``mesh``."""
    text = envs[0].get("DDP_MAGIC_MESH") if envs else None
    if not text:
        return []
    dims = " × ".join(text.split(","))
    names = ", ".join(part.split("=")[0] for part in text.split(","))
    return [Check("device mesh", True, f"{dims}: a DeviceMesh named `mesh` on every rank (dim names {names})", level="info")]


def live_checks(live: Live, nproc: int, backend: str) -> List[Check]:
    """Checks of what each rank of a running pool reports about itself (its os.environ and process group)."""
    envs: List[Mapping[str, Any]] = [dict(live[r].get("env") or {}) for r in sorted(live)]
    checks = check_rank_envs(envs, count=nproc) if envs else []
    missing = [r for r in range(nproc) if r not in live]
    answered = "rank 0 answered" if nproc == 1 else f"all {nproc} ranks answered"
    if missing:
        answered = f"no answer from {ranks_phrase(missing)} within the timeout (dead or stuck?)"
    checks.append(Check("every rank answered", not missing, answered))
    checks.append(check_process_group(live, nproc, backend))
    if envs:
        checks.extend(check_seen_settings(envs))
    checks.extend(check_interfaces(live))
    return checks
