"""The last %%ddp cell's outcome, as the views that outlive its output read it: ``%ddp status`` and the
JupyterLab snapshot (ui/labsnap.py). A pool that is whole again after a failure is ready; the failure,
and who is to blame, is the last cell's."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Tuple

from ddp_magic.errors import RankFailure
from ddp_magic.kernel.ranks import CellOutcome, LastCell
from ddp_magic.session import PoolStatus, RankRow
from ddp_magic.states import FailureKind, RankState
from ddp_magic.ui.labsnap import PoolSnapshots

RAISED = RankFailure(rank=1, kind=FailureKind.ERROR, type="ValueError", message="bad shard")
RELEASED = RankFailure(rank=0, kind=FailureKind.INTERRUPTED, message="released: rank 0 waited in a collective")


def _outcome(*failures: RankFailure, recovered: bool = True) -> CellOutcome:
    return CellOutcome(values=[None, None], failures=list(failures), notes=[], elapsed=1.0, recovered=recovered)


def _status(states: Tuple[RankState, RankState], last: Any) -> PoolStatus:
    rows = tuple(RankRow(r, 100 + r, s, "cpu") for r, s in enumerate(states))
    return PoolStatus(started=True, nproc=2, backend="gloo", master_port=1234, generation=1, ranks=rows, last_cell=last)


def test_a_recovered_failure_is_the_last_cell_s_and_the_ranks_are_ready():
    last = LastCell.of(_outcome(RAISED, RELEASED), 4, "3", 1)
    assert (last.name, last.ok, last.recovered, last.root) == ("In[4]", False, True, [1])
    assert last.text() == "last cell In[4]: rank 1 raised ValueError: bad shard; recovered: every rank is ready, the workers' variables intact"
    text = _status((RankState.READY, RankState.READY), last).text()
    assert text.splitlines()[1:3] == ["  rank 0: pid 100  ready       cpu", "  rank 1: pid 101  ready       cpu"]
    assert text.splitlines()[-1] == last.text() and "interrupted" not in text and "failed" not in text
    assert text.startswith("pool of 2 ranks, backend gloo")


def test_the_snapshot_says_ready_with_the_last_cell_failed_and_recovered():
    last = LastCell.of(_outcome(RAISED, RELEASED), 4, "3", 1)
    pool = _snapshot(_status((RankState.READY, RankState.READY), last))
    assert [r["state"] for r in pool["ranks"]] == ["ready", "ready"]
    assert all("cause" not in r and "kind" not in r for r in pool["ranks"]), "a ready rank carries no failure"
    assert pool["last_cell"] == {
        "number": 4, "ok": False, "headline": "rank 1 raised ValueError: bad shard", "recovered": True, "root": [1], "text": last.text(),
        "causes": {"0": {"kind": "interrupted", "cause": "stopped"}, "1": {"kind": "error", "cause": "root"}}, "cancelled": False,
    }


def test_a_pool_that_is_not_whole_keeps_the_failure_on_its_ranks():
    died = RankFailure(rank=1, kind=FailureKind.DIED, pid=101, exit_code=-9)
    last = LastCell.of(_outcome(died, RELEASED, recovered=False), 7, "5", 1)
    pool = _snapshot(_status((RankState.INTERRUPTED, RankState.DEAD), last))
    assert [(r.get("kind"), r.get("cause")) for r in pool["ranks"]] == [("interrupted", "stopped"), ("died", "root")]
    assert pool["last_cell"]["recovered"] is False and pool["last_cell"]["root"] == [1]
    assert "recovered" not in last.text()


def test_no_last_cell_before_one_ran_and_an_ok_one_says_so():
    assert _snapshot(_status((RankState.READY, RankState.READY), None))["last_cell"] is None
    ok = LastCell.of(_outcome(), 2, "1", 1)
    assert ok.ok and ok.root == [] and ok.text() == "last cell In[2]: ok"
    assert "last cell" not in _status((RankState.DONE, RankState.DONE), ok).text()  # %ddp status names a failed one only
    assert LastCell.of(_outcome(RAISED), None, "3", 1).name == "<ddp-cell-3>"  # no prompt number outside a notebook


def test_a_cell_the_user_interrupted_blames_nobody():
    both = [RankFailure(rank=r, kind=FailureKind.INTERRUPTED) for r in (0, 1)]
    last = LastCell.of(_outcome(*both), 5, "4", 1)
    assert last.root == [] and last.headline == "ranks 0-1 were interrupted"
    assert last.text().startswith("last cell In[5]: ranks 0-1 were interrupted; recovered")


def _snapshot(status: PoolStatus) -> dict:
    session = SimpleNamespace(status=lambda: status, pool=SimpleNamespace(launcher=SimpleNamespace(name="forkserver"), generation=1))
    out = PoolSnapshots(session).pool_dict()  # type: ignore[arg-type]
    assert out is not None
    return out
