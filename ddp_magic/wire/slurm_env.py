"""Both ends of a Slurm task's env: what the kernel's launcher puts in the step's env, and the rank's torchrun variables from it.

The launcher's step runs one task a node, the node's template (procs/slurm_template.py), which
forks that node's ranks; each rank gets torchrun's set from the kernel's spawn command and the Slurm
task variables it would have had as a task of its own (``task_vars``), so libraries that read
SLURM_PROCID (Lightning, submitit) see the rank, not the template. ``python -m ddp_magic.procs.worker
--slurm`` (one rank per task, its numbers from Slurm) is the path for a step someone writes by hand.

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

from . import slurm_munge

SECRET_ENV = "DDP_MAGIC_SECRET"  # the pool's secret, hex (the step's env only, where MUNGE cannot seal it)
MUNGED_ENV = "DDP_MAGIC_SECRET_MUNGE"  # the same secret sealed by MUNGE, one credential a node in the step's order
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
    secret = step_secret(env)
    if not secret:
        raise RuntimeError(f"{SECRET_ENV} is not in the env: this task was not started by ddp_magic's Slurm launcher")
    host, _, port = env.get(CONNECT_ENV, "").rpartition(":")
    if not host or not port.isdigit():
        raise RuntimeError(f"{CONNECT_ENV} must be HOST:PORT (got {env.get(CONNECT_ENV)!r})")
    mapped = torch_env(env)
    env.update(mapped)
    cfg = {"env": dict(env), "kernel_addr": host.strip("[]"), "kernel_port": int(port), "tls": env.get(TLS_ENV) or None}
    return cfg, secret


def node_name() -> str:
    """The Slurm node this task runs on (its name in squeue), or the host an SSH pool's kernel calls it by
    (DDP_MAGIC_NODE_NAME, kernel/launchers/ssh.py); "" otherwise (one host says nothing of its nodes)."""
    return os.environ.get("SLURMD_NODENAME") or os.environ.get("DDP_MAGIC_NODE_NAME", "")


def task_vars(rank: int, local_rank: int, node: int, world: int, per_node: int) -> Dict[str, str]:
    """The Slurm task variables of a rank forked by its node's template: what it would see as task ``rank`` of a step
    of ``world`` tasks, ``per_node`` a node (the template's own say task ``node`` of one a node)."""
    return {
        "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local_rank), "SLURM_NODEID": str(node),
        "SLURM_NTASKS": str(world), "SLURM_NPROCS": str(world), "SLURM_STEP_NUM_TASKS": str(world),
        "SLURM_NTASKS_PER_NODE": str(per_node), "SLURM_TASKS_PER_NODE": str(per_node),
    }


def secret_env(secret: bytes, nodes: int, env: Mapping[str, str]) -> Dict[str, str]:
    """What carries the pool's secret in a step's env: MUNGE credentials, one a node (srun sends the env to every
    node in the clear, and a credential decodes once), or, without MUNGE, the secret itself."""
    sealed = slurm_munge.seal(secret.hex(), nodes, env)
    return {MUNGED_ENV: sealed} if sealed else {SECRET_ENV: secret.hex()}


def step_secret(env: MutableMapping[str, str]) -> bytes:
    """The pool's secret from a task's env (b"" when none); both carriers leave the env. A credential is this node's
    (SLURM_NODEID); one that does not decode raises RuntimeError, naming MUNGE's words."""
    plain, sealed = env.pop(SECRET_ENV, ""), env.pop(MUNGED_ENV, "")
    if sealed:
        creds = sealed.split(",")
        node = int(env.get("SLURM_NODEID", "0") or 0)
        return bytes.fromhex(slurm_munge.unseal(creds[node if node < len(creds) else 0], env))
    return bytes.fromhex(plain) if plain else b""
