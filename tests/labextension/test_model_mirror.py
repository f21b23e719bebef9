"""The panel and the status bar write times as the cell's status view does: one clock, one format.

labextension/src/model.ts ``fmtSeconds`` mirrors ddp_magic/ui/status_render.py ``fmt_seconds``; this runs the
built TypeScript (labextension/lib/model.js, pure: no imports) in node and compares the two on the same values.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest

from ddp_magic.ui.status_render import fmt_seconds

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL_JS = os.path.join(ROOT, "labextension", "lib", "model.js")
VALUES = [0, 0.0005, 0.004, 0.005, 0.0125, 0.0355, 0.125, 0.375, 0.5, 0.9994, 0.9995, 0.9996, 1.005, 1.125, 2.125, 2.315, 9.999, 10.094,
          59.994, 59.996, 60, 64.5, 65.5, 75.25, 599.5, 3599.4, 3599.6, 3600, 3725, 86399]


def test_fmt_seconds_is_the_same_in_the_panel_and_the_cell_view() -> None:
    node = shutil.which("node")
    if node is None or not os.path.exists(MODEL_JS):
        pytest.skip("needs node and the built extension (jlpm build in labextension/)")
    with tempfile.TemporaryDirectory() as tmp:
        module = os.path.join(tmp, "model.mjs")  # lib/ is an ES module; a .mjs copy imports without a package.json
        shutil.copyfile(MODEL_JS, module)
        script = f"import * as M from {json.dumps(module)}; console.log(JSON.stringify({json.dumps(VALUES)}.map(M.fmtSeconds)));"
        out = subprocess.run([node, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert dict(zip(VALUES, json.loads(out.stdout))) == {v: fmt_seconds(v) for v in VALUES}


def _node_model(calls: str) -> object:
    """Evaluate ``calls`` (a JS expression over the built model, ``M``) in node; its JSON value."""
    node = shutil.which("node")
    if node is None or not os.path.exists(MODEL_JS):
        pytest.skip("needs node and the built extension (jlpm build in labextension/)")
    with tempfile.TemporaryDirectory() as tmp:
        module = os.path.join(tmp, "model.mjs")
        shutil.copyfile(MODEL_JS, module)
        script = f"import * as M from {json.dumps(module)}; console.log(JSON.stringify({calls}));"
        out = subprocess.run([node, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_background_job_reads_the_same_in_the_status_bar_and_in_percent_ddp_status() -> None:
    from ddp_magic.kernel.turns import Ticket, clock_text
    from ddp_magic.ui.labsnap import job_dict

    seconds = [0, 0.4, 7.9, 59.99, 61, 3599.5, 3731, 86399, 360000]
    assert _node_model(f"{json.dumps(seconds)}.map(M.clockText)") == [clock_text(s) for s in seconds]
    tickets = [Ticket("cell [12]", True), Ticket("cell [3]", True, since=0.0), Ticket("cell [7]", False, since=0.0)]
    tickets[1].progress = lambda: 4120
    jobs = [job_dict(t) for t in tickets]
    shown = _node_model(f"{json.dumps(jobs)}.map(j => M.jobText(j, 0, 0))")
    assert shown == [j["text"] for j in jobs]  # read at the snapshot's moment: the kernel's own words
    assert shown[0] == "background: cell [12] queued" and re.fullmatch(r"background: cell \[3\] running \d+:\d\d:\d\d, step 4,120", shown[1])
