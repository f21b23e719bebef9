"""The per-rank environment plan, port choice, backend choice and env checks.

Pure functions over plain data: no torch import, no process started, nothing
written to the kernel's own ``os.environ``. The pool, the magics, the widget and
the tests all read the same plan and the same checks from here.
"""
from __future__ import annotations

import errno
import os
import socket
import sys
import uuid
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

DIST_VARS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
)
TORCHRUN_EXTRA_VARS = (
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
)
# Variables from the kernel's env that would contradict the plan if a worker
# inherited them; the plan always overrides them, and a check reports them.
STALE_VARS = DIST_VARS + TORCHRUN_EXTRA_VARS + ("CUDA_VISIBLE_DEVICES",)
BACKENDS = ("auto", "nccl", "gloo", "mpi")


class PlanError(ValueError):
    """A request that cannot become a valid pool; the message says what to do."""


@dataclass
class GPUInfo:
    """What the kernel can know about GPUs without initialising CUDA."""

    count: int
    cuda_built: bool
    visible: Optional[str] = None  # CUDA_VISIBLE_DEVICES as set in the kernel
    source: str = ""
    physical: Optional[int] = None  # GPUs the driver lists, before CUDA_VISIBLE_DEVICES


@dataclass
class Plan:
    """Everything that decides how a pool's ranks are started."""

    nproc: int
    backend: str  # resolved: nccl, gloo or mpi
    backend_reason: str
    master_addr: str
    master_port: int
    port_was_given: bool
    nnodes: int = 1
    node_rank: int = 0
    init: bool = True
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    omp_threads: Optional[int] = None  # None: inherited from the kernel's env
    pg_timeout: float = 300.0  # seconds before a collective with a missing peer fails
    extra_env: Dict[str, str] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes

    def rank_env(self, local_rank: int) -> Dict[str, str]:
        """The variables torch.distributed and torchrun users expect, for one rank."""
        rank = self.node_rank * self.nproc + local_rank
        env = {
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "WORLD_SIZE": str(self.world_size),
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(self.nproc),
            "NODE_RANK": str(self.node_rank),
            "GROUP_RANK": str(self.node_rank),
            "GROUP_WORLD_SIZE": str(self.nnodes),
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "ROLE_NAME": "default",
            "TORCHELASTIC_RUN_ID": self.run_id,
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0",
            "DDP_MAGIC_BACKEND": self.backend,
            "DDP_MAGIC_INIT": "1" if self.init else "0",
            "DDP_MAGIC_PG_TIMEOUT": str(self.pg_timeout),
        }
        if self.omp_threads is not None:
            env["OMP_NUM_THREADS"] = str(self.omp_threads)
        env.update(self.extra_env)
        return env

    def all_envs(self) -> List[Dict[str, str]]:
        return [self.rank_env(i) for i in range(self.nproc)]


def detect_gpus(environ: Mapping[str, str] = os.environ, proc_root: str = "/proc/driver/nvidia/gpus") -> GPUInfo:
    """Count NVIDIA GPUs visible to workers without creating a CUDA context.

    The kernel may or may not have touched CUDA; either way we must not be the
    ones who initialise it here. The driver's /proc listing and
    CUDA_VISIBLE_DEVICES tell the count; torch is only asked whether it was built
    with CUDA (which does not initialise anything).
    """
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    try:
        physical = len(os.listdir(proc_root))
        source = proc_root
    except OSError:
        physical = 0
        source = "no NVIDIA driver found"
    count = physical
    if visible is not None:
        ids = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
        count = min(len(ids), physical) if physical else 0
        source += f", CUDA_VISIBLE_DEVICES={visible!r}"
    cuda_built = _torch_built_with_cuda()
    if not cuda_built:
        count = 0
        source += ", torch built without CUDA"
    return GPUInfo(count=count, cuda_built=cuda_built, visible=visible, source=source, physical=physical)


def _torch_dir() -> Optional[str]:
    """Where torch is installed, found without importing it."""
    mod = sys.modules.get("torch")
    if mod is not None and getattr(mod, "__file__", None):
        return os.path.dirname(mod.__file__)  # type: ignore[arg-type]
    try:
        import importlib.util

        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _torch_built_with_cuda(torch_dir: Optional[str] = None) -> bool:
    """torch.version.cuda without importing torch in the kernel when it is not already."""
    mod = sys.modules.get("torch.version")
    if mod is not None and torch_dir is None:
        return getattr(mod, "cuda", None) is not None
    torch_dir = torch_dir or _torch_dir()
    if torch_dir is None:
        return False
    path = os.path.join(torch_dir, "version.py")
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("cuda"):
            return "None" not in line.split("=", 1)[1]
    return False


