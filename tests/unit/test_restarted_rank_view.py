"""A cell that started one rank again alone says so, with that rank's own start.

It said ``pool started in 1.59 s``, the whole pool's first start, although it restarted one rank in 42 ms."""
from __future__ import annotations

import types

from ddp_magic.kernel.ranks import RankInfo
from ddp_magic.states import RankState
from ddp_magic.ui import status_render as R
from ddp_magic.ui.status_view import StatusView


def view(ranks: dict) -> StatusView:
    pool = types.SimpleNamespace(started=True, ranks=ranks, start_seconds=1.59, start_began=0.0)
    return StatusView(2, pool=pool, mode="off", ticker=False)


def test_one_rank_restarted_alone_says_its_own_time() -> None:
    v = view({0: RankInfo(0, RankState.READY, pid=10), 1: RankInfo(1, RankState.DEAD, pid=11, exit_code=-9)})
    v.on_state(RankInfo(1, RankState.READY, pid=12, started=100.0, finished=100.042))
    line = R.summary(v.snapshot())
    assert "rank 1 restarted in 42 ms" in line and "pool started" not in line, line


def test_a_whole_pool_started_in_the_cell_says_the_pools_time() -> None:
    v = view({})
    for rank in (0, 1):
        v.on_state(RankInfo(rank, RankState.READY, pid=10 + rank, started=100.0, finished=100.3))
    line = R.summary(v.snapshot())
    assert "pool started in 1.59 s" in line and "restarted" not in line, line
