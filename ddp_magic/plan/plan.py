"""The plan: a PoolSpec turned into what every rank is started with.

``make_plan(spec)`` chooses the backend, the master port and the per-rank
thread count, and ``Plan.rank_env`` writes the variables torch.distributed and
torchrun users expect. Pure functions over plain data: no torch import, no
process started, nothing written to the kernel's own ``os.environ``. The checks
of a plan live in plan/check*.py.
"""
from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

from ..errors import PlanError
from .gpus import GPUInfo, detect_gpus
from .net import master_port, validate_master_addr, validate_master_port
from .slurm import SlurmRequest
from .ray import AUTO_REASON as RAY_AUTO_REASON, RayRequest
from .ssh import AUTO_REASON, SshRequest
from .spec import BACKENDS, PoolSpec
from ..words import plural

DIST_VARS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
)
TORCHRUN_EXTRA_VARS = (
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
)
# Variables from the kernel's env that would contradict the plan if a worker
# inherited them; the plan always overrides them, and a check reports them.
STALE_VARS = DIST_VARS + TORCHRUN_EXTRA_VARS + ("CUDA_VISIBLE_DEVICES",)


@dataclass(frozen=True)
class Plan:
    """Everything that decides how a pool's ranks are started; ``nproc`` counts the ranks of one node.

    Frozen: made whole by ``make_plan(spec)``; a restart makes a new one (with a new run_id).
    """

    nproc: int
    backend: str  # resolved: nccl, gloo or mpi
    backend_reason: str
    master_addr: str
    master_port: int
    port_was_given: bool
    nnodes: int = 1
    node_rank: int = 0
    init: bool = True
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    omp_threads: Optional[int] = None  # None: inherited from the kernel's env
    pg_timeout: float = 300.0  # seconds before a collective with a missing peer fails
    extra_env: Dict[str, str] = field(default_factory=dict)
    slurm: Optional[SlurmRequest] = None  # --slurm: the ranks are the tasks of a job step (their RANK etc. come from Slurm)
    ssh: Optional[SshRequest] = None  # --hosts / --hostfile: the ranks run on those hosts, a template each over SSH
    slots: Tuple[int, ...] = ()  # hosts of different sizes (--hosts gpu1:8,gpu2:4): each node's ranks; (): nproc each
    ray: Optional[RayRequest] = None  # --ray: the ranks run on a Ray cluster's nodes, a template each (kernel/launchers/ray.py)

    @property
    def over_hosts(self) -> bool:
        """Every node's ranks start from this plan (Slurm, SSH, Ray), on nodes that are not this machine's to know."""
        return self.slurm is not None or self.ssh is not None or self.ray is not None

    @property
    def world_size(self) -> int:
        return sum(self.slots) if self.slots else self.nproc * self.nnodes

    def node_local(self, rank: int) -> Tuple[int, int]:
        """(node rank, local rank) of ``rank``: block distribution, ``nproc`` a node, or each node's own ``slots``."""
        if not self.slots:
            return rank // self.nproc, rank % self.nproc
        node = 0
        while node < len(self.slots) - 1 and rank >= self.slots[node]:
            rank, node = rank - self.slots[node], node + 1
        return node, rank

    def rank_env(self, local_rank: int, node_rank: Optional[int] = None) -> Dict[str, str]:
        """The variables torch.distributed and torchrun users expect, for one rank (of this node, or of ``node_rank``)."""
        node = self.node_rank if node_rank is None else node_rank
        rank = (sum(self.slots[:node]) if self.slots else node * self.nproc) + local_rank
        env = {
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "WORLD_SIZE": str(self.world_size),
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(self.slots[node] if self.slots else self.nproc),
            "NODE_RANK": str(node),
            "GROUP_RANK": str(node),
            "GROUP_WORLD_SIZE": str(self.nnodes),
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "ROLE_NAME": "default",
            "TORCHELASTIC_RUN_ID": self.run_id,
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0",
            "DDP_MAGIC_BACKEND": self.backend,
            "DDP_MAGIC_INIT": "1" if self.init else "0",
            "DDP_MAGIC_PG_TIMEOUT": str(self.pg_timeout),
        }
        if self.omp_threads is not None:
            env["OMP_NUM_THREADS"] = str(self.omp_threads)
        env.update(self.extra_env)
        return env

    def all_envs(self) -> List[Dict[str, str]]:
        """Every rank's env: this node's, or every node's for a Slurm pool (whose ranks all start from this plan)."""
        nodes = range(self.nnodes) if self.over_hosts else [self.node_rank]
        return [self.rank_env(i, n) for n in nodes for i in range(self.slots[n] if self.slots else self.nproc)]


