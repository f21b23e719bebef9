"""Real Ray clusters for the tests: one in the cluster in a box (a head on login, nodes n1 and n2) and a one-host head, each stopped by its own pids.

``ray stop`` kills every Ray process on the machine, in every namespace (it matches process names), so it is never
used: a cluster's processes are those whose command line names its own temp folder, with their descendants (the
workers, the actors' children), ended with SIGTERM, then SIGKILL. Every cluster has token authentication on
(``RAY_AUTH_MODE=token``, a token of its own: ``Cluster.env``), as a cluster started by Ray >= 2.59 does by default
once a token exists; a kernel gets the same env. Fake GPUs (``--num-gpus 2`` on a CPU host) are plain resources:
placement and CUDA_VISIBLE_DEVICES are tested on CPUs with gloo.

    python scripts/box_ray.py local        # a one-host head; prints its address, Ctrl-C stops it

Facts this relies on (tried here): ../shared/TOOLCHAIN.md, "Ray and SSH on the cluster in a box".
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

if TYPE_CHECKING:
    from cluster_box import Box

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout: what the nodes' Ray workers import
START_S = 240.0  # a loaded machine starts a raylet slowly (its agents register late)
# No dashboard, no usage stats, no log monitor (it tails the workers' logs for drivers that print them: ddp_magic's
# and ours start with log_to_driver=False, the ranks' output goes through ddp_magic's channel): CPU the suite needs.
QUIET = ["--include-dashboard=false", "--disable-usage-stats", "--include-log-monitor=false"]
STATE = """
import json, logging, sys, ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level=logging.ERROR)
from ray._private import state
actors = [a for a in state.actors().values() if a.get("State") != "DEAD"]
pgs = [p for p in ray.util.placement_group_table().values() if p.get("state") != "REMOVED"]
nodes = {n["NodeManagerHostname"]: n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}
print(json.dumps({"actors": [a.get("ActorClassName") for a in actors], "pgs": [p.get("name") for p in pgs], "nodes": nodes}))
"""


def missing() -> Optional[str]:
    """Why no Ray cluster can be started here (None: it can)."""
    try:
        import ray  # noqa: F401
    except ImportError as e:
        return f"ray is not installed for {sys.executable} ({e}): .venv/bin/pip install -c .venv/constraints.txt ray==2.60.0"
    if not os.path.exists(RAY):
        return f"no {RAY}"
    return None


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int, avoid: Sequence[int] = ()) -> List[int]:
    """``count`` distinct free ports, none of ``avoid``: every socket stays bound until all are chosen (one bound and
    closed at a time, the kernel may hand the same port out twice, and ray start refuses two components on one port)."""
    held: List[socket.socket] = []
    try:
        while len(held) < count:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            if s.getsockname()[1] in avoid:
                s.close()
                continue
            held.append(s)
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


# The GCS's health check of each raylet every second, not every 3 s: a killed raylet is counted out after 5 failed
# checks, about 5 s, not Ray's default 15 s (docs/ray.md says the default). The tests' wait for it, not ddp_magic's.
HEALTH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "5"}


@dataclass
class Cluster:
    """One Ray cluster of ours: its GCS address, its folder (every temp dir under it), its token."""

    address: str
    folder: str
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    enter: List[str] = field(default_factory=list)  # how a process reaches it (a box's login: its nsenter), [] on this host

    @property
    def env(self) -> Dict[str, str]:
        """What a kernel (and every ray command) needs to reach this cluster."""
        return {"RAY_ADDRESS": self.address, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token,
                "RAY_agent_register_timeout_ms": str(int(START_S * 1000))}

    def start(self, prefix: Sequence[str], args: Sequence[str], name: str, tries: int = 3) -> None:
        """``ray start`` through ``prefix`` (a box host's nsenter, or nothing) with a temp dir and agent ports of its own.
        A loaded machine may start a raylet past ray's fixed 30 s ("timed out during startup"), and another process may
        take an agent's port before ray binds it: that node's processes end and it starts again with new agent ports, up
        to ``tries`` times."""
        temp = os.path.join(self.folder, name)
        quiet = QUIET if "--head" in args else QUIET[1:]  # --include-dashboard is the head's alone
        gcs = [int(args[i + 1]) for i, a in enumerate(args[:-1]) if a == "--port"]
        for attempt in range(tries):
            argv = [*prefix, RAY, "start", *args, *self.ports(gcs), f"--temp-dir={temp}", *quiet]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=START_S + 30, env=self.node_env())
            if not done.returncode:
                return
            said = (done.stderr + done.stdout).strip()
            self.stop(temp)
            again = "timed out during startup" in said or "used by other components" in said  # a port taken meanwhile: others
            if not again or attempt == tries - 1:
                self.stop()
                raise RuntimeError(f"ray start on {name} failed: {said[-1500:]}")

    def node_env(self) -> Dict[str, str]:
        """A node's env: the cluster's, and this checkout first on its workers' path (a node actor is this checkout's
        procs/ray_actor.py, as its template is: the kernel's PYTHONPATH reaches the template, not Ray's workers)."""
        path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
        return dict(os.environ, **self.env, **HEALTH, PYTHONPATH=path)

    def ports(self, avoid: Sequence[int] = ()) -> List[str]:
        """The agents' ports, given (a raylet waits for an agent's port file otherwise, and gives up on a loaded machine):
        four distinct ones, none the GCS's (``avoid``)."""
        listen, grpc, metrics, runtime_env = free_ports(4, avoid)
        return ["--dashboard-agent-listen-port", str(listen), "--dashboard-agent-grpc-port", str(grpc),
                "--metrics-export-port", str(metrics), "--runtime-env-agent-port", str(runtime_env)]

    def pids(self, marker: str = "") -> List[int]:
        """Every process of this cluster (``marker``: of one node's temp dir): its command line names our folder, or it
        descends from one that does."""
        marker = marker or self.folder
        parents: Dict[int, int] = {}
        ours = set()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read()
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if marker.encode() in cmd:
                ours.add(int(entry))
        grew = True
        while grew:
            more = {p for p, pp in parents.items() if pp in ours and p not in ours}
            grew = bool(more)
            ours |= more
        return sorted(ours - {os.getpid()})

    def state(self, timeout: float = 120) -> Dict[str, list]:
        """The live actors, placement groups and nodes, from the GCS (no dashboard): {"actors", "pgs", "nodes": {host: address}}."""
        done = subprocess.run([*self.enter, sys.executable, "-c", STATE, self.address], capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, **self.env))
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            raise RuntimeError(f"the cluster's state could not be read: {(done.stderr or done.stdout)[-800:]}")
        return json.loads(lines[-1])

    def stop(self, marker: str = "") -> None:
        """SIGTERM to every process of ours (``marker``: of one node's), then SIGKILL to what is left; the folder goes."""
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            pids = self.pids(marker)
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    continue
            deadline = time.monotonic() + wait
            while self.pids(marker) and time.monotonic() < deadline:
                time.sleep(0.1)
        shutil.rmtree(marker or self.folder, ignore_errors=True)


