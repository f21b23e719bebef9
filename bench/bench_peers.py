#!/usr/bin/env python
"""ddp_magic side by side with the tools a user would otherwise pick, in one run on one machine.

    bash bench/run_peers.sh [--quick] [--publish]      # makes bench/.venv-peers, then runs this file
    bench/.venv-peers/bin/python bench/bench_peers.py [--quick] [--ns 1,2,4,8] [--backend gloo|nccl]

Compared: %%ddp (ddp_magic from this checkout), accelerate's ``notebook_launcher``,
ipyparallel (``Cluster(n).start_and_connect_sync()`` then ``%%px``), nbdistributed
(``%dist_init`` then ``%%distributed``), ``torchrun --standalone``, ``torch.multiprocessing.spawn``
and N bare ``python`` processes (the floor). The notebook tools run in real Jupyter kernels
(jupyter_client) of this interpreter. Sections: cold start, warm cell round trip, result return,
output (latency of a print, a cell printing 100,000 lines), training overhead (steps/s of a DDP loop
in a %%ddp cell vs the same loop under torchrun) and memory (kernel RSS after 500 cells, worker
RSS/USS beyond a bare ``import torch``).

Writes bench/results/peers.md, bench/results/peers.json and bench/results/peers_*.png. Every figure is
a median over repeats with (min–max); ratios are taken pair by pair (the same repeat, the same
machine state) and then summarised the same way. A measurement that fails shows the tool's own
error text in its table cell. See bench/README.md.

This file is the command line and the run; each question has its own file: peers_cold.py (1),
peers_live.py (2-4), peers_train.py (5), peers_memory.py (6), peers_report.py and peers_plots.py
(the tables and figures), peers_tools.py (one class per notebook tool); the harness (harness.py,
processes.py, kernels.py, jobs.py, memcpy.py) is shared with every bench.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import traceback
from typing import Dict, List, Optional

import jobs
import processes as P
from harness import DOCS_DIR, RESULTS_DIR, Store, log, run_meta, short_error, write_report
from kernels import ensure_kernelspec
from memcpy import memcpy_baseline
from peers_cold import cold_phase
from peers_live import live_phase
from peers_plots import plots
from peers_report import render
from peers_train import TRAIN_BLOCK

WATCHED = "ddp_magic|ipengine|ipcontroller|ipyparallel|nbdistributed|ipykernel_launcher|torchrun|torch.distributed.run"


def publish(md: str, pngs: List[str]) -> None:
    """Copy the report and its plots to docs/bench/ (README.md links there; nothing here edits it)."""
    os.makedirs(DOCS_DIR, exist_ok=True)
    with open(os.path.join(DOCS_DIR, "peers.md"), "w") as f:
        f.write(md + "\n")
    for p in pngs:
        shutil.copy(p, os.path.join(DOCS_DIR, os.path.basename(p)))
    log(f"published {DOCS_DIR}/peers.md and {len(pngs)} plots")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="n = 1,2 and fewer repeats (under 4 minutes)")
    p.add_argument("--ns", help="rank counts (default 1,2,4,8; --quick 1,2)")
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl"], help="gloo (CPU) or nccl (one GPU per rank)")
    p.add_argument("--tools", default="ddp,accelerate,ipp,nbd,torchrun,spawn,bare", help="which tools (default all)")
    p.add_argument("--repeats", type=int, help="cold-start repeats (default 3; --quick 1)")
    p.add_argument("--slow-repeats", type=int, help="cold-start repeats of ipyparallel and nbdistributed, the slow ones (default 2; --quick 1)")
    p.add_argument("--warm-repeats", type=int, help="warm round trips per cell (default 20; --quick 10)")
    p.add_argument("--acc-repeats", type=int, help="accelerate re-runs on a warm kernel (default 3; --quick 2)")
    p.add_argument("--result-repeats", type=int, help="result returns per size (default 3; --quick 2)")
    p.add_argument("--sizes", help="MiB per rank returned (default 1,64,256; --quick 1,64)")
    p.add_argument("--max-total-gib", type=float, default=3.0, help="skip result sizes whose n × size is larger (default 3)")
    p.add_argument("--ipp-max-total-mib", type=int, default=2048, help="ipyparallel pulls at most this many MiB in all (default 2048)")
    p.add_argument("--out-repeats", type=int, help="latency cells per tool (default 4; --quick 2)")
    p.add_argument("--lat-lines", type=int, default=10, help="timestamped lines per rank per latency cell (default 10)")
    p.add_argument("--lines", type=int, default=100_000, help="lines printed by the big-output cell, split over the ranks (default 100000)")
    p.add_argument("--lines-repeats", type=int, help="big-output cells per tool (default 2; --quick 1)")
    p.add_argument("--train-steps", type=int, help=f"timed training steps, taken in turns of {TRAIN_BLOCK} (default 1000; --quick 200)")
    p.add_argument("--train-warmup", type=int, default=20)
    p.add_argument("--train-log", action="store_true", help="the %%ddp side calls ddp_magic.log(step, loss) every step (its cost)")
    p.add_argument("--train-repeats", type=int, help="training runs, each a pair of jobs taking turns (default 3; --quick 2)")
    p.add_argument("--mem-n", type=int, help="n at which the kernel runs --mem-cells cells (default 2)")
    p.add_argument("--mem-cells", type=int, help="cells the kernels run for the memory figure (default 500; --quick 100)")
    p.add_argument("--skip", default="", help="sections to skip: cold,live,train,memcpy")
    p.add_argument("--nbd-no-wait", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=os.path.join(RESULTS_DIR, "peers"), help="output path without extension (default bench/results/peers)")
    p.add_argument("--publish", action="store_true", help="copy the table and plots to docs/bench/ (README.md is never edited)")
    p.add_argument("--publish-only", action="store_true", help="publish the last run's results (--out) without running anything")
    a = p.parse_args(argv)
    q = a.quick
    a.ns = [int(x) for x in (a.ns or ("1,2" if q else "1,2,4,8")).split(",") if x.strip()]
    a.tools = [t.strip() for t in a.tools.split(",") if t.strip()]
    for name, full, quick in (("repeats", 3, 1), ("slow_repeats", 2, 1), ("warm_repeats", 20, 10), ("acc_repeats", 3, 2), ("result_repeats", 3, 2),
                              ("out_repeats", 4, 2), ("lines_repeats", 2, 1), ("train_repeats", 3, 2), ("mem_n", 2, 2), ("mem_cells", 500, 100),
                              ("train_steps", 1000, 200)):
        if getattr(a, name) is None:
            setattr(a, name, quick if q else full)
    a.sizes = [int(x) for x in (a.sizes or ("1,64" if q else "1,64,256")).split(",") if x.strip()]
    a.skip = {x.strip() for x in a.skip.split(",") if x.strip()}
    return a


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for dist in ("accelerate", "ipyparallel", "nbdistributed", "ipykernel", "jupyter_client"):
        try:
            out.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            out.append(f"{dist} not installed")
    try:
        import ddp_magic

        out.insert(0, f"ddp_magic {ddp_magic.__version__} (working tree)")
    except Exception as e:
        out.insert(0, f"ddp_magic: {short_error(e)}")
    return ", ".join(out)


def _publish_last(args: argparse.Namespace) -> int:
    """--publish-only: the last run's report and plots (--out) to docs/bench/, nothing run."""
    with open(args.out + ".md") as f:
        md = f.read().rstrip()
    prefix = os.path.basename(args.out) + "_"
    folder = os.path.dirname(args.out)
    publish(md, sorted(os.path.join(folder, x) for x in os.listdir(folder) if x.startswith(prefix) and x.endswith(".png")))
    return 0