def choose_backend(requested: str, nproc: int, gpus: GPUInfo) -> "tuple[str, str]":
    """Resolve 'auto' and check an explicit choice. Returns (backend, reason)."""
    if requested not in BACKENDS:
        raise PlanError(f"unknown backend {requested!r}; use one of {', '.join(BACKENDS)}")
    if requested == "auto":
        if gpus.count >= nproc and gpus.count > 0:
            return "nccl", f"{gpus.count} GPU(s) visible, one per rank"
        if gpus.count > 0:
            return "gloo", f"{nproc} ranks but only {gpus.count} GPU(s): NCCL needs one GPU per rank, using gloo"
        return "gloo", "no GPU visible: gloo on CPU"
    if requested == "nccl":
        if gpus.count == 0:
            raise PlanError("--backend nccl needs NVIDIA GPUs and none is visible; use --backend gloo (CPU)")
        if nproc > gpus.count:
            raise PlanError(
                f"-n {nproc} with nccl needs {nproc} GPUs but {gpus.count} are visible "
                f"(NCCL allows one rank per GPU); use -n {gpus.count} or --backend gloo"
            )
        return "nccl", f"requested; {gpus.count} GPU(s) visible"
    return requested, "requested"


def port_is_free(addr: str, port: int) -> bool:
    """True when a listening socket could bind addr:port right now."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((addr, port))
        except OSError:
            return False
    return True


def free_port(addr: str = "127.0.0.1") -> int:
    """A port the OS says is free on addr (bind to 0 and read it back)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def port_holder(port: int) -> Optional[str]:
    """Who listens on a TCP port, from /proc (Linux); None when it cannot tell."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    local, state, inode = parts[1], parts[3], parts[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        inodes.add(inode)
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    if not inodes:
        return None
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = " ".join(f.read().replace(b"\0", b" ").decode(errors="replace").split())
                    return f"pid {pid} ({cmd if len(cmd) <= 80 else cmd[:79] + '…'})"
        except OSError:
            continue
    return "another user's process"


def check_master_addr(addr: str) -> None:
    try:
        socket.getaddrinfo(addr, None)
    except socket.gaierror as e:
        raise PlanError(f"--master-addr {addr!r} does not resolve ({e.strerror}); use 127.0.0.1 on one machine") from None


def check_master_port(addr: str, port: int) -> None:
    if not 0 < port < 65536:
        raise PlanError(f"--master-port {port} is not a TCP port; give 1024-65535 or leave it out to get a free one")
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((addr, port))
        except OSError as e:
            if e.errno == errno.EACCES:
                raise PlanError(
                    f"--master-port {port} is privileged (below 1024) and this user may not bind it; "
                    "give a port of 1024 or more, or leave it out to get a free one"
                ) from None
            if e.errno == errno.EADDRINUSE:
                who = port_holder(port)
                held = f" by {who}" if who else ""
                raise PlanError(
                    f"--master-port {port} is already in use{held}; leave --master-port out to get a free port, or pick another"
                ) from None
            raise PlanError(f"--master-port {port} cannot be bound on {addr}: {e.strerror}") from None


def default_omp_threads(nproc: int, environ: Mapping[str, str], cpus: Optional[int] = None) -> Optional[int]:
    """torchrun sets OMP_NUM_THREADS=1 when unset and nproc > 1; we share the cores instead.

    One thread per rank starves a rank on a big machine; all cores per rank
    oversubscribes. cores // nproc (at least 1) is what a user would pick by hand.
    """
    if "OMP_NUM_THREADS" in environ:
        return None
    cpus = cpus if cpus is not None else len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpus // max(1, nproc))


def make_plan(
    nproc: int,
    backend: str = "auto",
    master_addr: str = "127.0.0.1",
    master_port: Optional[int] = None,
    init: bool = True,
    environ: Mapping[str, str] = os.environ,
    gpus: Optional[GPUInfo] = None,
    extra_env: Optional[Dict[str, str]] = None,
    strict: bool = True,
) -> Plan:
    """Validate a request and turn it into a Plan; raises PlanError with the fix.

    ``strict=False`` (what ``%ddp_env`` uses) still builds a plan from a request
    that would not start (nccl without GPUs, a taken port, an address that does
    not resolve), so that ``plan_checks`` can show each problem as a failed check
    instead of stopping at the first one.
    """
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise PlanError(f"-n must be a whole number of ranks, 1 or more (got {nproc!r})")
    gpus = gpus if gpus is not None else detect_gpus(environ)
    try:
        backend, reason = choose_backend(backend, nproc, gpus)
    except PlanError as e:
        if strict or backend not in BACKENDS:
            raise
        reason = str(e)
    if strict:
        check_master_addr(master_addr)
    if master_port is None:
        try:
            port, given = free_port(master_addr), False
        except OSError:
            if strict:
                raise PlanError(f"--master-addr {master_addr!r} is not an address of this machine (cannot bind a port on it)") from None
            port, given = free_port("127.0.0.1"), False
    else:
        if strict:
            check_master_port(master_addr, master_port)
        port, given = master_port, True
    return Plan(
        nproc=nproc,
        backend=backend,
        backend_reason=reason,
        master_addr=master_addr,
        master_port=port,
        port_was_given=given,
        init=init,
        omp_threads=default_omp_threads(nproc, environ),
        extra_env=dict(extra_env or {}),
    )


# ---------------------------------------------------------------- checks
#
# Every check returns a Check; none raises, none imports torch (unless the
# kernel already did), none starts a process. The magics (%ddp_env), the status
# widget and the tests read the same functions. Each has a unit test that makes
# it pass and one that makes it fail (tests/test_env_checks.py).

# What ranks see of NCCL that torch renamed (torch reads the old name and warns).
DEPRECATED_NCCL_VARS = {
    "NCCL_BLOCKING_WAIT": "TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_ASYNC_ERROR_HANDLING": "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_DESYNC_DEBUG": "TORCH_NCCL_DESYNC_DEBUG",
    "NCCL_ENABLE_TIMING": "TORCH_NCCL_ENABLE_TIMING",
}
NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")
BUILD_BACKENDS = ("nccl", "gloo", "mpi")


@dataclass
class Check:
    """One validation result: shown with a mark, and a reason in words when it fails."""

    name: str
    ok: bool
    detail: str
    level: str = "error"  # "error" fails the check; "warning" and "info" only inform

    @property
    def mark(self) -> str:
        if self.ok:
            return "✓"
        return "✗" if self.level == "error" else "!"

    @property
    def failed(self) -> bool:
        """A failure that stops a pool from working (warnings do not)."""
        return not self.ok and self.level == "error"

    def to_dict(self) -> Dict[str, object]:
        return {"name": self.name, "ok": self.ok, "level": self.level, "mark": self.mark, "detail": self.detail}


def checks_verdict(checks: Sequence[Check]) -> str:
    """'env ✓', 'env ✗ 2 failed' or 'env ! 1 warning': the env part of a one-line summary."""
    failed = [c for c in checks if c.failed]
    warned = [c for c in checks if not c.ok and not c.failed]
    if failed:
        return f"env ✗ {len(failed)} failed"
    if warned:
        return f"env ! {len(warned)} warning{'s' if len(warned) > 1 else ''}"
    return "env ✓"


def _few(items: Sequence[str], limit: int = 4) -> str:
    items = list(items)
    if len(items) <= limit:
        return "; ".join(items)
    return "; ".join(items[:limit]) + f"; and {len(items) - limit} more"


def check_rank_envs(envs: Sequence[Mapping[str, str]], nnodes: int = 1, count: Optional[int] = None) -> List[Check]:
    """Consistency of the env the ranks see (planned, or read live from the workers).

    ``count`` is how many ranks the pool has on this node (default: len(envs));
    with one node, WORLD_SIZE must equal it and the ranks must be 0..N-1 exactly once.
    """
    checks: List[Check] = []
    if not envs:
        return [Check("variables set", False, "no rank env to check (no rank answered)")]
    missing = {i: [v for v in DIST_VARS if v not in e] for i, e in enumerate(envs)}
    bad = {i: m for i, m in missing.items() if m}
    checks.append(
        Check(
            "variables set",
            not bad,
            "all of " + ", ".join(DIST_VARS) + " set on every rank"
            if not bad
            else _few([f"rank {envs[i].get('RANK', i)} lacks {', '.join(m)}" for i, m in bad.items()]),
        )
    )
    for var in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE"):
        values = sorted({e.get(var, "<unset>") for e in envs})
        checks.append(
            Check(
                f"same {var}",
                len(values) == 1,
                f"{var}={values[0]} on every rank" if len(values) == 1 else f"ranks disagree on {var}: {', '.join(values)}; every rank must use the same value",
            )
        )
    try:
        world = int(envs[0]["WORLD_SIZE"])
        ranks = [int(e["RANK"]) for e in envs]
    except (KeyError, ValueError) as e:
        checks.append(Check("ranks unique and complete", False, f"cannot read RANK and WORLD_SIZE as numbers ({type(e).__name__}: {e})"))
        return checks
    n = count if count is not None else len(envs)
    checks.append(
        Check(
            "WORLD_SIZE matches the ranks",
            world == n * nnodes,
            f"WORLD_SIZE={world}: {n} rank(s)" + (f" × {nnodes} nodes" if nnodes > 1 else "")
            if world == n * nnodes
            else f"WORLD_SIZE={world} but the pool has {n * nnodes} rank(s): init_process_group would wait forever for the missing ones",
        )
    )
    dupes = sorted({r for r in ranks if ranks.count(r) > 1})
    want = set(range(world)) if nnodes == 1 else set(ranks)
    missing_ranks = sorted(want - set(ranks))
    out_of_range = sorted(r for r in ranks if not 0 <= r < world)
    problems = []
    if dupes:
        problems.append(f"rank(s) {dupes} appear more than once (two processes would claim one rank)")
    if missing_ranks:
        problems.append(f"rank(s) {missing_ranks} missing (the others would wait for them)")
    if out_of_range:
        problems.append(f"rank(s) {out_of_range} outside 0..{world - 1}")
    checks.append(Check("ranks unique and complete", not problems, f"ranks 0..{world - 1} exactly once" if not problems else "; ".join(problems)))
    checks.append(check_local_ranks(envs))
    try:
        port = int(envs[0]["MASTER_PORT"])
        checks.append(Check("MASTER_PORT valid", 0 < port < 65536, f"port {port}" if 0 < port < 65536 else f"{port} is not a TCP port (1-65535)"))
    except (KeyError, ValueError):
        checks.append(Check("MASTER_PORT valid", False, f"not a port number: {envs[0].get('MASTER_PORT')!r}"))
    return checks


def check_local_ranks(envs: Sequence[Mapping[str, str]]) -> Check:
    """LOCAL_RANK in 0..LOCAL_WORLD_SIZE-1, once per node, and RANK = NODE_RANK × LOCAL_WORLD_SIZE + LOCAL_RANK."""
    name = "LOCAL_RANK consistent"
    try:
        rows = [(int(e["RANK"]), int(e["LOCAL_RANK"]), int(e["LOCAL_WORLD_SIZE"]), int(e.get("NODE_RANK", "0"))) for e in envs]
    except (KeyError, ValueError) as e:
        return Check(name, False, f"cannot read RANK, LOCAL_RANK, LOCAL_WORLD_SIZE and NODE_RANK as numbers ({type(e).__name__}: {e})")
    problems: List[str] = []
    sizes = sorted({lw for _, _, lw, _ in rows})
    if len(sizes) > 1:
        problems.append(f"ranks disagree on LOCAL_WORLD_SIZE: {', '.join(map(str, sizes))}")
    seen: Dict[tuple, int] = {}
    for rank, local, lw, node in rows:
        if not 0 <= local < lw:
            problems.append(f"rank {rank}: LOCAL_RANK {local} outside 0..{lw - 1}")
        elif rank != node * lw + local:
            problems.append(f"rank {rank}: LOCAL_RANK {local} on node {node} means RANK {node * lw + local}")
        if (node, local) in seen:
            problems.append(f"ranks {seen[(node, local)]} and {rank} both have LOCAL_RANK {local} on node {node} (they would share a GPU)")
        seen[(node, local)] = rank
    if problems:
        return Check(name, False, _few(problems))
    return Check(name, True, f"LOCAL_RANK 0..{sizes[0] - 1} once per node, matching RANK")


def check_port(addr: str, port: int, given: bool = True, started: bool = False) -> Check:
    """MASTER_PORT can be bound on MASTER_ADDR; when not, who holds it (Linux /proc) where we can tell."""
    name = "master port free"
    if started:
        return Check(name, True, f"{addr}:{port} is held by the running pool (rank 0 hosts the store there)", level="info")
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    try:
        local = any(_is_local_ip(f, ip) for f, ip in _resolve(addr))
    except (socket.gaierror, UnicodeError):
        local = False
    bind_addr = addr if local else ("::" if family == socket.AF_INET6 else "0.0.0.0")  # the store listens on every interface
    try:
        check_master_port(bind_addr, port)
    except PlanError as e:
        return Check(name, False, str(e).replace("--master-port ", f"{addr}:", 1) if given else str(e).replace("--master-port ", f"the chosen port {addr}:", 1))
    except OSError as e:
        return Check(name, False, f"cannot bind {addr}:{port}: {e.strerror}")
    return Check(name, True, f"{addr}:{port} is free" + ("" if given else " (chosen for you)"))


def _resolve(addr: str) -> List["tuple[int, str]"]:
    infos = socket.getaddrinfo(addr, None, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys((family, sa[0]) for family, _, _, _, sa in infos))


def _is_local_ip(family: int, ip: str) -> bool:
    """An address is this machine's when a socket can bind to it."""
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


