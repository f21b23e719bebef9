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


def test_a_snapshot_of_two_hosts_in_a_shared_folder_loads_back(box: cluster_box.Box, box_kernel, tmp_path) -> None:
    """The box's hosts share the machine's /tmp: a snapshot there is whole, and a new pool on both hosts takes it back."""
    setup = ("import torch, torch.distributed as dist\ntorch.manual_seed(0)\n"
             "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))\n"
             "opt = torch.optim.Adam(model.parameters(), lr=0.1)\n"
             "model(torch.randn(3, 4)).sum().backward()\nopt.step()\n")
    try:
        for attempt in range(2):
            box_kernel.run(POOL + setup, timeout=300).ok()
            box_kernel.run("%%ddp --out before\nmodel.module.weight.tolist()", timeout=120).ok()
            saved = box_kernel.run(f"%ddp save {tmp_path}/{attempt}", timeout=300).ok().stdout
            assert "model (module, replicated), opt (optimizer, replicated)" in saved, saved
            box_kernel.run("%ddp stop", timeout=60).ok()
            loaded = box_kernel.run(POOL.replace("%%ddp", f"%ddp load {tmp_path}/{attempt}").strip(), timeout=300).ok().stdout
            assert "saved by 2 ranks) into 2 ranks: model, opt, torch" in loaded.replace("dist, ", ""), loaded
            box_kernel.run("%%ddp --out after\nimport socket\n(socket.gethostname(), model.module.weight.tolist())", timeout=120).ok()
            assert box_kernel.value("[a[0] for a in after]") == ["n1", "n2"]
            assert box_kernel.value("[a[1] == b for a, b in zip(after, before)]") == [True, True]
            box_kernel.run("%ddp stop", timeout=60).ok()
    finally:
        box_kernel.run("%ddp stop", timeout=60)
