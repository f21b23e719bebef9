"""What the ranks inherit from this kernel and machine: GPUs, torch's backends, CUDA, stale variables,
CUDA_VISIBLE_DEVICES, OpenMP threads, NCCL settings and socket interfaces."""
from __future__ import annotations

import sys
from typing import List, Mapping, Optional, Sequence

from .net import interfaces as local_interfaces
from .check import Check
from .gpus import BackendInfo, GPUInfo, cuda_initialised, detect_gpus
from .plan import STALE_VARS, threads_per_rank, usable_cpus
from ..words import plural

# What ranks see of NCCL that torch renamed (torch reads the old name and warns).
DEPRECATED_NCCL_VARS = {
    "NCCL_BLOCKING_WAIT": "TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_ASYNC_ERROR_HANDLING": "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_DESYNC_DEBUG": "TORCH_NCCL_DESYNC_DEBUG",
    "NCCL_ENABLE_TIMING": "TORCH_NCCL_ENABLE_TIMING",
}
NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")


def check_gpus(backend: str, nproc: int, gpus: GPUInfo) -> Check:
    """Enough GPUs for the backend: nccl needs one per rank; gloo and mpi run on CPU."""
    name = "GPUs for the backend"
    if backend == "nccl":
        if gpus.count >= nproc and gpus.count > 0:
            return Check(name, True, f"{plural(gpus.count, 'GPU')} visible for {plural(nproc, 'rank')}: one per rank")
        fix = "use --backend gloo (CPU)" if gpus.count == 0 else f"use -n {gpus.count} or --backend gloo"
        return Check(name, False, f"nccl needs one GPU per rank: {plural(nproc, 'rank')} but {plural(gpus.count, 'GPU')} visible ({gpus.source}); {fix}")
    extra = f"; {plural(gpus.count, 'GPU')} visible" + (f", fewer than the {nproc} ranks nccl would need" if 0 < gpus.count < nproc else "")
    return Check(name, True, f"{backend} runs on CPU, no GPU needed{extra}", level="info")


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


def check_cuda_in_kernel(modules: Mapping[str, object] = sys.modules) -> Check:
    """CUDA initialised in the kernel breaks fork-based launchers; ours never forks the kernel, so it is harmless.

    This check informs and never fails: both states are fine here.
    """
    if cuda_initialised(modules):
        detail = (
            "CUDA is initialised in the kernel: harmless here (ranks are never forked from the kernel), "
            "but the kernel's CUDA context holds some memory on its GPU"
        )
    else:
        detail = "not initialised in the kernel" + ("" if modules.get("torch") is not None else " (torch is not imported there)")
    return Check("CUDA in the kernel", True, detail, level="info")


def check_kernel_env(environ: Mapping[str, str], gpus: Optional[GPUInfo] = None) -> List[Check]:
    """Variables already set in the kernel that a user might think reach the ranks, and CUDA_VISIBLE_DEVICES."""
    stale = {k: environ[k] for k in STALE_VARS if k in environ and k != "CUDA_VISIBLE_DEVICES"}
    listed = ", ".join(f"{k}={v}" for k, v in stale.items())
    detail = f"the kernel has {listed}: stale from an earlier launch? each rank gets its own values instead" if stale else "none set"
    checks = [Check("no stale dist variables in the kernel", not stale, detail, level="warning")]
    checks.append(check_visible_devices(environ, gpus if gpus is not None else detect_gpus(environ)))
    return checks


def _all_gpus(n: int) -> str:
    return "its one GPU" if n == 1 else f"all {n} GPUs"


def _devices(ids: Sequence[str]) -> str:
    return f"{'device' if len(ids) == 1 else 'devices'} {', '.join(ids)}"


