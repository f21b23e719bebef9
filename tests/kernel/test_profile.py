"""%%ddp --profile in a real kernel: one merged Chrome trace with a lane group per rank, and the straggler named, by the
profile's table and by the cell's metrics chart alike (or by neither, when the ranks are equal)."""
from __future__ import annotations

import json
import os

import pytest

from ddp_magic.wire import shm

pytestmark = pytest.mark.kernel

SLOW_RANK_1 = (
    "import time, torch\n"
    "x = torch.ones(1000)\n"
    "for i in range(8):\n"
    "    if dist.get_rank() == 1:\n"
    "        time.sleep(0.2)  # rank 1 is late to every all_reduce: rank 0 waits 1.6 s, more than a late start under load\n"
    "    dist.all_reduce(x)\n"
    "    ddp_magic.log(step=i, x=float(x[0]))\n"
)


def _trace_files(k) -> list:
    """The ranks' own trace files of this kernel's pools (another worker's kernels make theirs at the same time)."""
    mine = f"{shm.SHM_PREFIX}{shm.pid_namespace()}-{k.pid}-"
    return sorted(n for n in os.listdir(shm.SHM_DIR) if n.startswith(mine) and ("-p0-" in n or "-p1-" in n))


@pytest.mark.parametrize("run", [1, 2])
def test_profile_merges_every_rank_and_names_the_straggler(ddp2, tmp_path, run):
    path = tmp_path / f"trace{run}.json"
    ex = ddp2.run(f"%%ddp --profile {path}\nimport ddp_magic\n{SLOW_RANK_1}", timeout=180).ok()
    assert "everyone waited for rank 1" in ex.stdout, ex.stdout
    assert "https://ui.perfetto.dev" in ex.stdout and "chrome://tracing" in ex.stdout
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    lanes = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert "rank 0" in lanes.values() and "rank 1" in lanes.values()
    for rank in (0, 1):
        mine = [e for e in events if e.get("ph") == "X" and rank * 100 <= e["pid"] < rank * 100 + 100]
        assert any(e["name"].startswith("gloo:all_reduce") or e["name"] == "c10d::allreduce_" for e in mine), f"rank {rank}: no collective"
        steps = [e for e in events if e.get("cat") == "ddp_magic" and e["pid"] == rank * 100]
        assert [e["name"] for e in steps] == [f"step {i}" for i in range(8)]
    assert min(e["ts"] for e in events if "ts" in e) > -1e5  # one clock: the cell starts near 0 on every rank
    assert _trace_files(ddp2) == [], "the ranks' own trace files are removed once merged"
    # the chart names the same rank: the steps alone could not (every rank logs right after the all_reduce), the profile does
    assert _slowest(ex) == ["rank 1 (profile: the others waited"], _chart(ex)["text/plain"]


EQUAL = (
    "import time, torch\n"
    "x = torch.ones(1000)\n"
    "for i in range(6):\n"
    "    time.sleep(0.1)  # the same work on every rank: a 0.6 s cell, so noise is far under a tenth of it\n"
    "    dist.all_reduce(x)\n"
    "    ddp_magic.log(step=i, x=float(x[0]))\n"
)


@pytest.mark.parametrize("run", [1, 2])
def test_equal_ranks_have_no_straggler_in_the_profile_or_the_chart(ddp2, tmp_path, run):
    ex = ddp2.run(f"%%ddp --profile {tmp_path}/t.json\nimport ddp_magic\n{EQUAL}", timeout=180).ok()
    assert "no straggler: no rank kept the others waiting" in ex.stdout and "everyone waited" not in ex.stdout, ex.stdout
    assert _slowest(ex) == ["no straggler"], _chart(ex)["text/plain"]


def _chart(ex) -> dict:
    (chart,) = [d for d in ex.displays if d.get("text/html", "").startswith("<div class='ddp-metrics'")]
    return chart


def _slowest(ex) -> list:
    """The saved chart's "slowest rank" column, per metric, up to its measured seconds."""
    head, columns, *rows = _chart(ex)["text/plain"].splitlines()
    return [r[columns.index("slowest rank"):].split(" +")[0].strip() for r in rows]


def test_the_next_cell_is_not_profiled_and_a_bad_path_says_so(ddp2, tmp_path):
    ex = ddp2.run("%%ddp\n1").ok()
    assert "ddp_magic profile" not in ex.stdout
    ex = ddp2.run(f"%%ddp --profile {tmp_path}/no/such/dir/t.json\n1")
    assert ex.error is not None and "cannot write into" in ex.stderr + str(ex.error)
    ex = ddp2.run("%%ddp\n2").ok()  # the refused profile armed nothing
    assert "ddp_magic profile" not in ex.stdout
