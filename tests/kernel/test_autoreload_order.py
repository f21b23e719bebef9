"""Autoreload in the user's order (docs/autoreload.md): the module is imported first, autoreload is turned on later.

Real kernels, real 2-rank pools, a DDP model in a ``model.py`` of the notebook's directory whose ``forward`` is edited.
The user imports the model in a ``%%ddp`` cell, decides to edit it, turns autoreload on (``%ddp autoreload``, or the
kernel's own ``%autoreload 2``), saves the edit and runs the next cell: that cell runs the new ``forward`` on every rank,
on the same object (same ``id()``, parameters and optimizer state), and says once what it reloaded. Each order is
played twice with a kernel restart between (a fresh pool, the same steps), and once on a kept pool that a restarted
kernel attached and ran a cell on before turning autoreload on (its ranks told the previous kernel about ``model``). Every cell after an edit runs twice.
"""
from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from kernel_helper import Kernel
from test_keep import kernel as keep_kernel
from test_keep import runtime  # noqa: F401  (the fixture, by name in this module)
from test_keep import stop_and_check

pytestmark = pytest.mark.kernel

MODEL = '''
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, x):
        return self.w * x * 1
'''
IMPORT = ("%%ddp\nimport model\nnet = DDP(model.Net())\nopt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)\n"
          "net(torch.ones(1)).sum().backward(); opt.step(); opt.zero_grad()\n"
          "before = (id(net), id(opt), opt.state[net.module.w]['momentum_buffer'].clone(), net.module.w.detach().clone())\n"
          "round(float(net(torch.ones(1)) / net.module.w), 6)")
AFTER = ("%%ddp\nsame = (id(net), id(opt)) == before[:2] and torch.equal(opt.state[net.module.w]['momentum_buffer'], before[2])\n"
         "(round(float(net(torch.ones(1)) / net.module.w), 6), same, torch.equal(net.module.w, before[3]))")
POOL = "%%ddp -n 2\nimport torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP"


def write(path: Path, text: str) -> None:
    """A save from an editor: the new text, and an mtime that a coarse filesystem clock still tells apart."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(textwrap.dedent(text))
    if path.stat().st_mtime_ns == before:
        os.utime(path, ns=(before + 1_000_000, before + 1_000_000))


RELOADED = "ddp_magic: autoreload: reloaded model (model.py) on 2 ranks"  # the file under the notebook's directory: its relative path


def edit_and_check(k: Kernel, where: Path, factor: int, turn_on: str) -> None:
    """``turn_on`` after the import, then the edit (forward multiplies by ``factor``); the next cell runs it, same object."""
    k.run(turn_on).ok()
    write(where / "model.py", MODEL.replace("x * 1", f"x * {factor}"))
    for attempt in range(2):
        ex = k.run(AFTER, timeout=120).ok()
        assert k.value("list(_)") == [(float(factor), True, True)] * 2, ex.stdout
        notices = [line for line in ex.stdout.splitlines() if "autoreload: reloaded" in line]
        assert notices == ([RELOADED] if attempt == 0 else []), ex.stdout  # one line, and none when nothing reloaded


def import_model(k: Kernel, where: Path) -> None:
    write(where / "model.py", MODEL)
    ex = k.run(IMPORT, timeout=120).ok()
    assert k.value("list(_)") == [1.0, 1.0] and "autoreload" not in ex.stdout, ex.stdout


@pytest.fixture
def where(tmp_path) -> Iterator[Path]:
    yield tmp_path


@pytest.mark.parametrize("turn_on", ["%ddp autoreload", "%load_ext autoreload\n%autoreload 2"])
def test_turned_on_after_the_import_the_next_cell_runs_the_edit(where: Path, turn_on: str) -> None:
    """import → turn on → edit → run, twice, with a kernel restart between: the first cell after the edit runs it."""
    k = Kernel()
    try:
        for round_ in range(2):
            if round_:
                k.km.restart_kernel(now=True)
                k.collect(1.0)
            k.run(f"import os; os.chdir({str(where)!r})").ok()
            k.run("%load_ext ddp_magic").ok()
            k.run(POOL, timeout=180).ok()
            import_model(k, where)
            edit_and_check(k, where, 2, turn_on)
            edit_and_check(k, where, 3, "pass")  # a later edit, autoreload on since
    finally:
        k.shutdown()


def test_a_kept_pool_attached_by_a_restarted_kernel_follows_the_edit(runtime: str, where: Path) -> None:  # noqa: F811
    """The previous kernel had autoreload on and its ranks told it about ``model``; the kernel that attaches turns it on."""
    k = keep_kernel(runtime)
    try:
        k.run(f"import os; os.chdir({str(where)!r})").ok()
        k.run(POOL, timeout=180).ok()
        k.run("%ddp autoreload").ok()
        import_model(k, where)
        assert "kept pool" in k.run("%ddp keep").ok().stdout
        k.km.restart_kernel(now=True)
        k.collect(1.0)
        k.run("%load_ext ddp_magic").ok()
        k.run(f"import os; os.chdir({str(where)!r})").ok()
        assert "attached the kept pool" in k.run("%ddp attach", timeout=120).ok().stdout
        k.run("%%ddp\nround(float(net(torch.ones(1)) / net.module.w), 6)", timeout=120).ok()  # a cell first, autoreload still off here
        assert k.value("list(_)") == [1.0, 1.0]
        edit_and_check(k, where, 2, "%ddp autoreload")
        write(where / "model.py", MODEL.replace("x * 1", "x * 4"))  # and a background cell after the next edit
        k.run(AFTER.replace("%%ddp", "%%ddp --bg --out job"), timeout=120).ok()
        assert k.value("job.wait(120)") is True
        assert k.value("list(job.result())") == [(4.0, True, True)] * 2
        stop_and_check(k, runtime)
    finally:
        k.shutdown()
