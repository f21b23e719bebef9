"""What the user asked for: a pool's options, validated once into a frozen value.

The magics, the session, the JupyterLab comm, the tests and the benchmarks all
build a ``PoolSpec`` here, from keyword options; nothing else validates options.
``make_plan(spec)`` (plan/plan.py) turns it into the concrete per-rank env,
and ``spec.changes_from(old)`` says what a new request changes (a restart).
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..errors import PlanError
from .slurm import SlurmRequest, resolve
from .ray import RayRequest, resolve as resolve_ray
from .ssh import SshRequest, resolve as resolve_ssh
from ..words import plural

BACKENDS = ("auto", "nccl", "gloo", "mpi")
START_METHODS = ("auto", "fork", "spawn", "torchrun")
SLURM_KEEPS = ("partition", "time", "gpus_per_node", "account", "extra", "queue_timeout")  # what a resized Slurm pool keeps
MESH_ENV = "DDP_MAGIC_MESH"
MESH_SYNTAX = "give --mesh NAME=SIZE,NAME=SIZE (e.g. --mesh dp=2,tp=2), or --mesh none"


def parse_mesh(text: str) -> Tuple[Tuple[str, int], ...]:
    """'dp=2,tp=2' -> (('dp', 2), ('tp', 2)); 'none' or '' -> (); bad syntax is a one-line PlanError."""
    text = text.strip()
    if text.lower() in ("", "none"):
        return ()
    out = []
    for part in text.split(","):
        name, eq, size = (x.strip() for x in part.partition("="))
        if not eq or not name.isidentifier() or not size.isdigit() or int(size) < 1:
            raise PlanError(f"--mesh {text!r}: {part.strip()!r} is not NAME=SIZE with a size of 1 or more; {MESH_SYNTAX}")
        out.append((name, int(size)))
    return tuple(out)


def mesh_text(mesh: Tuple[Tuple[str, int], ...]) -> str:
    return ",".join(f"{n}={s}" for n, s in mesh)


def check_mesh(mesh: Tuple[Tuple[str, int], ...], nproc: int, init: bool) -> None:
    """The mesh's sizes multiply to the world size, its names differ, and the ranks have a process group."""
    if not mesh:
        return
    names = [n for n, _ in mesh]
    if len(set(names)) != len(names):
        raise PlanError(f"--mesh {mesh_text(mesh)}: a dim name appears twice; give each dim its own name")
    product = 1
    for _, size in mesh:
        product *= size
    if product != nproc:
        raise PlanError(f"--mesh {mesh_text(mesh)} makes {product} ranks but -n is {nproc}: give sizes that multiply to {nproc}, or --mesh none")
    if not init:
        raise PlanError(f"--mesh {mesh_text(mesh)} needs the pool's process group; leave out --no-init")


def positive_int(text: str) -> int:
    """-n's text as a number of ranks (the magics' argument type)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} ranks makes no pool; give 1 or more")
    return value


def port(text: str) -> int:
    """--master-port's text as a number (the magics' argument type; PoolSpec checks the range)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None