def _route_source(family: int, ip: str) -> Optional[str]:
    """The local address the kernel would use to reach ip, or None when there is no route (no packet is sent)."""
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((ip, 9))
            return s.getsockname()[0]
    except OSError:
        return None


def _addr_ip(addr: str, ip: str) -> str:
    return addr if addr == ip else f"{addr} ({ip})"


def check_master_addr_resolves(addr: str) -> Check:
    name = "master address resolves"
    try:
        ips = _resolve(addr)
    except (socket.gaierror, UnicodeError) as e:
        why = getattr(e, "strerror", None) or str(e)
        return Check(name, False, f"{addr!r} does not resolve ({why}); on one machine use 127.0.0.1")
    return Check(name, True, f"{addr} → {', '.join(ip for _, ip in ips[:3])}")


def check_master_addr_local(addr: str, nnodes: int = 1) -> Check:
    """One node: MASTER_ADDR must be this machine (rank 0 hosts the store there). More nodes: a route must exist."""
    name = "master address is local" if nnodes == 1 else "master address reachable"
    try:
        ips = _resolve(addr)
    except (socket.gaierror, UnicodeError):
        return Check(name, False, f"cannot tell: {addr!r} does not resolve")
    for family, ip in ips:
        if _is_local_ip(family, ip):
            loopback = " (loopback: ranks on this machine only)" if ip in ("127.0.0.1", "::1") and nnodes > 1 else ""
            return Check(name, True, f"{_addr_ip(addr, ip)} is this machine{loopback}")
    family, ip = ips[0]
    if nnodes == 1:
        return Check(
            name,
            False,
            f"{_addr_ip(addr, ip)} is not an address of this machine: rank 0 runs here and hosts the rendezvous store, "
            "but every rank would look for it there; use 127.0.0.1 or this machine's own address",
        )
    src = _route_source(family, ip)
    if src is None:
        return Check(name, False, f"no route from this machine to {_addr_ip(addr, ip)}")
    return Check(name, True, f"{_addr_ip(addr, ip)} is reachable from here via {src}")