def check_visible_devices(environ: Mapping[str, str], gpus: GPUInfo) -> Check:
    """CUDA_VISIBLE_DEVICES in the kernel is inherited by every rank: it must name GPUs that exist."""
    name = "CUDA_VISIBLE_DEVICES"
    value = environ.get("CUDA_VISIBLE_DEVICES")
    physical = gpus.physical or 0
    if value is None:
        return Check(name, True, f"not set in the kernel: the ranks may use {_all_gpus(physical)}" if physical else "not set in the kernel", level="info")
    ids = [v.strip() for v in value.split(",")]
    if value.strip() in ("", "-1"):
        if physical:
            return Check(name, False, f"{value!r} in the kernel hides {_all_gpus(physical)} from every rank: unset it to use them", level="warning")
        return Check(name, True, f"{value!r} in the kernel: no GPU for the ranks", level="info")
    odd = [i for i in ids if not (i.isdigit() or i.startswith(("GPU-", "MIG-")))]
    if odd:
        odd_text = ", ".join(map(repr, odd))
        return Check(name, False, f"{value!r} in the kernel: {odd_text} is not a device index or UUID; CUDA stops reading the list there", level="warning")
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        detail = f"{value!r} in the kernel lists {_devices(dupes)} twice: CUDA then sees no device at all"
        return Check(name, False, detail, level="warning")
    absent = [i for i in ids if i.isdigit() and physical and int(i) >= physical]
    if absent:
        detail = f"{value!r} in the kernel names {_devices(absent)}, but this machine has {plural(physical, 'GPU')} (0..{physical - 1})"
        return Check(name, False, detail, level="warning")
    return Check(name, True, f"{value!r} in the kernel: every rank inherits it, rank i uses cuda:i among these", level="info")


def check_omp(omp_threads: Optional[int], nproc: int, environ: Mapping[str, str], cpus: Optional[int] = None) -> Check:
    """OMP_NUM_THREADS as the ranks will see it: a positive number, not oversubscribing the cores."""
    name = "OMP_NUM_THREADS"
    cpus = cpus if cpus is not None else usable_cpus()
    if omp_threads is not None:
        return Check(name, True, f"{omp_threads} per rank (not set in the kernel; ddp_magic shares the {plural(cpus, 'core')}: cores / ranks)", level="info")
    value = environ.get("OMP_NUM_THREADS", "")
    first = value.split(",")[0].strip()
    ours = threads_per_rank(nproc, cpus)
    if not first.isdigit() or int(first) < 1:
        return Check(
            name,
            False,
            f"{value!r} from the kernel's env is not a positive whole number: each rank's OpenMP ignores it and warns; "
            f"unset it (ddp_magic then gives {ours} per rank) or set a number",
            level="warning",
        )
    threads = int(first)
    if threads * nproc > cpus:
        return Check(
            name,
            False,
            f"{threads} per rank from the kernel's env × {nproc} ranks = {threads * nproc} threads on {plural(cpus, 'core')}: "
            f"oversubscribed, CPU ops will crawl; unset it to get {ours} per rank",
            level="warning",
        )
    return Check(name, True, f"{threads} per rank (from the kernel's env; {plural(threads * nproc, 'thread')} on {plural(cpus, 'core')})", level="info")


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


def check_socket_ifname(environ: Mapping[str, str], backend: str, interfaces: Optional[Sequence[str]] = None,
                        elsewhere: bool = False) -> Check:
    """GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME must name interfaces this machine has; ``elsewhere``: the ranks run on
    other hosts (Slurm nodes), whose interfaces this machine cannot see: each node chooses its own (procs/rank_net.py)."""
    name = "socket interface"
    gloo, nccl = environ.get("GLOO_SOCKET_IFNAME"), environ.get("NCCL_SOCKET_IFNAME")
    if elsewhere:
        shown = ", ".join(f"{k}={v}" for k, v in (("GLOO_SOCKET_IFNAME", gloo), ("NCCL_SOCKET_IFNAME", nccl)) if v)
        return Check(name, True, f"{shown}: kept on every node, which must have it" if shown else
                     "chosen on each node: the interface on its route to MASTER_ADDR (--iface NAME names one)", level="info")
    if not gloo and not nccl:
        return Check(name, True, "GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME not set: chosen automatically", level="info")
    have = list(interfaces) if interfaces is not None else local_interfaces()
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
