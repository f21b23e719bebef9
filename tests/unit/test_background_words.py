"""What the views say of a background job, a pool's start and a Slurm job, from plain data: the job's phases and run
clock (labsnap.job_dict), one start clock (the pool's own, ``Pool.start_began``), a pool not yet started shown as
planned, a cancel's words (texts.cancelled_text, LastCell, JobCancelled, the view's verdict), what ``%ddp stop`` says
of a Slurm job. tests/kernel/test_background_views.py checks them against a real kernel."""
from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from ddp_magic.errors import JobCancelled, RankFailure
from ddp_magic.kernel.launchers.slurm import released_text
from ddp_magic.kernel.launchers.slurm_alloc import Allocation, OwnAllocation
from ddp_magic.kernel.ranks import CellOutcome, LastCell
from ddp_magic.kernel.texts import cancelled_text
from ddp_magic.kernel.jobs.turns import Ticket
from ddp_magic.plan import Check
from ddp_magic.plan.slurm import SlurmRequest
from ddp_magic.session import PoolStatus, RankRow
from ddp_magic.states import FailureKind, RankState
from ddp_magic.ui import status_render as R, status_tables as T
from ddp_magic.ui.labsnap import PoolSnapshots, job_dict

STOPPED_0 = RankFailure(rank=0, kind=FailureKind.INTERRUPTED)
STOPPED_1 = RankFailure(rank=1, kind=FailureKind.INTERRUPTED)


def test_a_job_has_no_run_time_before_its_cell_reaches_the_ranks():
    t = Ticket("cell [3]", True)
    assert job_dict(t) == {"name": "cell [3]", "background": True, "phase": "queued", "elapsed": None, "step": None, "text": "background: cell [3] queued"}
    t.since = time.monotonic() - 30  # it got the turn 30 s ago; the pool has been starting since
    d = job_dict(t)
    assert (d["phase"], d["elapsed"], d["text"]) == ("starting", None, "background: cell [3] starting")
    t.ran = time.monotonic() - 17.03
    d = job_dict(t)
    assert d["phase"] == "running" and abs(d["elapsed"] - 17.03) < 0.5 and d["text"] == "background: cell [3] running 0:00:17"


def _pool_dict(started: bool, began: Any, states=(RankState.STARTING, RankState.STARTING), pids=(None, None)) -> dict:
    rows = tuple(RankRow(r, pid, s, "cpu", elapsed=0.01) for r, (s, pid) in enumerate(zip(states, pids)))
    status = PoolStatus(started=started, nproc=2, backend="gloo", master_addr="127.0.0.1", master_port=51829, ranks=rows)
    pool = SimpleNamespace(launcher=SimpleNamespace(name="slurm"), generation=1, start_began=began)
    out = PoolSnapshots(SimpleNamespace(status=lambda: status, pool=pool)).pool_dict()  # type: ignore[arg-type]
    assert out is not None
    return out


def test_the_snapshot_s_start_clock_is_the_pool_s_own_and_its_facts_are_planned_until_it_started():
    began = time.monotonic() - 23.9  # a Slurm job queued for 20 s, then its ranks started
    out = _pool_dict(False, began, (RankState.QUEUED, RankState.QUEUED))
    assert out["planned"] is True and all(abs(r["elapsed"] - 23.9) < 0.5 for r in out["ranks"])  # not the ranks' 10 ms
    out = _pool_dict(False, began, (RankState.CONNECTING, RankState.STARTING), (4242, None))
    assert all(abs(r["elapsed"] - 23.9) < 0.5 for r in out["ranks"]), out["ranks"]  # one clock: it never goes back
    out = _pool_dict(False, None)  # the cell ships its names first: the start has not begun
    assert [r["elapsed"] for r in out["ranks"]] == [0.0, 0.0] and [r["state"] for r in out["ranks"]] == ["starting", "starting"]
    out = _pool_dict(True, began, (RankState.READY, RankState.READY), (1, 2))
    assert out["planned"] is False and [r["elapsed"] for r in out["ranks"]] == [0.01, 0.01]


