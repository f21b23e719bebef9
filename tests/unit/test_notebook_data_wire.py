"""wire/notebook_data.py, both ends in one process: what the kernel writes to /dev/shm once, what a rank maps."""
from __future__ import annotations

import os
import stat
from typing import Iterator

import cloudpickle
import numpy as np
import pytest
import torch

from ddp_magic.wire import notebook_data as nd
from ddp_magic.wire import shm

BIG = nd.THRESHOLD // 4 * 2  # float32 elements: 2 MiB


@pytest.fixture()
def outbox() -> Iterator[nd.Outbox]:
    box = nd.Outbox()
    yield box
    box.clear()
    assert shm.pool_files(box.prefix) == []


def on_rank(blob: bytes, rank: int = 0) -> object:
    """What rank ``rank`` unpickles (the worker's transfer.load_name is cloudpickle.loads)."""
    os.environ["RANK"] = str(rank)
    try:
        return cloudpickle.loads(blob)
    finally:
        del os.environ["RANK"]


def test_a_large_tensor_goes_once_through_a_private_file(outbox: nd.Outbox) -> None:
    x = torch.arange(BIG, dtype=torch.float32)
    blobs, failure = outbox.dumps_names({"x": x, "d": {"x": x, "small": torch.ones(3)}}, nproc=4)
    assert failure is None and len(blobs["x"]) < 1024, "the pickle names the file; the bytes are not in it"
    assert outbox.written == x.nbytes, "x is written once, though two names hold it"
    files = shm.pool_files(outbox.prefix)
    assert len(files) == 1 and stat.S_IMODE(os.stat(files[0]).st_mode) == 0o600
    assert torch.equal(on_rank(blobs["x"]), x) and torch.equal(on_rank(blobs["d"])["x"], x)
    assert outbox.inline == sum(len(b) for b in blobs.values()) * 4, "the pickles count once per rank"


def test_an_unchanged_tensor_is_not_written_again_and_a_changed_one_is(outbox: nd.Outbox) -> None:
    x = torch.zeros(BIG)
    outbox.dumps_names({"x": x}, nproc=2)
    written = outbox.written
    blobs, _ = outbox.dumps_names({"x": x}, nproc=2)
    assert outbox.written == written, "same object, same version counter: nothing written"
    x.add_(1)
    blobs, _ = outbox.dumps_names({"x": x}, nproc=2)
    assert outbox.written == 2 * written and on_rank(blobs["x"])[0].item() == 1.0
    outbox.dumps_names({}, nproc=2)  # the next cell: the old copy's file goes
    assert len(shm.pool_files(outbox.prefix)) == 1


def test_a_numpy_array_is_compared_with_its_file(outbox: nd.Outbox) -> None:
    a = np.zeros(BIG, dtype=np.float32)
    outbox.dumps_names({"a": a}, nproc=2)
    written = outbox.written
    outbox.dumps_names({"a": a}, nproc=2)
    assert outbox.written == written
    a[7] = 3.0  # numpy has no version counter: the bytes tell
    blobs, _ = outbox.dumps_names({"a": a}, nproc=2)
    assert outbox.written == 2 * written and on_rank(blobs["a"])[7] == 3.0


def test_a_rank_writing_gets_its_own_copy(outbox: nd.Outbox) -> None:
    x = torch.zeros(BIG)
    blobs, _ = outbox.dumps_names({"x": x}, nproc=2)
    mine, theirs = on_rank(blobs["x"], 0), on_rank(blobs["x"], 1)
    mine += 5  # copy-on-write pages: neither the notebook's tensor nor another rank's view changes
    assert mine[0].item() == 5.0 and theirs[0].item() == 0.0 and x[0].item() == 0.0
    assert on_rank(blobs["x"], 0)[0].item() == 0.0, "the next cell maps the file afresh"


def test_parameters_and_requires_grad_survive(outbox: nd.Outbox) -> None:
    p = torch.nn.Parameter(torch.ones(BIG))
    t = torch.ones(BIG, requires_grad=True)
    blobs, _ = outbox.dumps_names({"p": p, "t": t, "half": torch.ones(BIG, dtype=torch.bfloat16)}, nproc=1)
    q, u, half = on_rank(blobs["p"]), on_rank(blobs["t"]), on_rank(blobs["half"])
    assert isinstance(q, torch.nn.Parameter) and q.requires_grad and u.requires_grad and half.dtype == torch.bfloat16


@pytest.mark.parametrize("dim,shape", [(0, (1030, 512)), (1, (512, 1030))])
def test_scatter_gives_each_rank_its_shard_covering_the_tensor_once(outbox: nd.Outbox, dim: int, shape: tuple) -> None:
    x = torch.arange(shape[0] * shape[1], dtype=torch.float32).reshape(shape)
    blobs, _ = outbox.dumps_names({"xs": nd.Scatter(x, dim)}, nproc=4)
    shards = [on_rank(blobs["xs"], r) for r in range(4)]
    assert [s.shape[dim] for s in shards] == [258, 258, 257, 257], "tensor_split: the first len % n shards are one longer"
    assert torch.equal(torch.cat(shards, dim), x)
    assert outbox.written == x.nbytes, "each element written once"


def test_scatter_of_small_values_arrays_and_lists(outbox: nd.Outbox) -> None:
    blobs, _ = outbox.dumps_names({"t": nd.Scatter(torch.arange(10)), "a": nd.Scatter(np.arange(10)), "l": nd.Scatter(list(range(10)))}, nproc=3)
    assert [on_rank(blobs["t"], r).tolist() for r in range(3)] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert [on_rank(blobs["a"], r).tolist() for r in range(3)] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert [on_rank(blobs["l"], r) for r in range(3)] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert outbox.written == 0