def local(num_cpus: int = 4, num_gpus: int = 2) -> Cluster:
    """A one-host head on 127.0.0.1 with ``num_gpus`` fake GPUs; every port its own (two tests' heads never collide)."""
    folder = tempfile.mkdtemp(prefix="ddpray")  # short: Ray's unix socket paths must fit 107 bytes
    port = free_port()
    cluster = Cluster(f"127.0.0.1:{port}", folder)
    cluster.start([], ["--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", str(num_cpus), "--num-gpus", str(num_gpus)], "head")
    return cluster


def in_box(box: "Box", nodes: Sequence[str] = ("n1", "n2"), num_cpus: int = 2, num_gpus: int = 2) -> Cluster:
    """A head on login (no CPU: no rank lands there) and ``nodes`` joined to it, each in its host."""
    head = box.host("login").mgmt
    cluster = Cluster(f"{head}:6379", tempfile.mkdtemp(prefix="ddprb"), enter=box.enter("login"))
    cluster.start(box.enter("login"), ["--head", "--node-ip-address", head, "--port", "6379", "--num-cpus", "0", "--num-gpus", "0"], "login")
    for node in nodes:
        join(box, cluster, node, num_cpus, num_gpus)
    return cluster


def join(box: "Box", cluster: Cluster, node: str, num_cpus: int = 2, num_gpus: int = 2) -> None:
    """``node`` joins the box's cluster (again, after its raylet was killed: a temp dir of its own each time)."""
    name = node if not os.path.exists(os.path.join(cluster.folder, node)) else f"{node}-{time.monotonic_ns()}"
    cluster.start(box.enter(node), ["--address", cluster.address, "--node-ip-address", box.host(node).mgmt,
                                    "--num-cpus", str(num_cpus), "--num-gpus", str(num_gpus)], name)


if __name__ == "__main__":
    if sys.argv[1:] == ["local"]:
        c = local()
        print(json.dumps({"address": c.address, **c.env}), flush=True)
        try:
            signal.pause()
        finally:
            c.stop()
