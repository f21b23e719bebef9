"""A load's DCP reader (procs/rank_snapshot_reader.py): whole CPU tensors read straight into their targets, everything
else DCP's own way, the values the same either way. One process, no process group (DCP's single-process mode)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from ddp_magic.procs.rank_snapshot_reader import DirectReader  # noqa: E402


def _saved(tmp_path) -> dict:
    state = {"w": torch.randn(64, 33), "b": torch.arange(10, dtype=torch.int64), "h": torch.randn(5).to(torch.bfloat16),
             "flag": torch.tensor(True), "empty": torch.empty(0, 3), "extra": {"step": 7, "name": "run"}}
    dcp.save(state, checkpoint_id=str(tmp_path))
    return state


def test_whole_tensors_go_straight_into_their_targets_and_values_the_dcp_way(tmp_path) -> None:
    state = _saved(tmp_path)
    target = {k: torch.full_like(v, 0) if isinstance(v, torch.Tensor) else {"step": 0, "name": ""} for k, v in state.items()}
    reader = DirectReader(str(tmp_path))
    dcp.load(target, storage_reader=reader)
    for k, v in state.items():
        assert (torch.equal(target[k], v) and target[k].dtype == v.dtype) if isinstance(v, torch.Tensor) else target[k] == v, k
    assert reader.direct == 4, "every tensor with bytes read straight into its target (DCP reads nothing for an empty one)"


def test_what_the_direct_path_cannot_fill_goes_dcps_way_with_the_same_values(tmp_path) -> None:
    """Another dtype (DCP casts), a non-contiguous target (a transposed view), a part of a saved tensor (DCP narrows)."""
    state = _saved(tmp_path)
    wide = torch.zeros(33, 64).t()  # the shape of w, not contiguous
    target = {"w": wide, "b": torch.zeros(10, dtype=torch.float64), "h": torch.zeros(5, dtype=torch.bfloat16)}
    reader = DirectReader(str(tmp_path))
    dcp.load(target, storage_reader=reader)
    assert torch.equal(target["w"], state["w"]) and target["w"] is wide
    assert torch.equal(target["b"], state["b"].double()) and torch.equal(target["h"], state["h"])
    assert reader.direct == 1, "only h (same dtype, contiguous, whole) went straight"
