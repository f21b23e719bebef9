"""What ``%ddp stacks`` costs: the wall time from the request to the grouped text, at n = 8 real ranks and up to
1,024 simulated ones (bench/simranks answers the on-demand STACK as a rank does), idle and while a cell runs.

    .venv/bin/python bench/bench_stacks.py                  # n = 8 real; 64, 256, 1,024 simulated; 20 repeats
    .venv/bin/python bench/bench_stacks.py --sim 1024 --real 8 --repeats 10

The running cell: every rank but one waits in all_reduce (a real gloo wait, or a simulated one) while rank 1
sleeps, as in docs/troubleshooting.md; the request is sent from another thread, as from a cell while a --bg job
runs. Each figure is the median (min-max) over the repeats; the text is built too (Stacks.text()), as %ddp prints it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from typing import Any, Callable, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from ddp_magic.kernel.stacks import stacks  # noqa: E402
from ddp_magic.kernel.jobs.turns import Ticket, Turns  # noqa: E402

REAL_CELL = "import time, torch, torch.distributed as dist\nt = torch.ones(1)\nif dist.get_rank() == 1:\n    time.sleep({s})\ndist.all_reduce(t)"
SIM_CELL = 'sim.sleep({s}, ranks=[1])\nsim.error("ValueError", "end of the sample", ranks=[1])\nsim.collective("all_reduce", 1, skip=[1])'  # rank 1 ends it


def sample(fn: Callable[[], Any], repeats: int) -> List[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def text(xs: List[float]) -> str:
    return f"{statistics.median(xs) * 1000:.0f} ms ({min(xs) * 1000:.0f}-{max(xs) * 1000:.0f})"


def measure(pool: Any, cell: str, repeats: int, label: str) -> None:
    turns = Turns()
    idle = sample(lambda: stacks(pool, turns).text(), repeats)
    ticket = Ticket("bench cell")
    turns.take(ticket)
    runner = threading.Thread(target=lambda: pool.run(cell.format(s=max(5.0, repeats * 0.5))))
    runner.start()
    time.sleep(2.0)  # the ranks are where the cell puts them
    busy = sample(lambda: stacks(pool, turns).text(), repeats)
    shown = stacks(pool, turns)
    runner.join()
    turns.give_back(ticket)
    print(f"| {label} | {text(idle)} | {text(busy)} | {len(shown.groups)} |", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", default="8", help="real rank counts (forked, gloo), comma-separated ('' for none)")
    ap.add_argument("--sim", default="64,256,1024", help="simulated rank counts, comma-separated")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    print("| ranks | idle | while a cell runs | groups |\n|---|---|---|---|")
    for n in [int(x) for x in args.real.split(",") if x]:
        from ddp_magic.kernel.pool import Pool

        pool = Pool(n, start_method="fork")
        pool.start()
        try:
            pool.run("import torch, torch.distributed as dist")
            measure(pool, REAL_CELL, args.repeats, f"{n} real")
        finally:
            pool.stop()
    for n in [int(x) for x in args.sim.split(",") if x]:
        import simranks

        pool = simranks.sim_pool(n)
        pool.start()
        try:
            measure(pool, SIM_CELL, args.repeats, f"{n:,} simulated")
        finally:
            pool.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
