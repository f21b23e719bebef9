"""Notebook tensors reach the ranks through /dev/shm once (real kernel): changes seen, unchanged ones not re-sent, scatter, writes."""
from __future__ import annotations

import os
import signal

import pytest

from conftest import wait_until
from ddp_magic.wire import shm
from kernel_helper import Kernel

pytestmark = pytest.mark.kernel

SESSION = "get_ipython().magics_manager.registry['DDPMagics'].session"
MIB = 1 << 20


def sent(k: Kernel) -> int:
    """Every byte the kernel sent the ranks for notebook values (files written once, plus the pickles per rank)."""
    return k.value(f"{SESSION}.data.sent")


def data_files(k: Kernel) -> list:
    return shm.pool_files(k.value(f"{SESSION}.data.prefix"))


def test_a_tensor_changed_in_the_notebook_between_cells_is_seen_changed(ddp2: Kernel) -> None:
    ddp2.run("import torch\nx = torch.zeros(1 << 20)").ok()  # 4 MiB: through /dev/shm
    ddp2.run("%%ddp\nfloat(x.sum())").ok()
    assert ddp2.value("list(_)") == [0.0, 0.0]
    ddp2.run("x += 1").ok()  # in place: same object, a new version
    ddp2.run("%%ddp\nfloat(x.sum())").ok()
    assert ddp2.value("list(_)") == [float(1 << 20)] * 2
    ddp2.run("x = torch.full((1 << 20,), 2.0)").ok()  # a new object
    ddp2.run("%%ddp\nfloat(x.sum())").ok()
    assert ddp2.value("list(_)") == [float(2 << 20)] * 2
    ddp2.run("import numpy as np\na = np.zeros(1 << 20)").ok()
    ddp2.run("%%ddp\nfloat(a.sum())").ok()
    ddp2.run("a[3] = 5").ok()  # numpy: no version counter, the bytes are compared
    ddp2.run("%%ddp\nfloat(a.sum())").ok()
    assert ddp2.value("list(_)") == [5.0, 5.0]


def test_an_unchanged_tensor_is_not_sent_again(ddp2: Kernel) -> None:
    ddp2.run("import torch\ny = torch.ones(1 << 21)\nys = {'y': y, 'n': 3}").ok()  # 8 MiB, also inside a dict
    before = sent(ddp2)
    ddp2.run("%%ddp\nfloat(y.sum()) + ys['n']").ok()
    first = sent(ddp2)
    assert first - before >= 8 * MIB
    for _ in range(2):  # the same cell again, and again
        ddp2.run("%%ddp\nfloat(y.sum()) + ys['n']").ok()
        assert ddp2.value("list(_)") == [float(1 << 21) + 3] * 2
    assert sent(ddp2) - first < 64 * 1024, "only the pickles naming the file went again"


def test_scatter_gives_each_rank_its_slice_and_the_slices_cover_the_tensor_once(ddp2: Kernel) -> None:
    ddp2.run("import ddp_magic, torch\nz = torch.arange(1001 * 1024, dtype=torch.float64).reshape(1001, 1024)\nzs = ddp_magic.scatter(z)").ok()
    rows = "%%ddp\n(tuple(zs.shape), (zs[:, 0] / 1024).long().tolist())"
    for _ in range(2):  # the second run maps the same file again
        ddp2.run(rows).ok()
        shards = ddp2.value("[tuple(v) for v in _]")
        assert [s for s, _ in shards] == [(501, 1024), (500, 1024)], "tensor_split: the first shard is one row longer"
        assert shards[0][1] + shards[1][1] == list(range(1001)), "every row once, in rank order"
    ddp2.run("%%ddp --scatter z\n(tuple(z.shape), float(z[0, 0]))").ok()
    assert ddp2.value("[tuple(v) for v in _]") == [((501, 1024), 0.0), ((500, 1024), 501 * 1024.0)]
    ddp2.run("zc = ddp_magic.scatter(z, dim=1)").ok()
    ddp2.run("%%ddp\n(tuple(zc.shape), float(zc[0, 0]))").ok()
    assert ddp2.value("[tuple(v) for v in _]") == [((1001, 512), 0.0), ((1001, 512), 512.0)]
    ex = ddp2.run("%%ddp --scatter nothing_here\n1")
    assert ex.error is not None and "no notebook variable 'nothing_here'" in ex.error[1]


def test_a_rank_writing_to_a_shipped_tensor_changes_only_its_own_copy(ddp2: Kernel) -> None:
    ddp2.run("import torch\nw = torch.zeros(1 << 20)").ok()
    write = "%%ddp\nif dist.get_rank() == 0:\n    w[:] = 7\ndist.barrier()\nfloat(w.sum())"
    for _ in range(2):  # each cell maps the notebook's value afresh
        ddp2.run(write).ok()
        assert ddp2.value("list(_)") == [7.0 * (1 << 20), 0.0], "rank 1's view is untouched"
        assert ddp2.value("float(w.sum())") == 0.0, "the notebook's tensor is untouched"


def test_stop_removes_the_data_files(ddp2: Kernel) -> None:
    ddp2.run("import torch\nv = torch.ones(1 << 20)").ok()
    ddp2.run("%%ddp\nfloat(v.sum())").ok()
    assert data_files(ddp2), "v is in /dev/shm"
    ddp2.run("%ddp stop").ok()
    assert data_files(ddp2) == []


def test_a_killed_kernel_leaves_no_data_files() -> None:
    k = Kernel()
    try:
        k.run("%load_ext ddp_magic").ok()
        k.run("import torch\nv = torch.ones(1 << 20)").ok()
        k.run("%%ddp -n 2\nfloat(v.sum())", timeout=180).ok()
        prefix = k.value(f"{SESSION}.data.prefix")
        assert shm.pool_files(prefix)
        os.kill(k.pid, signal.SIGKILL)
        assert wait_until(lambda: shm.pool_files(prefix) == [], 15), "the template removes a dead kernel's files"
    finally:
        k.shutdown()
