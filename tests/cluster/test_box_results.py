"""A big result from another host (the cluster in a box): it has no /dev/shm to take, so it crosses the control channel,
over TLS, out of band (the rank's relay encrypts it from the tensor's memory, the kernel's relay decrypts it into the
memory the tensor keeps). Every byte arrives, rank by rank, each cell twice; and a small result after it still does."""
from __future__ import annotations

import box_fixtures
import cluster_box
import pytest

box = box_fixtures.box  # the fixtures, by name in this module
box_kernel = box_fixtures.box_kernel

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

POOL = '%%ddp --slurm --nodes 2 --ntasks-per-node 1 --slurm-args "--exclude=n3"\n'
SETUP = """
import socket, torch, torch.distributed as dist
t = torch.arange(20 << 20, dtype=torch.int32) * (dist.get_rank() + 1)  # 80 MiB a rank (int32: every value exact)
"""
LAST = float((20 << 20) - 1)
CHECK = "[(len(v), float(v[-1]), bool((v[1:] - v[:-1]).eq(v[1]).all())) for v in {}]"


def test_big_results_from_each_host_arrive_whole_over_tls(box: cluster_box.Box, box_kernel) -> None:
    try:
        box_kernel.run(POOL + SETUP, timeout=300).ok()
        for _attempt in range(2):
            # each rank's own value, in its DONE (a tuple: sent as it is, its tensor out of band)
            box_kernel.run("%%ddp\n(socket.gethostname(), t)", timeout=300).ok()
            box_kernel.run("r = _").ok()  # each check below is a cell of its own, which sets _
            assert box_kernel.value("[v[0] for v in r]") == ["n1", "n2"]
            assert box_kernel.value(CHECK.format("[v[1] for v in r]")) == [(20 << 20, LAST, True), (20 << 20, 2 * LAST, True)]
            # a tensor of the same shape on every rank: gathered on rank 0 (n1), then one RESULT of 160 MiB to the kernel
            box_kernel.run("%%ddp\nt", timeout=300).ok()
            box_kernel.run("r = _").ok()
            assert box_kernel.value(CHECK.format("r")) == [(20 << 20, LAST, True), (20 << 20, 2 * LAST, True)]
            box_kernel.run("%%ddp\ntorch.ones(2) * dist.get_rank()", timeout=120).ok()
            box_kernel.run("r = _").ok()
            assert box_kernel.value("[v.tolist() for v in r]") == [[0.0, 0.0], [1.0, 1.0]], "a small result after the big ones"
    finally:
        box_kernel.run("%ddp stop", timeout=60)
