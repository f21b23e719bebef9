"""The ranks' record of the collective they are in: what a STACK reply says, read while the call is in flight."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from ddp_magic.procs import rank_collectives  # noqa: E402


@pytest.fixture()
def one_rank(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_call_in_flight_is_described_and_forgotten_after(one_rank):
    seen = {}
    wrapped = rank_collectives._wrap("all_reduce", lambda tensor, group=None: seen.setdefault("now", rank_collectives.describe()))
    dist.all_reduce(torch.ones(1))  # the group's sequence number moves on
    wrapped(torch.ones(2, 3, dtype=torch.float16))
    now = seen["now"]
    assert (now["op"], now["shape"], now["dtype"], now["group"], now["ranks"]) == ("all_reduce", [2, 3], "float16", "default", None)
    assert now["seq"] == 1 and now["waited"] >= 0
    assert rank_collectives.describe() is None


def test_a_nested_call_restores_the_outer_one(one_rank):
    inner = rank_collectives._wrap("all_gather", lambda *a: rank_collectives.describe())
    outer = rank_collectives._wrap("all_gather_object", lambda obj: (inner([torch.ones(1)], torch.ones(1)), rank_collectives.describe()))
    got_inner, got_outer = outer("x")
    assert got_inner["op"] == "all_gather" and got_outer["op"] == "all_gather_object" and got_outer["shape"] is None
