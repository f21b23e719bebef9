"""kernel/results/profile_merge.py on made-up Kineto traces: lanes per rank, one clock, the straggler table and the chart's straggler."""
from __future__ import annotations

import json
import zlib

import pytest

from ddp_magic.kernel.results.metrics import CellMetrics, StragglerMeasure
from ddp_magic.kernel.results.profile_merge import CLOCK_EVENT, ProfileReport, ProfileRun, RankProfile, merge, rank_profile, waited_for


def _trace(pid: int, base: float, collective_us: float) -> dict:
    """A rank's trace in its own clock (``base``): the clock marker, one compute op, one gloo all_reduce, a GPU kernel."""
    return {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"python {pid}"}},
        {"ph": "X", "cat": "user_annotation", "name": CLOCK_EVENT, "pid": pid, "tid": pid, "ts": base, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": pid, "ts": base + 10, "dur": 100},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": pid, "tid": 7, "ts": base + 200, "dur": collective_us},
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": pid, "tid": pid, "ts": base + 190, "dur": 20},
        {"ph": "X", "cat": "kernel", "name": "sgemm", "pid": 0, "tid": 7, "ts": base + 50, "dur": 5},
        {"ph": "s", "id": 5, "pid": pid, "tid": pid, "ts": base + 20, "name": "launch"},
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "x", "ts": base, "dur": 9},
    ]}


def test_merge_puts_every_rank_in_its_own_lanes_on_one_clock():
    wall = 1_700_000_000_000_000_000  # ns
    traces = {0: _trace(4242, 5000.0, 800_000.0), 1: _trace(4243, 9_000_000.0, 10.0)}
    infos = {0: {"start_ns": wall, "end_ns": wall + 2_000_000_000, "steps": [(0, wall / 1e9 + 0.0005)]},
             1: {"start_ns": wall + 1000, "end_ns": wall + 2_000_000_000, "steps": []}}
    merged = merge(traces, infos)
    events = merged["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {0: "rank 0", 1: "rank 0 · GPU 0", 100: "rank 1", 101: "rank 1 · GPU 0"}
    assert not [e for e in events if isinstance(e["pid"], str)]
    clocks = {e["pid"]: e["ts"] for e in events if e.get("name") == CLOCK_EVENT}
    assert clocks == {0: 0.0, 100: 1.0}  # each rank's marker at its own wall start, rank 1 one µs later
    flows = sorted(e["id"] for e in events if e.get("ph") == "s")
    assert flows == [10, 11]  # unique per rank
    assert [e["name"] for e in events if e.get("cat") == "ddp_magic"] == ["step 0"]

    rows = [rank_profile(r, merged, infos[r]) for r in (0, 1)]
    assert rows[0].collectives * 1e6 == pytest.approx(800_010.0)  # the union of the main thread's c10d op and the gloo thread's wait
    assert rows[1].collectives * 1e6 == pytest.approx(20.0)  # the gloo wait lies inside the c10d op
    assert rows[0].slowest_step is not None and rows[0].slowest_step[0] == 0
    rank, gap, why = waited_for(rows)
    assert rank == 1 and why.startswith("everyone waited for rank 1") and gap * 1e6 == pytest.approx(800_010.0 - 20.0)
    text = ProfileReport(path="/x/t.json", ranks=rows, why=why).text()
    assert "https://ui.perfetto.dev" in text and "chrome://tracing" in text and "everyone waited for rank 1" in text


def test_balanced_ranks_have_no_straggler():
    wall = 1_700_000_000_000_000_000
    traces = {0: _trace(1, 0.0, 500.0), 1: _trace(2, 0.0, 480.0)}
    infos = {r: {"start_ns": wall, "end_ns": wall + 1_000_000} for r in (0, 1)}
    merged = merge(traces, infos)
    rank, _, why = waited_for([rank_profile(r, merged, infos[r]) for r in (0, 1)])
    assert rank is None and why.startswith("no straggler")


def test_waits_under_a_tenth_of_the_cell_name_nobody_however_uneven():
    """Equal ranks under load: one sat 3 ms in collectives, the other 9 ms, in a 0.6 s cell. Noise, not a straggler."""
    ranks = [RankProfile(0, wall=0.6, collectives=0.009), RankProfile(1, wall=0.6, collectives=0.003)]
    assert waited_for(ranks).rank is None
    ranks = [RankProfile(0, wall=0.6, collectives=0.5), RankProfile(1, wall=0.6, collectives=0.01)]
    assert waited_for(ranks)[:2] == (1, pytest.approx(0.49))


class _Pool:
    """What ProfileRun.collect reads of a pool: each rank's DONE, its trace compressed in it (as from another host)."""

    def __init__(self, traces: dict, infos: dict) -> None:
        self.nproc = len(traces)
        self.done = {r: {"profile": dict(infos[r], data=zlib.compress(json.dumps(traces[r]).encode()))} for r in traces}

    def done_message(self, rank: int) -> dict:
        return self.done[rank]


def test_collect_gives_the_cells_metrics_the_profiles_straggler(tmp_path):
    wall = 1_700_000_000_000_000_000
    traces = {0: _trace(4242, 0.0, 400_000.0), 1: _trace(4243, 0.0, 10.0)}  # rank 0 waited 0.4 s: for rank 1
    infos = {r: {"start_ns": wall, "end_ns": wall + 500_000_000, "steps": []} for r in (0, 1)}
    metrics = CellMetrics()
    for rank in (0, 1):
        metrics.add(rank, [(i, 100.0 + i * 0.05, {"loss": 1.0}) for i in range(10)])  # logged after the collective: in step
    assert metrics.summary()[0].slowest is None
    report = ProfileRun(str(tmp_path / "t.json")).collect(_Pool(traces, infos), metrics)
    assert report.waited_for == 1 and "everyone waited for rank 1" in report.text()
    (loss,) = metrics.summary()
    assert (loss.slowest, loss.slowest_by, loss.lag) == (1, StragglerMeasure.PROFILE, pytest.approx(0.4, abs=1e-3))
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
