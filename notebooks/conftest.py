"""The example notebooks are tests: each one runs in a fresh kernel of this environment (nbval).

`pytest` (testpaths in setup.cfg include notebooks/) or `pytest notebooks/03_train_ddp.ipynb`
collects every code cell of a notebook as a test item, without `--nbval` on the command line:

- the kernel is this interpreter's (`--nbval-current-env`), so the notebooks test the ddp_magic
  installed here;
- outputs are compared strictly with the committed ones (nbval's default): a notebook whose
  committed outputs are stale against the code fails. What varies between runs (pids, ports,
  timings, the core count) is replaced on both sides by the rules in nbval_sanitize.cfg;
- cells tagged `raises-exception` are expected to fail, and do.

The committed outputs come from a CPU-only machine (gloo). Where NVIDIA GPUs are visible, ddp_magic
picks nccl and the outputs say so, so there the notebooks are only checked to run (as with
`--nbval-lax`); `CUDA_VISIBLE_DEVICES= pytest notebooks` compares them strictly there too.

Explicit `--nbval` / `--nbval-lax` / `--nbval-sanitize-with` / `--nbval-kernel-name` on the
command line win over these defaults. `python notebooks/refresh.py` re-executes the notebooks
and saves their outputs.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import pytest

HERE = Path(__file__).resolve().parent
SANITIZE = HERE / "nbval_sanitize.cfg"


def gpus_visible() -> int:
    """How many GPUs the ranks would see: ddp_magic's own count (it never initialises CUDA)."""
    try:
        from ddp_magic.plan.gpus import detect_gpus

        return detect_gpus().count
    except Exception:  # pragma: no cover - only if ddp_magic itself cannot be imported
        if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
            return 0
        try:
            return len(os.listdir("/proc/driver/nvidia/gpus"))
        except OSError:
            return 0


def pytest_configure(config: pytest.Config) -> None:
    opt = config.option
    if getattr(opt, "nbval_sanitize_with", None) is None and getattr(opt, "sanitize_with", None) is None:
        opt.nbval_sanitize_with = str(SANITIZE)
    if not getattr(opt, "nbval_kernel_name", None) and not getattr(opt, "current_env", False):
        opt.nbval_current_env = True


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> Optional[Any]:
    if file_path.suffix != ".ipynb" or HERE not in file_path.resolve().parents:
        return None
    opt = parent.config.option
    if opt.nbval or opt.nbval_lax:
        return None  # nbval's own hook collects it, as asked on the command line
    from nbval.plugin import IPyNbFile

    nb = IPyNbFile.from_parent(parent, path=file_path)
    if gpus_visible():
        nb.compare_outputs = False  # run every cell, compare none: the saved outputs are gloo's
    return nb


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    for item in items:
        path = Path(str(getattr(item, "fspath", ""))).resolve()
        if path.suffix == ".ipynb" and HERE in path.parents:
            item.add_marker(pytest.mark.notebook)
            item.add_marker(pytest.mark.kernel)
