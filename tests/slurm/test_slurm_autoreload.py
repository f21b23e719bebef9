"""Edits reach the ranks of both Slurm nodes (n1, n2 of the local Slurm, which share this machine's filesystem), and a
module only the notebook's machine can import is shipped to them by value and reloaded the same way (docs/autoreload.md).

The local counterparts (DDP state kept, syntax errors, new parameters, a rank's other version): tests/kernel/test_autoreload.py.
Every cell after an edit runs twice.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

import slurm_fixtures
from slurm_fixtures import wait_no_jobs
from slurm_helpers import Kernel

pytestmark = [pytest.mark.kernel, pytest.mark.slow, pytest.mark.slurm]
slurm_cluster = slurm_fixtures.slurm_cluster  # the fixture, by name in this module

NODES = ["n1", "n1", "n2", "n2"]


def write(path: Path, text: str) -> None:
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    if path.stat().st_mtime_ns == before:
        os.utime(path, ns=(before + 1_000_000, before + 1_000_000))


@pytest.fixture(scope="module")
def ak(slurm_cluster, tmp_path_factory):
    """A kernel in a notebook's directory with a pool of 2 nodes × 2 ranks and autoreload on; the allocation ends with the module."""
    slurm_fixtures.cancel_our_jobs()
    where = tmp_path_factory.mktemp("slurm_notebook")
    k = Kernel()
    k.where = where  # type: ignore[attr-defined]
    k.run(f"import os; os.chdir({str(where)!r})").ok()
    k.run("%load_ext ddp_magic").ok()
    k.run("%%ddp --slurm --nodes 2 --ntasks-per-node 2\nimport os, sys, torch, torch.distributed as dist", timeout=180).ok()
    k.run("%ddp autoreload").ok()
    yield k
    k.run("%ddp stop", timeout=60)
    k.shutdown()
    assert wait_no_jobs(10) == [], "%ddp stop released the allocation"


def test_an_edit_reaches_the_ranks_of_both_nodes(ak):
    mod = ak.where / "slurm_model.py"
    write(mod, "def f():\n    return 1\n")
    ak.run("%%ddp\nimport slurm_model\n(os.environ['SLURMD_NODENAME'], slurm_model.f())", timeout=60).ok()
    assert ak.value("list(_)") == [(n, 1) for n in NODES]
    write(mod, "def f():\n    return 2\n")
    for attempt in range(2):
        ak.run("%%ddp\n(os.environ['SLURMD_NODENAME'], slurm_model.f())", timeout=60).ok()
        assert ak.value("list(_)") == [(n, 2) for n in NODES]
        assert ak.run("%ddp status").ok().stdout.splitlines()[-1].endswith(f"reloaded at the last cell: {'slurm_model' if attempt == 0 else 'none'}")


def test_a_module_only_the_notebooks_machine_has_is_shipped_by_value(ak):
    lib = ak.where / "only_here"
    lib.mkdir()
    write(lib / "onlyhere.py", "def g():\n    return 'v1'\n")
    # on the kernel's path only (after the pool started): the ranks' own import cannot find it, as on a node without the file
    ak.run(f"import sys; sys.path.insert(0, {str(lib)!r}); import onlyhere").ok()
    missing = ak.run("%%ddp\nimport importlib.machinery\nimportlib.machinery.PathFinder.find_spec('onlyhere') is None", timeout=60).ok()
    assert ak.value("list(_)") == [True] * 4  # no rank finds a file of it
    notice = (f"ddp_magic: autoreload: onlyhere ({os.path.realpath(lib / 'onlyhere.py')}) is not importable on ranks 0-3: shipped by value "
              "from the notebook's machine; edits to it reach them the same way")
    assert notice in missing.stdout, missing.stdout  # the cell that first offered it: every rank took it by value
    ak.run("%%ddp\nimport onlyhere\n(os.environ['SLURMD_NODENAME'], onlyhere.g())", timeout=60).ok()
    assert ak.value("list(_)") == [(n, "v1") for n in NODES]
    write(lib / "onlyhere.py", "def g():\n    return 'v2'\n")
    for attempt in range(2):
        ex = ak.run("%%ddp\n(os.environ['SLURMD_NODENAME'], onlyhere.g())", timeout=60).ok()
        assert ak.value("list(_)") == [(n, "v2") for n in NODES] and "shipped by value" not in ex.stdout
        status = ak.run("%ddp status").ok().stdout.splitlines()[-1]
        assert status.endswith(f"reloaded at the last cell: {'onlyhere' if attempt == 0 else 'none'}; shipped by value: onlyhere"), status
