"""The separate programs, without a kernel: they start by module name, a rank connects
before it imports torch, and each goes when its parent goes."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional

import pytest

from ddp_magic.procs import rank_torch


def _python(*args: str, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60, env=env)


def test_rank_programs_import_without_torch():
    """torch is imported by the rank after it has joined the kernel (rank_torch.setup), not at import."""
    code = "import sys, ddp_magic.procs.worker, ddp_magic.procs.forkserver, ddp_magic.procs.rendezvous; print('torch' in sys.modules)"
    out = _python("-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_worker_under_torchrun_explains_its_arguments():
    out = _python("-m", "ddp_magic.procs.worker", "--help")
    assert out.returncode == 0 and "--connect" in out.stdout and "--secret-file" in out.stdout
    env = {k: v for k, v in os.environ.items() if k != "DDP_MAGIC_SECRET_FILE"}
    out = _python("-m", "ddp_magic.procs.worker", "--connect", "127.0.0.1:1", env=env)
    assert out.returncode == 2 and "--secret-file" in out.stderr


def test_die_with_parent_exits_when_the_parent_is_already_gone():
    if sys.platform != "linux":
        pytest.skip("prctl is Linux only")
    code = "from ddp_magic.procs.parent import die_with_parent; die_with_parent(1); print('still here')"
    out = _python("-c", code)
    assert out.returncode == 1 and "still here" not in out.stdout
    ok = _python("-c", "import os; from ddp_magic.procs.parent import die_with_parent; die_with_parent(os.getppid()); print('ok')")
    assert ok.returncode == 0 and ok.stdout.strip() == "ok"


def test_planned_device_follows_the_backend(monkeypatch):
    monkeypatch.setenv("DDP_MAGIC_BACKEND", "nccl")
    assert rank_torch.planned_device(3) == "cuda:3"
    monkeypatch.setenv("DDP_MAGIC_BACKEND", "gloo")
    assert rank_torch.planned_device(3) == "cpu"


def test_only_rank_torch_calls_torch_distributed():
    """The template imports it to warm up and the rendezvous program hosts a TCPStore; the rest of
    the rank-side code leaves torch.distributed to rank_torch.py (its docstring says so)."""
    import ast
    from pathlib import Path

    pkg = Path(rank_torch.__file__).resolve().parents[1]
    allowed = {"procs/rank_torch.py", "procs/forkserver.py", "procs/rendezvous.py"}
    allowed |= {"procs/mesh.py", "wire/sharded.py"}  # --mesh's DeviceMesh; a DTensor result's placements (no collective)
    allowed |= {"procs/rank_group.py"}  # the pool's group against the scripts' own init/destroy (patches c10d)
    allowed |= {"procs/rank_debug.py"}  # dist.breakpoint replaced; the watchdog reads the default group's sequence number
    allowed |= {"procs/rank_recover.py", "procs/rank_collectives.py"}  # abort and re-form the group; the collectives' record
    allowed |= {"procs/rank_snapshot.py", "procs/rank_snapshot_objects.py"}  # %ddp save / load: DCP, its state dicts, DDP rebuilt
    allowed |= {"procs/rank_snapshot_fsdp.py"}  # an FSDP2 module sharded again at a load: fully_shard on a mesh of the ranks
    allowed |= {"procs/rank_snapshot_bg.py"}  # a background save: its own gloo group, DCP written from a thread
    allowed |= {"procs/rank_heal.py", "procs/rank_heal_send.py"}  # a rank started again: the others' names sent to it, its DDP's buckets aligned
    allowed |= {"procs/rank_snapshot_reader.py"}  # a load's DCP reader: whole tensors read into place
    users = set()
    for path in sorted(pkg.glob("procs/*.py")) + sorted(pkg.glob("wire/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n.startswith("torch.distributed") for n in names):
                users.add(path.relative_to(pkg).as_posix())
    assert users - allowed == set() and "procs/rank_torch.py" in users
