"""The Ray pool's driver: the kernel's child (as srun is a Slurm pool's) that places the node templates on a Ray cluster and relays their lines.

Started by kernel/launchers/ray.py under procs/anchor.py, so it ends with the kernel, even a
SIGKILLed one. It connects to the cluster (``ray.init``; Ray's own log path off: nothing of
the ranks passes through Ray), checks before anything is placed (the versions, the token,
resources that can never fit: one line each, an ``refused`` event), asks for a placement
group (one bundle a node) and says ``waiting`` each second while it is pending, then
starts one procs/ray_actor.py actor pinned to each bundle, which starts that node's
template. From there it is srun's part: every line on its stdin goes to every template,
every template's line comes out on its stdout, and a node whose actor or template ended is
a ``lost`` event naming it. Its stdin closing or SIGTERM removes the placement group and
the actors; its death without that (SIGKILL) leaves Ray to end the job's non-detached
actors and placement group, whose templates follow their actors.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Dict, List, Optional

from ..logs import log
from .ray_keep import DriverKeep

_out = threading.Lock()
READ_S = 1.0  # an actor's read waits this long for its template's first line


def emit(event: Dict[str, Any]) -> None:
    """One event line to the kernel ("event" first: slurm_steps.py reads it as one)."""
    with _out:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()


def said(error: BaseException) -> str:
    """Ray's error in one line, with the fix: a version mismatch, a missing or wrong token, no cluster there."""
    text = str(error)
    if "Version mismatch" in text:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith(("Ray:", "Python:"))]
        there, here = " ".join(lines[:2]), " ".join(lines[2:4])
        return f"Ray or Python differ between the cluster ({there}) and this kernel ({here}): install the cluster's versions here"
    chain = [error]
    while chain[-1].__cause__ is not None and len(chain) < 8:  # ray.init's ConnectionError hides the AuthenticationError
        chain.append(chain[-1].__cause__)
    words = " ".join(f"{type(e).__name__}: {e}" for e in chain).lower()  # its cause may be a RuntimeError quoting the traceback
    if "authenticationerror" in words or "invalidauthtoken" in words or "token" in text.lower():
        return ("Ray's token authentication refused this kernel (the token is missing or wrong): give the cluster's token as "
                "RAY_AUTH_TOKEN or in ~/.ray/auth_token (RAY_AUTH_TOKEN_PATH) in the kernel's env (docs/ray.md)")
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return f"could not connect to a cluster: {first}"


def cluster_nodes(ray: Any) -> List[Dict[str, Any]]:
    """The live nodes with their totals: [{"name", "ip", "CPU", "GPU"}] (a head started with --num-cpus 0 has none)."""
    out = []
    for n in ray.nodes():
        if n.get("Alive"):
            res = n.get("Resources") or {}
            out.append({"name": n.get("NodeManagerHostname") or n.get("NodeManagerAddress"), "ip": n.get("NodeManagerAddress"),
                        "CPU": res.get("CPU", 0), "GPU": res.get("GPU", 0)})
    return out


def free_text(ray: Any, bundles: List[Dict[str, float]]) -> str:
    """'4 of 8 GPUs free' (GPUs when asked, else CPUs)."""
    kind = "GPU" if any("GPU" in b for b in bundles) else "CPU"
    asked = sum(b.get(kind, 0) for b in bundles)
    free = ray.available_resources().get(kind, 0)
    return f"{min(free, asked):g} of {asked:g} {kind}s free"


def never_fits(bundles: List[Dict[str, float]], per_node: int, nodes: List[Dict[str, Any]]) -> str:
    """Why ``bundles`` (one a node, the same each) can never be placed on a cluster of ``nodes`` ({"name", "CPU", "GPU"}
    totals), "" when they can: "8 GPUs asked, the cluster has 4: 2 on n1, 2 on n2"."""
    bundle, count = bundles[0], len(bundles)
    for kind in ("GPU", "CPU"):
        asked = bundle.get(kind, 0) * count
        if not asked:
            continue
        have = [(str(n.get("name")), float(n.get(kind) or 0)) for n in nodes]
        total = sum(v for _, v in have)
        each = ", ".join(f"{v:g} on {name}" for name, v in have if v) or "none on any node"
        if asked > total:
            return f"{asked:g} {kind}s asked, the cluster has {total:g}: {each}"
        fit = [name for name, v in have if v >= bundle[kind]]
        if len(fit) < count:
            return (f"{count} nodes with {bundle[kind]:g} {kind}s each asked ({per_node} ranks a node), "
                    f"{len(fit)} such in the cluster: {each}")
    return ""


