"""DTensors and FSDP2 in real %%ddp cells: the ranks send their shards, the kernel puts the global tensor together.

One kernel: first a pool of 2 (FSDP2 on gloo, Replicate, Partial, a state dict
saved and loaded into a plain module), then a pool of 4 with --mesh dp=2,tp=2.
"""
from __future__ import annotations

import pytest

from kernel_helper import Kernel

pytestmark = pytest.mark.kernel

FSDP_MODEL = """%%ddp -n 2
import torch, torch.nn as nn, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))  # 7 and 3 rows over 2 ranks: uneven shards
for layer in (model[0], model[2]):
    fully_shard(layer)
fully_shard(model)
mesh1 = init_device_mesh("cpu", (2,))
"""


@pytest.fixture(scope="module")
def k():
    kernel = Kernel()
    kernel.run("%load_ext ddp_magic\nimport torch, ddp_magic").ok()
    kernel.run(FSDP_MODEL, timeout=240).ok()
    yield kernel
    kernel.shutdown()


def test_fsdp2_weight_comes_back_as_one_tensor_equal_to_full_tensor(k: Kernel):
    for _ in range(2):  # the second run of the cell too
        ex = k.run("%%ddp --out w\nmodel[0].weight").ok()
        assert ex.result.startswith("ShardedResult (7, 5) float32 — Shard(0) on mesh")
        assert "dim0 0:4  rank 0" in ex.result and "dim0 4:7  rank 1" in ex.result
        assert "<table" in ex.displays[-1]["text/html"]
    k.run("%%ddp --out ft\nmodel[0].weight.full_tensor()").ok()
    assert k.value("type(w).__name__, tuple(w.shape), str(w.dtype), w.ranks") == ("ShardedResult", (7, 5), "torch.float32", [0, 1])
    assert k.value("torch.equal(w.full(), ft[0]), torch.equal(ft[0], ft[1])") == (True, True)
    assert k.value("tuple(w.local(0).shape), tuple(w.local(1).shape), str(w.placements)") == ((4, 5), (3, 5), "(Shard(dim=0),)")


def test_replicate_gives_one_copy(k: Kernel):
    k.run("%%ddp --out rep\ndistribute_tensor(torch.arange(12.).reshape(3, 4), mesh1, [Replicate()])").ok()
    assert k.value("type(rep).__name__, torch.equal(rep.full(), torch.arange(12.).reshape(3, 4))") == ("ShardedResult", True)
    assert k.value("torch.equal(rep.local(0), rep.local(1)), tuple(rep.full().shape)") == (True, (3, 4))


def test_partial_is_reduced_like_full_tensor(k: Kernel):
    cell = "%%ddp --out {}\np = DTensor.from_local(torch.full((2, 3), dist.get_rank() + 1.0), mesh1, [Partial({})])\n{}"
    k.run(cell.format("part", "", "p")).ok()
    k.run(cell.format("ref", "", "p.full_tensor()")).ok()
    assert k.value("torch.equal(part.full(), ref[0]), part.full()[0, 0].item()") == (True, 3.0)
    k.run(cell.format("pmax", "'max'", "p")).ok()
    assert k.value("pmax.full()[0, 0].item()") == 2.0


def test_state_dict_to_a_plain_checkpoint_and_module(k: Kernel, tmp_path):
    path = tmp_path / "model.pt"
    k.run("%%ddp --out sd\nmodel.state_dict()").ok()
    assert k.value("sorted(type(v).__name__ for v in sd.values())") == ["ShardedResult"] * 4
    k.run(f"ddp_magic.save(sd, {str(path)!r})").ok()
    k.run("%%ddp --out y\ntorch.manual_seed(1)\nmodel(torch.randn(4, 5)).detach()").ok()
    k.run(
        "plain = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))\n"
        f"plain.load_state_dict(torch.load({str(path)!r}, weights_only=True))\n"
        "torch.manual_seed(1)\nout = plain(torch.randn(4, 5)).detach()"
    ).ok()
    assert k.value("torch.allclose(out, y[0]), torch.allclose(out, y[1])") == (True, True)


def test_plain_results_and_dtensor_mixes_are_unchanged(k: Kernel):
    ex = k.run("%%ddp\ntorch.ones(2) * dist.get_rank()").ok()
    assert ex.result.startswith("RankResults(2 ranks)")
    ex = k.run("%%ddp\nmodel[0].weight if dist.get_rank() == 0 else None").ok()
    assert "RankResults" in ex.result and "shard of a DTensor" in ex.result
    assert "were not put together: some ranks returned a DTensor and others did not" in ex.stdout  # a notice: stdout


def test_two_d_mesh_from_the_option(k: Kernel):
    bad = k.run("%%ddp -n 4 --mesh dp=3,tp=2\n1")
    assert bad.error is not None and "--mesh dp=3,tp=2 makes 6 ranks but -n is 4" in bad.error[1] and "\n" not in bad.error[1]
    bad = k.run("%%ddp -n 4 --mesh dp2\n1")
    assert bad.error is not None and "is not NAME=SIZE" in bad.error[1]
    setup = "import torch, torch.distributed as dist\nfrom torch.distributed.tensor import Shard, distribute_tensor\n"
    k.run("%%ddp -n 4 --mesh dp=2,tp=2\n" + setup, timeout=240).ok()
    k.run("%%ddp --out names\n(mesh.mesh_dim_names, tuple(mesh.mesh.shape), mesh.device_type)").ok()
    assert k.value("[tuple(v) for v in names]") == [(("dp", "tp"), (2, 2), "cpu")] * 4
    for _ in range(2):
        ex = k.run("%%ddp --out g\ndistribute_tensor(torch.arange(48.).reshape(6, 8), mesh, [Shard(0), Shard(1)])").ok()
        assert ex.result.splitlines()[0] == "ShardedResult (6, 8) float32 — Shard(0), Shard(1) on mesh dp=2 × tp=2 (cpu)"
        assert k.value("torch.equal(g.full(), torch.arange(48.).reshape(6, 8))") is True
    assert k.value("torch.equal(g.local(3), torch.arange(48.).reshape(6, 8)[3:, 4:])") is True
    ex = k.run("%%ddp --out tp\ndistribute_tensor(torch.arange(8.), mesh['tp'], [Shard(0)])").ok()  # each dp replica's tp sub-mesh
    assert "the same tensor on the sub-mesh of ranks 2-3 too: equal copies" in ex.result
    assert k.value("torch.equal(tp.full(), torch.arange(8.)), tp.ranks, tp.copies") == (True, [0, 1], [(2, 3)])
    assert k.value("torch.equal(tp.local(3), torch.arange(4., 8.))") is True
    differ = "distribute_tensor(torch.arange(8.) * (dist.get_rank() // 2), mesh['tp'], [Shard(0)], src_data_rank=None)"
    ex = k.run("%%ddp\n" + differ).ok()
    assert "RankResults(4 ranks)" in ex.result and "sub-meshes (ranks 0-1 / 2-3) that hold different values" in ex.stdout
    env = k.run("%ddp_env").ok()
    assert "device mesh: dp=2 × tp=2: a DeviceMesh named `mesh` on every rank (dim names dp, tp)" in env.result
