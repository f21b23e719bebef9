"""The ranks' record of the collective they are in: what a STACK reply says, read while the call is in flight."""
from __future__ import annotations

import threading

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


def _routes():
    """Every way a peek could reach a collective, below and above torch.distributed's Python functions."""
    from torch.distributed.distributed_c10d import _get_default_group

    pg = _get_default_group()
    fc = torch.ops._c10d_functional
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
    ddp_buffers = torch.nn.parallel.DistributedDataParallel(torch.nn.BatchNorm1d(2))
    return {
        "dist.all_reduce": (lambda: dist.all_reduce(torch.ones(1)), "torch.distributed.all_reduce"),
        "dist.all_gather_object": (lambda: dist.all_gather_object([None], 1), "torch.distributed.all_gather_object"),
        "WORLD.allreduce": (lambda: dist.group.WORLD.allreduce(torch.ones(1)).wait(), "torch.ops.c10d.allreduce_"),
        "pg.barrier": (lambda: pg.barrier().wait(), "torch.ops.c10d.barrier"),
        "pg.broadcast": (lambda: pg.broadcast([torch.ones(1)]).wait(), "torch.ops.c10d.broadcast_"),
        "ops.c10d.barrier": (lambda: torch.ops.c10d.barrier(torch.ones(1), pg.boxed(), [], -1), "torch.ops.c10d.barrier"),
        "functional": (lambda: fc.wait_tensor(fc.all_reduce(torch.ones(1), "sum", pg.group_name)), "torch.ops._c10d_functional.all_reduce"),
        "backend.allreduce": (lambda: pg._get_backend(torch.device("cpu")).allreduce([torch.ones(1)]).wait(), "a c10d Backend's allreduce"),
        "new_group": (lambda: dist.new_group([0]), "torch.distributed.new_group"),
        "ddp forward": (lambda: ddp(torch.ones(1, 2)), "DistributedDataParallel.forward"),
        "ddp forward, buffers": (lambda: ddp_buffers(torch.ones(3, 2)), "DistributedDataParallel.forward"),
    }


def test_every_route_to_a_collective_is_refused_on_the_refused_thread_only(one_rank):
    rank_collectives.install()
    routes = _routes()
    refused: dict = {}
    inside, leave = threading.Event(), threading.Event()

    def peek() -> None:
        rank_collectives.refuse(threading.get_ident(), "a peek may not call {op}")
        with rank_collectives.guard():
            inside.set()
            leave.wait(60)
            for name, (call, _op) in routes.items():
                try:
                    call()
                except rank_collectives.CollectiveRefused as e:
                    refused[name] = str(e)
            refused["norm"] = float(torch.ones(4).norm())  # plain ops run under the guard

    saved = rank_collectives.STATE.refused
    t = threading.Thread(target=peek)
    try:
        t.start()
        assert inside.wait(60)
        for call, _op in routes.values():  # this thread, while the other sits in its guard: every route works
            call()
        leave.set()
        t.join(60)
    finally:
        leave.set()
        rank_collectives.STATE.refused = saved  # a later thread may get the same ident
    assert refused.pop("norm") == 2.0
    assert sorted(refused) == sorted(routes)
    for name, (_, op) in routes.items():
        assert refused[name].startswith(f"a peek may not call {op}"), (name, refused[name])
    for call, _op in routes.values():  # and after it
        call()
