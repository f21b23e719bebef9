"""A kept pool's output path (docs/keep.md, "Shown exactly once"): what the marks on its stream messages cost.

    .venv/bin/python bench/bench_keep_print.py [ROOT] [--rounds 8]   # ROOT: the checkout whose ddp_magic runs (default: this one)

At n = 2, on one pool, in rounds of two blocks (kept with ``%ddp keep``, normal with ``--off``, the order alternating):
10 warm ``%%ddp 1`` cells and 3 cells that print 2,000 lines a rank. Prints each block's medians and, per kind of
cell, the median of the rounds' kept ÷ normal ratios (the machine's drifting load cancels within a round). Run it on
two checkouts to compare their kept paths.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List

PRINT = "%%ddp\nfor i in range(2000):\n    print('line', i)\n"


def _block(k: Any, times: Dict[str, List[float]]) -> None:
    """One block: the warm cells, then the printing cells; their medians."""
    warm = []
    for _ in range(10):
        t = time.monotonic()
        k.run("%%ddp\n1").ok()
        warm.append(time.monotonic() - t)
    printing = []
    for _ in range(3):
        t = time.monotonic()
        ex = k.run(PRINT, timeout=120).ok()
        printing.append(time.monotonic() - t)
        assert ex.stdout.count("line") >= 4000, len(ex.stdout)
    times["warm"].append(statistics.median(warm))
    times["print"].append(statistics.median(printing))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(args.root, "tests"))
    from kernel_helper import Kernel  # the checkout's own

    runtime = tempfile.mkdtemp(prefix="kpb-", dir="/tmp")
    k = Kernel(extra_env={"JUPYTER_RUNTIME_DIR": runtime, "JPY_SESSION_NAME": "bench.ipynb", "PYTHONPATH": args.root})
    res: Dict[bool, Dict[str, List[float]]] = {True: {"warm": [], "print": []}, False: {"warm": [], "print": []}}
    try:
        k.run("%load_ext ddp_magic").ok()
        k.run("%%ddp -n 2\n1", timeout=180).ok()
        for r in range(args.rounds):
            for keep in (True, False) if r % 2 == 0 else (False, True):
                k.run("%ddp keep" if keep else "%ddp keep --off", timeout=60).ok()
                _block(k, res[keep])
        for what in ("warm", "print"):
            ratios = [a / b for a, b in zip(res[True][what], res[False][what])]
            print(f"{what}: kept {[round(x * 1e3, 1) for x in res[True][what]]} ms, normal {[round(x * 1e3, 1) for x in res[False][what]]} ms, "
                  f"kept ÷ normal median {statistics.median(ratios):.3f} ({', '.join(f'{x:.3f}' for x in ratios)})")
    finally:
        try:
            k.run("%ddp stop", timeout=60)
        finally:
            k.shutdown()
            shutil.rmtree(runtime, ignore_errors=True)


if __name__ == "__main__":
    main()