class Driver:
    """The placement group, the actors on its bundles, and the relay between them and the kernel."""

    def __init__(self, ray: Any, args: argparse.Namespace) -> None:
        self.ray, self.args = ray, args
        self.pg: Any = None
        self.actors: List[Any] = []
        self.names: List[str] = []
        self.ending = threading.Event()
        self.keeping = DriverKeep(self.end)  # a kept pool: this driver outlives the kernel under the lease (procs/ray_keep.py)

    def bundles(self) -> List[Dict[str, float]]:
        bundle = {"CPU": self.args.cpus * self.args.per_node}
        if self.args.gpus:
            bundle["GPU"] = self.args.gpus * self.args.per_node
        return [dict(bundle) for _ in range(self.args.nodes)]

    def place(self) -> bool:
        """The placement group, waited for (a ``waiting`` event each second); False when --start-timeout passed."""
        from ray.util.placement_group import placement_group

        strategy = "STRICT_SPREAD" if self.args.nodes > 1 else "PACK"
        self.pg = placement_group(self.bundles(), strategy=strategy, name=f"ddp_magic-{os.getpid()}")
        t0 = time.monotonic()
        while not self.ray.wait([self.pg.ready()], timeout=1.0)[0]:
            waited = time.monotonic() - t0
            if self.args.timeout and waited > self.args.timeout:
                return False
            emit({"event": "waiting", "text": f"waiting for Ray: {free_text(self.ray, self.bundles())}", "waited": waited})
        return True

    def start_actors(self) -> List[Dict[str, Any]]:
        """One actor a bundle, each starting its node's template; the nodes in bundle order."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from .ray_actor import NodeActor

        remote = self.ray.remote(concurrency_groups={"read": 1})(NodeActor)
        for i, bundle in enumerate(self.bundles()):
            strategy = PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=i)
            self.actors.append(remote.options(scheduling_strategy=strategy, num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0),
                                              max_restarts=0).remote())
        wheres = self.ray.get([a.where.remote() for a in self.actors])
        addrs = {n.get("NodeID"): n.get("NodeManagerAddress") for n in self.ray.nodes()}
        for w in wheres:  # the node's address as Ray knows it (--node-ip-address), not whatever the host routes by
            w["ip"] = addrs.get(w["node_id"]) or w["ip"]
        self.names = unique([str(w["host"]) for w in wheres])
        cwd, pythonpath = os.getcwd(), os.environ.get("PYTHONPATH", "")
        pids = self.ray.get([a.start.remote(n, cwd, pythonpath) for a, n in zip(self.actors, self.names)])
        return [dict(w, name=n, template_pid=p) for w, n, p in zip(wheres, self.names, pids)]

    def relay_out(self, actor: Any, node: str) -> None:
        """The template's lines to our stdout; its end or its actor's (a node lost) said as ``lost``."""
        while not self.ending.is_set():
            try:
                lines = self.ray.get(actor.read.options(concurrency_group="read").remote(READ_S))
            except Exception as e:  # the actor died: its node (raylet) went, or it was killed
                log.debug("the actor of %s is gone", node, exc_info=True)
                if not self.ending.is_set():
                    emit({"event": "lost", "node": node, "why": f"its Ray actor died ({type(e).__name__}: {str(e).splitlines()[0][:200]})"})
                return
            if lines is None:
                if not self.ending.is_set():
                    emit({"event": "lost", "node": node, "why": f"its template ended (code {self.ray.get(actor.code.remote())})"})
                return
            with _out:
                sys.stdout.write("".join(lines))
                sys.stdout.flush()

    def relay_in(self) -> None:
        """Every line of our stdin to every template, until it closes (the kernel is gone, or ends the pool)."""
        for line in iter(sys.stdin.readline, ""):
            if self.keeping.take(line):
                continue
            for actor in self.actors:
                actor.write.remote(line)

    def relay_then_end(self) -> None:
        self.relay_in()
        if not self.keeping.kernel_left(self.actors):  # kept: the lease ends us
            self.end()

    def end(self, *_: object) -> None:
        """Remove the placement group and kill the actors (their templates follow), then exit."""
        self.ending.set()
        for actor in self.actors:
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


def unique(hosts: List[str]) -> List[str]:
    """Each node's name: its hostname, with -2, -3 on a second and third bundle on the same host."""
    out: List[str] = []
    for h in hosts:
        name, i = h, 1
        while name in out:
            i += 1
            name = f"{h}-{i}"
        out.append(name)
    return out


def connect(args: argparse.Namespace) -> Optional[Any]:
    """``ray`` connected to the cluster, or None once the refusal was said."""
    try:
        import ray
    except ImportError as e:
        emit({"event": "refused", "why": f"Ray is not installed for {sys.executable} ({e}): pip install 'ddp-magic[ray]'"})
        return None
    try:
        ray.init(address=args.address, log_to_driver=False, logging_level=logging.WARNING, namespace="ddp_magic",
                 include_dashboard=False, configure_logging=False)
    except BaseException as e:  # Ray's words, in one line with the fix
        log.debug("ray.init failed", exc_info=True)
        emit({"event": "refused", "why": said(e)})
        return None
    return ray


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ddp_magic.procs.ray_driver")
    parser.add_argument("--address", default="auto")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--per-node", type=int, default=1)
    parser.add_argument("--gpus", type=float, default=0.0)
    parser.add_argument("--cpus", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=0.0)
    parser.add_argument("--plan-only", action="store_true", help="the cluster's nodes and versions, nothing placed (%%ddp_env)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the kernel's: it ends us by closing our stdin
    ray = connect(args)
    if ray is None:
        return
    driver = Driver(ray, args)
    nodes = cluster_nodes(ray)
    why = never_fits(driver.bundles(), args.per_node, nodes)
    info = {"ray": ray.__version__, "python": sys.version.split()[0], "cluster": nodes, "free": free_text(ray, driver.bundles())}
    if why or args.plan_only:
        emit(dict({"event": "refused", "why": why} if why else {"event": "plan"}, **info))
        return
    signal.signal(signal.SIGTERM, driver.end)
    threading.Thread(target=driver.relay_then_end, name="ddp-ray-in", daemon=True).start()
    if not driver.place():
        emit({"event": "refused", "why": f"the placement group was still pending after --start-timeout {args.timeout:g}s "
                                          f"({free_text(ray, driver.bundles())}); it was removed"})
        driver.end()
    placed = driver.start_actors()
    emit({"event": "placed", "nodes": placed, "pg": driver.pg.id.hex(), **info})
    readers = [threading.Thread(target=driver.relay_out, args=(a, n), daemon=True) for a, n in zip(driver.actors, driver.names)]
    for t in readers:
        t.start()
    driver.ending.wait()


if __name__ == "__main__":
    main(sys.argv[1:])
