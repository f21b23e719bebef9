"""What the kernel can know about GPUs and torch's build without initialising CUDA or importing torch.

The kernel may or may not have touched CUDA or imported torch; either way these
functions must not be the ones that do: they read the driver's /proc listing,
CUDA_VISIBLE_DEVICES and the files torch installs, and ask torch only when the
kernel already imported it.
"""
from __future__ import annotations

import glob
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Set

from ..logs import log

BUILD_BACKENDS = ("nccl", "gloo", "mpi")


@dataclass
class GPUInfo:
    """What the kernel can know about GPUs without initialising CUDA."""

    count: int
    cuda_built: bool
    visible: Optional[str] = None  # CUDA_VISIBLE_DEVICES as set in the kernel
    source: str = ""
    physical: Optional[int] = None  # GPUs the driver lists, before CUDA_VISIBLE_DEVICES


def detect_gpus(environ: Mapping[str, str] = os.environ, proc_root: str = "/proc/driver/nvidia/gpus") -> GPUInfo:
    """Count NVIDIA GPUs visible to workers without creating a CUDA context.

    The driver's /proc listing and CUDA_VISIBLE_DEVICES tell the count; torch is
    only asked whether it was built with CUDA (which does not initialise anything).
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
    cuda_built = torch_built_with_cuda()
    if not cuda_built:
        count = 0
        source += ", torch built without CUDA"
    return GPUInfo(count=count, cuda_built=cuda_built, visible=visible, source=source, physical=physical)


def device_map(nproc: int, environ: Mapping[str, str] = os.environ) -> Dict[int, str]:
    """Which GPU each local rank uses under nccl: cuda:LOCAL_RANK, i.e. the LOCAL_RANK-th visible device."""
    visible = [v.strip() for v in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()] if "CUDA_VISIBLE_DEVICES" in environ else []
    return {r: f"cuda:{r} (physical GPU {visible[r]})" if r < len(visible) else f"cuda:{r}" for r in range(nproc)}


def cuda_initialised(modules: Mapping[str, object] = sys.modules) -> bool:
    """Whether the kernel has a CUDA context; False when torch is not imported there (never imports it)."""
    torch: Any = modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:
        log.debug("torch.cuda.is_initialized() failed in the kernel", exc_info=True)
        return False


def find_torch_dir() -> Optional[str]:
    """Where torch is installed, found without importing it."""
    mod = sys.modules.get("torch")
    if mod is not None and getattr(mod, "__file__", None):
        return os.path.dirname(str(mod.__file__))
    try:
        import importlib.util

        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def torch_built_with_cuda(where: Optional[str] = None) -> bool:
    """torch.version.cuda without importing torch in the kernel when it is not already."""
    mod = sys.modules.get("torch.version")
    if mod is not None and where is None:
        return getattr(mod, "cuda", None) is not None
    where = where or find_torch_dir()
    if where is None:
        return False
    try:
        with open(os.path.join(where, "version.py")) as f:
            text = f.read()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("cuda"):
            return "None" not in line.split("=", 1)[1]
    return False


@dataclass
class BackendInfo:
    """Which process-group backends this torch has; None where it cannot tell."""

    available: Dict[str, Optional[bool]]
    source: str

    def listing(self) -> str:
        marks = {True: "✓", False: "✗", None: "?"}
        return ", ".join(f"{b} {marks[self.available.get(b)]}" for b in BUILD_BACKENDS)


def _build_definitions(where: str) -> Optional[Set[str]]:
    """The compile definitions torch exported for its C++ users (share/cmake), e.g. USE_C10D_GLOO."""
    files = glob.glob(os.path.join(where, "share", "cmake", "Caffe2", "Caffe2Targets*.cmake"))
    if not files:
        return None
    defs: Set[str] = set()
    for path in files:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        for value in re.findall(r'INTERFACE_COMPILE_DEFINITIONS\s+"([^"]*)"', text):
            defs.update(d.strip() for d in value.split(";") if d.strip())
    return defs


def _nccl_library_present(where: str) -> bool:
    site = os.path.dirname(where)
    patterns = [os.path.join(where, "lib", "libnccl*"), os.path.join(site, "nvidia", "nccl", "lib", "libnccl*")]
    return any(glob.glob(p) for p in patterns)


def _ask_torch(dist: Any) -> Optional[BackendInfo]:
    """The answer of a torch.distributed the kernel already imported; None when asking fails."""
    try:
        if not dist.is_available():
            return BackendInfo({b: False for b in BUILD_BACKENDS}, "torch.distributed (already imported in the kernel): built without distributed support")
        have = {"nccl": bool(dist.is_nccl_available()), "gloo": bool(dist.is_gloo_available()), "mpi": bool(dist.is_mpi_available())}
        return BackendInfo(dict(have), "asked torch.distributed (already imported in the kernel)")
    except Exception:
        log.debug("asking the kernel's torch.distributed for its backends failed; reading the build files", exc_info=True)
        return None


def _read_build_files(where: str) -> BackendInfo:
    defs = _build_definitions(where)
    if defs is None:
        why = "cannot tell without importing torch (its build files are missing); the ranks find out when they start"
        return BackendInfo({b: None for b in BUILD_BACKENDS}, why)
    dist_ok = "USE_DISTRIBUTED" in defs
    cuda = torch_built_with_cuda(where)
    return BackendInfo(
        {
            "nccl": dist_ok and cuda and ("USE_C10D_NCCL" in defs or _nccl_library_present(where)),
            "gloo": dist_ok and "USE_C10D_GLOO" in defs,
            "mpi": dist_ok and "USE_C10D_MPI" in defs,
        },
        "read from torch's build files (torch is not imported in the kernel)",
    )


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
        asked = _ask_torch(dist)
        if asked is not None:
            return asked
    where = torch_dir or find_torch_dir()
    if where is None:
        return BackendInfo({b: False for b in BUILD_BACKENDS}, f"torch is not installed for {sys.executable}")
    return _read_build_files(where)
