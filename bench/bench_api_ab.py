#!/usr/bin/env python
"""Before and after, paired, through the Pool API: ``Pool.run("1")`` on n simulated ranks in two processes side by side.

Process A runs ddp_magic as committed at ``--rev`` (git archive, the checkout untouched), process B this tree; each
holds a started pool of n simulated ranks (bench/simranks), both alive at once. Each repeat runs one warm cell in
both, their order alternating, so a slow moment of a shared machine hits A and B alike. Kernel CPU is the process's
(every thread, split into user and system time); wall is the call. *B − A* is taken repeat by repeat, then its median.

    .venv/bin/python bench/bench_api_ab.py --n 1024 --repeats 40 --rev main
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from typing import Dict, List

from harness import HERE, REPO, log
from processes import export_rev

CHILD = """
import json, resource, sys, time
sys.path.insert(0, {here!r})
import simranks
pool = simranks.sim_pool({n})
pool.start()
for _ in range(5):
    pool.run("1")
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() != "go":
        break
    r0, c0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), time.perf_counter()
    out = pool.run("1")
    wall, cpu, r1 = time.perf_counter() - t0, time.process_time() - c0, resource.getrusage(resource.RUSAGE_SELF)
    if out.values != [1] * {n}:
        raise SystemExit("a rank's value is not 1")
    print(json.dumps([cpu * 1e3, wall * 1e3, (r1.ru_utime - r0.ru_utime) * 1e3, (r1.ru_stime - r0.ru_stime) * 1e3]), flush=True)
pool.stop()
"""


def measure(n: int, repeats: int, srcs: Dict[str, str]) -> Dict[str, List[List[float]]]:
    """tree -> [[CPU ms, wall ms, user ms, system ms]] by repeat."""
    procs: Dict[str, subprocess.Popen] = {}
    got: Dict[str, List[List[float]]] = {tree: [] for tree in srcs}
    try:
        for tree, src in srcs.items():  # the simulated ranks' hosts inherit PYTHONPATH: they run the same tree
            procs[tree] = subprocess.Popen([sys.executable, "-c", CHILD.format(here=HERE, n=n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           text=True, env=dict(os.environ, PYTHONPATH=src), cwd=src)
            if (procs[tree].stdout.readline() if procs[tree].stdout else "").strip() != "ready":  # type: ignore[union-attr]
                raise RuntimeError(f"the pool of tree {tree} did not start")
        for i in range(repeats):
            for tree in (list(procs) if i % 2 == 0 else list(procs)[::-1]):
                p = procs[tree]
                p.stdin.write("go\n")  # type: ignore[union-attr]
                p.stdin.flush()  # type: ignore[union-attr]
                got[tree].append(json.loads(p.stdout.readline()))  # type: ignore[union-attr]
    finally:
        for p in procs.values():
            try:
                p.communicate("stop\n", timeout=60)
            except (subprocess.TimeoutExpired, OSError, ValueError):
                p.kill()
                p.wait()
    return got


def report(n: int, got: Dict[str, List[List[float]]], names: Dict[str, str]) -> str:
    med = statistics.median
    lines = [f"n = {n}, {len(got['B'])} repeats, median (ms):", "", "| tree | CPU | user | system | wall |", "|---|---|---|---|---|"]
    for tree, name in names.items():
        g = got[tree]
        lines.append(f"| {name} | " + " | ".join(f"{med(x[i] for x in g):.1f}" for i in (0, 2, 3, 1)) + " |")
    pair = [[b[i] - a[i] for i in range(4)] for a, b in zip(got["A"], got["B"])]
    lines.append("| B − A, repeat by repeat | " + " | ".join(f"{med(d[i] for d in pair):.2f}" for i in (0, 2, 3, 1)) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=1024, help="simulated ranks in each pool (default 1024)")
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--rev", default="main", help="the 'before' tree: ddp_magic as committed at this revision (default main)")
    args = p.parse_args()
    before, sha = export_rev(args.rev)
    load = os.getloadavg()[0]
    try:
        got = measure(args.n, args.repeats, {"A": before, "B": REPO})
    finally:
        shutil.rmtree(before, ignore_errors=True)
    out = f"load average at start {load:.2f}\n\n" + report(args.n, got, {"A": f"{args.rev} ({sha[:10]})", "B": "this tree"})
    log(out)
    print(out + f"load average at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
