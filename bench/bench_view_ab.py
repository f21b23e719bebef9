"""Before and after, paired: a warm trivial %%ddp cell, with and without the status view, in two kernels side by side.

Kernel A runs ddp_magic as committed at ``--rev`` (git archive, the checkout untouched), kernel B this tree; both
on simulated ranks (bench/simranks), both alive at once. Each repeat runs, in both kernels (their order alternating),
a plain ``1``, ``%%ddp`` ``1`` (the default status view) and ``%%ddp --no-widget`` ``1`` (the view's two cells in
alternating order), so a slow moment of a shared machine hits A and B, view and no view, alike. Kernel CPU is read
inside each kernel around the cell (scale_kernel.py's pre/post_run_cell events: every thread of the kernel); wall is
execute → idle at the client. *view − no view* is taken repeat by repeat, then its median.

    .venv/bin/python bench/bench_view_ab.py --ns 4,1024 --repeats 100 --rev main   # --rev: any commit (the "before")
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


def _kernel(src: str, n: int) -> Cells:
    P.set_src(src)  # the kernel's cwd and PYTHONPATH: its ranks' hosts import the same ddp_magic
    cells = Cells(KernelSession(env=ENV))
    found = cells.k.ok("import ddp_magic; ddp_magic.__file__")["value"] or ""
    if os.path.abspath(src) not in found:
        raise RuntimeError(f"the kernel imported {found}, not the ddp_magic of {src}")
    cells.run(f"%%ddp -n {n}\n1")
    return cells


def measure(n: int, repeats: int, srcs: Dict[str, str], watch: P.Watch) -> Dict[Tuple[str, str], List[Tuple[float, float]]]:
    """(tree, cell) -> [(kernel CPU ms, wall ms)] by repeat."""
    kernels: Dict[str, Cells] = {}
    got: Dict[Tuple[str, str], List[Tuple[float, float]]] = {(t, c): [] for t in srcs for c, _ in CELLS}
    try:
        for tree, src in srcs.items():
            kernels[tree] = _kernel(src, n)
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
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ns", default="4,1024", help="pool sizes (simulated ranks), comma-separated (default 4,1024)")
    p.add_argument("--repeats", type=int, default=60)
    p.add_argument("--rev", default="main", help="the 'before' tree: ddp_magic as committed at this revision (default main)")
    args = p.parse_args()
    before, sha = P.export_rev(args.rev)
    store = Store()
    watch = P.Watch(store)
    out: List[str] = [f"load average at start {os.getloadavg()[0]:.2f}", ""]
    try:
        for n in [int(x) for x in args.ns.split(",")]:
            got = measure(n, args.repeats, {"A": before, "B": REPO}, watch)
            out.append(report(n, got, {"A": f"{args.rev} ({sha[:10]})", "B": "this tree"}))
            log(out[-1])
    finally:
        shutil.rmtree(before, ignore_errors=True)
        left: Optional[List[str]] = watch.final()
        if left:
            out.append("WARNING: processes still alive at the end, killed by pid: " + "; ".join(left))
    out.append(f"load average at end {os.getloadavg()[0]:.2f}")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