@dataclass
class BackendInfo:
    """Which process-group backends this torch has; None where it cannot tell."""

    available: Dict[str, Optional[bool]]
    source: str

    def listing(self) -> str:
        marks = {True: "✓", False: "✗", None: "?"}
        return ", ".join(f"{b} {marks[self.available.get(b)]}" for b in BUILD_BACKENDS)


def _build_definitions(torch_dir: str) -> Optional[set]:
    """The compile definitions torch exported for its C++ users (share/cmake), e.g. USE_C10D_GLOO."""
    import glob
    import re

    files = glob.glob(os.path.join(torch_dir, "share", "cmake", "Caffe2", "Caffe2Targets*.cmake"))
    if not files:
        return None
    defs: set = set()
    for path in files:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        for value in re.findall(r'INTERFACE_COMPILE_DEFINITIONS\s+"([^"]*)"', text):
            defs.update(d.strip() for d in value.split(";") if d.strip())
    return defs


def _nccl_library_present(torch_dir: str) -> bool:
    import glob

    site = os.path.dirname(torch_dir)
    patterns = [os.path.join(torch_dir, "lib", "libnccl*"), os.path.join(site, "nvidia", "nccl", "lib", "libnccl*")]
    return any(glob.glob(p) for p in patterns)


def backend_availability(modules: Mapping[str, object] = sys.modules, torch_dir: Optional[str] = None) -> BackendInfo:
    """nccl / gloo / mpi availability without importing torch in the kernel.

    When the kernel already imported torch.distributed, torch is asked (cheap).
    Otherwise the answer is read from the files torch installs: the compile
    definitions in ``share/cmake/Caffe2/Caffe2Targets.cmake`` (USE_DISTRIBUTED,
    USE_C10D_GLOO/NCCL/MPI), ``version.py`` (a CUDA build) and the NCCL library.
    A running pool's ranks report the backend they actually initialised
    (``%ddp_env`` on a live pool).
    """
    dist = modules.get("torch.distributed")
    if dist is not None and torch_dir is None:
        try:
            if not dist.is_available():  # type: ignore[attr-defined]
                return BackendInfo({b: False for b in BUILD_BACKENDS}, "torch.distributed (already imported in the kernel): built without distributed support")
            return BackendInfo(
                {
                    "nccl": bool(dist.is_nccl_available()),  # type: ignore[attr-defined]
                    "gloo": bool(dist.is_gloo_available()),  # type: ignore[attr-defined]
                    "mpi": bool(dist.is_mpi_available()),  # type: ignore[attr-defined]
                },
                "asked torch.distributed (already imported in the kernel)",
            )
        except Exception:
            pass
    torch_dir = torch_dir or _torch_dir()
    if torch_dir is None:
        return BackendInfo({b: False for b in BUILD_BACKENDS}, f"torch is not installed for {sys.executable}")
    defs = _build_definitions(torch_dir)
    if defs is None:
        why = "cannot tell without importing torch (its build files are missing); the ranks find out when they start"
        return BackendInfo({b: None for b in BUILD_BACKENDS}, why)
    dist_ok = "USE_DISTRIBUTED" in defs
    cuda = _torch_built_with_cuda(torch_dir)
    return BackendInfo(
        {
            "nccl": dist_ok and cuda and ("USE_C10D_NCCL" in defs or _nccl_library_present(torch_dir)),
            "gloo": dist_ok and "USE_C10D_GLOO" in defs,
            "mpi": dist_ok and "USE_C10D_MPI" in defs,
        },
        "read from torch's build files (torch is not imported in the kernel)",
    )


