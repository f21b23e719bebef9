"""How long each failure takes to reach the user (bench_recovery.py's second table): a figure per way a cell fails.

The kernel tests (tests/kernel/test_failures.py, test_cells.py) assert what came first (the error before the other
ranks' sleep ended, the interrupt before the cell's end); the seconds are measured here, on a warm pool of n ranks, one
fresh pool per sample (a failure may leave it broken). For a Ctrl-C the figure counts from the Ctrl-C (the cell's
``cancel``, as a notebook's interrupt is taken), for ``--timeout 2`` from the timeout, else from the cell's start.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

PY = sys.executable
WAIT = "import time\ntime.sleep(60)"
IGNORE = "import time\nwhile True:\n    try:\n        time.sleep(0.05)\n    except KeyboardInterrupt:\n        pass"
# label -> (code, --timeout, Ctrl-C after s)
FAULTS: Dict[str, Tuple[str, Optional[float], Optional[float]]] = {
    "a rank raises, the others wait in all_reduce": (
        "x = torch.ones(1)\nif dist.get_rank() == 1:\n    raise ValueError('planned')\ndist.all_reduce(x)", None, None),
    "a rank exits (os._exit), the others in a barrier": ("import os\nif dist.get_rank() == 1:\n    os._exit(3)\ndist.barrier()", None, None),
    "a rank is killed (SIGKILL), the others in a barrier": (
        "import os, signal\nif dist.get_rank() == 1:\n    os.kill(os.getpid(), signal.SIGKILL)\ndist.barrier()", None, None),
    "past --timeout 2, every rank sleeping": (WAIT, 2.0, None),
    "Ctrl-C, the ranks interruptible": (WAIT, None, 1.0),
    "Ctrl-C, the ranks ignore it (SIGTERM follows)": (IGNORE, None, 1.0),
}

CHILD = r'''
import json, sys, threading, time
from ddp_magic.kernel.pool import Pool
n, code, timeout, after = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
p = Pool(n)
try:
    p.run("import torch, torch.distributed as dist")  # warm: the pool's start is not part of the figure
    cancel = threading.Event()
    if after is not None:
        threading.Timer(after, cancel.set).start()
    t0 = time.monotonic()
    out = p.run(code, timeout=timeout, cancel=cancel)
    took = time.monotonic() - t0 - (after or timeout or 0.0)
    print("BENCHJSON " + json.dumps({"seconds": took, "ok": out.ok, "kinds": [str(f.kind) for f in out.failures]}), flush=True)
finally:
    p.stop()
'''


def sample(src: str, n: int, code: str, timeout: Optional[float], after: Optional[float]) -> dict:
    args = [PY, "-c", CHILD, str(n), code, json.dumps(timeout), json.dumps(after)]
    out = subprocess.run(args, env=dict(os.environ, PYTHONPATH=src), capture_output=True, text=True, timeout=300, cwd=src)
    for line in out.stdout.splitlines():
        if line.startswith("BENCHJSON "):
            got = json.loads(line[len("BENCHJSON "):])
            assert not got["ok"], f"the cell did not fail: {got}"
            return got
    raise RuntimeError(f"child failed: {out.stderr[-800:]}")


def measure(src: str, n: int, repeats: int) -> Dict[str, List[float]]:
    """Every failure, repeat by repeat (so drift affects them alike): seconds until the cell's error."""
    got: Dict[str, List[float]] = {}
    for _ in range(repeats):
        for label, (code, timeout, after) in FAULTS.items():
            got.setdefault(label, []).append(sample(src, n, code, timeout, after)["seconds"])
    print(f"n={n}: " + ", ".join(f"{label}: {statistics.median(v):.2f}s" for label, v in got.items()), flush=True)
    return got


def table(results: Dict[int, Dict[str, List[float]]], repeats: int) -> str:
    ns = sorted(results)
    rows = [f"A failure → the cell's error (s), median (min–max) of {repeats}; from the Ctrl-C, from the timeout, else from "
            "the cell's start; a warm pool.", "",
            "| failure | " + " | ".join(f"n={n}" for n in ns) + " |", "|---|" + "---|" * len(ns)]
    for label in FAULTS:
        cells = []
        for n in ns:
            v = results[n].get(label, [])
            cells.append(f"{statistics.median(v):.2f} ({min(v):.2f}–{max(v):.2f})" if v else "–")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)
