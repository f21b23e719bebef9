#!/usr/bin/env python
"""bench_core.py, sections 2-4 through the Pool API, in a child process of their own (``python bench/core_api.py --n N``).

The same questions as core_live.py without a kernel: `Pool.restart()`, warm `Pool.run`
round trips, the first tensor result (the caller imports torch), result return. The
child prints its series as one BENCHJSON line; ``live_api`` runs it and merges them.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, List

import processes as P
from core_live import KERNEL_SETUP, make_tensor, sizes_for
from harness import MIB, PY, Store, short_error


def _run_ok(p: Any, src: str) -> Any:
    out = p.run(src)
    if not out.ok:
        raise RuntimeError("; ".join(f.headline() for f in out.failures))
    return out


def _timed(p: Any, src: str, check: Any) -> float:
    t0 = time.perf_counter()
    out = _run_ok(p, src)
    dt = time.perf_counter() - t0
    check(out)
    return dt


def _small_tensor_and_restart(p: Any, n: int, restart_repeats: int, store: Store, pids: List[int]) -> None:
    """The first tensor result (the kernel imports torch), then `Pool.restart` timed."""
    def values_are_ones(out: Any) -> None:
        if [float(v) for v in out.values] != [1.0] * n:
            raise RuntimeError(f"values {out.values!r}")

    def restart() -> float:
        t0 = time.perf_counter()
        p.restart()
        dt = time.perf_counter() - t0
        pids.extend(x for x in p.pids if x)
        return dt

    for which in ("first", "second"):
        store.measure(f"tensor1.api.{which}.n{n}", lambda: _timed(p, "torch.ones(1)", values_are_ones), quiet=True)
    for _ in range(restart_repeats):
        store.measure(f"restart.api.n{n}", restart, quiet=True)


def _warm(p: Any, n: int, warm_repeats: int, store: Store) -> None:
    """Warm `Pool.run` round trips, the two cells interleaved."""
    cells = {"ddp": ("1", [1] * n), "allreduce": ("x = torch.ones(1)\ndist.all_reduce(x)", [None] * n)}
    for _ in range(3):
        for src, _want in cells.values():
            _run_ok(p, src)
    for i in range(warm_repeats):
        for name, (src, want) in cells.items():
            def check(out: Any, want: List[Any] = want) -> None:
                if out.values != want:
                    raise RuntimeError(f"values {out.values!r}")

            store.measure(f"warm.api.{name}.n{n}", lambda src=src, check=check: _timed(p, src, check), i, quiet=True)


def _results(p: Any, n: int, a: argparse.Namespace, store: Store) -> None:
    """Result return through `Pool.run`: every rank's tensor of each size."""
    for size, allowed in sizes_for(n, a.sizes, a.max_total_gib):
        if not allowed:
            continue
        key = f"result.api.n{n}.s{size}"
        elems = size * MIB // 4
        try:
            _run_ok(p, make_tensor(elems, a.untouched))
        except Exception as e:
            store.error(key, short_error(e))
            continue

        def check(out: Any, elems: int = elems) -> None:
            if len(out.values) != n or any(getattr(v, "numel", lambda: -1)() != elems for v in out.values):
                raise RuntimeError(f"unexpected values {[type(v).__name__ for v in out.values]}")

        for _ in range(a.result_repeats):
            store.measure(key, lambda check=check: _timed(p, "t", check), quiet=True)
        _run_ok(p, "del t")


def child(a: argparse.Namespace) -> None:
    """Sections 2-4 through `Pool` in this (child) process; prints the series as one BENCHJSON line."""
    sys.path.insert(0, a.src)
    from ddp_magic.kernel.pool import Pool

    store = Store()
    pids: List[int] = []
    p = Pool(a.n)
    try:
        _run_ok(p, KERNEL_SETUP)
        proc = getattr(p.launcher, "proc", None)
        if proc is not None:
            pids.append(proc.pid)
        _small_tensor_and_restart(p, a.n, a.restart_repeats, store, pids)
        _run_ok(p, KERNEL_SETUP)
        _warm(p, a.n, a.warm_repeats, store)
        _results(p, a.n, a, store)
        pids.extend(x for x in p.pids if x)
    except Exception as e:
        store.error(f"live.api.n{a.n}", short_error(e))
    finally:
        p.stop()
    print("BENCHJSON " + json.dumps({"series": {k: s.to_dict() for k, s in store.series.items()}, "by_repeat": store.by_rep, "pids": pids}), flush=True)


def live_api(n: int, args: argparse.Namespace, store: Store, watch: P.Watch) -> None:
    """The child for n ranks, its series merged into ``store``; every pid it made must be gone."""
    argv = [PY, os.path.abspath(__file__), "--n", str(n), "--result-repeats", str(args.result_repeats),
            "--restart-repeats", str(args.restart_repeats), "--warm-repeats", str(args.warm_repeats), "--sizes", ",".join(map(str, args.sizes)),
            "--max-total-gib", str(args.max_total_gib), "--src", P.SRC] + (["--untouched"] if args.untouched else [])
    try:
        got = P.child_json(argv, timeout=900)
        store.merge(got["series"])
        for key, reps in got.get("by_repeat", {}).items():
            store.by_rep.setdefault(key, {}).update({int(r): v for r, v in reps.items()})
        watch.expect_gone(got["pids"], f"API pool n={n}")
    except Exception as e:
        store.error(f"live.api.n{n}", short_error(e))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, required=True)
    for name, default in (("--result-repeats", 5), ("--restart-repeats", 10), ("--warm-repeats", 50)):
        ap.add_argument(name, type=int, default=default)
    ap.add_argument("--sizes", default="64,256")
    ap.add_argument("--max-total-gib", type=float, default=3.0)
    ap.add_argument("--untouched", action="store_true")
    ap.add_argument("--src", default=P.SRC)
    ns = ap.parse_args()
    ns.sizes = [int(x) for x in ns.sizes.split(",") if x.strip()]
    child(ns)
