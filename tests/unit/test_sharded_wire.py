"""A DTensor through the result path (wire/transfer + wire/sharded), its picture (ui/sharded), and --mesh's validation.

The DTensor test uses a one-rank gloo group in this process (no other process):
what travels is the local shard plus metadata, never a collective.
"""
from __future__ import annotations

import pytest
import torch

from ddp_magic.errors import PlanError
from ddp_magic.kernel.results.combine import combine
from ddp_magic.kernel.results.sharded import ShardedResult
from ddp_magic.plan.spec import MESH_ENV, PoolSpec, parse_mesh
from ddp_magic.procs import mesh as rank_mesh
from ddp_magic.ui import sharded as view
from ddp_magic.wire import sharded, transfer

from test_sharded_assembly import pieces


@pytest.fixture(scope="module")
def one_rank_group(tmp_path_factory):
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path_factory.mktemp("pg") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_dtensor_travels_as_its_shard_and_metadata(one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    full = torch.randn(5, 3, requires_grad=True)
    dt = distribute_tensor(full.detach(), mesh, [Shard(1)])
    value = {"w": dt, "plain": torch.ones(2)}
    packed = transfer.pack(value, shm_dir=None)
    back = transfer.unpack(packed)
    piece = back["w"]
    assert isinstance(piece, sharded.ShardPiece) and type(back["plain"]) is torch.Tensor
    m = piece.meta
    assert (m["shape"], m["dtype"], m["mesh_shape"], m["mesh_dims"], m["placements"], m["coord"], m["rank"]) == (
        (5, 3), "float32", (1,), ("dp",), (("shard", 1),), (0,), 0
    )
    assert torch.equal(piece.local, full.detach())
    assert "Shard(1)" in repr(piece) and "rank 0" in repr(piece)
    r = combine([back], [])
    assert isinstance(r["w"], ShardedResult) and torch.equal(r["w"].full(), full.detach())
    assert r["w"].placements == (Shard(1),)
    rep = transfer.unpack(transfer.pack(distribute_tensor(full.detach(), mesh, [Replicate()]), shm_dir=None))
    assert rep.meta["placements"] == (("replicate",),)


def test_plain_tensors_keep_their_fast_path():
    assert sharded.reduce_dtensor(torch.ones(3)) is None
    assert sharded.is_dtensor(torch.nn.Parameter(torch.ones(1))) is False


def test_the_picture_names_who_holds_which_block():
    full = torch.arange(48.0).reshape(6, 8)
    r = ShardedResult(pieces(full, [2, 2], [("shard", 0), ("shard", 1)], names=("dp", "tp")))
    assert view.text(r) == (
        "ShardedResult (6, 8) float32 — Shard(0), Shard(1) on mesh dp=2 × tp=2 (cpu)\n"
        "            dim1 0:4  dim1 4:8\n"
        "  dim0 0:3  rank 0    rank 1\n"
        "  dim0 3:6  rank 2    rank 3"
    )
    assert repr(r) == view.text(r)
    html = r._repr_html_()
    assert "<table" in html and "rank 3" in html and "dp=2 × tp=2" in html


def test_the_picture_of_uneven_replicated_and_partial_results():
    uneven = ShardedResult(pieces(torch.randn(5), [4], [("shard", 0)]))
    assert view.text(uneven).splitlines()[1:] == [
        "  dim0 0:2  rank 0", "  dim0 2:4  rank 1", "  dim0 4:5  rank 2", "  (uneven: rank 3 holds an empty shard)"
    ]
    rep = ShardedResult(pieces(torch.randn(4, 2), [2], [("replicate",)]))
    assert "ranks 0-1" in view.text(rep) and "Replicate()" in view.text(rep)
    part = ShardedResult(pieces(torch.empty(2, 2), [2], [("partial", "sum")], partial_parts=[torch.ones(2, 2)] * 2))
    assert "ranks 0+1" in view.text(part) and "Partial(sum): the ranks of a block are reduced by .full()" in view.text(part)


@pytest.mark.parametrize(
    "text, words",
    [
        ("dp=2,tp", "'tp' is not NAME=SIZE"),
        ("dp=x", "'dp=x' is not NAME=SIZE"),
        ("dp=0,tp=4", "'dp=0' is not NAME=SIZE with a size of 1 or more"),
        ("dp=2,dp=2", "a dim name appears twice"),
        ("dp=2,tp=3", "--mesh dp=2,tp=3 makes 6 ranks but -n is 4: give sizes that multiply to 4, or --mesh none"),
    ],
)
def test_mesh_errors_are_one_line(text, words):
    with pytest.raises(PlanError) as e:
        PoolSpec.from_options(4, mesh=text)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_mesh_option_reaches_the_rank_env():
    spec = PoolSpec.from_options(4, mesh="dp=2, tp=2")
    assert spec.mesh == (("dp", 2), ("tp", 2)) and spec.env == {MESH_ENV: "dp=2,tp=2"}
    assert MESH_ENV == rank_mesh.MESH_ENV and rank_mesh.dims(spec.env[MESH_ENV]) == [("dp", 2), ("tp", 2)]
    assert spec.with_options(mesh="none").mesh == () and parse_mesh("") == ()
    assert spec.with_options(nproc=2, mesh="dp=2").changes_from(spec) == ["-n 4 → 2", "mesh dp=2,tp=2 → dp=2"]
    with pytest.raises(PlanError, match="leave out --no-init"):
        PoolSpec.from_options(2, mesh="dp=2", init=False)
    with pytest.raises(PlanError, match="makes 4 ranks but -n is 2"):
        spec.with_options(nproc=2)


def test_ddp_env_shows_the_mesh():
    from ddp_magic.plan.plan import make_plan
    from ddp_magic.ui.report import plan_report

    report = plan_report(make_plan(PoolSpec.from_options(4, mesh="dp=2,tp=2", backend="gloo"), strict=False))
    assert "✓ device mesh: dp=2 × tp=2: a DeviceMesh named `mesh` on every rank (dim names dp, tp)" in repr(report)
    assert "device mesh" not in repr(plan_report(make_plan(PoolSpec(2, backend="gloo"), strict=False)))


def test_a_bad_mesh_on_the_magic_line_is_a_one_line_usage_error():
    from types import SimpleNamespace

    from ddp_magic.errors import UsageError
    from ddp_magic.magics import DDPMagics

    m = DDPMagics(None)
    m.shell = SimpleNamespace(user_ns={})  # type: ignore[assignment]
    for line, words in [("-n 4 --mesh dp=3,tp=2", "--mesh dp=3,tp=2 makes 6 ranks but -n is 4"), ("-n 2 --mesh dp:2", "'dp:2' is not NAME=SIZE")]:
        with pytest.raises(UsageError) as e:
            m.ddp(line, "1")
        assert words in str(e.value) and "\n" not in str(e.value)
    assert m.session.pool is None  # nothing started
