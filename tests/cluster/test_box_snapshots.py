"""A snapshot across hosts (the cluster in a box): each host's /dev/shm is its own, so a save there is a folder not every
node sees, and it stops before writing, naming the ranks that cannot see it (it would have been split silently)."""
from __future__ import annotations

import box_fixtures
import cluster_box
import pytest

box = box_fixtures.box  # the fixtures, by name in this module
box_kernel = box_fixtures.box_kernel

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

POOL = '%%ddp --slurm --nodes 2 --ntasks-per-node 1 --slurm-args "--exclude=n3"\n'


def test_a_save_to_a_folder_one_node_cannot_see_is_refused_before_writing(box: cluster_box.Box, box_kernel) -> None:
    try:
        box_kernel.run(POOL + "import torch\nmodel = torch.nn.Linear(2, 2)\n", timeout=300).ok()
        for attempt in range(2):
            refused = box_kernel.run(f"%ddp save /dev/shm/ddp-snapshot-{attempt}", timeout=300)
            assert refused.error is not None, refused.stdout
            assert f"rank 1 does not see /dev/shm/ddp-snapshot-{attempt} as rank 0 does: a snapshot needs a folder every node shares" \
                in refused.error[1], refused.error
            box_kernel.run("%%ddp\nmodel.weight.shape", timeout=120).ok()  # the pool goes on
    finally:
        box_kernel.run("%ddp stop", timeout=60)
