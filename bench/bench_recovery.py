#!/usr/bin/env python
"""Recovery time: from a failure to the next cell's result, three ways.

    .venv/bin/python bench/bench_recovery.py                      # n = 2,4; 3 repeats
    .venv/bin/python bench/bench_recovery.py --ns 2 --repeats 5 --old-rev d58773e

The failure: rank 1 raises while every other rank waits in ``all_reduce``. The state: a
model the ranks built before (``--state-mib`` of float32 parameters per rank, built in a
setup cell whose time is measured too; ``--reload-s`` adds a sleep to it standing for the
minutes loading a model onto GPUs takes, which the old path and torchrun pay again).

- **re-form** (this working tree): the failing cell, then the next cell (an all_reduce
  that reads the model). Nothing is rebuilt: the group is re-formed in the same processes.
- **kill and restart** (ddp_magic at ``--old-rev``, git archive; the behaviour before
  issue 17): the failing cell stops the stuck ranks, the next cell restarts the pool, and
  the setup cell must run again before the model can be read.
- **torchrun relaunch**: the same failure in a torchrun job (until torchrun exits), then
  a fresh ``torchrun --standalone`` that builds the state again and all_reduces.

A second table (bench/recovery_faults.py): each way a cell fails, the seconds until its error (a rank raises, exits
or is killed; past --timeout; Ctrl-C, heeded or not). ``--faults-only`` runs it alone.

Every figure is a median (min–max) over the repeats. Writes bench/results/recovery.md and .json
and prints a Markdown table (docs/bench/recovery.md holds a run).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

import recovery_faults
from harness import write_report  # bench/ is sys.path[0] when this runs as a script

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PY = sys.executable
OUT = os.path.join(HERE, "results", "recovery")  # .md and .json (harness.write_report)

SETUP = "import os, time, torch, torch.distributed as dist\nmodel = torch.nn.Linear({k}, {k})\ntime.sleep({reload})\nlen(list(model.parameters()))"
FAIL = "x = torch.ones(1)\nif dist.get_rank() == 1:\n    raise ValueError('planned')\ndist.all_reduce(x)"
NEXT = "t = model.weight.sum().reshape(1)\ndist.all_reduce(t)\nt.item()"

# One child process per measurement: a Pool of the ddp_magic on its PYTHONPATH, timed around the cells.
CHILD = r'''
import json, sys, time
from ddp_magic.kernel.pool import Pool
n, setup, fail, nxt, restart = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1"
p = Pool(n)
try:
    p.run("1")  # the pool's cold start is not part of any figure
    t = time.monotonic(); p.run(setup); setup_s = time.monotonic() - t
    pids = p.pids
    t0 = time.monotonic()
    failed = p.run(fail)
    t1 = time.monotonic()
    if restart:  # the old behaviour: the state is gone, so the setup runs again first
        p.run(setup)
    out = p.run(nxt)
    t2 = time.monotonic()
    print("BENCHJSON " + json.dumps({"setup_s": setup_s, "fail_s": t1 - t0, "next_s": t2 - t1, "total_s": t2 - t0,
          "ok": out.ok, "same_pids": p.pids == pids, "notes": failed.notes[-2:]}), flush=True)
finally:
    p.stop()
'''

JOB = (
    "import os, sys, time, torch, torch.distributed as dist\n"
    "dist.init_process_group('gloo')\n"
    "model = torch.nn.Linear({k}, {k})\ntime.sleep({reload})\n"
    "x = torch.ones(1)\n"
    "if sys.argv[1] == 'fail' and dist.get_rank() == 1:\n"
    "    os.write(1, f'FAILAT {{time.time()!r}}\\n'.encode())\n    raise ValueError('planned')\n"
    "dist.all_reduce(x)\n"
    "t = model.weight.sum().reshape(1)\ndist.all_reduce(t)\n"
    "os.write(1, f'RESULT {{time.time()!r}}\\n'.encode())\n"
    "dist.destroy_process_group()\n"
)


def child(src: str, n: int, a: argparse.Namespace, restart: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=src)
    args = [PY, "-c", CHILD, str(n), SETUP.format(k=a.k, reload=a.reload_s), FAIL, NEXT, "1" if restart else "0"]
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600, cwd=src)
    for line in out.stdout.splitlines():
        if line.startswith("BENCHJSON "):
            return json.loads(line[len("BENCHJSON "):])
    raise RuntimeError(f"child failed: {out.stderr[-800:]}")


def torchrun(n: int, job: str, mode: str) -> float:
    """Seconds from the failure until torchrun exits (``fail``), or from launch until the last rank printed its result (``ok``)."""
    exe = os.path.join(os.path.dirname(PY), "torchrun")
    argv = ([exe] if os.path.exists(exe) else [PY, "-m", "torch.distributed.run"]) + ["--standalone", f"--nproc-per-node={n}", job, mode]
    t0 = time.time()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=REPO))
    if mode == "fail":
        failed = [float(line.split()[1]) for line in out.stdout.splitlines() if line.startswith("FAILAT ")]
        return time.time() - (failed[0] if failed else t0)
    stamps = [float(line.split()[1]) for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if len(stamps) != n:
        raise RuntimeError(f"torchrun job: {out.stderr[-800:]}")
    return max(stamps) - t0


def old_tree(rev: str, tmp: str) -> str:
    """ddp_magic as committed at ``rev``, exported with git archive (the checkout is not touched)."""
    dest = os.path.join(tmp, "old")
    os.makedirs(dest)
    archive = subprocess.run(["git", "-C", REPO, "archive", rev, "ddp_magic"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    return dest


def med(values: List[float]) -> str:
    if not values:
        return "–"
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def measure(n: int, a: argparse.Namespace, old: str, job: str) -> Dict[str, List[float]]:
    """Every way, interleaved repeat by repeat so drift affects them alike."""
    got: Dict[str, List[float]] = {}
    for _ in range(a.repeats):
        new = child(REPO, n, a, restart=False)
        assert new["ok"] and new["same_pids"], new
        got.setdefault("reform.fail", []).append(new["fail_s"])
        got.setdefault("reform.total", []).append(new["total_s"])
        got.setdefault("setup", []).append(new["setup_s"])
        was = child(old, n, a, restart=True)
        got.setdefault("old.fail", []).append(was["fail_s"])
        got.setdefault("old.total", []).append(was["total_s"])
        down = torchrun(n, job, "fail")
        up = torchrun(n, job, "ok")
        got.setdefault("torchrun.fail", []).append(down)
        got.setdefault("torchrun.total", []).append(down + up)
        print(f"n={n}: re-form {new['total_s']:.2f}s, kill+restart {was['total_s']:.2f}s, torchrun {down + up:.2f}s", flush=True)
    return got


def table(results: Dict[int, Dict[str, List[float]]], a: argparse.Namespace) -> str:
    rows = [
        f"Failure → next cell's result (s), median (min–max) of {a.repeats}; state: Linear({a.k}, {a.k}) per rank "
        f"({a.k * a.k * 4 / 2**20:.0f} MiB) and a {a.reload_s:g} s sleep standing for a reload; old = ddp_magic {a.old_rev}.",
        "",
        "| n | re-form (this tree) | of which the failing cell | kill and restart (old) | of which the failing cell "
        "| torchrun relaunch | of which the failed job | setup cell alone |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, g in sorted(results.items()):
        rows.append(
            f"| {n} | {med(g['reform.total'])} | {med(g['reform.fail'])} | {med(g['old.total'])} | {med(g['old.fail'])} "
            f"| {med(g['torchrun.total'])} | {med(g['torchrun.fail'])} | {med(g['setup'])} |"
        )
    return "\n".join(rows)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ns", default="2,4")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--k", type=int, default=2048, help="the state: Linear(k, k) per rank (default 2048: 16 MiB)")
    p.add_argument("--reload-s", type=float, default=0.0, help="seconds the setup sleeps, standing for loading a model (default 0)")
    p.add_argument("--old-rev", default="d58773e", help="the ddp_magic to compare with (default d58773e: the last commit before issue 17)")
    p.add_argument("--faults-only", action="store_true", help="only the second table: each failure's seconds to its error")
    a = p.parse_args(argv)
    ns = [int(x) for x in a.ns.split(",") if x.strip()]
    faults = {n: recovery_faults.measure(REPO, n, a.repeats) for n in ns}
    if a.faults_only:
        text = recovery_faults.table(faults, a.repeats)
        write_report(OUT + "_faults", text, {"args": vars(a), "faults": faults, "table": text})
        return 0
    results: Dict[int, Dict[str, List[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="ddp_bench_recovery_") as tmp:
        old = old_tree(a.old_rev, tmp)
        job = os.path.join(tmp, "job.py")
        with open(job, "w") as f:
            f.write(JOB.format(k=a.k, reload=a.reload_s))
        for n in ns:
            results[n] = measure(n, a, old, job)
    text = table(results, a) + "\n\n" + recovery_faults.table(faults, a.repeats)
    write_report(OUT, text, {"args": vars(a), "results": results, "faults": faults, "table": text})
    return 0


if __name__ == "__main__":
    sys.exit(main())
