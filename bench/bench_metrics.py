"""The cost of ``ddp_magic.log``: bench_peers.py's training turns (%%ddp against torchrun, taking turns) with and without
one ``ddp_magic.log(step, loss)`` per step in the %%ddp cell.

    .venv/bin/python bench/bench_metrics.py                  # n=2, 3 runs of each, 500 timed steps per run
    .venv/bin/python bench/bench_metrics.py --ns 1,2 --runs 5 --train-steps 1000

Each run is one peers_train.train_turns: the same DDP loop (MLP 256→512→256, batch 64, SGD) in a %%ddp cell (status view
on, so the live chart is drawn too) and under torchrun at the same time, in strict turns of 50 steps; its ratio is the
median over the turn pairs of torchrun's turn time ÷ %%ddp's (= %%ddp steps/s ÷ torchrun steps/s). The two variants
alternate run by run. Prints a Markdown table and writes bench/results/metrics.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import processes as P  # noqa: E402
from bench_peers import parse_args  # noqa: E402
from harness import Store, log  # noqa: E402
from kernels import ensure_kernelspec  # noqa: E402
from peers_tools import TOOLS  # noqa: E402
from peers_train import train_turns  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "metrics.json")


def run(n: int, runs: int, argv: List[str], tmp: str, cleanup: P.Watch) -> Dict[str, List[float]]:
    """``runs`` turn-taking runs of each variant on one warm %%ddp pool of n ranks, alternating."""
    args = parse_args(argv)
    tool = TOOLS["ddp"](n, args, tmp, cleanup)
    ratios: Dict[str, List[float]] = {"plain": [], "log": []}
    try:
        tool.start_kernel()
        tool.setup_live()
        for i in range(runs):
            for variant in (("plain", "log") if i % 2 == 0 else ("log", "plain")):
                args.train_log = variant == "log"
                ratio, info = train_turns(tool, n, args, tmp)
                ratios[variant].append(ratio)
                log(f"n={n} {variant}: {ratio:.3f}× torchrun ({info['ddp_rate']:.1f} vs {info['torchrun_rate']:.1f} steps/s)")
        rows = tool.ok("m = %ddp metrics\nlen(m['step'])")["results"]
        log(f"n={n}: the last logging cell's metrics hold {rows[-1] if rows else '?'} rows")
    finally:
        tool.stop()
    return ratios


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ns", default="2", help="rank counts (default 2)")
    p.add_argument("--runs", type=int, default=3, help="runs of each variant (default 3)")
    p.add_argument("--train-steps", type=int, default=500, help="timed steps per run (default 500)")
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="ddp_bench_metrics_")
    cleanup = P.Watch(Store())
    ensure_kernelspec()
    out = {}
    try:
        for n in [int(x) for x in a.ns.split(",")]:
            out[n] = run(n, a.runs, ["--train-steps", str(a.train_steps)], tmp, cleanup)
    finally:
        cleanup.final()
    print("| n | %%ddp ÷ torchrun, plain | %%ddp ÷ torchrun, one ddp_magic.log per step | runs |")
    print("|---|---|---|---|")
    for n, r in out.items():
        print(f"| {n} | {statistics.median(r['plain']):.3f} ({min(r['plain']):.3f}-{max(r['plain']):.3f}) "
              f"| {statistics.median(r['log']):.3f} ({min(r['log']):.3f}-{max(r['log']):.3f}) | {len(r['log'])} |")
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({str(n): r for n, r in out.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
