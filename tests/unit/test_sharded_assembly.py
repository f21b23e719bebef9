"""ShardedResult from synthetic shard metadata (no processes): Shard(0), Shard(1), uneven, Replicate, 2-D meshes, Partial.

The pieces are cut here with torch.chunk, the rule DTensor uses, independently of
kernel/results/sharded.py's own block arithmetic, and put back together by it.
"""
from __future__ import annotations

import itertools
from typing import Any, Dict, List, Sequence, Tuple

import pytest
import torch

from ddp_magic.kernel.results.combine import PerRank, combine, full_values, save
from ddp_magic.kernel.results.sharded import ShardedResult, ShardMismatch, shard_block
from ddp_magic.wire.sharded import ShardPiece

Placement = Tuple[Any, ...]


def _chunk(t: torch.Tensor, dim: int, k: int, i: int) -> torch.Tensor:
    """torch.chunk's i-th of k along dim, empty where it makes fewer chunks (uneven: the last ranks get nothing)."""
    chunks = torch.chunk(t, k, dim=dim) if t.shape[dim] else ()
    if i < len(chunks):
        return chunks[i]
    shape = list(t.shape)
    shape[dim] = 0
    return t.new_empty(shape)


def pieces(
    full: torch.Tensor, mesh_shape: Sequence[int], placements: Sequence[Placement], names: Any = None, partial_parts: Any = None, first_rank: int = 0
) -> List[ShardPiece]:
    """Every rank's piece of ``full`` as a DTensor with these placements would hold it (row-major ranks)."""
    out = []
    coords = list(itertools.product(*[range(s) for s in mesh_shape]))
    for rank, coord in enumerate(coords):
        local = full if partial_parts is None else partial_parts[rank]
        for mesh_dim, p in enumerate(placements):
            if p[0] == "shard":
                local = _chunk(local, p[1], mesh_shape[mesh_dim], coord[mesh_dim])
        meta: Dict[str, Any] = {
            "shape": tuple(full.shape), "stride": tuple(full.stride()), "dtype": str(full.dtype).replace("torch.", ""),
            "requires_grad": False, "mesh_shape": tuple(mesh_shape), "mesh_dims": names, "mesh_ranks": tuple(range(first_rank, first_rank + len(coords))),
            "device_type": "cpu", "placements": tuple(placements), "coord": coord, "rank": first_rank + rank,
        }
        out.append(ShardPiece(local.clone(), meta))
    return out


def test_shard0_even():
    full = torch.arange(32.0).reshape(8, 4)
    r = ShardedResult(pieces(full, [2], [("shard", 0)]))
    assert torch.equal(r.full(), full)
    assert r.shape == torch.Size([8, 4]) and r.dtype == torch.float32
    assert torch.equal(r.local(1), full[4:])
    assert r.block(1) == ((4, 0), (4, 4))
    assert r.mesh.shape == (2,) and r.ranks == [0, 1]


def test_shard1():
    full = torch.arange(24).reshape(3, 8)
    r = ShardedResult(pieces(full, [4], [("shard", 1)]))
    assert torch.equal(r.full(), full) and r.full().dtype == torch.int64
    assert torch.equal(r.local(3), full[:, 6:])


@pytest.mark.parametrize("rows, k", [(5, 4), (6, 4), (7, 3), (1, 4), (0, 2), (9, 2)])
def test_uneven_shards_follow_torch_chunk(rows, k):
    full = torch.randn(rows, 3)
    ps = pieces(full, [k], [("shard", 0)])
    r = ShardedResult(ps)
    assert torch.equal(r.full(), full)
    assert [tuple(p.local.shape) for p in ps] == [r.block(i)[1] for i in range(k)]


@pytest.mark.parametrize("size", range(0, 13))
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_blocks_agree_with_torchs_own_rule(size, k):
    from torch.distributed.tensor import Shard

    for i in range(k):
        got = shard_block((size,), (k,), (("shard", 0),), (i,))
        want_size, want_off = Shard.local_shard_size_and_offset(size, k, i)
        assert got == ((int(want_off),), (int(want_size),))


def test_replicate_gives_one_copy():
    full = torch.randn(4, 4)
    r = ShardedResult(pieces(full, [2], [("replicate",)]))
    assert torch.equal(r.full(), full) and r.full().shape == (4, 4)
    assert torch.equal(r.local(0), r.local(1))


def test_two_d_mesh_shard0_by_shard1():
    full = torch.arange(48.0).reshape(6, 8)
    r = ShardedResult(pieces(full, [2, 2], [("shard", 0), ("shard", 1)], names=("dp", "tp")))
    assert torch.equal(r.full(), full)
    assert torch.equal(r.local(2), full[3:, :4]) and torch.equal(r.local(1), full[:3, 4:])
    assert r.mesh.dim_names == ("dp", "tp") and r.mesh.text() == "dp=2 × tp=2 (cpu)"