@dataclass(frozen=True)
class PoolSpec:
    """A pool's options as the user gave them (``backend="auto"`` stays "auto" here)."""

    nproc: int  # ranks in all (world size), over every node
    backend: str = "auto"
    master_addr: str = "127.0.0.1"
    master_port: Optional[int] = None  # None: a free port, chosen per start
    init: bool = True  # call init_process_group on the ranks before the first cell
    start_method: str = "auto"
    nnodes: int = 1
    start_timeout: float = 180.0  # seconds for every rank (and node) to join
    pg_timeout: float = 300.0  # seconds before a collective with a missing peer fails
    grace: float = 1.0  # seconds a rank gets to finish or honour an interrupt
    listen_addr: Optional[str] = None  # the control channel; None: loopback, or master_addr across nodes
    extra_env: Tuple[Tuple[str, str], ...] = field(default=())  # sorted (name, value) pairs for every rank
    mesh: Tuple[Tuple[str, int], ...] = ()  # --mesh dp=2,tp=2: a DeviceMesh named `mesh` on every rank (a str is parsed)
    slurm: Optional[SlurmRequest] = None  # --slurm: the ranks are tasks of a Slurm job step (plan/slurm.py)
    ssh: Optional[SshRequest] = None  # --hosts / --hostfile: a template a host over SSH forks its ranks (plan/ssh.py)
    ray: Optional[RayRequest] = None  # --ray: a template a Ray node (an actor's child, on its bundle) forks its ranks (plan/ray.py)

    def __post_init__(self) -> None:
        n = self.nproc
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise PlanError(f"-n must be a whole number of ranks, 1 or more (got {n!r})")
        if not isinstance(self.nnodes, int) or isinstance(self.nnodes, bool) or self.nnodes < 1:
            raise PlanError(f"--nnodes must be 1 or more (got {self.nnodes!r})")
        if n % self.nnodes and self.ssh is None:  # an SSH pool's hosts may differ in size (their slots say)
            raise PlanError(f"-n {n} ranks do not split evenly over {self.nnodes} nodes; give a multiple of {self.nnodes}")
        if self.backend not in BACKENDS:
            raise PlanError(f"unknown backend {self.backend!r}; use one of {', '.join(BACKENDS)}")
        if self.start_method not in START_METHODS:
            raise PlanError(f"unknown start method {self.start_method!r}; use auto, fork, spawn or torchrun")
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise PlanError(f"--master-port {self.master_port} is not a TCP port; give 1024-65535 or leave it out to get a free one")
        object.__setattr__(self, "mesh", parse_mesh(self.mesh) if isinstance(self.mesh, str) else tuple(self.mesh))
        check_mesh(self.mesh, n, self.init)
        if self.ray is not None and (self.slurm is not None or self.ssh is not None):
            raise PlanError("--ray with --slurm or --hosts: give one")
        if self.ray is not None and (self.nnodes != self.ray.nodes or n != self.ray.world_size):
            raise PlanError(f"-n {n} over {plural(self.nnodes, 'node')} is not the Ray request's {self.ray.shape_text()}")
        if self.ssh is not None and (self.slurm is not None or self.nnodes != len(self.ssh.hosts) or n != self.ssh.world_size):
            raise PlanError("--hosts (or --hostfile) and --slurm both given; give one" if self.slurm is not None
                            else f"-n {n} over {plural(self.nnodes, 'node')} is not {self.ssh.shape_text()}")
        if self.slurm is not None and (self.nnodes != self.slurm.nodes or n != self.slurm.world_size):
            asked = f"{plural(self.slurm.nodes, 'node')} × {self.slurm.ntasks_per_node}"
            raise PlanError(f"-n {n} over {plural(self.nnodes, 'node')} is not the Slurm request's {asked}")
        for name in ("start_timeout", "pg_timeout", "grace"):
            if getattr(self, name) <= 0:
                raise PlanError(f"{name.replace('_', '-')} must be more than 0 seconds (got {getattr(self, name)!r})")

    @classmethod
    def from_options(cls, nproc: Optional[int], extra_env: Optional[Mapping[str, str]] = None, environ: Mapping[str, str] = os.environ,
                     **options: Any) -> "PoolSpec":
        """Build from keyword options; ``None`` means "the default", unknown names are a PlanError.

        ``slurm`` may be the magic's Slurm options as a dict (nodes, ntasks_per_node, partition, ...): they are
        resolved against ``environ`` (an allocation the kernel runs inside) into a SlurmRequest."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise PlanError(f"unknown pool {'option' if len(unknown) == 1 else 'options'}: {', '.join(unknown)}")
        given = {k: v for k, v in options.items() if v is not None}
        if isinstance(given.get("slurm"), Mapping):
            nproc, given["slurm"] = _slurm(nproc, dict(given["slurm"]), environ)
            given["nnodes"] = given["slurm"].nodes
        if isinstance(given.get("ssh"), Mapping):
            nproc, given["ssh"] = resolve_ssh(nproc, given["ssh"], environ)
            given["nnodes"] = len(given["ssh"].hosts)
        if isinstance(given.get("ray"), Mapping):
            nproc, given["ray"] = resolve_ray(nproc, given["ray"], environ)
            given["nnodes"] = given["ray"].nodes
        if nproc is None:
            raise PlanError("give the number of ranks, e.g. -n 2")
        return cls(nproc=nproc, extra_env=tuple(sorted((extra_env or {}).items())), **given)

    def with_options(self, nproc: Optional[int] = None, extra_env: Optional[Mapping[str, str]] = None, environ: Mapping[str, str] = os.environ,
                     **options: Any) -> "PoolSpec":
        """This spec with the given options changed (``None``: keep); validated like a new one.

        Slurm options given are the whole new request; on a Slurm pool a new ``-n`` alone keeps the request's options
        (and its nodes where -n divides over them)."""
        given = {k: v for k, v in options.items() if v is not None}
        slurm = given.get("slurm")
        if isinstance(slurm, Mapping) or (self.slurm is not None and nproc is not None and nproc != self.nproc):
            asked = dict(slurm) if isinstance(slurm, Mapping) else {}
            if self.slurm is not None and not isinstance(slurm, Mapping):
                asked = {k: getattr(self.slurm, k) for k in SLURM_KEEPS}
                if nproc is not None and nproc % self.slurm.nodes == 0:
                    asked["nodes"] = self.slurm.nodes
            if nproc is None and "nodes" not in asked and "ntasks_per_node" not in asked:
                nproc = self.nproc  # --slurm on a running pool: as many ranks
            nproc, given["slurm"] = _slurm(nproc, asked, environ)
            given["nnodes"] = given["slurm"].nodes
        nproc = self._ssh_options(nproc, given, environ)
        nproc = self._ray_options(nproc, given, environ)
        if nproc is not None:
            given["nproc"] = nproc
        if extra_env is not None:
            given["extra_env"] = tuple(sorted(extra_env.items()))
        return replace(self, **given)

    def _ssh_options(self, nproc: Optional[int], given: Dict[str, Any], environ: Mapping[str, str]) -> Optional[int]:
        """SSH options given are the whole new request (``given`` changed in place); on an SSH pool a new -n alone keeps
        its hosts, -n divided over them; --slurm drops the hosts. The world size, when it changed."""
        ssh = given.get("ssh")
        if isinstance(ssh, Mapping):
            nproc, given["ssh"] = resolve_ssh(nproc, ssh, environ)
            given["nnodes"] = len(given["ssh"].hosts)
            given.setdefault("slurm", None)
        elif self.ssh is not None and "slurm" in given:
            given["ssh"] = None
        elif self.ssh is not None and nproc is not None and nproc != self.nproc:
            asked = {"hosts": ",".join(self.ssh.names), "remote_python": self.ssh.remote_python}
            nproc, given["ssh"] = resolve_ssh(nproc, asked, environ)
        return nproc

    def _ray_options(self, nproc: Optional[int], given: Dict[str, Any], environ: Mapping[str, str]) -> Optional[int]:
        """Ray options given are the whole new request; on a Ray pool a new -n alone keeps its address and each rank's
        resources, -n over its nodes (packed again where -n alone made it); --slurm or --hosts drop Ray. The world size, when it changed."""
        ray = given.get("ray")
        if isinstance(ray, Mapping):
            nproc, given["ray"] = resolve_ray(nproc, ray, environ)
            given["nnodes"] = given["ray"].nodes
            given.setdefault("slurm", None)
            given.setdefault("ssh", None)
        elif self.ray is not None and ("slurm" in given or "ssh" in given):
            given["ray"] = None
        elif self.ray is not None and nproc is not None and nproc != self.nproc:
            r = self.ray
            asked = {"address": r.address, "gpus_per_rank": r.gpus_per_rank, "cpus_per_rank": r.cpus_per_rank, "queue_timeout": r.queue_timeout,
                     **({"nodes": r.nodes} if nproc % r.nodes == 0 and not r.packed else {})}
            nproc, given["ray"] = resolve_ray(nproc, asked, environ)
            given["nnodes"] = given["ray"].nodes
        return nproc

    @property
    def over_hosts(self) -> bool:
        """Its ranks start on nodes that a launcher places them on (Slurm, SSH, Ray), not on this machine alone."""
        return self.slurm is not None or self.ssh is not None or self.ray is not None

    @property
    def nproc_per_node(self) -> int:
        """Ranks a node (an SSH pool's hosts of different sizes: the most any has)."""
        return self.ssh.ntasks_per_node if self.ssh is not None else self.nproc // self.nnodes

    @property
    def env(self) -> Dict[str, str]:
        env = dict(self.extra_env)
        if self.mesh:
            env[MESH_ENV] = mesh_text(self.mesh)  # read by procs/mesh.py on every rank
        return env

    @property
    def launcher_method(self) -> str:
        """The start method a launcher is made for: Slurm's for --slurm; a pool over nodes otherwise runs under torchrun."""
        if self.slurm is not None:
            return "slurm"
        if self.ssh is not None:
            return "ssh"
        if self.ray is not None:
            return "ray"
        return "torchrun" if self.nnodes > 1 else self.start_method

    @property
    def control_addr(self) -> str:
        """Where the kernel's control channel listens: loopback unless ranks on other nodes must reach it."""
        return self.listen_addr or ("127.0.0.1" if self.nnodes == 1 and self.ssh is None and self.ray is None else self.master_addr)

    def changes_from(self, old: "PoolSpec") -> List[str]:
        """What this spec changes, as the user would say it ("-n 2 → 4"); empty: the same pool."""
        out = []
        for f in fields(self):
            a, b = getattr(old, f.name), getattr(self, f.name)
            if a == b or (f.name == "backend" and b == "auto"):
                continue
            label = "-n" if f.name == "nproc" else f.name.replace("_", "-")
            if f.name == "extra_env":
                a, b = dict(a), dict(b)
            if f.name == "mesh":
                a, b = mesh_text(a) or "none", mesh_text(b) or "none"
            if f.name in ("slurm", "ssh", "ray"):
                a, b = (x.shape_text() if x is not None else "none" for x in (a, b))
            out.append(f"{label} {a} → {b}")
        return out


def _slurm(nproc: Optional[int], options: Dict[str, Any], environ: Mapping[str, str]) -> Tuple[int, SlurmRequest]:
    """The magic's Slurm options (nodes, ntasks_per_node, partition, ...) as a request, resolved against the kernel's env."""
    nodes, per_node = options.pop("nodes", None), options.pop("ntasks_per_node", None)
    return resolve(nproc, nodes, per_node, environ, **{k: v for k, v in options.items() if v is not None})
