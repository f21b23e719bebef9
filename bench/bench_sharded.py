#!/usr/bin/env python
"""Sharded results against plain tensor results: the time to bring 64 MiB per rank back to the kernel.

    .venv/bin/python bench/bench_sharded.py [--ns 2,4] [--mib 64] [--repeats 5] [--out docs/bench/sharded.md]

Through the Python API (``ddp_magic.Pool``, no Jupyter kernel), in one pool per
size, alternating the two kinds of cell so both see the same machine:

- plain: every rank returns a dense CPU tensor of ``--mib`` MiB (the existing result path:
  pickled with its bytes out of band, through /dev/shm, mapped by the kernel);
- sharded: every rank returns a DTensor whose local shard is ``--mib`` MiB (``Shard(0)``
  on a 1-D mesh of all ranks): the same path for the shard, plus its placement metadata,
  then one ``ShardedResult``; "+ full()" adds putting the global tensor together (one copy).

Each figure is the median over repeats, with min–max in brackets; the table goes to stdout
and to ``--out``.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

SETUP = """
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
elems = {mib} * (1 << 20) // 4
plain = torch.randn(elems)
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
sharded = DTensor.from_local(torch.randn(elems), mesh, [Shard(0)])
None
"""


def _timed(pool: Any, src: str, assemble: bool) -> Dict[str, float]:
    """One cell: the wall time until its values are in the kernel, and (sharded) until .full() is built."""
    t0 = time.perf_counter()
    outcome = pool.run(src)
    t1 = time.perf_counter()
    assert not outcome.failures, outcome.failures
    out = {"return": t1 - t0}
    if not assemble:  # the same work full() does: every byte read once into a fresh tensor
        copies = [v.clone() for v in outcome.values]
        out["full"] = time.perf_counter() - t0
        assert sum(c.numel() for c in copies) == sum(v.numel() for v in outcome.values)
    else:
        assert outcome.combined is not None, "the ranks' shards were not combined"
        full = outcome.combined.full()
        out["full"] = time.perf_counter() - t0
        assert full.numel() == sum(v.local.numel() for v in outcome.values)
    return out


def measure(n: int, mib: int, repeats: int) -> Dict[str, List[float]]:
    """Alternating plain and sharded cells on one pool of n ranks; the first of each kind is a warm-up."""
    from ddp_magic.kernel.pool import Pool

    pool = Pool(n)
    try:
        setup = pool.run(SETUP.format(mib=mib))
        assert not setup.failures, setup.failures
        samples: Dict[str, List[float]] = {"plain": [], "plain + clone()": [], "sharded": [], "sharded + full()": []}
        for i in range(repeats + 1):
            plain = _timed(pool, "plain", assemble=False)
            sharded = _timed(pool, "sharded", assemble=True)
            if i == 0:
                continue
            samples["plain"].append(plain["return"])
            samples["plain + clone()"].append(plain["full"])
            samples["sharded"].append(sharded["return"])
            samples["sharded + full()"].append(sharded["full"])
        return samples
    finally:
        pool.stop()


def fmt(xs: List[float]) -> str:
    return f"{statistics.median(xs) * 1000:.0f} ms [{min(xs) * 1000:.0f}–{max(xs) * 1000:.0f}]"


def table(results: Dict[int, Dict[str, List[float]]], mib: int, repeats: int) -> str:
    import torch

    head = [
        f"# Sharded results vs plain tensor results ({mib} MiB per rank)",
        "",
        f"`bench/bench_sharded.py --mib {mib} --repeats {repeats}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}, gloo.",
        "Wall time of a `Pool.run` cell from the call until every rank's value is in the kernel (median [min–max]);",
        "\"sharded + full()\" also puts the global tensor together (one copy of every byte into a fresh tensor);",
        "\"plain + clone()\" does the same amount of copying to the plain results, for a like-for-like figure: the plain",
        "results are views of the /dev/shm files, whose pages are only read (faulted in) when something reads them.",
        "GB/s: bytes returned (all ranks) / median time.",
        "",
        "| ranks | bytes back | plain tensor | sharded (DTensor) | sharded / plain | plain + clone() | sharded + full() | full() / clone() "
        "| GB/s plain + clone() | GB/s sharded + full() |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = []
    for n, s in sorted(results.items()):
        total = n * mib * (1 << 20)
        p, pc, sh, fu = (statistics.median(s[k]) for k in ("plain", "plain + clone()", "sharded", "sharded + full()"))
        rows.append(
            f"| {n} | {n * mib} MiB | {fmt(s['plain'])} | {fmt(s['sharded'])} | {sh / p:.2f} | {fmt(s['plain + clone()'])} | "
            f"{fmt(s['sharded + full()'])} | {fu / pc:.2f} | {total / pc / 1e9:.2f} | {total / fu / 1e9:.2f} |"
        )
    return "\n".join(head + rows) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ns", default="2,4", help="pool sizes, comma-separated")
    ap.add_argument("--mib", type=int, default=64, help="MiB returned per rank")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "docs", "bench", "sharded.md"))
    args = ap.parse_args()
    results = {n: measure(n, args.mib, args.repeats) for n in (int(x) for x in args.ns.split(","))}
    md = table(results, args.mib, args.repeats)
    print(md)
    if args.out:
        with open(args.out, "w") as f:
            f.write(md)


if __name__ == "__main__":
    main()
