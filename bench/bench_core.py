#!/usr/bin/env python
"""Core benchmarks of ddp_magic: cold start, restart, warm round trip, result return.

    .venv/bin/python bench/bench_core.py [--ns 1,2,4,8] [--repeats R] [--warm-repeats W]
                                         [--max-total-gib G] [--quick]

Prints Markdown tables and writes them to bench/results/core.md, with the raw
numbers in bench/results/core.json. Every figure is a median over repeats with
min–max in brackets. See bench/README.md for what each column means.

The questions live in their own files: core_cold.py (1. cold start), core_live.py
(2-4 in a kernel), core_api.py (2-4 through the Pool API, a child process),
memcpy.py (the floor of a result return), core_report.py (the tables); the
harness (harness.py, processes.py, kernels.py, jobs.py) is shared with every bench.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import List, Optional, Tuple

import jobs
import processes as P
from core_api import live_api
from core_cold import cold_api, cold_kernel
from core_live import live_kernel, sizes_for
from core_report import render
from harness import REPO, RESULTS_DIR, Store, log, run_meta, write_report
from memcpy import memcpy_baseline


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ns", default=None, help="rank counts, comma-separated (default 1,2,4,8; --quick: 1,2)")
    p.add_argument("--repeats", type=int, default=None, help="repeats of each cold start (default 3; --quick: 2)")
    p.add_argument("--result-repeats", type=int, default=None, help="repeats of each result return and memcpy (default 5; --quick: 2)")
    p.add_argument("--restart-repeats", type=int, default=None, help="repeats of the restart measurement (default 10; --quick: 3)")
    p.add_argument("--warm-repeats", type=int, default=None, help="repeats of each warm round trip (default 50; --quick: 15)")
    p.add_argument("--sizes", default="64,256", help="MiB per rank returned in section 4 (default 64,256)")
    p.add_argument("--max-total-gib", type=float, default=3.0, help="skip result sizes whose n × size exceeds this (default 3)")
    p.add_argument("--untouched", action="store_true", help="section 4: return a bare torch.empty (pages not yet in memory) instead of a filled one")
    p.add_argument("--quick", action="store_true", help="ns 1,2 and fewer repeats (under 2 minutes)")
    p.add_argument("--skip", default="", help="sections to skip, comma-separated: cold,live,memcpy")
    p.add_argument("--out", default=os.path.join(RESULTS_DIR, "core"), help="output path without extension (default bench/results/core)")
    p.add_argument("--src", default=REPO, help="directory holding the ddp_magic package to benchmark (default: this checkout)")
    p.add_argument("--git-rev", help="benchmark ddp_magic as committed at this revision (git archive into a temp dir), e.g. HEAD; "
                   "useful while the working tree is being edited")
    a = p.parse_args(argv)
    a.ns = [int(x) for x in (a.ns or ("1,2" if a.quick else "1,2,4,8")).split(",") if x.strip()]
    for name, full, quick in (("repeats", 3, 2), ("result_repeats", 5, 2), ("restart_repeats", 10, 3), ("warm_repeats", 50, 15)):
        if getattr(a, name) is None:
            setattr(a, name, quick if a.quick else full)
    a.sizes = [int(x) for x in str(a.sizes).split(",") if x.strip()]
    a.skip = {x.strip() for x in a.skip.split(",") if x.strip()}
    return a


def _where_from(store: Store) -> None:
    """A note when the children import ddp_magic from somewhere else than the tree benchmarked."""
    try:
        _, where, _ = P.run_proc([sys.executable, "-c", "import ddp_magic; print(ddp_magic.__file__)"])
        if not where.strip().startswith(P.SRC + os.sep):
            store.notes.append(f"WARNING: ddp_magic was imported from {where.strip()}, not from {P.SRC}")
    except Exception as e:  # the figures still come
        log(f"could not locate ddp_magic: {e}")


def _run_sections(args: argparse.Namespace, store: Store, watch: P.Watch, paths: dict) -> None:
    """Sections 1-4 and the memcpy baseline, in the order and interleaving that the tables assume."""
    if "cold" not in args.skip:
        # Interleaved: each repeat visits every n and every launcher, so drift hits all alike.
        for rep in range(args.repeats):
            log(f"cold start, repeat {rep + 1}/{args.repeats}")
            jobs.cold_import(rep, store)
            for n in args.ns:
                cold_kernel(n, rep, store, watch)
                cold_api(n, rep, store, watch)
                cold_api(n, rep, store, watch, as_float=True)
                jobs.cold_script("torchrun", n, rep, "gloo", store, paths)
                jobs.cold_bare(n, rep, "gloo", store)
    if "live" not in args.skip:
        for n in args.ns:
            log(f"live pool n={n}: kernel")
            live_kernel(n, args, store, watch)
            log(f"live pool n={n}: API")
            live_api(n, args, store, watch)
    if "memcpy" not in args.skip:
        log("memcpy baseline")
        memcpy_baseline([(n, s) for n in args.ns for s, ok in sizes_for(n, args.sizes, args.max_total_gib) if ok], args.result_repeats, args.untouched, store)


def _leftovers(before: set, watch: P.Watch, store: Store) -> Tuple[dict, bool]:
    """Processes this run left behind (noted in the report); returns `pgrep`'s list and whether any are new."""
    time.sleep(0.5)
    after = P.pgrep("ddp_magic")
    new = {pid: cmd for pid, cmd in after.items() if pid not in before}
    ours = {pid for pid in watch.leftover if P.pid_alive(pid)}
    if ours:
        store.notes.append(f"WARNING: processes started by this benchmark are still alive: {sorted(ours)}")
    if new:
        store.notes.append(
            "WARNING: `pgrep -f ddp_magic` shows processes that were not there when the benchmark started "
            "(not among the processes this benchmark started and checked; they may belong to someone else's concurrent run): "
            + "; ".join(f"{pid} ({P.where(pid)}) {cmd[:80]}" for pid, cmd in new.items())
        )
    return after, bool(ours or new)


def main() -> int:
    args = parse_args()
    exported = None
    if args.git_rev:
        exported, sha = P.export_rev(args.git_rev)
        args.src = exported
        args.source_desc = f"ddp_magic at commit {sha[:10]} ({args.git_rev}), exported with git archive"
    else:
        args.source_desc = f"ddp_magic from {os.path.abspath(args.src)}" + (" (working tree)" if os.path.abspath(args.src) == REPO else "")
    P.set_src(args.src)
    t_start, load_start = time.monotonic(), os.getloadavg()[0]
    store = Store()
    watch = P.Watch(store)
    before = set(P.pgrep("ddp_magic"))
    log(f"ns={args.ns} repeats={args.repeats} warm_repeats={args.warm_repeats} sizes={args.sizes} MiB max_total={args.max_total_gib} GiB")
    torch_version = jobs.warm_page_cache()
    _where_from(store)
    tmpdir = tempfile.mkdtemp(prefix="ddp_bench_")
    try:
        _run_sections(args, store, watch, jobs.write_jobs(tmpdir, "gloo"))
    except KeyboardInterrupt:
        store.notes.append("interrupted by the user; the tables are partial")
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
        if exported:
            shutil.rmtree(exported, ignore_errors=True)
    after, left = _leftovers(before, watch, store)
    meta = run_meta(args, t_start, load_start, torch=torch_version)
    write_report(args.out, render(store, args, meta), store.payload(meta))
    if left:
        print("\nWARNING: processes left behind (`pgrep -af ddp_magic`):", file=sys.stderr)
        for pid, cmd in after.items():
            print(f"  {pid} {cmd}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
