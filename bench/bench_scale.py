#!/usr/bin/env python
"""A thousand ranks from one notebook: what every step costs the kernel, n = 8, 64, 256, 1,024 simulated ranks.

    .venv/bin/python bench/bench_scale.py                      # the full curve, 5 repeats; ~10 min on 2 busy cores
    .venv/bin/python bench/bench_scale.py --quick              # n = 8, 64, 256, 2 repeats
    .venv/bin/python bench/bench_scale.py --publish            # also writes docs/bench/scale.md
    .venv/bin/python bench/bench_scale.py --ns 1024 --real-ns '' --skip api,kernel,memory,real,view --cprofile   # where it goes, by function

Steps (each in every repeat, the n's interleaved): pool start (admission of every socket,
authenticated), a warm trivial cell (n small results) against a plain cell, one rank raising
while the others wait in all_reduce (the error, the group re-formed), n × 1 MiB results,
the kernel's memory with the pool idle, the status view's update; kernel CPU and wall per
step. Through the Pool API (scale_api.py) and in a real Jupyter kernel (scale_kernel.py),
and beside them real ranks (torch, gloo) at n = 16 and 32. The ranks are bench/simranks';
the kernel side is ddp_magic's, for real. Writes bench/results/scale.md and scale.json
(scale_report.py renders them).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from typing import List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the working tree's ddp_magic before any installed one
import processes as P  # noqa: E402
import scale_api  # noqa: E402
import scale_kernel  # noqa: E402
from harness import DOCS_DIR, RESULTS_DIR, Store, log, run_meta, write_report  # noqa: E402
from scale_report import render  # noqa: E402


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ns", help="simulated pool sizes (default 8,64,256,1024; --quick 8,64,256)")
    p.add_argument("--real-ns", help="real pool sizes (torch ranks, default 16,32; --quick 16; '' for none)")
    p.add_argument("--repeats", type=int, help="repeats of every step (default 5; --quick 2)")
    p.add_argument("--skip", default="", help="phases to skip: api,kernel,profile,memory,real,view")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=os.path.join(RESULTS_DIR, "scale"), help="output path without extension (default bench/results/scale)")
    p.add_argument("--publish", action="store_true", help="copy the report to docs/bench/scale.md")
    p.add_argument("--cprofile", action="store_true", help="after the profile phase, cProfile the default-view cell at the largest n "
                   "(4 x repeats cells); its top functions go to OUT_cprofile.txt")
    p.add_argument("--git-rev", help="measure ddp_magic as committed at this revision (git archive into a temp dir; the checkout is untouched), "
                   "e.g. to see a step's curve before a change")
    a = p.parse_args(argv)
    a.ns = [int(x) for x in (a.ns or ("8,64,256" if a.quick else "8,64,256,1024")).split(",") if x.strip()]
    real = a.real_ns if a.real_ns is not None else ("16" if a.quick else "16,32")
    a.real_ns = [int(x) for x in real.split(",") if x.strip()]
    a.repeats = a.repeats or (2 if a.quick else 5)
    a.skip = {x.strip() for x in a.skip.split(",") if x.strip()}
    return a


def run(args: argparse.Namespace, store: Store, watch: P.Watch) -> None:
    """The phases, each interleaving the n's inside every repeat."""
    if "view" not in args.skip:
        log("the status view's update")
        scale_kernel.view_update(args.ns, args.repeats, store)
    if "api" not in args.skip:
        log("Pool API, simulated ranks")
        scale_api.phase("sim", args.ns, args.repeats, store)
        scale_api.memcpy_rate(args.ns, args.repeats, store)
    if "kernel" not in args.skip:
        log("Jupyter kernel, simulated ranks")
        scale_kernel.phase(args.ns, args.repeats, store, watch)
    if "profile" not in args.skip:
        log("where the kernel's CPU goes, at the largest n")
        scale_kernel.profile(max(args.ns), args.repeats, store, watch, args.out + "_cprofile.txt" if args.cprofile else "")
    if "memory" not in args.skip:
        log("kernel memory")
        scale_kernel.memory(args.ns, store, watch)
    if "real" not in args.skip and args.real_ns:
        log("Pool API, real ranks")
        scale_api.phase("real", args.real_ns, args.repeats, store)


def main() -> int:
    args = parse_args()
    exported = None
    if args.git_rev:
        exported, sha = P.export_rev(args.git_rev)
        sys.path.insert(0, exported)  # before anything imports ddp_magic; the simulated ranks' hosts inherit it (the launcher's env)
        P.set_src(exported)
        log(f"ddp_magic at {sha[:10]} ({args.git_rev}), from {exported}")
    t_start, load_start = time.monotonic(), os.getloadavg()[0]
    store = Store()
    watch = P.Watch(store)
    try:
        run(args, store, watch)
    except KeyboardInterrupt:
        store.notes.append("interrupted by the user; the tables are partial")
    finally:
        left = watch.final()
        if left:
            store.notes.append("WARNING: processes this benchmark started were still alive at the end and were killed by pid: " + "; ".join(left))
    if exported:
        shutil.rmtree(exported, ignore_errors=True)
    meta = run_meta(args, t_start, load_start)
    md = render(store, args, meta)
    write_report(args.out, md, store.payload(meta))
    if args.publish:
        shutil.copy(args.out + ".md", os.path.join(DOCS_DIR, "scale.md"))
        log(f"published {DOCS_DIR}/scale.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
