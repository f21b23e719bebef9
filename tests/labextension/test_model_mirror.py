"""The panel writes times and metric values as the cell does, and both write them truly.

labextension/src/format.ts ``fmtSeconds`` mirrors ddp_magic/ui/status_render.py ``fmt_seconds``, and ``fmtValue``
mirrors ddp_magic/ui/metrics_chart.py ``fmt``; this runs the built TypeScript (labextension/lib/format.js, metrics.js,
...: pure, no JupyterLab imports) in node and compares the two on the same values. Agreeing is not enough (both once wrote 15,900 as
"1.59k"): the TypeScript's metric values are also read back and checked against the number they stand for.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from typing import Any, List


from format_patterns import half_place, read_back
from ddp_magic.plan.check import Check, checks_verdict
from ddp_magic.words import plural, ranks_phrase
from ddp_magic.ui.metrics_chart import fmt, group_line, identical_ranks, slowest_text, tick_labels
from ddp_magic.ui.status_render import fmt_seconds

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIB = os.path.join(ROOT, "labextension", "lib")
MODULES = ["format", "ranks", "state", "commands", "metrics", "groups"]  # the pure modules: M in the calls is all of them
VALUES = [0, 0.0005, 0.004, 0.005, 0.0125, 0.0355, 0.125, 0.375, 0.5, 0.9994, 0.9995, 0.9996, 1.005, 1.125, 2.125, 2.315, 9.999, 10.094,
          59.994, 59.996, 60, 64.5, 65.5, 75.25, 599.5, 3599.4, 3599.6, 3600, 3725, 86399]
# mantissas with more digits than either formatter shows, so no value is an exact decimal tie (Python rounds those
# half to even, JavaScript up); and the ones next to a rounding edge (9.9995 -> 10, 999.96k -> 1M)
MANTISSAS = [1.0, 1.00049, 1.23456, 1.5, 2.5, 3.14159, 4.99951, 5.963, 7.77777, 9.99949, 9.99951, 9.999999]
METRIC_VALUES = [0.0, 15900.0, 5963.0, 0.0002628, -0.0002628] + [
    sign * m * 10.0**e for e in range(-6, 13) for m in MANTISSAS for sign in (1, -1)
]


def _ts(function: str, values: List[Any]) -> List[Any]:
    """``function`` of labextension/src/ (format.ts, metrics.ts, ...) applied to every value, in node (a list value: its arguments)."""
    call = f"(Array.isArray(v) ? M.{function}(...v) : M.{function}(v))"
    out = _node_model(f"{json.dumps(values)}.map(v => {call})")
    assert isinstance(out, list)
    return out


def test_fmt_seconds_is_the_same_in_the_panel_and_the_cell_view() -> None:
    assert dict(zip(VALUES, _ts("fmtSeconds", VALUES))) == {v: fmt_seconds(v) for v in VALUES}


def test_the_panel_writes_every_metric_value_truly() -> None:
    shown = _ts("fmtValue", METRIC_VALUES)
    wrong = []
    for x, text in zip(METRIC_VALUES, shown):
        back = read_back(text)
        digits = re.sub(r"e.*$", "", text).replace("-", "").replace(".", "").lstrip("0")
        if abs(back - x) > half_place(text) * (1 + 1e-9) or len(digits) > 4:
            wrong.append(f"{x!r} -> {text!r} (reads {back!r})")
    assert not wrong, "\n".join(wrong[:20])
    assert dict(zip(METRIC_VALUES[:5], shown[:5])) == {0.0: "0", 15900.0: "15.9k", 5963.0: "5963", 0.0002628: "0.0002628", -0.0002628: "-0.0002628"}


def test_fmt_value_is_the_same_in_the_panel_and_the_cell_chart() -> None:
    shown = _ts("fmtValue", METRIC_VALUES + [None, float("nan")])  # JSON carries NaN as null: both are "-"
    want = [fmt(v) for v in METRIC_VALUES] + ["-", "-"]
    differ = [f"{x!r}: panel {a!r}, cell {b!r}" for x, a, b in zip(METRIC_VALUES + [None, None], shown, want) if a != b]
    assert not differ, "\n".join(differ[:20])


def test_the_y_axis_labels_and_identical_ranks_are_the_same_in_the_panel_and_the_cell_chart() -> None:
    triples = [[lo, (lo + hi) / 2, hi] for lo, hi in ((1.049, 16.8), (0.0, 1.0), (0.0002628, 0.00031), (-0.05, 0.05), (5181.0, 92500.0),
                                                      (1e-6, 3e-6), (0.6136, 0.7184), (2.31, 2.37), (99.2, 1000.7), (-3.3, -1.1),
                                                      (10.0, 16.25), (-16.25, -10.0), (0.0, 0.25))]  # 13.125: a tie (Python 13.12, toFixed 13.13)
    shown = _ts("tickLabels", [[t] for t in triples])
    assert shown == [tick_labels(t) for t in triples]
    for labels in shown:  # one precision on an axis (fmt's unit forms aside)
        if not any(c in "".join(labels) for c in "kMGTe"):
            assert len({len(t.split(".")[1]) if "." in t else 0 for t in labels}) == 1, labels
    lines = [{"0": [[0, 1.0], [1, 0.5]], "1": [[0, 1.0], [1, 0.5]], "2": [[0, 1.0]]}, {"0": [[0, 1.0]], "1": [[0, 2.0]]},
             {"3": [[0, 1.5]], "1": [[0, 1.5]], "2": [[0, 1.5]], "0": [[0, 0.5]]}]
    # rank 2 a step behind ranks 0 and 1, the same on the step it logged: one line, and the chart says so
    assert _ts("identicalRanks", [[x] for x in lines]) == [identical_ranks(x) for x in lines] == [[[0, 1, 2]], [], [[1, 2, 3]]]
    assert _ts("groupLine", [[lines[0], [0, 1, 2]]]) == [group_line(lines[0], [0, 1, 2])] == [[[0, 1.0], [1, 0.5]]]


def test_rank_lists_and_counts_are_worded_as_the_kernel_words_them() -> None:
    lists = [[1], [0, 1], [3, 0, 2, 1], [0, 2, 3], [0, 2], [5, 1, 2, 7, 8, 9]]
    assert _ts("ranksPhrase", [[r] for r in lists]) == [ranks_phrase(r) for r in lists]
    counts = [[n, "check"] for n in (0, 1, 2, 19)]
    assert _ts("plural", counts) == [plural(n, w) for n, w in counts]


def test_the_env_line_is_the_kernel_s_checks_verdict() -> None:
    """The panel counts the checks as plan/check.py checks_verdict does when the kernel sent no line of its own."""
    cases = [(0, 0, 19), (1, 0, 18), (2, 1, 16), (0, 1, 18), (0, 3, 1), (0, 0, 1)]
    checks = {c: [Check("f", False, "x")] * c[0] + [Check("w", False, "x", "warning")] * c[1] + [Check("p", True, "x")] * c[2] for c in cases}
    summaries = [
        [{"verdict": "", "problems": [k.to_dict() for k in cs if not k.ok], "passed": sum(k.ok for k in cs), "total": len(cs)}]
        for cs in checks.values()
    ]
    assert _ts("envHeadline", summaries) == [checks_verdict(cs) for cs in checks.values()]


def _node_model(calls: str) -> object:
    """Evaluate ``calls`` (a JS expression over ``M``, the exports of the built pure modules) in node; its JSON value."""
    node = shutil.which("node")
    assert node is not None, "node is needed to build the extension (scripts/setup.sh installs it)"
    assert os.path.exists(os.path.join(LIB, "format.js")), "labextension/lib/ is missing: run bash scripts/build_labextension.sh"
    with tempfile.TemporaryDirectory() as tmp:
        # lib/ is ES modules whose imports name no extension (the bundler resolves them): .mjs copies, each import
        # naming its .mjs, import in node without a package.json
        for name in os.listdir(LIB):
            if name.endswith(".js"):
                with open(os.path.join(LIB, name)) as f:
                    text = re.sub(r"""(from\s+['"]\./[\w-]+)(['"])""", r"\1.mjs\2", f.read())
                with open(os.path.join(tmp, name[:-3] + ".mjs"), "w") as f:
                    f.write(text)
        imports = "".join(f"import * as {m} from {json.dumps(os.path.join(tmp, m + '.mjs'))}; " for m in MODULES)
        script = f"{imports}const M = {{{', '.join('...' + m for m in MODULES)}}}; console.log(JSON.stringify({calls}));"
        out = subprocess.run([node, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_background_job_reads_the_same_in_the_status_bar_and_in_percent_ddp_status() -> None:
    from ddp_magic.kernel.jobs.turns import Ticket, clock_text
    from ddp_magic.ui.labsnap import job_dict

    seconds = [0, 0.4, 7.9, 59.99, 61, 3599.5, 3731, 86399, 360000]
    assert _node_model(f"{json.dumps(seconds)}.map(M.clockText)") == [clock_text(s) for s in seconds]
    tickets = [Ticket("cell [12]", True), Ticket("cell [3]", True, since=0.0, ran=0.0), Ticket("cell [7]", False, since=0.0, ran=0.0),
               Ticket("cell [9]", True, since=0.0)]  # the last: its pool starts, its cell has not reached the ranks
    tickets[1].progress = lambda: 4120
    jobs = [job_dict(t) for t in tickets]
    shown = _node_model(f"{json.dumps(jobs)}.map(j => M.jobText(j, 0, 0))")
    assert shown == [j["text"] for j in jobs]  # read at the snapshot's moment: the kernel's own words
    assert shown[0] == "background: cell [12] queued" and re.fullmatch(r"background: cell \[3\] running \d+:\d\d:\d\d, step 4,120", shown[1])
    assert shown[3] == "background: cell [9] starting"


def test_the_slowest_ranks_lag_is_the_same_figure_in_the_panel_and_the_cell_chart() -> None:
    """The cell wrote ``+0.04 s`` where the panel wrote ``+36 ms``: both are fmt_seconds now."""
    lags = [0.036, 0.55, 1.0, 2.125, 75.25]
    msgs = [{"summary": [{"name": "loss", "last": 1.0, "last_lo": 1.0, "last_hi": 1.0, "min": 1.0, "mean": 1.0, "slowest": 1, "lag": lag}],
             "final": True} for lag in lags]
    panel = [rows[0]["slowest"] for rows in _ts("metricRows", [[m] for m in msgs])]
    assert panel == [slowest_text({"slowest": 1, "lag": lag}) for lag in lags] == ["rank 1 (+36 ms)", "rank 1 (+550 ms)", "rank 1 (+1.00 s)",
                                                                                   "rank 1 (+2.12 s)", "rank 1 (+1 m 15 s)"]
