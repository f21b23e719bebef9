"""ddp_magic.log in real %%ddp -n 2 cells: every row arrives, in order; the chart stays in the output and names a slow rank only when one is."""
from __future__ import annotations

import base64
import json
import re

import pytest
from format_patterns import SECONDS, seconds_range

pytestmark = pytest.mark.kernel

LOG_CELL = (
    "%%ddp\nimport time, ddp_magic\n"
    "r = dist.get_rank()\n"
    "for i in range(300):\n"
    "    ddp_magic.log(step=i, loss=r * 1000 + i, lr=0.5)\n"
    "    if i % 100 == 99:\n"
    "        time.sleep(0.3)  # several flushes while the cell runs, the rest at its end\n"
)


def _charts(ex) -> list:
    return [d for d in ex.displays if d.get("text/html", "").startswith("<div class='ddp-metrics'")]


def _slowest(chart: dict) -> list:
    """The "slowest rank" column of the saved chart's text table, one entry per metric."""
    head, columns, *rows = chart["text/plain"].splitlines()
    at = columns.index("slowest rank")
    return [r[at:].strip() for r in rows]


def _rows(m: dict, rank: int, key: str) -> list:
    return [v for r, v in zip(m["rank"], m[key]) if r == rank]


@pytest.mark.parametrize("run", [1, 2])
def test_rows_from_two_ranks_arrive_complete_and_in_order(ddp2, run):
    ex = ddp2.run(LOG_CELL, timeout=120).ok()
    ddp2.run("m = %ddp metrics").ok()
    m = ddp2.value("{k: v for k, v in m.items() if k != 'time'}")
    assert set(m) == {"rank", "step", "loss", "lr"}
    for rank in (0, 1):
        assert _rows(m, rank, "step") == list(range(300))  # every row, in the order logged, this run's only
        assert _rows(m, rank, "loss") == [float(rank * 1000 + i) for i in range(300)]
    assert m["rank"] == [0] * 300 + [1] * 300
    (chart,) = _charts(ex)  # one saved chart, after the cell's output
    html = chart["text/html"]
    images = [base64.b64decode(b).decode() for b in re.findall(r"<img src='data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)'", html)]
    assert "<svg" not in html and len(images) == 2
    # loss: a line per rank; lr (0.5 on both ranks) drawn once, and the chart says so
    assert [svg.count("<polyline") for svg in images] == [2, 1]
    assert "identical" not in images[0] and ">ranks 0-1 identical<" in images[1]
    assert "<style" not in html
    head, columns, *rows = chart["text/plain"].splitlines()
    assert head == "ddp_magic metrics: loss, lr from 2 ranks, steps 0-299 (%ddp metrics gives the data)"
    assert [r.split()[0] for r in rows] == ["loss", "lr"]
    # loss: rank 0 logged 0..299, rank 1 1000..1299; the last values 299 and 1299, their mean 799
    assert rows[0].split()[1:5] == ["799", "(299", "to", "1299)"] and rows[0].split()[5:7] == ["0", "649.5"]


def test_cell_value_carries_metrics_and_default_steps(ddp2):
    ddp2.run("%%ddp --out res\nimport ddp_magic\nfor v in (3.0, torch.tensor(2.0), torch.tensor([1.5])):\n    ddp_magic.log(x=v)\ndist.get_rank()").ok()
    assert ddp2.value("list(res)") == [0, 1]
    assert ddp2.value("res.metrics['step']") == [0, 1, 2, 0, 1, 2]
    assert ddp2.value("res.metrics['x']") == [3.0, 2.0, 1.5] * 2


def test_a_cell_that_logs_nothing_keeps_the_last_metrics(ddp2):
    ddp2.run("%%ddp\nimport ddp_magic\nddp_magic.log(step=5, y=dist.get_rank())").ok()
    ex = ddp2.run("%%ddp\nx = 1").ok()
    assert not [d for d in ex.displays if d.get("text/html", "").startswith("<div class='ddp-metrics'")]
    ddp2.run("m = %ddp metrics").ok()
    assert ddp2.value("m['y']") == [0.0, 1.0]