def check_backend_available(backend: str, info: BackendInfo) -> Check:
    name = "backend available"
    have = info.available.get(backend)
    listing = f"{info.listing()} — {info.source}"
    if have is None:
        return Check(name, False, f"{backend}: {info.source}. Known: {info.listing()}", level="warning")
    if have:
        return Check(name, True, f"{backend} is built into this torch ({listing})")
    fix = {
        "nccl": "install a CUDA build of torch, or use --backend gloo",
        "mpi": "MPI needs torch built from source with MPI; use --backend gloo (CPU) or nccl (GPUs)",
        "gloo": "use --backend nccl (GPUs) or mpi",
    }.get(backend, "choose another backend")
    return Check(name, False, f"this torch was built without {backend}: {fix} ({listing})")


def check_gpus(backend: str, nproc: int, gpus: GPUInfo) -> Check:
    """Enough GPUs for the backend: nccl needs one per rank; gloo and mpi run on CPU."""
    name = "GPUs for the backend"
    if backend == "nccl":
        if gpus.count >= nproc and gpus.count > 0:
            return Check(name, True, f"{gpus.count} GPU(s) visible for {nproc} rank(s): one per rank")
        fix = "use --backend gloo (CPU)" if gpus.count == 0 else f"use -n {gpus.count} or --backend gloo"
        return Check(name, False, f"nccl needs one GPU per rank: {nproc} rank(s) but {gpus.count} GPU(s) visible ({gpus.source}); {fix}")
    extra = f"; {gpus.count} GPU(s) visible, fewer than the {nproc} ranks nccl would need" if 0 < gpus.count < nproc else f"; {gpus.count} GPU(s) visible"
    return Check(name, True, f"{backend} runs on CPU, no GPU needed{extra}", level="info")