def usable_cpus() -> int:
    """The cores this process may run on (its affinity mask, which the ranks inherit), not all the machine has."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def threads_per_rank(nproc: int, cpus: Optional[int] = None) -> int:
    """The OpenMP threads each of nproc ranks on this node gets when the kernel sets none.

    torchrun gives 1 when unset and nproc > 1; one thread starves a rank on a big
    machine, all cores per rank oversubscribes. cores // nproc (at least 1) is what
    a user would pick by hand.
    """
    return max(1, (cpus if cpus is not None else usable_cpus()) // max(1, nproc))


def choose_backend(requested: str, nproc: int, gpus: GPUInfo) -> Tuple[str, str]:
    """Resolve 'auto' and check an explicit choice for nproc ranks on this node. Returns (backend, reason)."""
    if requested not in BACKENDS:
        raise PlanError(f"unknown backend {requested!r}; use one of {', '.join(BACKENDS)}")
    if requested == "auto":
        if gpus.count >= nproc and gpus.count > 0:
            return "nccl", f"{plural(gpus.count, 'GPU')} visible, one per rank"
        if gpus.count > 0:
            return "gloo", f"{nproc} ranks but only {plural(gpus.count, 'GPU')}: NCCL needs one GPU per rank, using gloo"
        return "gloo", "no GPU visible: gloo on CPU"
    if requested == "nccl":
        if gpus.count == 0:
            raise PlanError("--backend nccl needs NVIDIA GPUs and none is visible; use --backend gloo (CPU)")
        if nproc > gpus.count:
            raise PlanError(
                f"-n {nproc} with nccl needs {nproc} GPUs but {gpus.count} are visible "
                f"(NCCL allows one rank per GPU); use -n {gpus.count} or --backend gloo"
            )
        return "nccl", f"requested; {plural(gpus.count, 'GPU')} visible"
    return requested, "requested"


def _backend(spec: PoolSpec, gpus: GPUInfo, strict: bool) -> Tuple[str, str]:
    """The backend and why; lenient: an impossible request is kept, with the reason it would fail.

    A Slurm pool's GPUs are its nodes' (--gpus-per-node), not the kernel's: a login node has none."""
    if spec.slurm is not None:
        gpus = GPUInfo(count=spec.slurm.gpus_per_node or 0, cuda_built=True, source="--gpus-per-node")
    if spec.ssh is not None:  # the hosts' GPUs: counted when they answer (kernel/launchers/ssh.py placed)
        return ("gloo", AUTO_REASON) if spec.backend == "auto" else (spec.backend, "requested; each host's GPUs are checked when it answers")
    if spec.ray is not None:  # Ray's GPUs: what each rank asks for (kernel/launchers/ray.py placed)
        return ("gloo", RAY_AUTO_REASON) if spec.backend == "auto" else (spec.backend, "requested")
    try:
        return choose_backend(spec.backend, spec.nproc_per_node, gpus)
    except PlanError as e:
        if strict:
            raise
        return spec.backend, str(e)


def _master_port(spec: PoolSpec, strict: bool) -> Tuple[int, bool]:
    """(port, whether the user gave it): a given one is checked, else a free one on master_addr (net.master_port)."""
    addr = spec.master_addr
    if spec.master_port is not None:
        if strict:
            validate_master_port(addr, spec.master_port)
        return spec.master_port, True
    try:
        return master_port(addr), False
    except OSError:
        if strict:
            raise PlanError(f"--master-addr {addr!r} is not an address of this machine (cannot bind a port on it)") from None
        return master_port("127.0.0.1"), False


def make_plan(
    spec: PoolSpec,
    *,
    environ: Mapping[str, str] = os.environ,
    gpus: Optional[GPUInfo] = None,
    strict: bool = True,
) -> Plan:
    """Turn a PoolSpec into a Plan for one node; raises PlanError with the fix.

    ``environ`` is the kernel's env, which the ranks inherit (it decides the
    thread count and CUDA_VISIBLE_DEVICES). ``strict=False`` (what ``%ddp_env``
    uses) still builds a plan from a request that would not start (nccl without
    GPUs, a taken port, an address that does not resolve), so that
    ``plan_checks`` can show each problem as a failed check instead of stopping
    at the first one.
    """
    gpus = gpus if gpus is not None else detect_gpus(environ)
    backend, reason = _backend(spec, gpus, strict)
    if strict and not spec.over_hosts:  # a Slurm (SSH) pool's MASTER_ADDR is its first node's, known once placed
        validate_master_addr(spec.master_addr)
    port, given = _master_port(spec, strict and spec.ssh is None and spec.ray is None)  # an SSH pool's port: its first host says (kernel/launchers/ssh.py)
    nproc = spec.nproc_per_node
    return Plan(
        nproc=nproc,
        backend=backend,
        backend_reason=reason,
        master_addr=spec.master_addr,
        master_port=port,
        port_was_given=given,
        nnodes=spec.nnodes,
        init=spec.init,
        omp_threads=None if "OMP_NUM_THREADS" in environ else threads_per_rank(nproc),
        pg_timeout=spec.pg_timeout,
        extra_env=spec.env,
        slurm=spec.slurm,
        ssh=spec.ssh,
        slots=spec.ssh.slots if spec.ssh is not None else (),
        ray=spec.ray,
    )