def _run_sections(args: argparse.Namespace, store: Store, tmp: str, cleanup: P.Watch, paths: Dict[str, str]) -> None:
    """Cold starts (interleaved over repeats, n and tools), the live pools per n, then the memcpy baseline."""
    if "cold" not in args.skip:
        cold_phase(args, store, tmp, cleanup, paths)
    if "live" not in args.skip:
        for n in args.ns:
            log(f"live pools n={n}")
            live_phase(n, args, store, tmp, cleanup)
    if "memcpy" not in args.skip:
        log("memcpy baseline")
        memcpy_baseline([(n, s) for n in args.ns for s in args.sizes if n * s <= args.max_total_gib * 1024], args.result_repeats, False, store)


def _new_processes(before: Dict[int, str], store: Store) -> Dict[int, str]:
    """Processes of this interpreter that were not there at the start (noted in the report either way)."""
    time.sleep(0.5)
    new = {p: c for p, c in P.pgrep(WATCHED).items() if p not in before and sys.prefix in c}
    if new:
        store.notes.append("WARNING: `pgrep -af` shows processes of this interpreter that were not there at the start: "
                           + "; ".join(f"{p} {c[:80]}" for p, c in new.items()))
    else:
        store.notes.append("Clean-up: every process this run started was gone at the end "
                           f"(checked by pid, and `pgrep -af` shows no new process of {sys.prefix}).")
    return new


def _finish(args: argparse.Namespace, store: Store, meta: dict) -> None:
    """The report, its JSON and its plots (a failed plot is logged, the tables stay)."""
    md = render(store, args, meta)
    write_report(args.out, md, store.payload(meta))
    pngs: List[str] = []
    try:
        pngs = plots(store, args, meta, args.out)
    except Exception:
        log("plots failed:\n" + traceback.format_exc())
    log(f"wrote {args.out}.md, {args.out}.json and {len(pngs)} plots")
    if args.publish:
        publish(md, pngs)


def main() -> int:
    args = parse_args()
    if args.publish_only:
        return _publish_last(args)
    t_start, load_start = time.monotonic(), os.getloadavg()[0]
    store = Store()
    cleanup = P.Watch(store)
    before = P.pgrep(WATCHED)
    ensure_kernelspec()
    log(f"ns={args.ns} tools={args.tools} backend={args.backend} cold repeats={args.repeats} warm={args.warm_repeats} sizes={args.sizes}")
    torch_version = jobs.warm_page_cache("ipyparallel, accelerate, nbdistributed, ipykernel")
    tmp = tempfile.mkdtemp(prefix="ddp_bench_peers_")
    try:
        _run_sections(args, store, tmp, cleanup, jobs.write_jobs(tmp, args.backend))
    except KeyboardInterrupt:
        store.notes.append("interrupted by the user; the tables are partial")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        left = cleanup.final()
        if left:
            store.notes.append("WARNING: processes this benchmark started were still alive at the end and were killed by pid: " + "; ".join(left))
    new = _new_processes(before, store)
    _finish(args, store, run_meta(args, t_start, load_start, torch=torch_version, backend=args.backend, versions=versions()))
    if new:
        print("\nWARNING: new processes since the start:\n" + "\n".join(f"  {p} {c}" for p, c in new.items()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
