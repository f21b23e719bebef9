"""What ``--ray`` asked for: a frozen RayRequest (the cluster's address, nodes, ranks a node, each rank's GPUs and CPUs), pure and unit-tested.

Nothing here imports Ray. ``-n N`` alone is N bundles of one rank each, PACKed by Ray (one
node's ranks together, as few nodes as fit): once placed, the bundles are grouped by node,
one template a node, the ranks numbered node by node (procs/ray_place.py ``by_node``).
``--nodes K --ntasks-per-node M`` is K bundles of M ranks, each on a node of its own
(STRICT_SPREAD). A ``ray://`` address (Ray Client) is refused here: ranks started through
it could not dial a kernel outside the cluster.
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
    """The ranks' placement on a Ray cluster: ``nodes`` bundles of ``ntasks_per_node`` ranks, each rank's resources; or,
    ``packed`` (-n N alone), N bundles of one rank each that Ray packs onto as few nodes as fit (``nodes`` is then 1 and
    ``ntasks_per_node`` N: the nodes are known once placed)."""

    nodes: int = 1
    ntasks_per_node: int = 1
    address: str = ""  # --address, else RAY_ADDRESS, else "auto" (the cluster this host belongs to)
    gpus_per_rank: float = 0.0
    cpus_per_rank: float = 1.0
    queue_timeout: Optional[float] = None  # --start-timeout: remove the placement group still pending after this long
    packed: bool = False  # -n N alone: a bundle a rank, PACK; the nodes are Ray's choice

    @property
    def world_size(self) -> int:
        return self.nodes * self.ntasks_per_node

    @property
    def strategy(self) -> Strategy:
        return Strategy.STRICT_SPREAD if self.nodes > 1 else Strategy.PACK

    @property
    def ranks_a_bundle(self) -> int:
        return 1 if self.packed else self.ntasks_per_node

    def bundle(self) -> Dict[str, float]:
        """One bundle: its ranks' CPUs and GPUs together (a rank's when packed, else a node's)."""
        out = {"CPU": self.cpus_per_rank * self.ranks_a_bundle}
        if self.gpus_per_rank:
            out["GPU"] = self.gpus_per_rank * self.ranks_a_bundle
        return out

    def bundles(self) -> List[Dict[str, float]]:
        return [self.bundle() for _ in range(self.world_size if self.packed else self.nodes)]

    def shape_text(self) -> str:
        gpus = f", {self.gpus_per_rank:g} GPU a rank" if self.gpus_per_rank else ""
        if self.packed:
            return f"Ray {plural(self.world_size, 'rank')}{gpus}"
        return f"Ray {plural(self.nodes, 'node')} × {self.ntasks_per_node}{gpus}"

    def describe(self) -> str:
        return f"{self.shape_text()} ({self.strategy.value}) at {self.address or 'the cluster this host belongs to'}"

    def driver_argv(self) -> List[str]:
        """The arguments of procs/ray_driver.py: what it places and waits for."""
        argv = ["--address", self.address or "auto", "--nodes", str(self.nodes), "--per-node", str(self.ntasks_per_node),
                "--gpus", repr(self.gpus_per_rank), "--cpus", repr(self.cpus_per_rank)]
        return argv + (["--timeout", repr(self.queue_timeout)] if self.queue_timeout else []) + (["--pack"] if self.packed else [])

    def restart_hint(self, lost_ranks: int) -> str:
        """The pool the other nodes can hold, as the user types it: '%ddp restart -n 2' (packed), else one node fewer with
        this request's other options (Ray options given are the whole new request)."""
        left = self.world_size - lost_ranks
        if self.packed or self.nodes <= 1 or left <= 0:
            return f"%ddp restart -n {left}" if left > 0 else "%ddp restart"
        extra = (f" --gpus-per-rank {self.gpus_per_rank:g}" if self.gpus_per_rank else "") \
            + (f" --cpus-per-rank {self.cpus_per_rank:g}" if self.cpus_per_rank != 1 else "") + (f" --address {self.address}" if self.address else "")
        return f"%ddp restart --ray --nodes {self.nodes - 1} --ntasks-per-node {self.ntasks_per_node}{extra}"


def check_address(address: str) -> str:
    """``address`` as the driver takes it; PlanError for Ray Client's ray://, with the supported places."""
    if address.startswith("ray://"):
        raise PlanError(f"--address {address}: {CLIENT_REFUSED}")
    return address


def resolve(nproc: Optional[int], options: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> Tuple[int, RayRequest]:
    """The magic's Ray options (nodes, ntasks_per_node, address, gpus_per_rank, cpus_per_rank, queue_timeout) as a request."""
    nodes, per_node = options.get("nodes"), options.get("ntasks_per_node")
    packed = nodes is None and per_node is None and nproc is not None  # -n N alone: a bundle a rank, where Ray packs them
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
                         queue_timeout=options.get("queue_timeout"), packed=packed)
    return request.world_size, request

