"""The Ray launcher: Ray places and holds (a placement group, one actor a node), ddp_magic runs (one template a node forks that node's ranks).

``acquire`` starts procs/ray_driver.py, the kernel's child as srun is a Slurm pool's (under
procs/anchor.py: it ends with the kernel). The driver connects to the cluster with Ray's
log path off, checks before anything is placed (Ray or Python versions, the token,
resources that can never fit), asks for a placement group and says ``waiting for Ray: 4 of
8 GPUs free`` while it is pending (the ranks QUEUED, Ctrl-C or ``--start-timeout`` removes
it), then starts one actor a node, whose child is that node's template (procs/ray_group.py,
procs/ray_actor.py). ``-n N`` alone is a bundle a rank that Ray packs: the ranks are numbered
node by node as Ray placed them (the plan's ``slots``). From there it is nodes.py's
machinery, as on Slurm and SSH: the driver's stdin reaches every template, their events
come back on its stdout, ranks dial the kernel (TLS across hosts), a template that hears no
beat ends its ranks. What the kernel tells a template crosses Ray's RPC, clear unless the cluster runs Ray's TLS: the
pool's secret goes sealed to a key the template made (its hello's; wire/seal.py), never as it is.

A lost node (its raylet killed, its link down): before the next cell starts its ranks again,
``place_again`` asks the driver to place the node's bundles again (Ray reschedules a dead
node's bundles where there is room), checks the new template's hello and hands it the pool's
secret; then its ranks are forked and join the others' group as a Slurm node's do
(kernel/failures/recovery.py). No room: the ranks wait QUEUED with one line saying what is
missing, until --start-timeout (then the cell fails, nothing ran, the others keep their state).

The env is torchrun's: MASTER_ADDR is the first node's Ray address, each node's
CUDA_VISIBLE_DEVICES the GPU ids of its bundles (local rank i on cuda:i), the node's
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
from .ray_words import again_text, not_placed_text, pack_text, placed_again_text
from .slurm_steps import TemplateStep

if TYPE_CHECKING:
    from ...plan.plan import Plan

DRIVER = ["-m", "ddp_magic.procs.ray_driver"]
CONNECT_WAIT_S = 120.0  # ray.init and the checks; placement has --start-timeout (default: wait, Ctrl-C removes it)
HELLO_WAIT_S = 60.0  # from the placement to every template's hello (an actor's start, python's)
PING_S = 5.0  # a node whose ranks were lost: its template answers a ping within this, or the node is placed again


class RayLauncher(RayKeep):
    """Ranks forked by one template a Ray node (the child of an actor pinned to the node's bundle); the placement group
    and the templates are held across restarts (a new -n in the same shape forks from them) and ended by ``close``."""

    name = "ray"

    def __init__(self, secret: bytes, python: str = sys.executable) -> None:
        super().__init__(secret, python)
        self.request: Optional[RayRequest] = None
        self.placed_nodes: List[dict] = []  # the driver's "placed": name, ip, gpus, node_id, bundles; a node each, in rank order
        self.hellos: Dict[str, dict] = {}
        self.released = ""
        self.gcs = ""  # the cluster's GCS address, as a node joins it (ray start --address ...)
        self._asked = 0  # the last request to place a lost node again (its id)

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
            self.gcs = request.address or str(placed.get("gcs") or "")  # as the user reaches it, else as Ray says it
            step.nodes = self.nodes()
            self._check_hellos(step)
        except BaseException:  # refused, or Ctrl-C while pending: the driver removes the placement group as it ends
            self._release()
            raise
        self.hand_over(step, forwarded(dict(os.environ)))
        self.start_beat()
        self.tls_key = tls.ServerKey() if self._needs_tls() else None
        where = ", ".join(f"{n['name']} ({n['ip']}{self._ranks_there(n)}{', GPUs ' + ','.join(n['gpus']) if n.get('gpus') else ''})"
                          for n in self.placed_nodes)
        return (f"{request.describe()}: placed on {where} in {time.monotonic() - t0:.1f}s"
                + (" (control channel: TLS)" if self.tls_key else ""))

    def _await_placed(self, step: TemplateStep, progress: Callable[[str], None]) -> dict:
        """The driver's ``placed`` event; its ``waiting`` ones shown on the way; a ``refused`` or its end raises."""
        deadline = time.monotonic() + CONNECT_WAIT_S
        while True:
            step.wait_until(lambda: bool(step.starter), deadline)
            for ev in step.take_starter():
                kind = ev.get("event")
                if kind == "placed":
                    return ev
                if kind == "refused":
                    raise LaunchError(f"Ray: {ev.get('why')}")
                if kind == "waiting":
                    progress(str(ev.get("text")))
                    deadline = time.monotonic() + CONNECT_WAIT_S  # placement waits as long as --start-timeout says
            if step.proc.poll() is not None and not step.starter:
                said = "; ".join(step.said[-3:]) or f"code {step.proc.returncode}"
                raise LaunchError(f"Ray: the driver ended before placing anything ({said})")
            if time.monotonic() > deadline:
                raise LaunchError(f"Ray: no answer from the cluster within {CONNECT_WAIT_S:.0f}s ({'; '.join(step.said[-3:])})")

    def _check_hellos(self, step: TemplateStep) -> None:
        """Every node's template says who it is: other code there is refused by name, nothing runs."""
        deadline = time.monotonic() + HELLO_WAIT_S
        problems = [p for p in (self._hello_problem(step, node, deadline) for node in self.nodes()) if p]
        if problems:
            raise LaunchError("Ray: nothing was started; " + "; ".join(problems))

    def _hello_problem(self, step: TemplateStep, node: str, deadline: float) -> str:
        """Why ``node``'s template may not run ranks ("" when it may): silent, ended, or other code."""
        if not step.wait_until(lambda: node in step.hello or node in step.lost, deadline):
            return f"{node}: its template said nothing within {HELLO_WAIT_S:.0f}s"
        if node in step.lost:
            return f"{node}: {step.lost[node]}"
        self.hellos[node] = step.hello[node]
        why = node_hello.sealed_refusal(step.hello[node])
        return f"{node}: {why}" if why else ""

    def first_line(self, env: Dict[str, str], only: Optional[str] = None) -> dict:
        """A host template's first line, the pool's secret sealed to each node's key (its hello's), never as it is: the
        line crosses Ray's RPC (wire/seal.py). ``only``: that node's alone (one placed again)."""
        return node_hello.first_line(self.secret, env, {n: str(self.hellos[n]["key"]) for n in ([only] if only else self.nodes())})

    def _ranks_there(self, node: dict) -> str:
        """', 2 ranks' for a node of a packed pool (a bundle a rank), "" otherwise."""
        return f", {len(node['bundles'])} ranks" if self.request is not None and self.request.packed and node.get("bundles") else ""

    def _start_step(self, nodes: List[str], env: Dict[str, str]) -> TemplateStep:
        """A node whose template went while its ranks were being started: ``place_again`` places it, at the next cell."""
        raise LaunchError(f"the Ray node {', '.join(nodes)} is lost (its template ended); the next cell places its ranks again"
                          " if the cluster has room")

    # ------------------------------------------------------------ a lost node placed again
    def place_again(self, lost: Dict[str, List[int]], progress: Callable[[str], None]) -> str:
        """Before ranks lost with their nodes are started again (``lost``: node -> its ranks): each node whose template is gone
        (or does not answer a ping) is placed again by Ray, a new template there, its hello checked, the secret handed over.
        ``progress(text)`` while Ray has no room; LaunchError (one line) past --start-timeout, nothing else changed."""
        out = []
        for node, ranks in lost.items():
            if node not in self.nodes() or (self._step_for(node) is not None and not self.unanswered([node], PING_S)):
                continue  # its template answers: it forks them again
            step = self.steps[0] if self.steps else None
            if step is None or step.proc.poll() is not None:
                raise LaunchError("the Ray driver is gone: %ddp restart places the pool again")
            out.append(self._place_node(step, node, ranks, progress))
        return "; ".join(out)

    def _place_node(self, step: TemplateStep, node: str, ranks: List[int], progress: Callable[[str], None]) -> str:
        assert self.request is not None
        i, t0 = self.nodes().index(node), time.monotonic()
        hint, timeout = self.request.restart_hint(len(ranks)), self.request.queue_timeout or 0
        self._asked += 1  # the driver's answers carry it: an interrupted request's last word is not this one's
        step.send({"op": "ray_place", "index": i, "timeout": timeout, "id": self._asked})
        try:
            ev = self._await_again(step, i, lambda said: progress(again_text(node, ranks, said, self.gcs, hint)))
        except BaseException:  # Ctrl-C: the driver stops waiting and kills what it started
            step.send({"op": "ray_cancel", "index": i})
            raise
        if ev.get("event") != "placed_again":
            raise LaunchError(not_placed_text(node, ranks, ev, self.gcs, hint, timeout))
        new = dict(ev["node"])
        step.serve_again(node, str(new["name"]))
        self.placed_nodes[i] = new
        problem = self._hello_problem(step, str(new["name"]), time.monotonic() + HELLO_WAIT_S)
        if problem:
            step.send({"op": "ray_drop", "index": i})
            step.mark_lost(str(new["name"]), problem)
            raise LaunchError(f"Ray placed {node}'s ranks again, but {problem}")
        then = self.kept_again(step, i)  # a kept pool: the new template follows the lease as the others do
        step.send({"op": "ray_admit", "index": i, "first": self.first_line(step.env, only=str(new["name"])), "then": then})
        return placed_again_text(node, new, time.monotonic() - t0)

    def _await_again(self, step: TemplateStep, i: int, say: Callable[[dict], None]) -> dict:
        """The driver's ``placed_again`` or ``not_placed`` for node ``i``; its ``waiting_again`` said on the way (each second:
        a driver silent for ``CONNECT_WAIT_S`` is given up on)."""
        heard = time.monotonic()
        while True:
            step.wait_until(lambda: bool(step.starter), time.monotonic() + 1.0)
            for ev in step.take_starter():
                if ev.get("index") != i or ev.get("id") != self._asked:
                    continue
                heard = time.monotonic()
                if ev.get("event") in ("placed_again", "not_placed"):
                    return ev
                if ev.get("event") == "waiting_again":
                    say(ev)
            if step.proc.poll() is not None or time.monotonic() - heard > CONNECT_WAIT_S:
                ended = "ended" if step.proc.poll() is not None else f"said nothing for {CONNECT_WAIT_S:.0f}s"
                raise LaunchError(f"Ray: the driver {ended} while placing node {i} again ({'; '.join(step.said[-3:])})")

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
        if plan.ray is not None and plan.ray.packed:  # as Ray packed them: a node's ranks are its bundles, numbered node by node
            out = replace(out, nnodes=len(self.placed_nodes), slots=tuple(len(n.get("bundles") or ()) for n in self.placed_nodes))
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
        nodes = ", ".join(f"{n['name']} ({n['ip']}{self._ranks_there(n)}"
                          + ("" if self._step_for(str(n["name"])) is not None else ", its template gone") + ")" for n in self.placed_nodes)
        return f"{self.request.describe()}: {nodes}"

    def give_up(self) -> str:
        self._release()
        return "the placement group was removed and every node's template ended"

    def _release(self) -> None:
        """End the driver (it removes the placement group and kills the actors; each template ends its ranks)."""
        self.stop_beat()
        self._end_steps()
        self.released = "; its Ray placement group was removed" if self.request is not None else ""
        self.request, self.placed_nodes, self.tls_key, self.gcs, self.kept_lines = None, [], None, "", []
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
        packed = f"; {pack_text(ev.get('would') or [])}" if request.packed else ""
        checks.append(Check("Ray takes the request", True, f"{request.describe()}: fits ({ev.get('free')} now; nothing was placed){packed}"))
        if request.packed and ev.get("would"):  # the env each rank would get, numbered node by node as they would pack
            plan = replace(plan, nnodes=len(ev["would"]), slots=tuple(int(k) for _, k in ev["would"]))
    return replace(plan, master_addr="(the first node's Ray address, once placed)"), checks
