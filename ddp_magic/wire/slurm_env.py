"""Both ends of a Slurm task's env: what the kernel's launcher puts in the step's env, and the rank's torchrun variables from it.

A rank started by Slurm runs ``python -m ddp_magic.procs.worker --slurm`` as a task of a job step.

Slurm numbers the tasks (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS); the
ranks get torchrun's names for them, as submitit's TorchDistributedEnvironment does.
A rank started again alone is a step of one task, whose Slurm numbers are 0: the
kernel then says its place (DDP_MAGIC_RANK, DDP_MAGIC_LOCAL_RANK, DDP_MAGIC_NODE_RANK),
which wins. The pool's secret comes in the step's env (never argv, never a file) and
leaves ``os.environ`` once read, so the cells never see it.
"""
from __future__ import annotations

import os
from typing import Dict, Mapping, MutableMapping, Tuple

SECRET_ENV = "DDP_MAGIC_SECRET"  # the pool's secret, hex (the step's env only)
CONNECT_ENV = "DDP_MAGIC_CONNECT"  # HOST:PORT of the kernel's control channel
TLS_ENV = "DDP_MAGIC_TLS"  # the kernel's certificate fingerprint (sha256 hex): the channel is TLS, pinned to it
# torchrun's name <- (our override for a rank started again alone, Slurm's own)
PLACES = {
    "RANK": ("DDP_MAGIC_RANK", "SLURM_PROCID"),
    "LOCAL_RANK": ("DDP_MAGIC_LOCAL_RANK", "SLURM_LOCALID"),
    "NODE_RANK": ("DDP_MAGIC_NODE_RANK", "SLURM_NODEID"),
}


def torch_env(env: Mapping[str, str]) -> Dict[str, str]:
    """torchrun's variables for this task, from Slurm's (the kernel's override first); WORLD_SIZE and LOCAL_WORLD_SIZE
    are the pool's (the step may hold one task only), else Slurm's."""
    out: Dict[str, str] = {}
    for name, (ours, slurm) in PLACES.items():
        value = env.get(ours) or env.get(slurm)
        if value is None:
            raise RuntimeError(f"{slurm} is not set: run this under srun (ddp_magic's Slurm launcher does)")
        out[name] = value
    out["GROUP_RANK"] = out["NODE_RANK"]
    out["ROLE_RANK"] = out["RANK"]
    out["WORLD_SIZE"] = env.get("WORLD_SIZE") or env.get("SLURM_NTASKS", "1")
    out["LOCAL_WORLD_SIZE"] = env.get("LOCAL_WORLD_SIZE") or env.get("SLURM_NTASKS_PER_NODE", "1")
    return out


def config(env: MutableMapping[str, str]) -> Tuple[dict, bytes]:
    """The worker's config and the pool's secret, from the step's env (the secret is removed from it)."""
    secret = env.pop(SECRET_ENV, "")
    if not secret:
        raise RuntimeError(f"{SECRET_ENV} is not in the env: this task was not started by ddp_magic's Slurm launcher")
    host, _, port = env.get(CONNECT_ENV, "").rpartition(":")
    if not host or not port.isdigit():
        raise RuntimeError(f"{CONNECT_ENV} must be HOST:PORT (got {env.get(CONNECT_ENV)!r})")
    mapped = torch_env(env)
    env.update(mapped)
    cfg = {"env": dict(env), "kernel_addr": host.strip("[]"), "kernel_port": int(port), "tls": env.get(TLS_ENV) or None}
    return cfg, bytes.fromhex(secret)


def node_name() -> str:
    """The Slurm node this task runs on (its name in squeue); "" outside Slurm (one host says nothing of its nodes)."""
    return os.environ.get("SLURMD_NODENAME", "")
