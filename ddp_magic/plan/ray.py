"""What ``--ray`` asked for: a frozen RayRequest (the cluster's address, nodes, ranks a node, each rank's GPUs and CPUs), pure and unit-tested.

Nothing here imports Ray. ``-n N`` alone is one node's N ranks (PACK: one bundle of the
node's resources); ``--nodes K --ntasks-per-node M`` is K bundles of M ranks, each on a
node of its own (STRICT_SPREAD). A ``ray://`` address (Ray Client) is refused here: ranks
started through it could not dial a kernel outside the cluster.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..errors import PlanError
from ..words import plural

ADDRESS_ENV = "RAY_ADDRESS"
CLIENT_REFUSED = ("ray:// (Ray Client) cannot run ddp_magic's ranks: they dial this kernel, which must be inside the cluster's network. "
                  "Run the kernel on the head node (or pod), in a notebook pod in the cluster, or next to a local `ray start --head`, "
                  "and give --address HOST:6379 (docs/ray.md)")
AUTO_REASON = "gloo: the ranks ask Ray for no GPU (--gpus-per-rank 1 makes it nccl)"


class Strategy(str, Enum):
    """Ray's placement strategies that a pool uses: one node's ranks together, or one node each."""

    PACK = "PACK"
    STRICT_SPREAD = "STRICT_SPREAD"


@dataclass(frozen=True)
class RayRequest:
    """The ranks' placement on a Ray cluster: ``nodes`` bundles of ``ntasks_per_node`` ranks, each rank's resources."""

    nodes: int = 1
    ntasks_per_node: int = 1
    address: str = ""  # --address, else RAY_ADDRESS, else "auto" (the cluster this host belongs to)
    gpus_per_rank: float = 0.0
    cpus_per_rank: float = 1.0
    queue_timeout: Optional[float] = None  # --start-timeout: remove the placement group still pending after this long

    @property
    def world_size(self) -> int:
        return self.nodes * self.ntasks_per_node

    @property
    def strategy(self) -> Strategy:
        return Strategy.STRICT_SPREAD if self.nodes > 1 else Strategy.PACK

    def bundle(self) -> Dict[str, float]:
        """One node's bundle: its ranks' CPUs and GPUs together (its one actor holds them all)."""
        out = {"CPU": self.cpus_per_rank * self.ntasks_per_node}
        if self.gpus_per_rank:
            out["GPU"] = self.gpus_per_rank * self.ntasks_per_node
        return out

    def bundles(self) -> List[Dict[str, float]]:
        return [self.bundle() for _ in range(self.nodes)]

    def shape_text(self) -> str:
        gpus = f", {self.gpus_per_rank:g} GPU a rank" if self.gpus_per_rank else ""
        return f"Ray {plural(self.nodes, 'node')} × {self.ntasks_per_node}{gpus}"

    def describe(self) -> str:
        return f"{self.shape_text()} ({self.strategy.value}) at {self.address or 'the cluster this host belongs to'}"

    def driver_argv(self) -> List[str]:
        """The arguments of procs/ray_driver.py: what it places and waits for."""
        argv = ["--address", self.address or "auto", "--nodes", str(self.nodes), "--per-node", str(self.ntasks_per_node),
                "--gpus", repr(self.gpus_per_rank), "--cpus", repr(self.cpus_per_rank)]
        return argv + (["--timeout", repr(self.queue_timeout)] if self.queue_timeout else [])


def check_address(address: str) -> str:
    """``address`` as the driver takes it; PlanError for Ray Client's ray://, with the supported places."""
    if address.startswith("ray://"):
        raise PlanError(f"--address {address}: {CLIENT_REFUSED}")
    return address


def resolve(nproc: Optional[int], options: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> Tuple[int, RayRequest]:
    """The magic's Ray options (nodes, ntasks_per_node, address, gpus_per_rank, cpus_per_rank, queue_timeout) as a request."""
    nodes, per_node = options.get("nodes"), options.get("ntasks_per_node")
    if nodes is None:
        nodes = 1 if per_node is None or nproc is None else max(1, nproc // per_node)
    if per_node is None:
        if nproc is None:
            raise PlanError("--ray: give -n N, or --nodes K --ntasks-per-node M")
        if nproc % nodes:
            raise PlanError(f"--ray: -n {nproc} ranks do not split evenly over {plural(nodes, 'node')}; give a multiple of {nodes}")
        per_node = nproc // nodes
    if nproc is not None and nproc != nodes * per_node:
        raise PlanError(f"--ray: -n {nproc} is not --nodes {nodes} × --ntasks-per-node {per_node}; give one or the other")
    cpus_given = options.get("cpus_per_rank")
    gpus, cpus = float(options.get("gpus_per_rank") or 0), float(1 if cpus_given is None else cpus_given)
    if gpus < 0 or cpus < 0:
        raise PlanError("--gpus-per-rank and --cpus-per-rank are 0 or more")
    address = check_address(str(options.get("address") or environ.get(ADDRESS_ENV) or ""))
    request = RayRequest(nodes=nodes, ntasks_per_node=per_node, address=address, gpus_per_rank=gpus, cpus_per_rank=cpus,
                         queue_timeout=options.get("queue_timeout"))
    return request.world_size, request

