"""A Ray pool's placement group as its driver holds it: the bundles, one node actor a node, the relay to and from their templates, a lost node placed again.

procs/ray_driver.py connects and checks; this is what it holds after. The group is one
bundle a node (``--nodes``: STRICT_SPREAD) or one a rank (``-n N`` alone: PACK). Once Ray
placed it, the bundles are grouped by node (procs/ray_place.py ``by_node``): each node gets
one procs/ray_actor.py actor pinned to its first bundle, whose child is that node's template,
with every GPU of the node's bundles (the actor's own, and the others' read by a task
pinned to each). Every line of the driver's stdin goes to every node's template; each
template's lines come out on the driver's stdout; a node whose actor or template ended is a
``lost`` event naming it.

A lost node's bundles are placed again by Ray when the cluster has room (a placement group
reschedules the bundles of a dead node). The kernel asks for it at the next cell
(``ray_place``, kernel/launchers/ray.py): a new actor is pinned to the node's first bundle,
pending until Ray placed it again, with a ``waiting_again`` event each second saying what
the node asked for and what each node has free; once placed, its template says its hello and
the kernel admits it (``ray_admit``: its first line, a kept pool's keep and follow lines,
and from then on every line) or drops it
(``ray_drop``: other code there). ``ray_cancel`` (Ctrl-C) or the request's --start-timeout
ends the wait (``not_placed``), and the old actor is never fed again nor said lost twice.

A kept pool (procs/ray_keep.py): the driver takes the kernel's ``watch`` line for itself, its
stdin's end then closes each template's stdin instead of ending the pool, and the lease's end
calls ``end`` (the actors killed, the group removed, then the exit frees the lease's lock).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Set

from ..logs import log
from .ray_keep import DriverKeep
from .ray_place import by_node, free_nodes, unique
from .ray_unattended import Unattended

_out = threading.Lock()
READ_S = 1.0  # an actor's read waits this long for its template's first line
# a lost node's actor placed again starts within this once Ray placed its bundle (--start-timeout bounds the wait for room
# only: a node that just joined starts its first Python worker slowly on a busy machine)
ACTOR_START_S = 120.0
OP_PREFIX = '{"op": "ray_'  # a line of the kernel's meant for the driver itself, never for a template


def emit(event: Dict[str, Any]) -> None:
    """One event line to the kernel ("event" first: slurm_steps.py reads it as one)."""
    _say(json.dumps({"event": event.get("event"), **event}) + "\n")  # "event" first, whatever order it was built in


def _say(text: str) -> None:
    """``text`` on our stdout, the kernel's pipe; a kept pool's kernel may be gone (nobody reads it: dropped)."""
    with _out:
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except (OSError, ValueError):
            log.debug("no kernel reads the driver's stdout", exc_info=True)


def cluster_nodes(ray: Any) -> List[Dict[str, Any]]:
    """The live nodes with their totals: [{"name", "ip", "node_id", "CPU", "GPU"}] (a head started with --num-cpus 0 has none)."""
    out = []
    for n in ray.nodes():
        if n.get("Alive"):
            res = n.get("Resources") or {}
            out.append({"name": n.get("NodeManagerHostname") or n.get("NodeManagerAddress"), "ip": n.get("NodeManagerAddress"),
                        "node_id": n.get("NodeID"), "CPU": res.get("CPU", 0), "GPU": res.get("GPU", 0)})
    return out


def free_per_node(ray: Any, kinds: List[str]) -> List[Dict[str, Any]]:
    """What each live node with any of ``kinds`` has free now ([{"name", "CPU", "GPU"}]), as Ray counts it."""
    try:
        from ray._private.state import available_resources_per_node  # no public API says it without the dashboard

        available = available_resources_per_node()
    except Exception:  # another Ray: said as unknown rather than wrong
        log.debug("free resources a node could not be read", exc_info=True)
        return []
    return free_nodes(cluster_nodes(ray), available, kinds)


def free_text(ray: Any, bundles: List[Dict[str, float]]) -> str:
    """'4 of 8 GPUs free' (GPUs when asked, else CPUs)."""
    kind = "GPU" if any("GPU" in b for b in bundles) else "CPU"
    asked = sum(b.get(kind, 0) for b in bundles)
    free = ray.available_resources().get(kind, 0)
    return f"{min(free, asked):g} of {asked:g} {kind}s free"


def bundle_gpus() -> List[str]:
    """A task's body, pinned to one bundle: the GPU ids Ray gave that bundle (they stay the bundle's while it is placed)."""
    import ray

    return [str(g) for g in ray.get_gpu_ids()]


@dataclass
class Held:
    """One node of the pool: its bundles, the actor on the first of them, the node's name and Ray id."""

    bundles: List[int]
    actor: Any
    name: str = ""
    node_id: str = ""
    admitted: bool = True  # fed every line of the kernel's (a node placed again: once the kernel admits it)
    superseded: bool = False  # placed again, or dropped: never fed again, its end not said
    info: Dict[str, Any] = field(default_factory=dict)


