"""How healing carries a donor's state: its tensors slotted out of the payload, bucketed by dtype, put back in place.

The tensors go by broadcasts on a group of the donor and the new ranks only (procs/rank_heal.py ``_send``), so the
survivors neither receive nor unpickle a model; the pickled part is the rest. Run for real by tests/kernel/test_heal.py.
"""
from __future__ import annotations

import pickle

import pytest

torch = pytest.importorskip("torch")

from ddp_magic.procs import rank_heal as H  # noqa: E402


def test_slots_take_every_tensor_out_and_fill_puts_them_back_where_they_were():
    state = {"model": {"w": torch.ones(2, 3), "b": torch.zeros(3)},
             "opt": {"state": {0: {"momentum_buffer": torch.full((2, 3), 2.0)}}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]},
             "step": 7}
    tensors: list = []
    slotted = H._slots(state, tensors)
    assert len(tensors) == 3 and not any(isinstance(v, torch.Tensor) for v in _leaves(slotted))
    assert len(pickle.dumps(slotted)) < 1000  # what every rank receives: no tensor data
    back = H._fill(pickle.loads(pickle.dumps(slotted)), [t.clone() for t in tensors])
    assert torch.equal(back["model"]["w"], state["model"]["w"]) and back["opt"]["param_groups"] == state["opt"]["param_groups"]
    assert torch.equal(back["opt"]["state"][0]["momentum_buffer"], torch.full((2, 3), 2.0)) and back["step"] == 7


def test_buckets_group_by_dtype_and_split_at_the_bucket_size(monkeypatch):
    monkeypatch.setattr(H, "BUCKET", 100)
    ts = [torch.ones(10), torch.ones(10, dtype=torch.int64), torch.ones(10), torch.ones(10), torch.ones(1, dtype=torch.int64)]
    buckets = H._buckets([H._Slot(i, t) for i, t in enumerate(ts)])
    assert sorted(map(sorted, buckets)) == [[0, 2], [1, 4], [3]]  # 40 + 40 bytes fit, a third float32 does not
    for b in buckets:
        assert len({ts[i].dtype for i in b}) == 1


def _leaves(tree):
    if isinstance(tree, dict):
        for v in tree.values():
            yield from _leaves(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from _leaves(v)
    else:
        yield tree