def test_bad_values_say_what_to_log(ddp2):
    ex = ddp2.run("%%ddp\nimport ddp_magic\nddp_magic.log(loss='high')")
    assert ex.error is not None and "is not a number; log numbers or one-element tensors" in ex.stderr + str(ex.error)
    ex = ddp2.run("%%ddp\nddp_magic.log(loss=torch.ones(3))")
    assert ex.error is not None and "tensor of 3 elements" in ex.stderr + str(ex.error)


def test_outside_a_cell_log_does_nothing_and_df_needs_pandas(ddp2):
    ddp2.run("import ddp_magic\nddp_magic.log(step=1, loss=2.0)").ok()  # the kernel is no rank: a script runs the same everywhere
    ex = ddp2.run("%ddp metrics --df")
    try:
        import pandas  # noqa: F401
    except ImportError:
        assert "needs pandas" in ex.stderr + str(ex.error)
    else:
        ex.ok()
        assert "DataFrame" in ddp2.run("type(_).__name__").ok().result


def test_the_chart_is_live_in_the_status_view_while_the_cell_runs(ddp2):
    ex = ddp2.run("%%ddp\nimport time, ddp_magic\nfor i in range(8):\n    ddp_magic.log(step=i, loss=1 / (i + 1))\n    time.sleep(0.5)").ok()
    live = [json.dumps(m["content"]) for m in ex.messages if m["msg_type"] in ("comm_msg", "display_data", "update_display_data")]
    assert any("data-title='Metrics'" in t and "<polyline" in t for t in live), "the status view's Metrics section drew the chart"
    settled = [m["content"]["data"]["text/html"] for m in ex.messages if m["msg_type"] == "update_display_data"]
    assert settled and "data-state='finished'" in settled[-1] and "<polyline" not in settled[-1], "no second copy in the settled view"


# rank 1 is late to every step: it sleeps before it logs, then both meet in an all_reduce (as a DDP step does)
SLOW_RANK_1 = (
    "%%ddp\nimport time, ddp_magic\nx = torch.ones(1)\n"
    "for i in range(10):\n"
    "    time.sleep(0.1 if dist.get_rank() == 1 else 0.0)\n"
    "    ddp_magic.log(step=i, loss=1.0 / (i + 1))\n"
    "    dist.all_reduce(x)\n"
)
# equal ranks: the same work, then the all_reduce, then the log; a step is 0.2 s, so scheduling noise is far under a tenth
EQUAL_RANKS = (
    "%%ddp\nimport time, ddp_magic\nx = torch.ones(1)\n"
    "for i in range(8):\n"
    "    time.sleep(0.2)\n"
    "    dist.all_reduce(x)\n"
    "    ddp_magic.log(step=i, loss=1.0 / (i + 1))\n"
)


@pytest.mark.parametrize("run", [1, 2])
def test_the_chart_names_the_rank_that_is_late_every_step(ddp2, run):
    ex = ddp2.run(SLOW_RANK_1, timeout=120).ok()
    (chart,) = _charts(ex)
    (slowest,) = _slowest(chart)
    m = re.fullmatch(rf"rank 1 \(\+({SECONDS})\)", slowest)  # fmt_seconds: '+100 ms', '+1.20 s'
    assert m, chart["text/plain"]
    # it logged each step its 0.1 s sleep late, give or take when rank 0 got the CPU back: named, with about that lag (a
    # step's: less than the whole cell took, however loaded the machine)
    low, high = seconds_range(m.group(1))
    assert high >= 0.05 and low < ex.elapsed, (chart["text/plain"], ex.elapsed)
    assert "rank 1 (+" in chart["text/html"]


@pytest.mark.parametrize("run", [1, 2])
def test_ranks_in_step_have_no_straggler(ddp2, run):
    (chart,) = _charts(ddp2.run(EQUAL_RANKS, timeout=120).ok())
    assert _slowest(chart) == ["no straggler"], chart["text/plain"]
    assert "+0.00 s" not in chart["text/html"]