def check_cuda_in_kernel(modules: Mapping[str, object] = sys.modules) -> Check:
    """CUDA initialised in the kernel breaks fork-based launchers; ours never forks the kernel, so it is harmless.

    This check informs and never fails: both states are fine here.
    """
    torch = modules.get("torch")
    initialised = False
    if torch is not None:
        try:
            initialised = bool(torch.cuda.is_initialized())  # type: ignore[attr-defined]
        except Exception:
            initialised = False
    return Check(
        "CUDA in the kernel",
        True,
        "CUDA is initialised in the kernel: harmless here (ranks are never forked from the kernel), "
        "but the kernel's CUDA context holds some memory on its GPU"
        if initialised
        else "not initialised in the kernel" + ("" if torch is not None else " (torch is not imported there)"),
        level="info",
    )


def check_kernel_env(environ: Mapping[str, str], gpus: Optional[GPUInfo] = None) -> List[Check]:
    """Variables already set in the kernel that a user might think reach the ranks, and CUDA_VISIBLE_DEVICES."""
    stale = {k: environ[k] for k in STALE_VARS if k in environ and k != "CUDA_VISIBLE_DEVICES"}
    checks = [
        Check(
            "no stale dist variables in the kernel",
            not stale,
            "none set"
            if not stale
            else "the kernel has " + ", ".join(f"{k}={v}" for k, v in stale.items()) + ": stale from an earlier launch? each rank gets its own values instead",
            level="warning",
        )
    ]
    checks.append(check_visible_devices(environ, gpus if gpus is not None else detect_gpus(environ)))
    return checks


def check_visible_devices(environ: Mapping[str, str], gpus: GPUInfo) -> Check:
    """CUDA_VISIBLE_DEVICES in the kernel is inherited by every rank: it must name GPUs that exist."""
    name = "CUDA_VISIBLE_DEVICES"
    value = environ.get("CUDA_VISIBLE_DEVICES")
    physical = gpus.physical or 0
    if value is None:
        return Check(name, True, f"not set in the kernel: the ranks may use all {physical} GPU(s)" if physical else "not set in the kernel", level="info")
    ids = [v.strip() for v in value.split(",")]
    if value.strip() in ("", "-1"):
        if physical:
            return Check(name, False, f"{value!r} in the kernel hides all {physical} GPU(s) from every rank: unset it to use them", level="warning")
        return Check(name, True, f"{value!r} in the kernel: no GPU for the ranks", level="info")
    odd = [i for i in ids if not (i.isdigit() or i.startswith(("GPU-", "MIG-")))]
    if odd:
        odd_text = ", ".join(map(repr, odd))
        return Check(name, False, f"{value!r} in the kernel: {odd_text} is not a device index or UUID; CUDA stops reading the list there", level="warning")
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        return Check(name, False, f"{value!r} in the kernel lists device(s) {', '.join(dupes)} twice: CUDA then sees no device at all", level="warning")
    absent = [i for i in ids if i.isdigit() and physical and int(i) >= physical]
    if absent:
        detail = f"{value!r} in the kernel names device(s) {', '.join(absent)}, but this machine has {physical} GPU(s) (0..{physical - 1})"
        return Check(name, False, detail, level="warning")
    return Check(name, True, f"{value!r} in the kernel: every rank inherits it, rank i uses cuda:i among these", level="info")


