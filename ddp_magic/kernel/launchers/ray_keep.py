"""The kernel's side of a kept Ray pool (docs/keep.md, "On Ray"): what RayLauncher adds to be kept, apart from its placing.

As over SSH, the first node's template holds the lease (TCP and TLS at the node's Ray address) and the other nodes'
templates follow it; unlike SSH, nothing new starts on this host: the pool's driver is already here, holding the
placement group and the actors, and at ``%ddp keep`` it stops ending with the kernel (its anchor's parent-death
signal lifted, as a kept srun's) and watches the lease instead (procs/ray_keep.py says why the actors and the group
are not made detached). The kernel's pipe to the driver then only carries what the driver takes for itself (the
watch) besides the templates' commands; the kernel's exit closes it, and the pool goes on.

A node lost while the pool is kept and placed again by the keeping kernel (kernel/launchers/ray.py ``place_again``)
gets a new template that never heard the keep: the keep and follow lines this kernel wrote are remembered, and the
driver gives them to that template right after its first line (``ray_admit``), so it follows the lease as the others.
A node lost once this kernel is gone is the driver's to place again (procs/ray_unattended.py): the watch line hands it
what it needs to admit the new template as this kernel would (the templates' env, the keep and follow lines).
"""
from __future__ import annotations

from typing import Dict, List, Optional

from ...logs import log
from ...plan.ray import RayRequest
from .hosts import HostLauncher
from .slurm_steps import TemplateStep

WATCH_OP, UNWATCH_OP = "watch", "unwatch"  # lines the driver takes for itself (procs/ray_keep.py)


class RayKeep(HostLauncher):
    """A Ray launcher's kept-pool half: the lease's place, what an attaching kernel needs, the driver's outliving."""

    placed_nodes: List[dict]  # RayLauncher's: name, ip, gpus, node_id, bundles; a node each, in rank order
    hellos: Dict[str, dict]
    request: Optional[RayRequest]

    def __init__(self, secret: bytes, python: str) -> None:
        super().__init__(secret, python)
        self.kept_lines: List[dict] = []  # the keep and follow commands of the keep in force, as this kernel wrote them

    def _write(self, cmd: dict) -> None:
        """A command to every template, the keep's and follow's remembered for a node's template placed again later."""
        op = cmd.get("op")
        if op == "keep":  # a keep again (new timers) keeps the follow it had
            self.kept_lines = [dict(cmd)] + [c for c in self.kept_lines if c.get("op") == "follow"]
        elif op == "follow":
            self.kept_lines.append(dict(cmd))
        elif op in ("unkeep", "exit"):
            self.kept_lines = []
        super()._write(cmd)

    def kept_again(self, step: TemplateStep, index: int) -> List[dict]:
        """What the template of node ``index`` placed again hears right after its first line to follow a kept pool's lease:
        the keep and follow lines, as ``step`` writes them; none when the pool is not kept (or for node 0, the lease's
        holder: its loss ended the lease)."""
        if not self.lease_lock or index == 0:
            return []
        return [step.wire_form(dict(cmd)) for cmd in self.kept_lines]

    def keepable(self) -> str:
        """Why this pool cannot outlive its kernel ("" when it can): every node must still have its template."""
        gone = [n for n in self.nodes() if self._step_for(n) is None]
        if not self.steps or gone:
            return (f"{', '.join(gone) or 'its nodes'} lost {'its' if len(gone) == 1 else 'their'} template; "
                    "%ddp restart places the pool again, then keep")
        return ""

    def lease_bind(self) -> str:
        """Where the first node's template holds the lease: its address as Ray knows it (TCP and TLS, even on this host)."""
        return str(self.placed_nodes[0]["ip"]) if self.placed_nodes else "127.0.0.1"

    def kept_blob(self) -> Dict[str, object]:
        """What a kernel that attaches the kept pool needs to fork a rank again (kernel/keep/launcher.py): nodes, env."""
        step = self._step_for(self.lease_node)
        return {"nodes": self.nodes(), "step_env": dict(step.env if step is not None else {}), "job": ""}

    def outlive_kernel(self, lock: str, watch: Optional[Dict[str, object]] = None) -> None:
        """``%ddp keep``: the driver outlives this kernel and follows the lease (it holds ``lock`` here while the lease
        lives, and ends the actors and the group with it). ``lock=""`` (``keep --off``, a keep that failed): the driver
        stops watching and ends with this kernel again."""
        self.lease_lock = lock
        for step in self.steps:
            if lock and watch is not None:
                admit = {"env": dict(step.env), "then": self.kept_again(step, 1)}  # for a node lost once this kernel is gone
                step.send({"op": WATCH_OP, "watch": dict(watch, admit=admit)})  # the secret on the driver's stdin only
                step.outlive_kernel(True)
            elif not lock:
                step.send({"op": UNWATCH_OP})
                try:
                    step.outlive_kernel(False)
                except OSError:  # the driver is gone already: nothing to tie to this kernel
                    log.debug("a kept Ray pool's driver was gone already", exc_info=True)

    def detach(self) -> None:
        """The kept pool is no more this kernel's (its exit, or another kernel took it): the driver's stdin closes (it tells
        the templates no kernel is there), nothing is signalled; the driver, the actors and the group follow the lease."""
        self.let_go_of_steps("a kept Ray pool's driver pipe")
        self.kept_lines = []
        self.request, self.placed_nodes = None, []
        self.hellos.clear()