def test_a_pool_not_yet_started_shows_its_env_as_planned_without_a_placeholder_port():
    envs = [{"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "51829", "RANK": str(r), "WORLD_SIZE": "2"} for r in range(2)]
    checks = [Check("same MASTER_PORT", True, "MASTER_PORT=51829 on every rank"), Check("same WORLD_SIZE", True, "WORLD_SIZE=2 on every rank")]
    planned = T.env_html(R.Snapshot(nproc=2, infos={}, now=0.0, elapsed=0.0, envs=envs, checks=checks, planned=True))
    assert "MASTER_PORT: one value on every rank, set when the ranks start" in planned and "WORLD_SIZE=2 on every rank" in planned
    assert "planned: the env each rank will receive; MASTER_ADDR/PORT are set when the ranks start" in planned
    assert "51829" not in planned and "received" not in planned
    ran = T.env_html(R.Snapshot(nproc=2, infos={}, now=0.0, elapsed=0.0, envs=envs))
    assert "(the env each rank received)" in ran and "MASTER_PORT=51829" in ran


def _cancelled(*failures: RankFailure, lost: bool = False) -> CellOutcome:
    return CellOutcome(values=[None, None], failures=list(failures), notes=[], elapsed=21.0, state_lost=lost, recovered=not lost, cancelled=True)


def test_a_cancel_is_said_as_a_cancel_everywhere():
    outcome = _cancelled(STOPPED_0, STOPPED_1)
    text = cancelled_text(outcome, 187)
    assert text == "cancelled by job.cancel(): ranks 0-1 stopped at step 187; state kept"
    assert cancelled_text(_cancelled(STOPPED_0, STOPPED_1, lost=True), None) == (
        "cancelled by job.cancel(): ranks 0-1 stopped; state lost: the pool restarts on the next cell")
    raised = RankFailure(rank=1, kind=FailureKind.ERROR, type="ValueError", message="no")
    assert cancelled_text(_cancelled(raised, STOPPED_0), 5) == "", "a rank that raised first is that rank's failure"
    assert cancelled_text(CellOutcome([None], [STOPPED_0], [], 1.0), 5) == "", "a Ctrl-C is not a cancel"
    outcome.cancel_text = text
    last = LastCell.of(outcome, 12, "3", 1)
    assert last.headline == text and last.text() == f"last cell In[12]: {text}" and last.to_dict()["cancelled"] is True
    error = JobCancelled(text, outcome.failures, ["the process group was re-formed"])
    assert str(error) == f"{text}\n\nthe process group was re-formed" and error.ranks == [0, 1]
    assert R.verdict(outcome, None) == (False, text)  # the cell's view


def test_ddp_stop_says_what_became_of_the_slurm_job():
    request = SlurmRequest(nodes=2)
    ours = OwnAllocation(request)
    ours.job_id, ours.nodes = "1234", ["n1", "n2"]
    assert released_text(ours) == "; Slurm job 1234 released: its nodes are free"
    assert released_text(ours, {"n2": 0.0}) == "; Slurm job 1234 released: n1 free, n2 once it answers"  # a silent node
    assert released_text(ours, {"n1": 0.0, "n2": 0.0}) == "; Slurm job 1234 released: n1,n2 once they answer"
    ours.nodes = []
    assert released_text(ours) == "; Slurm job 1234 cancelled while it was queued"
    found = Allocation(SlurmRequest(nodes=2, job_id="77"))
    assert released_text(found) == "; Slurm job 77 kept: the kernel runs inside it"


def test_a_process_a_short_lived_thread_starts_outlives_the_thread():
    """Linux sends the parent-death signal when the *thread* that started a process ends: a background job's thread
    started the template, and the pool died with the job. launchers.base.popen starts it on a thread that lasts."""
    import shutil
    import subprocess
    import threading

    from ddp_magic.kernel.launchers.base import popen

    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("no setpriv (util-linux) to ask for a parent-death signal")
    started: list = []
    thread = threading.Thread(target=lambda: started.append(popen([setpriv, "--pdeathsig", "KILL", "sleep", "30"], stdin=subprocess.DEVNULL)))
    thread.start()
    thread.join()
    proc = started[0]
    try:
        time.sleep(0.5)
        assert proc.poll() is None, "it died with the thread that started it"
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(FileNotFoundError):  # a start that fails raises on the caller's thread
        _on_thread(popen, ["/nonexistent/program"])


def _on_thread(fn: Any, *args: Any) -> Any:
    out: list = []
    errors: list = []

    def run() -> None:
        try:
            out.append(fn(*args))
        except BaseException as e:
            errors.append(e)

    import threading

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if errors:
        raise errors[0]
    return out[0]
