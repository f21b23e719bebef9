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
    return GPUInfo(count=count, cuda_built=cuda_built, visible=visible, source=source)


def _torch_built_with_cuda() -> bool:
    """torch.version.cuda without importing torch in the kernel when it is not already."""
    mod = sys.modules.get("torch.version")
    if mod is not None:
        return getattr(mod, "cuda", None) is not None
    try:
        import importlib.util

        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.submodule_search_locations:
        return False
    path = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
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
                        cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                    return f"pid {pid} ({cmd[:80]})"
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
) -> Plan:
    """Validate a request and turn it into a Plan; raises PlanError with the fix."""
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise PlanError(f"-n must be a whole number of ranks, 1 or more (got {nproc!r})")
    gpus = gpus if gpus is not None else detect_gpus(environ)
    backend, reason = choose_backend(backend, nproc, gpus)
    check_master_addr(master_addr)
    if master_port is None:
        port, given = free_port(master_addr), False
    else:
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


def check_rank_envs(envs: Sequence[Mapping[str, str]]) -> List[Check]:
    """Consistency of the env the ranks see (planned or read live from workers)."""
    checks: List[Check] = []
    missing = {i: [v for v in DIST_VARS if v not in e] for i, e in enumerate(envs)}
    bad = {i: m for i, m in missing.items() if m}
    checks.append(
        Check(
            "variables set",
            not bad,
            "all of " + ", ".join(DIST_VARS) + " set on every rank"
            if not bad
            else "; ".join(f"rank {i} lacks {', '.join(m)}" for i, m in bad.items()),
        )
    )
    for var in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE"):
        values = sorted({e.get(var, "<unset>") for e in envs})
        checks.append(
            Check(f"same {var}", len(values) == 1, f"{var}={values[0]} on every rank" if len(values) == 1 else f"ranks disagree: {', '.join(values)}")
        )
    try:
        world = int(envs[0]["WORLD_SIZE"]) if envs else 0
        ranks = [int(e["RANK"]) for e in envs]
    except (KeyError, ValueError) as e:
        checks.append(Check("ranks unique and complete", False, f"cannot read RANK/WORLD_SIZE: {e}"))
        return checks
    dupes = sorted({r for r in ranks if ranks.count(r) > 1})
    want = set(range(world)) if len(envs) == world else set(ranks)
    missing_ranks = sorted(want - set(ranks))
    out_of_range = sorted(r for r in ranks if not 0 <= r < world)
    problems = []
    if dupes:
        problems.append(f"duplicate rank(s) {dupes}")
    if missing_ranks:
        problems.append(f"missing rank(s) {missing_ranks}")
    if out_of_range:
        problems.append(f"rank(s) {out_of_range} outside 0..{world - 1}")
    checks.append(
        Check("ranks unique and complete", not problems, f"ranks 0..{world - 1} exactly once" if not problems else "; ".join(problems))
    )
    try:
        port = int(envs[0]["MASTER_PORT"]) if envs else 0
        checks.append(Check("MASTER_PORT valid", 0 < port < 65536, f"port {port}"))
    except (KeyError, ValueError):
        checks.append(Check("MASTER_PORT valid", False, f"not a number: {envs[0].get('MASTER_PORT')!r}"))
    return checks


def check_kernel_env(environ: Mapping[str, str]) -> List[Check]:
    """Variables already set in the kernel that a user might think reach the ranks."""
    stale = {k: environ[k] for k in STALE_VARS if k in environ and k != "CUDA_VISIBLE_DEVICES"}
    checks = [
        Check(
            "no stale dist variables in the kernel",
            not stale,
            "none set" if not stale else "the kernel has " + ", ".join(f"{k}={v}" for k, v in stale.items()) + "; each rank gets its own values instead",
            level="warning",
        )
    ]
    if "CUDA_VISIBLE_DEVICES" in environ:
        checks.append(Check("CUDA_VISIBLE_DEVICES", True, f"{environ['CUDA_VISIBLE_DEVICES']!r} in the kernel: ranks map onto these devices", level="info"))
    return checks


def check_cuda_in_kernel(modules: Mapping[str, object] = sys.modules) -> Check:
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
        "CUDA is initialised in the kernel: harmless here (workers are never forked from the kernel)"
        if initialised
        else "not initialised in the kernel",
        level="info",
    )


def plan_checks(plan: Plan, environ: Mapping[str, str] = os.environ, gpus: Optional[GPUInfo] = None) -> List[Check]:
    """Every check that can be made before a pool starts."""
    gpus = gpus if gpus is not None else detect_gpus(environ)
    checks = check_rank_envs(plan.all_envs())
    free = port_is_free(plan.master_addr, plan.master_port)
    who = None if free else port_holder(plan.master_port)
    checks.append(
        Check(
            "master port free",
            free,
            f"{plan.master_addr}:{plan.master_port} is free" + ("" if plan.port_was_given else " (chosen for you)")
            if free
            else f"{plan.master_addr}:{plan.master_port} is in use" + (f" by {who}" if who else ""),
        )
    )
    try:
        check_master_addr(plan.master_addr)
        checks.append(Check("master address resolves", True, plan.master_addr))
    except PlanError as e:
        checks.append(Check("master address resolves", False, str(e)))
    if plan.backend == "nccl":
        enough = gpus.count >= plan.nproc
        checks.append(Check("GPUs for nccl", enough, f"{gpus.count} visible for {plan.nproc} ranks"))
    else:
        checks.append(Check("backend", True, f"{plan.backend}: {plan.backend_reason}", level="info"))
    checks.append(check_cuda_in_kernel())
    checks.extend(check_kernel_env(environ))
    omp = plan.omp_threads if plan.omp_threads is not None else environ.get("OMP_NUM_THREADS")
    checks.append(Check("OMP_NUM_THREADS", True, f"{omp} per rank" + (" (from the kernel's env)" if plan.omp_threads is None else " (default: cores / ranks)"), level="info"))
    nccl = {k: v for k, v in environ.items() if k.startswith("NCCL_") or k.startswith("TORCH_NCCL_")}
    if nccl:
        checks.append(Check("NCCL settings", True, ", ".join(f"{k}={v}" for k, v in sorted(nccl.items())), level="info"))
    return checks
