"""Before and after, paired: a warm trivial %%ddp cell, with and without the status view, in two kernels side by side.

Kernel A runs ddp_magic as committed at ``--rev`` (git archive, the checkout untouched), kernel B this tree; both
on simulated ranks (bench/simranks), both alive at once. Each repeat runs, in both kernels (their order alternating),
a plain ``1``, ``%%ddp`` ``1`` (the default status view) and ``%%ddp --no-widget`` ``1`` (the view's two cells in
alternating order), so a slow moment of a shared machine hits A and B, view and no view, alike. Kernel CPU is read
inside each kernel around the cell (scale_kernel.py's pre/post_run_cell events: every thread of the kernel); wall is
execute → idle at the client. *view − no view* is taken repeat by repeat, then its median.

    .venv/bin/python bench/bench_view_ab.py --ns 4,1024 --repeats 100 --rev main   # --rev: any commit (the "before")
    .venv/bin/python bench/bench_view_ab.py --memory --ns 4 --repeats 100           # the ranks' memory sampling off (A) / on (B)

``--memory``: both kernels run this tree on real ranks (torch, gloo; the simulated ones sample no memory), and in
kernel A a first cell turns the ranks' memory sampling off (procs/rank_memory.py: no sampler sends, no peak reset
at RUN, no figures in DONE), so *B − A* is what memory sampling costs, view and no view alike.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from typing import Dict, List, Optional, Tuple

import processes as P
from harness import REPO, Store, log
from kernels import KernelSession, stop_kernel
from scale_kernel import ENV, Cells

CELLS = (("plain", "1"), ("view", "%%ddp\n1"), ("noview", "%%ddp --no-widget\n1"))


# A rank's memory sampling off (--memory's kernel A): worker.py calls these through the module, so a cell can swap them
SAMPLING_OFF = ("%%ddp --no-widget\nfrom ddp_magic.procs import rank_memory as _rm\n"
                "_rm.STATE.send = None\n_rm.EVERY_S = 1e9\n_rm.sample = lambda: {}\n_rm.cell_started = lambda: None\n_rm.at_done = lambda: {}")


def _kernel(src: str, n: int, real: bool = False, sampling: bool = True) -> Cells:
    P.set_src(src)  # the kernel's cwd and PYTHONPATH: its ranks' hosts import the same ddp_magic
    cells = Cells(KernelSession(env={} if real else ENV), sim=not real)
    found = cells.k.ok("import ddp_magic; ddp_magic.__file__")["value"] or ""
    if os.path.abspath(src) not in found:
        raise RuntimeError(f"the kernel imported {found}, not the ddp_magic of {src}")
    cells.run(f"%%ddp -n {n}\n1", timeout=300)
    if not sampling:
        ex, _ = cells.run(SAMPLING_OFF)
        if ex["error"]:
            raise RuntimeError(f"could not turn the ranks' memory sampling off: {ex['error']}")
        ex, _ = cells.run("%%ddp --no-widget\nfrom ddp_magic.procs import worker\nworker.rank_memory.at_done()")
        if (ex["value"] or "").count("{}") != n:
            raise RuntimeError(f"the ranks' memory sampling is still on: {(ex['value'] or '')[:120]!r}")
    return cells


def measure(n: int, repeats: int, srcs: Dict[str, str], watch: P.Watch, memory: bool = False) -> Dict[Tuple[str, str], List[Tuple[float, float]]]:
    """(tree, cell) -> [(kernel CPU ms, wall ms)] by repeat; ``memory``: real ranks, A with memory sampling off."""
    kernels: Dict[str, Cells] = {}
    got: Dict[Tuple[str, str], List[Tuple[float, float]]] = {(t, c): [] for t in srcs for c, _ in CELLS}
    try:
        for tree, src in srcs.items():
            kernels[tree] = _kernel(src, n, real=memory, sampling=not (memory and tree == "A"))
        for _ in range(3):  # warm-up, untimed
            for cells in kernels.values():
                for _, code in CELLS:
                    cells.run(code)
        for i in range(repeats):
            for tree, cells in (list(kernels.items()) if i % 2 == 0 else list(kernels.items())[::-1]):
                for cell, code in (CELLS if (i // 2) % 2 == 0 else (CELLS[0], CELLS[2], CELLS[1])):
                    ex, cpu = cells.run(code)
                    if cell != "plain" and not (ex["value"] or "").startswith(f"RankResults({n} ranks)"):
                        raise RuntimeError(f"{tree} {cell}: unexpected value {(ex['value'] or '')[:80]!r}")
                    got[(tree, cell)].append((cpu * 1e3, ex["elapsed"] * 1e3))
    finally:
        for tree, cells in kernels.items():
            stop_kernel(cells.k, watch, f"kernel {tree} (n={n})")
    return got


def report(n: int, got: Dict[Tuple[str, str], List[Tuple[float, float]]], names: Dict[str, str]) -> str:
    med = statistics.median
    lines = [f"n = {n}, {len(got[('B', 'view')])} repeats, median (ms):", "",
             "| tree | plain cell CPU | view CPU | no view CPU | view − no view CPU (paired) "
             "| plain wall | view wall | no view wall | view − no view wall (paired) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for tree, name in names.items():
        col = {c: got[(tree, c)] for c, _ in CELLS}
        d_cpu = med(v[0] - w[0] for v, w in zip(col["view"], col["noview"]))
        d_wall = med(v[1] - w[1] for v, w in zip(col["view"], col["noview"]))
        lines.append(f"| {name} | " + " | ".join(f"{med(x[0] for x in col[c]):.1f}" for c in ("plain", "view", "noview")) + f" | {d_cpu:.2f} | "
                     + " | ".join(f"{med(x[1] for x in col[c]):.1f}" for c in ("plain", "view", "noview")) + f" | {d_wall:.2f} |")
    pair = {c: [(b[0] - a[0], b[1] - a[1]) for a, b in zip(got[("A", c)], got[("B", c)])] for c, _ in CELLS}  # the same repeat
    lines.append("| B − A, repeat by repeat | " + " | ".join(f"{med(d[0] for d in pair[c]):.2f}" for c in ("plain", "view", "noview")) + " | | "
                 + " | ".join(f"{med(d[1] for d in pair[c]):.2f}" for c in ("plain", "view", "noview")) + " | |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ns", default="4,1024", help="pool sizes (simulated ranks), comma-separated (default 4,1024)")
    p.add_argument("--repeats", type=int, default=60)
    p.add_argument("--rev", default="main", help="the 'before' tree: ddp_magic as committed at this revision (default main)")
    p.add_argument("--memory", action="store_true", help="A and B both this tree on real ranks, A with their memory sampling off")
    args = p.parse_args()
    before, sha = (REPO, "") if args.memory else P.export_rev(args.rev)
    names = {"A": "memory sampling off", "B": "memory sampling on"} if args.memory else {"A": f"{args.rev} ({sha[:10]})", "B": "this tree"}
    store = Store()
    watch = P.Watch(store)
    out: List[str] = [f"load average at start {os.getloadavg()[0]:.2f}", ""]
    try:
        for n in [int(x) for x in args.ns.split(",")]:
            got = measure(n, args.repeats, {"A": before, "B": REPO}, watch, memory=args.memory)
            out.append(report(n, got, names))
            log(out[-1])
    finally:
        if before != REPO:
            shutil.rmtree(before, ignore_errors=True)
        left: Optional[List[str]] = watch.final()
        if left:
            out.append("WARNING: processes still alive at the end, killed by pid: " + "; ".join(left))
    out.append(f"load average at end {os.getloadavg()[0]:.2f}")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