def test_nothing_goes_through_files_when_ranks_are_on_other_hosts(outbox: nd.Outbox) -> None:
    x = torch.ones(BIG)
    blobs, _ = outbox.dumps_names({"x": x, "xs": nd.Scatter(x)}, nproc=2, local=False)
    assert outbox.written == 0 and len(blobs["x"]) > x.nbytes
    assert on_rank(blobs["xs"], 1).shape == (BIG // 2,)


def test_bad_scatter_requests_say_why() -> None:
    with pytest.raises(TypeError, match="scatter takes a torch tensor"):
        nd.Scatter({"a": 1})
    with pytest.raises(ValueError, match="out of range"):
        nd.Scatter(torch.ones(2, 2), dim=2)
    ns = {"x": torch.ones(4), "k": 3}
    with pytest.raises(ValueError, match="does not use"):
        nd.scattered({}, ["x"], ns, set())
    with pytest.raises(ValueError, match="lives on the workers"):
        nd.scattered({}, ["x"], ns, {"x"})
    with pytest.raises(ValueError, match="no notebook variable"):
        nd.scattered({}, ["y"], ns, set())
    with pytest.raises(ValueError, match="scatter takes"):
        nd.scattered({"k": 3}, ["k"], ns, set())
    assert isinstance(nd.scattered({"x": ns["x"]}, ["x"], ns, set())["x"], nd.Scatter)


def test_a_rank_refuses_a_file_outside_dev_shm() -> None:
    with pytest.raises(ValueError, match="refusing"):
        nd._attach("/etc/passwd", (0, 4, (1,)), "torch", "float32", {})


def test_a_container_of_small_tensors_goes_out_of_band_through_one_file_per_cell(outbox: nd.Outbox) -> None:
    samples = [torch.full((4096,), float(i)) for i in range(100)] + [np.arange(1000)]  # 1.6 MiB in 16 KiB pieces
    blobs, _ = outbox.dumps_names({"samples": samples}, nproc=2)
    assert len(blobs["samples"]) < 64 * 1024 and len(shm.pool_files(outbox.prefix)) == 1
    got = on_rank(blobs["samples"], 1)
    assert all(torch.equal(a, b) for a, b in zip(got[:100], samples[:100])) and (got[100] == samples[100]).all()
    got[0] += 1  # copy-on-write here too
    assert samples[0][0].item() == 0.0 and on_rank(blobs["samples"], 0)[0][0].item() == 0.0
    outbox.dumps_names({}, nproc=2)  # the next cell: this cell's file goes
    assert shm.pool_files(outbox.prefix) == []


def test_a_small_module_keeps_its_parameters(outbox: nd.Outbox) -> None:
    model = torch.nn.Linear(3, 2)
    blobs, _ = outbox.dumps_names({"model": model}, nproc=2)
    copy = on_rank(blobs["model"])
    assert all(isinstance(p, torch.nn.Parameter) and p.requires_grad for p in copy.parameters())
    assert torch.equal(copy.weight, model.weight) and outbox.written == 0


def test_without_dev_shm_everything_goes_in_the_message(outbox: nd.Outbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nd.shm, "SHM_DIR", "/nonexistent-ddp-magic-test")  # full or missing: os.open fails
    x = torch.arange(BIG, dtype=torch.float32)
    blobs, failure = outbox.dumps_names({"x": x, "xs": nd.Scatter(x), "many": [torch.ones(4096) for _ in range(70)]}, nproc=2)
    assert failure is None and outbox.written == 0 and len(blobs["x"]) > x.nbytes
    assert torch.equal(on_rank(blobs["x"]), x) and on_rank(blobs["xs"], 1)[0].item() == BIG // 2
    assert len(on_rank(blobs["many"])) == 70


def test_an_inference_tensor_without_a_version_counter_is_sent_every_cell(outbox: nd.Outbox) -> None:
    with torch.inference_mode():
        x = torch.ones(BIG)
    outbox.dumps_names({"x": x}, nproc=1)
    blobs, failure = outbox.dumps_names({"x": x}, nproc=1)
    assert failure is None and outbox.written == 2 * x.nbytes and on_rank(blobs["x"])[0].item() == 1.0


def test_more_ranks_than_rows_gives_the_last_ranks_empty_shards(outbox: nd.Outbox) -> None:
    x = torch.ones(2, BIG // 2)
    a = np.ones((2, BIG // 2), dtype=np.float32)
    blobs, _ = outbox.dumps_names({"x": nd.Scatter(x), "a": nd.Scatter(a)}, nproc=4)
    assert [tuple(on_rank(blobs["x"], r).shape) for r in range(4)] == [(1, BIG // 2), (1, BIG // 2), (0, BIG // 2), (0, BIG // 2)]
    assert [on_rank(blobs["a"], r).shape[0] for r in range(4)] == [1, 1, 0, 0]


def test_a_file_removed_behind_the_kernels_back_is_written_again(outbox: nd.Outbox) -> None:
    x = torch.ones(BIG)
    outbox.dumps_names({"x": x}, nproc=1)
    for path in shm.pool_files(outbox.prefix):
        os.unlink(path)
    blobs, _ = outbox.dumps_names({"x": x}, nproc=1)
    assert outbox.written == 2 * x.nbytes and on_rank(blobs["x"])[0].item() == 1.0
