"""The Ray launcher: Ray places and holds (a placement group, one actor a node), ddp_magic runs (one template a node forks that node's ranks).

``acquire`` starts procs/ray_driver.py, the kernel's child as srun is a Slurm pool's (under
procs/anchor.py: it ends with the kernel). The driver connects to the cluster with Ray's
log path off, checks before anything is placed (Ray or Python versions, the token,
resources that can never fit), asks for a placement group and says ``waiting for Ray: 4 of
8 GPUs free`` while it is pending (the ranks QUEUED, Ctrl-C or ``--start-timeout`` removes
it), then starts one actor pinned to each bundle, whose child is that node's template
(procs/ray_actor.py). From there it is nodes.py's machinery, as on Slurm and SSH: the
driver's stdin reaches every template, their events come back on its stdout, ranks dial
the kernel (TLS across hosts), a template that hears no beat ends its ranks.

The env is torchrun's: MASTER_ADDR is the first node's Ray address, each node's
CUDA_VISIBLE_DEVICES the GPU ids Ray gave its actor (local rank i on cuda:i), the node's
hostname in the output prefix ``[rank 3 n2]``. Nothing is detached: the driver's end (the
kernel's) makes Ray end the actors and the placement group, and each template its ranks. A kept
pool's driver outlives the kernel under the lease (ray_keep.py).
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Dict, List, Optional

from ...logs import log
from ...plan.check import Check
from ...plan.net import address_family, is_local_ip, master_port, route_source
from ...plan.ray import AUTO_REASON, RayRequest
from ...wire import node_hello, tls
from .base import LaunchError
from .hosts import forwarded
from .ray_keep import RayKeep
from .slurm_steps import TemplateStep

if TYPE_CHECKING:
    from ...plan.plan import Plan

DRIVER = ["-m", "ddp_magic.procs.ray_driver"]
CONNECT_WAIT_S = 120.0  # ray.init and the checks; placement has --start-timeout (default: wait, Ctrl-C removes it)
HELLO_WAIT_S = 60.0  # from the placement to every template's hello (an actor's start, python's)


class RayLauncher(RayKeep):
    """Ranks forked by one template a Ray node (the child of an actor pinned to the node's bundle); the placement group
    and the templates are held across restarts (a new -n in the same shape forks from them) and ended by ``close``."""

    name = "ray"

    def __init__(self, secret: bytes, python: str = sys.executable) -> None:
        super().__init__(secret, python)
        self.request: Optional[RayRequest] = None
        self.placed_nodes: List[dict] = []  # the driver's "placed": name, ip, gpus, node_id, a node a bundle in order
        self.hellos: Dict[str, dict] = {}
        self.released = ""

    def start(self, timeout: float = 0) -> str:
        return "ray (a template a node, each the child of an actor on its bundle)"

    def nodes(self) -> List[str]:
        return [str(n["name"]) for n in self.placed_nodes]

    # ------------------------------------------------------------ the placement
    def acquire(self, plan: Plan, progress: Callable[[str], None]) -> Optional[str]:
        """The placement held if it serves ``plan``, else a new one: checked, waited for (QUEUED), its templates started."""
        request = plan.ray
        assert request is not None, "a Ray launcher needs a plan with a Ray request"
        self.plan = plan
        if self.serves(plan):
            self.tls_key = tls.ServerKey() if self._needs_tls() else None
            return None
        self._release()
        t0 = time.monotonic()
        step = TemplateStep([self.python, *DRIVER, *request.driver_argv()], {}, self.secret, [], self.log, proc_env=dict(os.environ))
        self.steps.append(step)
        try:
            placed = self._await_placed(step, progress)
            self.request, self.placed_nodes = request, placed["nodes"]
            step.nodes = self.nodes()
            self._check_hellos(step)
        except BaseException:  # refused, or Ctrl-C while pending: the driver removes the placement group as it ends
            self._release()
            raise
        self.hand_over(step, forwarded(dict(os.environ)))
        self.start_beat()
        self.tls_key = tls.ServerKey() if self._needs_tls() else None
        where = ", ".join(f"{n['name']} ({n['ip']}{', GPUs ' + ','.join(n['gpus']) if n.get('gpus') else ''})" for n in self.placed_nodes)
        return (f"{request.describe()}: placed on {where} in {time.monotonic() - t0:.1f}s"
                + (" (control channel: TLS)" if self.tls_key else ""))

    def _await_placed(self, step: TemplateStep, progress: Callable[[str], None]) -> dict:
        """The driver's ``placed`` event; its ``waiting`` ones shown on the way; a ``refused`` or its end raises."""
        deadline = time.monotonic() + CONNECT_WAIT_S
        while True:
            step.wait_until(lambda: bool(step.events), deadline)
            for ev in step.take_events():
                kind = ev.get("event")
                if kind == "placed":
                    return ev
                if kind == "refused":
                    raise LaunchError(f"Ray: {ev.get('why')}")
                if kind == "waiting":
                    progress(str(ev.get("text")))
                    deadline = time.monotonic() + CONNECT_WAIT_S  # placement waits as long as --start-timeout says
            if step.proc.poll() is not None and not step.events:
                said = "; ".join(step.said[-3:]) or f"code {step.proc.returncode}"
                raise LaunchError(f"Ray: the driver ended before placing anything ({said})")
            if time.monotonic() > deadline:
                raise LaunchError(f"Ray: no answer from the cluster within {CONNECT_WAIT_S:.0f}s ({'; '.join(step.said[-3:])})")

    def _check_hellos(self, step: TemplateStep) -> None:
        """Every node's template says who it is: other code there is refused by name, nothing runs."""
        deadline = time.monotonic() + HELLO_WAIT_S
        mine, problems = node_hello.identity(), []
        for node in self.nodes():
            if not step.wait_until(lambda n=node: n in step.hello or n in step.lost, deadline):  # type: ignore[misc]
                problems.append(f"{node}: its template said nothing within {HELLO_WAIT_S:.0f}s")
                continue
            if node in step.lost:
                problems.append(f"{node}: {step.lost[node]}")
                continue
            self.hellos[node] = step.hello[node]
            differs = node_hello.mismatch(mine, step.hello[node])
            if differs:
                problems.append(f"{node}: other code: {differs}")
        if problems:
            raise LaunchError("Ray: nothing was started; " + "; ".join(problems))

    def _start_step(self, nodes: List[str], env: Dict[str, str]) -> TemplateStep:
        """A node whose template is gone: its bundle went with it (the node lost); the next start places the pool again."""
        raise LaunchError(f"the Ray node {', '.join(nodes)} is lost (its template ended); %ddp restart places the pool again"
                          " if the cluster has room")

    def serves(self, plan: Plan) -> bool:
        return (plan.ray is not None and self.request == plan.ray and bool(self.steps)
                and all(self._step_for(n) is not None for n in self.nodes()))

    def _needs_tls(self) -> bool:
        return tls.forced() or not all(is_local_ip(address_family(str(n["ip"])), str(n["ip"])) for n in self.placed_nodes)

    def placed(self, plan: Plan, avoid: int = 0) -> Plan:
        """MASTER_ADDR the first node's Ray address and a port for it; nccl when asked for GPUs and the backend was left."""
        addr = str(self.placed_nodes[0]["ip"])
        port = plan.master_port if plan.port_was_given else master_port(addr, avoid, local=is_local_ip(address_family(addr), addr))
        out = replace(plan, master_addr=addr, master_port=port)
        if plan.backend_reason == AUTO_REASON and plan.ray is not None and plan.ray.gpus_per_rank >= 1 and plan.init:
            out = replace(out, backend="nccl", backend_reason="a GPU a rank from Ray")
        return out

    def listen_addr(self, asked: Optional[str], default: str) -> str:
        """--control-addr, else the address this machine reaches the first node from."""
        if asked:
            return asked
        addr = str(self.placed_nodes[0]["ip"]) if self.placed_nodes else ""
        return (route_source(address_family(addr), addr) if addr else None) or default

    def alive(self) -> bool:
        return self.request is not None and any(s.proc.poll() is None for s in self.steps)

    def where(self) -> str:
        """'Ray 2 nodes × 2 (STRICT_SPREAD) at 198.51.100.10:6379: n1 (198.51.100.11), n2 (198.51.100.12, its template gone)'."""
        if self.request is None:
            return ""
        nodes = ", ".join(f"{n['name']} ({n['ip']}" + ("" if self._step_for(str(n["name"])) is not None else ", its template gone") + ")"
                          for n in self.placed_nodes)
        return f"{self.request.describe()}: {nodes}"

    def give_up(self) -> str:
        self._release()
        return "the placement group was removed and every node's template ended"

    def _release(self) -> None:
        """End the driver (it removes the placement group and kills the actors; each template ends its ranks)."""
        self.stop_beat()
        self._end_steps()
        self.released = "; its Ray placement group was removed" if self.request is not None else ""
        self.request, self.placed_nodes, self.tls_key = None, [], None
        self.hellos.clear()

    def close(self) -> None:
        try:
            self._release()
        except Exception:  # a driver that would not end: it ends with the kernel (its anchor), and Ray with it
            log.debug("ending the Ray driver failed", exc_info=True)


def preview(plan: Plan) -> "tuple[Plan, List[Check]]":
    """What %ddp_env --ray shows, nothing placed: the driver connects (versions, token) and weighs the request against
    the cluster's nodes; MASTER_ADDR is the first node's, once placed."""
    import json
    import subprocess

    request = plan.ray
    assert request is not None
    argv = [sys.executable, *DRIVER, *request.driver_argv(), "--plan-only"]
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=CONNECT_WAIT_S)
    except subprocess.TimeoutExpired:
        return plan, [Check("Ray cluster", False, f"no answer within {CONNECT_WAIT_S:.0f}s from {request.address or 'the cluster'}")]
    events = [json.loads(ln) for ln in done.stdout.splitlines() if ln.startswith('{"event"')]
    if not events:
        return plan, [Check("Ray cluster", False, f"the driver said nothing: {(done.stderr or done.stdout).strip()[-300:]}")]
    ev = events[-1]
    nodes = ", ".join(f"{n['name']} ({n.get('CPU', 0):g} CPUs, {n.get('GPU', 0):g} GPUs)" for n in ev.get("cluster", []))
    checks = []
    if ev.get("ray"):
        checks.append(Check("Ray cluster", True, f"Ray {ev['ray']}, Python {ev['python']} as here; nodes: {nodes or 'none'}"))
    if ev.get("event") == "refused":
        checks.append(Check("Ray takes the request", False, str(ev.get("why"))))
    else:
        checks.append(Check("Ray takes the request", True, f"{request.describe()}: fits ({ev.get('free')} now; nothing was placed)"))
    return replace(plan, master_addr="(the first node's Ray address, once placed)"), checks
