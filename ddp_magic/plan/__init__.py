"""plan/: what the user asked for, turned into what the ranks are started with, and the checks of it.

- spec.py         PoolSpec: the pool's options, validated once into a frozen value
- plan.py         Plan and make_plan(spec): backend, master port, per-rank env and thread count
- net.py          addresses and ports (the one home of the IPv4/IPv6 choice), who holds a port
- gpus.py         GPUs, torch's build and its backends, known without initialising CUDA or importing torch
- check.py        Check (one result) and checks_verdict
- checks.py       plan_checks (cached) and live_checks: which checks run when
- checks_ranks.py the rank env's consistency; checks_net.py the master address and port;
  checks_host.py  what the ranks inherit from the kernel; checks_live.py what live ranks report

Everything here is pure over plain data: no torch import, no process started,
nothing written to the kernel's ``os.environ``.
"""
from .check import Check, checks_verdict
from .checks import clear_cache, live_checks, plan_checks
from .gpus import BackendInfo, GPUInfo, backend_availability, detect_gpus, device_map
from .net import address_family, free_port
from .plan import DIST_VARS, STALE_VARS, TORCHRUN_EXTRA_VARS, Plan, choose_backend, make_plan, threads_per_rank, usable_cpus
from .spec import BACKENDS, START_METHODS, PoolSpec

__all__ = [
    "BACKENDS",
    "DIST_VARS",
    "STALE_VARS",
    "START_METHODS",
    "TORCHRUN_EXTRA_VARS",
    "BackendInfo",
    "Check",
    "GPUInfo",
    "Plan",
    "PoolSpec",
    "address_family",
    "backend_availability",
    "checks_verdict",
    "choose_backend",
    "clear_cache",
    "detect_gpus",
    "device_map",
    "free_port",
    "live_checks",
    "make_plan",
    "plan_checks",
    "threads_per_rank",
    "usable_cpus",
]