def check_omp(omp_threads: Optional[int], nproc: int, environ: Mapping[str, str], cpus: Optional[int] = None) -> Check:
    """OMP_NUM_THREADS as the ranks will see it: a positive number, not oversubscribing the cores."""
    name = "OMP_NUM_THREADS"
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if omp_threads is not None:
        return Check(name, True, f"{omp_threads} per rank (not set in the kernel; ddp_magic shares the {cpus} core(s): cores / ranks)", level="info")
    value = environ.get("OMP_NUM_THREADS", "")
    first = value.split(",")[0].strip()
    if not first.isdigit() or int(first) < 1:
        return Check(
            name,
            False,
            f"{value!r} from the kernel's env is not a positive whole number: each rank's OpenMP ignores it and warns; "
            f"unset it (ddp_magic then gives {max(1, cpus // max(1, nproc))} per rank) or set a number",
            level="warning",
        )
    threads = int(first)
    if threads * nproc > cpus:
        return Check(
            name,
            False,
            f"{threads} per rank from the kernel's env × {nproc} ranks = {threads * nproc} threads on {cpus} core(s): "
            f"oversubscribed, CPU ops will crawl; unset it to get {max(1, cpus // max(1, nproc))} per rank",
            level="warning",
        )
    return Check(name, True, f"{threads} per rank (from the kernel's env; {threads * nproc} threads on {cpus} core(s))", level="info")


def check_nccl_env(environ: Mapping[str, str], backend: str) -> Check:
    """NCCL_* / TORCH_NCCL_* as the ranks will see them: deprecated names and bad NCCL_DEBUG levels."""
    name = "NCCL settings"
    nccl = {k: v for k, v in environ.items() if k.startswith(("NCCL_", "TORCH_NCCL_"))}
    unused = "" if backend == "nccl" else f" (unused: the backend is {backend})"
    if not nccl:
        return Check(name, True, "none set" + unused, level="info")
    listing = ", ".join(f"{k}={v}" for k, v in sorted(nccl.items()))
    problems = [f"{old} is deprecated: torch reads {new} (and warns on every rank)" for old, new in DEPRECATED_NCCL_VARS.items() if old in nccl]
    level = nccl.get("NCCL_DEBUG")
    if level is not None and level.upper() not in NCCL_DEBUG_LEVELS:
        problems.append(f"NCCL_DEBUG={level!r} is not one of {', '.join(NCCL_DEBUG_LEVELS)}: NCCL ignores it")
    if problems:
        return Check(name, False, "; ".join(problems) + f" — every rank sees {listing}{unused}", level="warning")
    return Check(name, True, f"every rank sees {listing}{unused}", level="info")


def _interfaces() -> List[str]:
    try:
        return [name for _, name in socket.if_nameindex()]
    except OSError:
        try:
            return os.listdir("/sys/class/net")
        except OSError:
            return []


def check_socket_ifname(environ: Mapping[str, str], backend: str, interfaces: Optional[Sequence[str]] = None) -> Check:
    """GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME must name interfaces this machine has."""
    name = "socket interface"
    gloo, nccl = environ.get("GLOO_SOCKET_IFNAME"), environ.get("NCCL_SOCKET_IFNAME")
    if not gloo and not nccl:
        return Check(name, True, "GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME not set: chosen automatically", level="info")
    have = list(interfaces) if interfaces is not None else _interfaces()
    problems: List[str] = []
    fatal = False
    if gloo:
        absent = [n for n in gloo.split(",") if n.strip() and n.strip() not in have]
        if absent:
            consequence = ": init_process_group fails" if backend == "gloo" else ""
            problems.append(f"GLOO_SOCKET_IFNAME names {', '.join(absent)}, which this machine lacks{consequence}")
            fatal = fatal or backend == "gloo"
    if nccl and not nccl.startswith("^"):
        exact = nccl.startswith("=")
        wanted = [n.strip() for n in nccl.lstrip("=").split(",") if n.strip()]
        absent = [w for w in wanted if not any((i == w) if exact else i.startswith(w) for i in have)]
        if absent:
            consequence = ": NCCL finds no socket" if backend == "nccl" else ""
            problems.append(f"NCCL_SOCKET_IFNAME names {', '.join(absent)}, which matches no interface here{consequence}")
            fatal = fatal or backend == "nccl"
    shown = ", ".join(f"{k}={v}" for k, v in (("GLOO_SOCKET_IFNAME", gloo), ("NCCL_SOCKET_IFNAME", nccl)) if v)
    if problems:
        return Check(name, False, "; ".join(problems) + f" (interfaces here: {', '.join(have) or 'none found'})", level="error" if fatal else "warning")
    return Check(name, True, f"{shown}: present on this machine", level="info")


def plan_checks(
    plan: Plan,
    environ: Mapping[str, str] = os.environ,
    gpus: Optional[GPUInfo] = None,
    *,
    started: bool = False,
    modules: Mapping[str, object] = sys.modules,
    backends: Optional[BackendInfo] = None,
    interfaces: Optional[Sequence[str]] = None,
    cpus: Optional[int] = None,
) -> List[Check]:
    """Every check that can be made in the kernel about a plan: before a pool starts, or (started=True) for one that runs."""
    gpus = gpus if gpus is not None else detect_gpus(environ)
    checks = check_rank_envs(plan.all_envs(), nnodes=plan.nnodes)
    checks.append(check_port(plan.master_addr, plan.master_port, plan.port_was_given, started))
    checks.append(check_master_addr_resolves(plan.master_addr))
    checks.append(check_master_addr_local(plan.master_addr, plan.nnodes))
    checks.append(check_gpus(plan.backend, plan.nproc, gpus))
    checks.append(check_backend_available(plan.backend, backends if backends is not None else backend_availability(modules)))
    checks.append(check_cuda_in_kernel(modules))
    checks.extend(check_kernel_env(environ, gpus))
    checks.append(check_omp(plan.omp_threads, plan.nproc, environ, cpus))
    checks.append(check_nccl_env(environ, plan.backend))
    checks.append(check_socket_ifname(environ, plan.backend, interfaces))
    return checks


