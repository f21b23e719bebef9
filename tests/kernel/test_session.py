"""The Session API driven directly (no IPython): what the magics and the JupyterLab comm both call."""
from __future__ import annotations

from typing import Any, Iterator, List

import pytest

from ddp_magic.kernel import Listener
from ddp_magic.kernel.pool import Pool
from ddp_magic.plan.spec import PoolSpec
from ddp_magic.session import CellListener, CellOptions, Session
from ddp_magic.states import RankState

pytestmark = pytest.mark.kernel


class Heard(CellListener):
    def __init__(self) -> None:
        self.notices: List[str] = []
        self.pools: List[Any] = []

    def on_notice(self, text: str) -> None:
        self.notices.append(text)

    def on_pool(self, pool: Pool) -> None:
        self.pools.append((pool, pool.started))


@pytest.fixture(scope="module")
def session() -> Iterator[Session]:
    s = Session()
    yield s
    s.stop()


def test_restart_rules_without_starting_anything() -> None:
    s = Session(pool=Pool(PoolSpec.from_options(2)))  # validated, nothing started
    try:
        resolved = s.pool.backend
        assert s.changes(s.spec_for()) == []
        assert s.changes(s.spec_for(backend=resolved)) == [], "naming the backend auto chose is no change"
        assert s.changes(s.spec_for(backend="auto")) == []
        assert s.changes(s.spec_for(start_timeout=5)) == [], "the join timeout restarts nothing"
        assert s.changes(s.spec_for(3)) == ["-n 2 → 3"]
        assert s.changes(s.spec_for(init=False)) == ["init True → False"]
        assert s.status().exists and not s.status().started
    finally:
        s.stop()
    assert s.pool is None and not s.status().exists


def test_start_status_and_ready_line(session: Session) -> None:
    status = session.start(PoolSpec.from_options(2, backend="gloo"))
    assert status.started and status.nproc == 2 and status.backend == "gloo"
    assert [r.rank for r in status.ranks] == [0, 1]
    assert all(r.state is RankState.READY and isinstance(r.pid, int) for r in status.ranks)
    assert "ready in" in status.ready_text() and str(status.pids) in status.ready_text()
    assert "rank 1: pid" in status.text()


def test_run_ships_names_keeps_owned_ones_and_labels_cells(session: Session) -> None:
    heard = Heard()
    first = session.run("import torch.distributed as dist\nw = dist.get_rank() + k", {"k": 10}, CellOptions(), heard)
    assert first.ok and heard.pools and heard.pools[0][1] is True, "on_pool is called with the pool before the cell runs"
    assert {"dist", "w"} <= set(session.status().owned)
    second = session.run("w * 2", {"w": -1})  # the workers own w: the notebook's w is not sent
    assert second.outcome.values == [20, 22]
    assert int(second.label) == int(first.label) + 1
    bad = session.run("1 / (dist.get_rank() - 1)", {})
    assert not bad.ok and bad.outcome.failures[0].rank == 1


def test_a_failed_cell_on_a_pool_whole_again_leaves_every_rank_ready_and_is_the_last_cell(session: Session) -> None:
    """The ranks' states say the pool is ready; the failure (and who is to blame) is the session's last cell."""
    cell = "import torch\nx = torch.ones(1)\nif dist.get_rank() == 1:\n    raise ValueError('bad shard')\ndist.all_reduce(x)"
    pids = session.status().pids
    for number in (7, 8):  # run again: the same outcome, under its new prompt number
        result = session.run(cell, {}, CellOptions(number=number, first_line=2))
        assert not result.ok and result.outcome.recovered and result.outcome.failures[0].rank == 1
        assert 'line 5, in <module>\n    raise ValueError' in result.outcome.failures[0].traceback  # body line 4 is the editor's 5
        status = session.status()
        assert [r.state for r in status.ranks] == [RankState.READY] * 2 and status.pids == pids
        last = status.last_cell
        assert last is not None and (last.number, last.ok, last.recovered, last.root) == (number, False, True, [1])
        assert last.causes == {1: ("error", "root"), 0: ("interrupted", "stopped")}
        assert status.text().splitlines()[-1] == f"last cell In[{number}]: rank 1 raised ValueError: bad shard; {RECOVERED}"
        assert result.metrics is not None and result.metrics.label == str(number)  # the panel's "cell n" is the prompt's n
    ok = session.run("dist.get_rank()", {}, CellOptions(number=9, first_line=2))
    assert ok.ok and ok.outcome.values == [0, 1] and session.status().last_cell.ok  # type: ignore[union-attr]
    assert [r.state for r in session.status().ranks] == [RankState.DONE] * 2


RECOVERED = "recovered: every rank is ready, the workers' variables intact"


def test_env_is_live_with_a_pool_and_planned_for_a_spec(session: Session) -> None:
    live = session.env()
    assert live.state == "live" and sorted(live.live or {}) == [0, 1]
    planned = session.env(session.spec_for(3))
    assert planned.state == "planned" and planned.nproc == 3 and planned.plan is not None


def test_a_changed_option_restarts_with_a_notice_and_forgets_the_names(session: Session) -> None:
    old = session.status().pids
    heard = Heard()
    result = session.run("import os\nos.getpid()", {}, CellOptions(spec=session.spec_for(pg_timeout=60)), heard)
    assert any(n.startswith("restarting the pool (pg-timeout 300.0 → 60") for n in heard.notices), heard.notices
    assert set(result.outcome.values).isdisjoint(old)
    assert "w" not in session.status().owned and "os" in session.status().owned
    status = session.restart(listener=Listener())
    assert status.owned == () and set(status.pids).isdisjoint(result.outcome.values)
    assert status.last_cell is None, "a restarted pool has no last cell"


def test_stop_says_whether_there_was_a_pool(session: Session) -> None:
    assert session.stop() == "stopped the pool; its workers have exited"  # no Slurm job to speak of
    assert session.stop() == ""
    assert not session.status().exists