def test_two_d_mesh_uneven_and_same_dim_twice():
    full = torch.randn(7, 5)
    assert torch.equal(ShardedResult(pieces(full, [2, 3], [("shard", 0), ("shard", 1)])).full(), full)
    assert torch.equal(ShardedResult(pieces(full, [2, 2], [("shard", 0), ("shard", 0)])).full(), full)


def test_two_d_mesh_replicate_by_shard():
    full = torch.randn(4, 6)
    r = ShardedResult(pieces(full, [2, 2], [("replicate",), ("shard", 1)]))
    assert torch.equal(r.full(), full)


@pytest.mark.parametrize("op, reduce", [("sum", lambda ps: sum(ps)), ("avg", lambda ps: sum(ps) / len(ps)), ("max", lambda ps: torch.stack(ps).amax(0))])
def test_partial_is_reduced_with_its_own_op(op, reduce):
    parts = [torch.randn(4, 3) for _ in range(2)]
    r = ShardedResult(pieces(torch.empty(4, 3), [2], [("partial", op)], partial_parts=parts))
    assert torch.allclose(r.full(), reduce(parts))


def test_partial_by_shard_on_two_d_mesh():
    parts = [torch.randn(4, 6) for _ in range(4)]  # rank r holds its partial of the whole; tp shards it
    r = ShardedResult(pieces(torch.empty(4, 6), [2, 2], [("partial", "sum"), ("shard", 1)], partial_parts=parts))
    want = torch.cat([parts[0][:, :3] + parts[2][:, :3], parts[1][:, 3:] + parts[3][:, 3:]], dim=1)
    assert torch.allclose(r.full(), want)


def test_refusals_name_the_reason():
    full = torch.randn(4, 4)
    ps = pieces(full, [2], [("shard", 0)])
    with pytest.raises(ShardMismatch, match="a sub-mesh or a missing rank"):
        ShardedResult(ps[:1])
    other = pieces(torch.randn(6, 4), [2], [("shard", 0)])
    with pytest.raises(ShardMismatch, match="global shape"):
        ShardedResult([ps[0], other[1]])
    strided = pieces(full, [2], [("other", "_StridedShard(dim=0, sf=2)")])
    with pytest.raises(ShardMismatch, match="not assembled in the kernel"):
        ShardedResult(strided)


def test_combine_a_state_dict_of_shards_and_alike_entries():
    w, b = torch.randn(6, 4), torch.randn(6)
    pw, pb = pieces(w, [2], [("shard", 0)]), pieces(b, [2], [("shard", 0)])
    values = [{"w": pw[r], "b": pb[r], "step": 3, "loss": float(r)} for r in range(2)]
    notes: List[str] = []
    sd = combine(values, notes)
    assert not notes and list(sd) == ["w", "b", "step", "loss"]
    assert isinstance(sd["w"], ShardedResult) and torch.equal(sd["w"].full(), w)
    assert sd["step"] == 3 and isinstance(sd["loss"], PerRank) and sd["loss"] == [0.0, 1.0]
    assert torch.equal(full_values(sd)["b"], b)


def test_combine_leaves_plain_values_and_says_why_it_did_not():
    assert combine([1, 2], []) is None and combine([torch.ones(2), torch.ones(2)], []) is None
    ps = pieces(torch.randn(4, 4), [2], [("shard", 0)])
    notes: List[str] = []
    assert combine([{"w": ps[0]}, {"w": None}], notes) is None
    assert "at ['w']" in notes[0] and "some ranks returned a DTensor" in notes[0] and "each rank's value is returned" in notes[0]


def test_save_writes_full_tensors_loadable_without_ddp_magic(tmp_path):
    w = torch.randn(6, 4)
    sd = combine([{"w": p} for p in pieces(w, [2], [("shard", 0)])], [])
    save(sd, tmp_path / "a.pt")
    torch.save(sd, tmp_path / "b.pt")  # a ShardedResult pickles as its global tensor
    for name in ("a.pt", "b.pt"):
        loaded = torch.load(tmp_path / name, weights_only=True)
        assert type(loaded["w"]) is torch.Tensor and torch.equal(loaded["w"], w)


def test_sub_meshes_holding_the_same_tensor_give_one_result_with_copies():
    w = torch.randn(5, 4)
    values = pieces(w, [2], [("shard", 0)]) + pieces(w, [2], [("shard", 0)], first_rank=2)  # tp sub-meshes of dp=2 x tp=2
    r = combine(values, [])
    assert isinstance(r, ShardedResult) and torch.equal(r.full(), w)
    assert r.ranks == [0, 1] and r.copies == [(2, 3)] and torch.equal(r.local(3), w[3:])
    notes: List[str] = []
    other = pieces(w, [2], [("shard", 0)]) + pieces(w + 1, [2], [("shard", 0)], first_rank=2)
    assert combine(other, notes) is None
    assert "2 sub-meshes (ranks 0-1 / 2-3) that hold different values" in notes[0]
