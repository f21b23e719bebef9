"""What the SSH and Ray launchers share: templates the kernel feeds on their starter's stdin and beats, on hosts of their own.

Slurm's templates get their env from srun and their secret sealed by MUNGE; an ssh session's
or a Ray driver's templates get both as their first line (``hand_over``), and only the part of
the kernel's env a rank needs (``forwarded``): the rest is the host's own login env. Each such
template ends its ranks when it hears no beat for ``node_hello.SILENCE_S`` (the kernel's host
gone, its link down), so the kernel beats every starter while the pool lives.
"""
from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from ...logs import log
from ...wire import node_hello
from ...wire.node_hello import BEAT_S, SILENCE_S
from .nodes import NodeLauncher
from .slurm_steps import TemplateStep

if TYPE_CHECKING:
    from ...plan.plan import Plan

FORWARD_PREFIXES = ("DDP_MAGIC_", "NCCL_", "GLOO_", "TORCH_", "PYTORCH_", "OMP_", "MKL_", "TP_SOCKET_IFNAME", "CUBLAS_")
NODE_NAME_ENV = "DDP_MAGIC_NODE_NAME"  # a rank's host as the kernel calls it: [rank 5 gpu2] (wire/slurm_env.py node_name)


def forwarded(env: Dict[str, str]) -> Dict[str, str]:
    """What of the kernel's env the hosts' ranks get (the rest is the host's own login env): ddp_magic's, torch's,
    NCCL's, gloo's and OpenMP's settings, and the user's own PYTHONPATH."""
    out = {k: v for k, v in env.items() if k.startswith(FORWARD_PREFIXES)}
    out["PYTHONUNBUFFERED"] = "1"
    if os.environ.get("PYTHONPATH"):
        out["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return out


def host_rank_env(plan: "Plan", nodes: List[str], rank: int, env: Dict[str, str]) -> Tuple[int, Dict[str, str]]:
    """``rank``'s host index and env: the hosts' shared env (forwarded) with torchrun's set for it and its host's name.
    One home for the kernel that started the pool and one that attached it kept (kernel/keep/launcher.py)."""
    node_rank, local = plan.node_local(rank)
    wanted = dict(forwarded(env), **plan.rank_env(local, node_rank))
    wanted[NODE_NAME_ENV] = nodes[node_rank]
    return node_rank, wanted


class HostLauncher(NodeLauncher):
    """A NodeLauncher whose templates take the secret and env on stdin and end without the kernel's beat."""

    def __init__(self, secret: bytes, python: str) -> None:
        super().__init__(secret, python)
        self._beats = threading.Event()  # set while start_beat's thread runs

    def _rank_env(self, rank: int, env: Dict[str, str]) -> Tuple[int, Dict[str, str]]:
        assert self.plan is not None
        return host_rank_env(self.plan, self.nodes(), rank, env)

    def hand_over(self, step: TemplateStep, env: Dict[str, str]) -> None:
        """A template's first line to every template of ``step``; its env kept as theirs."""
        step.send(self.first_line(env))
        step.env = dict(env)

    def first_line(self, env: Dict[str, str]) -> dict:
        """A template's first line: the pool's secret, the env its ranks share, and how long it waits for a beat."""
        return node_hello.first_line(self.secret, env)

    def launch(self, plan: Plan, base_env: Dict[str, str], control_addr: str, control_port: int, store_path: Optional[str] = None) -> Optional[str]:
        """Every rank, forked by its host's template. ``store_path`` is unused: ranks meet at rank 0's TCP store."""
        self.plan = plan
        self._pids.clear()
        for rank in range(plan.world_size):
            self._spawn(rank, base_env, control_addr, control_port)
        return None

    def left_there(self, nodes: List[str]) -> str:
        one = len(nodes) == 1
        return f"{'its template ends' if one else 'their templates end'} on {'its' if one else 'their'} own, hearing no beat for {SILENCE_S:.0f}s"

    def start_beat(self) -> None:
        """A beat on every starter each ``BEAT_S``, from a thread of its own, until ``stop_beat``."""
        if self._beats.is_set():
            return
        self._beats.set()

        def run() -> None:
            while self._beats.is_set():
                for step in list(self.steps):
                    if step.proc.poll() is None:
                        step.send({"op": "beat"})
                time.sleep(BEAT_S)

        threading.Thread(target=run, name=f"ddp-{self.name}-beat", daemon=True).start()

    def stop_beat(self) -> None:
        self._beats.clear()

    def let_go_of_steps(self, what: str) -> None:
        """A kept pool no longer this kernel's (its exit, or another kernel took it): each starter's stdin closed (its
        far end follows the lease; nothing is signalled), and this launcher's hold on it dropped."""
        self.stop_beat()
        steps, self.steps = self.steps, []
        for step in steps:
            if step.proc.stdin is not None:
                try:
                    step.proc.stdin.close()
                except OSError:
                    log.debug("%s was closed already", what, exc_info=True)
        self.lease_lock, self.tls_key = "", None
        self._pids.clear()
        self._pending.clear()