def check_process_group(live: Mapping[int, Mapping[str, object]], nproc: int, backend: str) -> Check:
    """The process group as each live rank reports it: initialised everywhere, one backend, the right size and ranks."""
    name = "process group"
    pgs = {r: dict(live[r].get("process_group") or {}) for r in live}  # type: ignore[call-overload]
    init = sorted(r for r, pg in pgs.items() if pg.get("initialised"))
    if not init:
        errors = sorted({str(pg["error"]) for pg in pgs.values() if pg.get("error")})
        detail = "not initialised on any rank (started with --no-init, or destroyed by the cell)"
        return Check(name, True, detail + (f"; ranks report: {', '.join(errors)}" if errors else ""), level="info")
    problems = []
    if len(init) < len(pgs):
        problems.append(f"initialised on {len(init)}/{len(pgs)} ranks only (not on {sorted(set(pgs) - set(init))})")
    sizes = sorted({pg.get("world_size") for pg in pgs.values() if pg.get("initialised")}, key=str)
    backends = sorted({str(pg.get("backend")) for pg in pgs.values() if pg.get("initialised")})
    if sizes != [nproc]:
        problems.append(f"world size {', '.join(map(str, sizes))} where the pool has {nproc} ranks")
    if len(backends) > 1:
        problems.append(f"ranks use different backends: {', '.join(backends)}")
    elif backends and backends[0] != backend:
        problems.append(f"backend {backends[0]}, the pool planned {backend}")
    wrong = [r for r, pg in pgs.items() if pg.get("initialised") and pg.get("rank") is not None and pg.get("rank") != r]
    if wrong:
        problems.append(f"rank(s) {wrong} have another process-group rank than their RANK")
    if problems:
        return Check(name, False, "; ".join(problems))
    return Check(name, True, f"initialised on {len(init)}/{len(pgs)} ranks: backend {backends[0]}, world size {nproc}")


def check_seen_settings(envs: Sequence[Mapping[str, str]]) -> List[Check]:
    """OMP_NUM_THREADS and NCCL_* as the ranks actually see them: the same on every rank."""
    checks = []
    omp = sorted({e.get("OMP_NUM_THREADS", "<unset>") for e in envs})
    checks.append(
        Check(
            "OMP_NUM_THREADS",
            len(omp) <= 1,
            (f"{omp[0]} on every rank" if omp else "no rank answered") if len(omp) <= 1 else f"ranks see different values: {', '.join(omp)}",
            level="info" if len(omp) <= 1 else "warning",
        )
    )
    keys = sorted({k for e in envs for k in e if k.startswith(("NCCL_", "TORCH_NCCL_"))})
    differ = [k for k in keys if len({e.get(k) for e in envs}) > 1]
    if differ:
        checks.append(Check("NCCL settings", False, f"ranks see different {', '.join(differ)}", level="warning"))
    elif keys:
        checks.append(Check("NCCL settings", True, "every rank sees " + ", ".join(f"{k}={envs[0].get(k)}" for k in keys), level="info"))
    else:
        checks.append(Check("NCCL settings", True, "none set on the ranks", level="info"))
    return checks


def live_checks(live: Mapping[int, Mapping[str, object]], nproc: int, backend: str) -> List[Check]:
    """Checks of what each rank of a running pool reports about itself (its os.environ and process group)."""
    envs = [dict(live[r].get("env") or {}) for r in sorted(live)]  # type: ignore[call-overload]
    checks = check_rank_envs(envs, count=nproc) if envs else []
    missing = [r for r in range(nproc) if r not in live]
    answered = f"all {nproc} ranks answered" if not missing else f"no answer from rank(s) {missing} within the timeout (dead or stuck?)"
    checks.append(Check("every rank answered", not missing, answered))
    checks.append(check_process_group(live, nproc, backend))
    if envs:
        checks.extend(check_seen_settings(envs))
    return checks


def device_map(nproc: int, environ: Mapping[str, str] = os.environ) -> Dict[int, str]:
    """Which GPU each local rank uses under nccl: cuda:LOCAL_RANK, i.e. the LOCAL_RANK-th visible device."""
    visible = [v.strip() for v in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()] if "CUDA_VISIBLE_DEVICES" in environ else []
    out = {}
    for r in range(nproc):
        out[r] = f"cuda:{r} (physical GPU {visible[r]})" if r < len(visible) else f"cuda:{r}"
    return out
