"""Short nccl bench for bench/gpu_check.sh: n = 1, 2 and the GPU count (when more than 2).

Cold start (pool start + first cell), a warm trivial cell, and result return of a
256 MiB CUDA tensor per rank (all_gather among ranks, then one copy to the host).
Prints a Markdown table; uses the plain Pool API (no kernel needed).
"""
from __future__ import annotations

import statistics
import sys
import time

from ddp_magic.plan.gpus import detect_gpus
from ddp_magic.kernel.pool import Pool


def bench(n: int) -> dict:
    row: dict = {"n": n}
    t0 = time.perf_counter()
    pool = Pool(n, backend="nccl")
    try:
        out = pool.run("import torch, torch.distributed as dist\nx = torch.ones(1, device='cuda')\ndist.all_reduce(x)\nx.item()")
        row["cold start s"] = time.perf_counter() - t0
        assert out.ok, out.failures
        warm = []
        for _ in range(30):
            t = time.perf_counter()
            pool.run("1")
            warm.append(time.perf_counter() - t)
        row["warm cell ms"] = statistics.median(warm) * 1e3
        pool.run("big = torch.empty(64 * 2**20, dtype=torch.float32, device='cuda'); torch.cuda.synchronize()")
        times = []
        for _ in range(3):
            t = time.perf_counter()
            out = pool.run("big")
            times.append(time.perf_counter() - t)
            assert out.ok and str(out.values[0].device) == "cpu"
        total = n * 256 * 2**20
        row["return 256MiB/rank MB/s"] = total / statistics.median(times) / 1e6
        row["GPU mem/rank MiB"] = max((i.memory or 0) for i in pool.ranks.values()) / 2**20
    finally:
        pool.stop()
    return row


def main() -> int:
    gpus = detect_gpus().count
    if gpus == 0:
        print("no GPU visible: nothing to bench")
        return 1
    ns = sorted({1, min(2, gpus), gpus})
    rows = []
    for n in ns:
        try:
            rows.append(bench(n))
        except Exception as e:  # report, do not hide
            rows.append({"n": n, "error": f"{type(e).__name__}: {e}"[:200]})
    cols = ["n", "cold start s", "warm cell ms", "return 256MiB/rank MB/s", "GPU mem/rank MiB", "error"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{r[c]:.2f}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
