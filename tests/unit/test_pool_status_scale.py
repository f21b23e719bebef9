"""What %ddp status prints for a pool of 1,024 ranks (kernel/pool_status.py): a line per node and state, the odd ranks alone."""
from __future__ import annotations

import signal

from ddp_magic.kernel.pool_status import ODD_SHOWN, PoolStatus, RankRow
from ddp_magic.states import RankState


def pool(n: int, odd: dict) -> PoolStatus:
    rows = tuple(RankRow(r, 4000 + r, odd.get(r, (RankState.READY, None))[0], "cpu", node=f"n{r // 256 + 1}",
                         exit_code=odd.get(r, (None, None))[1]) for r in range(n))
    return PoolStatus(started=True, nproc=n, backend="gloo", master_port=1234, ranks=rows)


def test_1024_ranks_are_a_line_per_node_and_the_odd_ranks():
    text = pool(1024, {517: (RankState.DEAD, 3), 3: (RankState.FAILED, None), 9: (RankState.DEAD, -signal.SIGKILL)}).text().splitlines()
    assert text == [
        "pool of 1024 ranks, backend gloo, MASTER_PORT 1234",
        "  ranks 0-2, 4-8, 10-255: ready  cpu  on n1  (pids 4000-4002, 4004-4008, 4010-4255)",
        "  ranks 256-511: ready  cpu  on n2  (pids 4256-4511)",
        "  ranks 512-516, 518-767: ready  cpu  on n3  (pids 4512-4516, 4518-4767)",
        "  ranks 768-1023: ready  cpu  on n4  (pids 4768-5023)",
        "  not ready:",
        "  rank 3: pid 4003  failed      cpu  on n1",
        "  rank 9: pid 4009  dead        cpu  on n1  (SIGKILL)",
        "  rank 517: pid 4517  dead        cpu  on n3  (exit 3)",
    ]


def test_many_odd_ranks_are_grouped_past_the_first_ones():
    text = pool(1024, {r: (RankState.DEAD, 1) for r in range(0, 1024, 8)}).text().splitlines()  # 128 dead ranks
    alone = [ln for ln in text if ln.startswith("  rank ") and ": pid " in ln]
    assert len(alone) == ODD_SHOWN and len(text) < ODD_SHOWN + 12
    assert any(ln.startswith("  ranks 256, 264, 272, 280, 288, 296, 304, 312 and ") and ": dead  cpu  on n2" in ln for ln in text), text


def test_32_ranks_keep_a_line_each():
    text = pool(32, {5: (RankState.DEAD, 3)}).text().splitlines()
    assert text[1] == "  rank 0: pid 4000  ready       cpu  on n1" and len(text) == 33
    assert text[6] == "  rank 5: pid 4005  dead        cpu  on n1  (exit 3)"
