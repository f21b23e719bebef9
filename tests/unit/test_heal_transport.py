"""How healing carries a donor's state: its tensors slotted out of the payload, bucketed by dtype, put back in place;
or written once into a private file of the pool in /dev/shm and copied out by each new rank.

The tensors go on a group of the donor and the new ranks only (procs/rank_heal_send.py), so the survivors neither
receive nor unpickle a model; the pickled part is the rest. Run for real by tests/kernel/test_heal.py.
"""
from __future__ import annotations

import os
import pickle

import pytest

torch = pytest.importorskip("torch")

from ddp_magic.procs import rank_heal_send as H  # noqa: E402
from ddp_magic.wire import shm  # noqa: E402


def test_slots_take_every_tensor_out_and_fill_puts_them_back_where_they_were():
    state = {"model": {"w": torch.ones(2, 3), "b": torch.zeros(3)},
             "opt": {"state": {0: {"momentum_buffer": torch.full((2, 3), 2.0)}}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]},
             "step": 7}
    tensors: list = []
    slotted = H.slots_of(state, tensors)
    assert len(tensors) == 3 and not any(isinstance(v, torch.Tensor) for v in _leaves(slotted))
    assert len(pickle.dumps(slotted)) < 1000  # what every rank receives: no tensor data
    back = H.fill(pickle.loads(pickle.dumps(slotted)), [t.clone() for t in tensors])
    assert torch.equal(back["model"]["w"], state["model"]["w"]) and back["opt"]["param_groups"] == state["opt"]["param_groups"]
    assert torch.equal(back["opt"]["state"][0]["momentum_buffer"], torch.full((2, 3), 2.0)) and back["step"] == 7


def test_buckets_group_by_dtype_and_split_at_the_bucket_size(monkeypatch):
    monkeypatch.setattr(H, "BUCKET", 100)
    ts = [torch.ones(10), torch.ones(10, dtype=torch.int64), torch.ones(10), torch.ones(10), torch.ones(1, dtype=torch.int64)]
    buckets = H.buckets([H.Slot(i, t) for i, t in enumerate(ts)])
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


def test_a_tensor_at_an_odd_offset_of_its_bucket_has_the_fingerprint_of_its_copy():
    """A healed rank's tensors are views into the buckets it received, at any byte offset: a save's and a heal's
    fingerprint read them as 8-byte words, which an odd offset cannot be viewed as (a save after a heal failed so)."""
    from ddp_magic.procs.rank_snapshot_digest import _tensor_print

    bucket = torch.arange(2 * 65536 + 7, dtype=torch.float32)
    view = bucket[1:]  # 4 bytes in
    assert view.storage_offset() * view.element_size() % 8 == 4
    assert _tensor_print(view) == _tensor_print(view.clone())
    assert _tensor_print(view) != _tensor_print(bucket[2:])


def test_a_state_written_to_the_pools_file_comes_back_equal_private_and_the_file_is_the_pools(monkeypatch):
    """Every dtype and shape (a scalar, an empty tensor, a view at an offset, a non-contiguous one), equal after the
    round trip; each reader's copy its own (an optimizer steps it in place); the file 0600 and named as the donor
    rank's of the pool, so the pool's end removes it if the donor dies before it does."""
    pool = shm.pool_prefix("test" + str(os.getpid()))
    monkeypatch.setenv(shm.ENV, pool)
    base = torch.arange(40, dtype=torch.float32)
    tensors = [torch.tensor(3.5, dtype=torch.float64), torch.empty(0), base[3:10], base.view(5, 8).t(),
               torch.tensor([True, False, True]), torch.arange(7, dtype=torch.int8), torch.randn(3, 5).to(torch.bfloat16)]
    slots = [H.Slot(i, t) for i, t in enumerate(tensors)]
    path = H.write_file(tensors, slots, rank=3)
    try:
        assert path is not None and os.path.basename(path).startswith(shm.rank_prefix(pool, 3))
        assert os.stat(path).st_mode & 0o777 == 0o600
        first, second = H.read_file(path, slots), H.read_file(path, slots)
        for got, want in zip(first, tensors):
            assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
        first[2].add_(1)
        assert torch.equal(second[2], tensors[2]) and torch.equal(H.read_file(path, slots)[2], tensors[2])
        alone = H.read_file(path, slots, alone=True)  # the only new rank: the file's pages themselves
        os.unlink(path)  # as the donor does once it has them
        for got, want in zip(alone, tensors):
            assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
        alone[3].mul_(2)  # its own memory now, written in place as an optimizer would
        assert torch.equal(alone[3], tensors[3] * 2)
    finally:
        shm.remove_pool_files(pool)
    assert shm.pool_files(pool) == []


def test_without_a_pool_prefix_nothing_is_written_and_the_broadcasts_carry_it(monkeypatch):
    monkeypatch.delenv(shm.ENV, raising=False)
    assert H.write_file([torch.ones(3)], [H.Slot(0, torch.ones(3))], rank=0) is None


def test_a_healed_module_takes_the_received_tensors_as_its_own_and_stays_tied():
    """procs/rank_heal.py adopt_state: no copy of the state (the heal's largest cost was the 512 MiB copy into fresh
    parameters); the official word_language_model's tie_weights (decoder.weight = encoder.weight) stays one tensor."""
    from ddp_magic.procs.rank_heal import adopt_state

    class RNNModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = torch.nn.Embedding(10, 4)
            self.rnn = torch.nn.LSTM(4, 4)
            self.decoder = torch.nn.Linear(4, 10)
            self.decoder.weight = self.encoder.weight
            self.register_buffer("seen", torch.zeros(1))

    donor = RNNModel()
    donor.seen += 3
    received = {k: v.detach().clone() for k, v in donor.state_dict().items()}
    healed = RNNModel()
    adopt_state(healed, received)
    assert healed.decoder.weight is healed.encoder.weight and isinstance(healed.encoder.weight, torch.nn.Parameter)
    assert healed.encoder.weight.data_ptr() == received["encoder.weight"].data_ptr(), "the received tensor, not a copy"
    assert len(list(healed.parameters())) == len(list(donor.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(healed.state_dict().values(), donor.state_dict().values()))
    assert healed.seen.item() == 3 and healed.encoder.weight.requires_grad
    opt = torch.optim.SGD(healed.parameters(), lr=0.1)
    out, _ = healed.rnn(healed.encoder(torch.tensor([[1, 2]])))
    healed.decoder(out).sum().backward()
    opt.step()
    assert torch.equal(healed.decoder.weight, healed.encoder.weight)