class Driver:
    """The placement group, the actors on its bundles, and the relay between them and the kernel."""

    def __init__(self, ray: Any, args: argparse.Namespace) -> None:
        self.ray, self.args = ray, args
        self.pg: Any = None
        self.held: List[Held] = []  # a node each, in node order (node rank i is held[i])
        self.dropped: List[Any] = []  # actors superseded: killed again at the end
        self.again: Dict[int, threading.Event] = {}  # node index -> the cancel of its placing again
        self.lost: Set[int] = set()  # node indexes whose actor or template ended, not yet placed again
        self.ending = threading.Event()
        self.lock = threading.Lock()
        self._remote: Any = None
        self.keeping = DriverKeep(self.end)  # a kept pool: this driver outlives the kernel under the lease (procs/ray_keep.py)
        self.unattended = Unattended(self)  # kept, no kernel here: a lost node placed again by us (procs/ray_unattended.py)

    # ------------------------------------------------------------ the group
    def bundles(self) -> List[Dict[str, float]]:
        """One bundle a node (its ranks' CPUs and GPUs), or one a rank (``--pack``: -n N alone)."""
        ranks = 1 if self.args.pack else self.args.per_node
        bundle = {"CPU": self.args.cpus * ranks}
        if self.args.gpus:
            bundle["GPU"] = self.args.gpus * ranks
        return [dict(bundle) for _ in range(self.args.nodes * self.args.per_node if self.args.pack else self.args.nodes)]

    def place(self) -> bool:
        """The placement group, waited for (a ``waiting`` event each second); False when --start-timeout passed."""
        from ray.util.placement_group import placement_group

        strategy = "STRICT_SPREAD" if self.args.nodes > 1 and not self.args.pack else "PACK"
        self.pg = placement_group(self.bundles(), strategy=strategy, name=f"ddp_magic-{os.getpid()}")
        t0 = time.monotonic()
        while not self.ray.wait([self.pg.ready()], timeout=1.0)[0]:
            waited = time.monotonic() - t0
            if self.args.timeout and waited > self.args.timeout:
                return False
            emit({"event": "waiting", "text": f"waiting for Ray: {free_text(self.ray, self.bundles())}", "waited": waited})
        return True

    def bundle_nodes(self) -> Dict[int, str]:
        """{bundle index: the id of the node Ray placed it on} (a bundle of a dead node: not yet placed again)."""
        from ray.util.placement_group import placement_group_table

        return {int(k): str(v) for k, v in (placement_group_table(self.pg).get("bundles_to_node_id") or {}).items()}

    def _actor(self, bundle: int) -> Any:
        """A node actor pinned to ``bundle`` with its resources (pending until Ray placed that bundle)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from .ray_actor import NodeActor

        if self._remote is None:
            self._remote = self.ray.remote(concurrency_groups={"read": 1})(NodeActor)
        res = self.bundles()[bundle]
        strategy = PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=bundle)
        return self._remote.options(scheduling_strategy=strategy, num_cpus=res["CPU"], num_gpus=res.get("GPU", 0), max_restarts=0).remote()

    def _gpus(self, groups: List[List[int]], wheres: List[Dict[str, Any]]) -> List[List[str]]:
        """Each node's GPU ids: its actor's (its first bundle's) and those of its other bundles, read by a task on each."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        per_bundle = self.bundles()[0].get("GPU", 0)
        task = self.ray.remote(bundle_gpus)
        refs = [[task.options(scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=b),
                              num_cpus=0, num_gpus=per_bundle).remote() for b in (g[1:] if per_bundle else [])] for g in groups]
        out = []
        for w, more in zip(wheres, refs):
            ids = list(w["gpus"]) + [g for ids in self.ray.get(more) for g in ids]
            out.append(sorted(set(ids), key=lambda g: (len(g), g)))
        return out

    def start_actors(self) -> List[Dict[str, Any]]:
        """One actor a node, each starting its node's template; the nodes in the order of their first bundle."""
        groups = by_node(self.bundle_nodes())
        actors = [self._actor(g[0]) for g in groups]
        wheres = self.ray.get([a.where.remote() for a in actors])
        addrs = {n.get("NodeID"): n.get("NodeManagerAddress") for n in self.ray.nodes()}
        for w in wheres:  # the node's address as Ray knows it (--node-ip-address), not whatever the host routes by
            w["ip"] = addrs.get(w["node_id"]) or w["ip"]
        gpus = self._gpus(groups, wheres)
        names = unique([str(w["host"]) for w in wheres])
        cwd, pythonpath = os.getcwd(), os.environ.get("PYTHONPATH", "")
        pids = self.ray.get([a.start.remote(n, cwd, pythonpath, g) for a, n, g in zip(actors, names, gpus)])
        placed = [dict(w, name=n, template_pid=p, gpus=g, bundles=grp) for w, n, p, g, grp in zip(wheres, names, pids, gpus, groups)]
        self.held = [Held(grp, a, n, str(w["node_id"]), info=info) for grp, a, n, w, info in zip(groups, actors, names, wheres, placed)]
        for held in self.held:
            threading.Thread(target=self.relay_out, args=(held,), name="ddp-ray-out", daemon=True).start()
        return placed

    # ------------------------------------------------------------ the relay
    def relay_out(self, held: Held) -> None:
        """The template's lines to our stdout; its end or its actor's (a node lost) said as ``lost``, once, while it is the node's."""
        while not self.ending.is_set():
            try:
                lines = self.ray.get(held.actor.read.options(concurrency_group="read").remote(READ_S))
            except Exception as e:  # the actor died: its node (raylet) went, or it was killed
                log.debug("the actor of %s is gone", held.name, exc_info=True)
                if not self.ending.is_set() and not held.superseded:
                    self._lost(held, f"its Ray actor died ({type(e).__name__}: {str(e).splitlines()[0][:200]})")
                return
            if lines is None:
                if not self.ending.is_set() and not held.superseded:
                    self._lost(held, f"its template ended (code {self.ray.get(held.actor.code.remote())})")
                return
            if not held.admitted and self.keeping.alone:
                self.unattended.admit(held, lines)
            _say("".join(lines))

    def _lost(self, held: Held, why: str) -> None:
        """``held``'s node is lost: said to the kernel; a kept pool with no kernel here places it again itself."""
        emit({"event": "lost", "node": held.name, "why": why})
        with self.lock:
            if held not in self.held:
                return
            i = self.held.index(held)
            self.lost.add(i)
        self.unattended.on_lost(i)

    def relay_in(self) -> None:
        """Every line of our stdin to every node's template, until it closes (the kernel is gone, or ends the pool); the
        kernel's ``ray_*`` commands are ours."""
        for line in iter(sys.stdin.readline, ""):
            if self.keeping.take(line):  # the lease watched (%ddp keep) or no more (--off)
                continue
            if line.startswith(OP_PREFIX):
                self.command(json.loads(line))
                continue
            with self.lock:
                fed = [h.actor for h in self.held if h.admitted and not h.superseded]
            for actor in fed:
                actor.write.remote(line)

    def relay_then_end(self) -> None:
        """The kernel's pipe to its end, then ours; kept, the lease's end is ours instead (DriverKeep's watch calls ``end``)."""
        self.relay_in()
        with self.lock:
            live = [h.actor for h in self.held if not h.superseded]
        if not self.keeping.kernel_left(live):
            self.end()
        self.unattended.after_kernel_left()

    def command(self, cmd: Dict[str, Any]) -> None:
        """The kernel's word on a lost node (``index``: its node rank): place it again, admit or drop what was placed, stop waiting."""
        op, i = cmd.get("op"), int(cmd.get("index", -1))
        if not 0 <= i < len(self.held):
            return
        if op == "ray_place":
            self.again[i] = threading.Event()
            args = (i, float(cmd.get("timeout") or 0), self.again[i], cmd.get("id"))
            threading.Thread(target=self.place_again, args=args, name="ddp-ray-again", daemon=True).start()
        elif op == "ray_cancel" and i in self.again:
            self.again[i].set()
        elif op == "ray_admit":
            held = self.held[i]
            held.actor.write.remote(json.dumps(cmd.get("first")) + "\n")  # its first line, before any other (one caller: in order)
            for line in cmd.get("then") or []:  # a kept pool's keep and follow, for this template alone
                held.actor.write.remote(json.dumps(line) + "\n")
            held.admitted = True
            with self.lock:
                self.lost.discard(i)
        elif op == "ray_drop":
            self.supersede(self.held[i])

    def supersede(self, held: Held) -> None:
        """``held`` is no longer the node's: never fed again, its end not said; its actor killed (its template follows)."""
        with self.lock:
            held.superseded = True
            self.dropped.append(held.actor)
        try:
            self.ray.kill(held.actor, no_restart=True)
        except Exception:  # gone already
            log.debug("a superseded actor was gone already", exc_info=True)

    # ------------------------------------------------------------ a lost node placed again
    def room(self, held: Held) -> Dict[str, Any]:
        """What the lost node asked for, the group's state and what each node has free: the kernel's words when there is no room."""
        from ray.util.placement_group import placement_group_table

        bundles = self.bundles()
        asked = {k: sum(bundles[b].get(k, 0) for b in held.bundles) for k in bundles[0]}
        return {"state": placement_group_table(self.pg).get("state"), "asked": asked, "free": free_per_node(self.ray, list(asked))}

    def place_again(self, i: int, timeout: float, cancel: threading.Event, asked: Any = None) -> bool:
        """Node ``i``'s bundles placed again by Ray (waited for: ``waiting_again`` each second), a new actor and template on them;
        ``placed_again`` with the node, or ``not_placed`` (Ctrl-C, --start-timeout, the bundles over several nodes, Ray's error);
        each event carries the kernel's ``id`` of this request (an interrupted one's last word must not answer the next)."""
        try:
            return self._place_again(i, timeout, cancel, asked)
        except Exception as e:  # never a silent end: the kernel waits for our word
            log.debug("placing node %d again failed", i, exc_info=True)
            emit({"event": "not_placed", "index": i, "id": asked, "why": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"})
            return False

    def _place_again(self, i: int, timeout: float, cancel: threading.Event, asked: Any) -> bool:
        old = self.held[i]
        self.supersede(old)
        t0 = time.monotonic()
        actor, where = self._pinned_again(i, old, timeout, cancel, t0, asked)
        if actor is None:
            return False
        try:
            on = {self.bundle_nodes().get(b) for b in old.bundles}
            if on != {where["node_id"]}:
                names = {n["node_id"]: n["name"] for n in cluster_nodes(self.ray)}
                raise RuntimeError(f"Ray placed its bundles again over several nodes ({', '.join(sorted(names.get(n or '', '?') for n in on))})")
            where["ip"] = {n.get("NodeID"): n.get("NodeManagerAddress") for n in self.ray.nodes()}.get(where["node_id"]) or where["ip"]
            gpus = self._gpus([old.bundles], [where])[0]
            others = [h.name for j, h in enumerate(self.held) if j != i]
            name = old.name if self.keeping.alone else unique(others + [str(where["host"])])[-1]  # kept: the names the pool has
            pid = self.ray.get(actor.start.remote(name, os.getcwd(), os.environ.get("PYTHONPATH", ""), gpus))
        except Exception as e:  # its node went again meanwhile, or the bundles are split: said, and the next cell tries again
            log.debug("placing node %d again failed", i, exc_info=True)
            self._not_placed(i, actor, old, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}", time.monotonic() - t0, asked)
            return False
        info = dict(where, name=name, template_pid=pid, gpus=gpus, bundles=old.bundles)
        held = Held(old.bundles, actor, name, str(where["node_id"]), admitted=False, info=info)
        with self.lock:
            self.held[i] = held
        threading.Thread(target=self.relay_out, args=(held,), name="ddp-ray-out", daemon=True).start()
        emit({"event": "placed_again", "index": i, "id": asked, "node": info, "waited": time.monotonic() - t0})
        return True

    def _pinned_again(self, i: int, old: Held, timeout: float, cancel: threading.Event, t0: float, asked: Any) -> "tuple[Any, Dict[str, Any]]":
        """A new actor on the node's first bundle, once Ray placed it again: (actor, where it is), or (None, {}) once
        ``not_placed`` was said. An actor that died pending (Ray leased it to the lost node before counting it out) is made again."""
        from ray.exceptions import ActorDiedError

        actor = self._actor(old.bundles[0])
        ref = actor.where.remote()
        placed = 0.0  # when Ray placed the bundle on a live node: from then on the actor starts, the wait for room is over
        while True:
            if self.ray.wait([ref], timeout=1.0)[0]:
                try:
                    return actor, self.ray.get(ref)
                except ActorDiedError:
                    log.debug("the actor placed again on node %d died pending: made again", i, exc_info=True)
                    time.sleep(1.0)
                    actor = self._actor(old.bundles[0])
                    ref = actor.where.remote()
            waited = time.monotonic() - t0
            placed = placed or (time.monotonic() if self._on_live_node(old.bundles[0]) else 0.0)
            why = ("cancelled" if cancel.is_set() or self.ending.is_set() else "timeout" if timeout and not placed and waited > timeout
                   else f"its actor did not start within {ACTOR_START_S:.0f}s of Ray placing it" if placed and time.monotonic() - placed > ACTOR_START_S
                   else "")
            if why:
                self._not_placed(i, actor, old, why, waited, asked)
                return None, {}
            emit(dict(self.room(old), event="waiting_again", index=i, id=asked, waited=waited))

    def _on_live_node(self, bundle: int) -> bool:
        """Whether Ray has placed ``bundle`` on a node it counts alive (a lost node's keeps it until Ray counts it out)."""
        node = self.bundle_nodes().get(bundle)
        return bool(node) and any(n.get("NodeID") == node and n.get("Alive") for n in self.ray.nodes())

    def _not_placed(self, i: int, actor: Any, old: Held, why: str, waited: float, asked: Any) -> None:
        try:
            self.ray.kill(actor, no_restart=True)
        except Exception:
            log.debug("the pending actor was gone already", exc_info=True)
        emit(dict(self.room(old), event="not_placed", index=i, id=asked, why=why, waited=waited))

    def end(self, *_: object) -> None:
        """Remove the placement group and kill the actors (their templates follow), then exit."""
        self.ending.set()
        for actor in [h.actor for h in self.held] + self.dropped:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # gone already
                log.debug("an actor was gone already", exc_info=True)
        if self.pg is not None:
            try:
                from ray.util.placement_group import remove_placement_group

                remove_placement_group(self.pg)
            except Exception:  # the cluster is gone: so is the group
                log.debug("the placement group could not be removed", exc_info=True)
        os._exit(0)
