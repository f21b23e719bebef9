"""What ``%ddp autoreload`` costs a warm cell when nothing changed: off and on side by side, at n = 4 real ranks and
at 1,024 simulated ones (bench/simranks), in a real Jupyter kernel.

    .venv/bin/python bench/bench_autoreload.py                  # n = 4 and 1,024; about 3 min on 2 cores
    .venv/bin/python bench/bench_autoreload.py --repeats 40 --ns 4

Each row: the cell's wall time from execute request to idle, off and on interleaved pair by pair (so drift in the
machine's load hits both alike), median (min–max) over the repeats; the difference of the pairs' medians; and the part
of the kernel's CPU that autoreload itself adds (its before- and after-cell steps, timed in the kernel), plus, for real
ranks, what a rank adds (its stat of each watched file and the scan of sys.modules, timed on the rank). The real
ranks import five modules of the notebook's directory, the simulated ones none (they run no Python cells); the
kernel watches the notebook's modules it imported itself in both cases. Writes bench/results/autoreload.md.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from kernel_helper import Kernel, simulated_kernel  # noqa: E402

SESSION = "get_ipython().magics_manager.registry['DDPMagics'].session"
TIMED = f"""
import time as _t
_s = {SESSION}
_costs = []
def _timed(name, fn):
    def run(*a, **kw):
        t = _t.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            _costs.append((name, _t.perf_counter() - t))
    return run
_s.autoreload.before_cell = _timed("before", _s.autoreload.before_cell)
_s.autoreload.after_cell = _timed("after", _s.autoreload.after_cell)
_cpu, _c0 = [], [0.0]
get_ipython().events.register("pre_run_cell", lambda *a: _c0.__setitem__(0, _t.process_time()))
get_ipython().events.register("post_run_cell", lambda *a: _cpu.append(_t.process_time() - _c0[0]))
"""
RANK_COST = """%%ddp
import time as _t
from ddp_magic.procs.rank_reload import RELOADER as _R
_samples = []
for _ in range(2000):
    _t0 = _t.perf_counter(); _R.begin_cell({"apply": {}, "ship": {}}); _R.done_fields(); _samples.append(_t.perf_counter() - _t0)
_samples.sort()
(len(_R.watched), _samples[len(_samples) // 2] * 1e6)
"""


def fmt(xs: List[float], scale: float = 1e3, digits: int = 1) -> str:
    return f"{statistics.median(xs) * scale:.{digits}f} ({min(xs) * scale:.{digits}f}–{max(xs) * scale:.{digits}f})"


def timed(k: Kernel, code: str) -> float:
    t0 = time.perf_counter()
    k.run(code, timeout=300).ok()
    return time.perf_counter() - t0


def measure(k: Kernel, cell: str, repeats: int) -> Tuple[List[float], List[float], Dict[str, float]]:
    """(off times, on times, {before, after: autoreload's own kernel CPU per on-cell; cpu_off, cpu_on: the kernel's CPU per cell}, s)."""
    off, on = [], []
    k.run("_costs.clear(); _cpu.clear()").ok()
    for _ in range(repeats):
        k.run("%ddp autoreload off").ok()
        off.append(timed(k, cell))
        k.run("%ddp autoreload").ok()
        on.append(timed(k, cell))
    costs = k.value("[(n, c) for n, c in _costs]")
    parts = {name: statistics.median([c for n, c in costs if n == name] or [0.0]) for name in ("before", "after")}
    cpu = k.value("list(_cpu)")  # the clearing cell, then per pair: off toggle, off cell, on toggle, on cell
    parts["cpu_off"] = statistics.median(cpu[2::4])
    parts["cpu_on"] = statistics.median(cpu[4::4])
    return off, on, parts


def notebook(folder: Path, modules: int) -> None:
    for i in range(modules):
        (folder / f"bench_mod{i}.py").write_text(f"import math\n\ndef f(x):\n    return math.sqrt(x) + {i}\n")


def real(n: int, repeats: int, folder: Path) -> dict:
    k = Kernel()
    try:
        k.run(f"import os; os.chdir({str(folder)!r})").ok()
        k.run("%load_ext ddp_magic").ok()
        k.run("import " + ", ".join(f"bench_mod{i}" for i in range(5))).ok()
        k.run(TIMED).ok()
        k.run(f"%%ddp -n {n}\nimport torch\n" + "\n".join(f"import bench_mod{i}" for i in range(5)), timeout=300).ok()
        k.run("%ddp autoreload").ok()
        k.run("%%ddp\n1").ok()  # the ranks load IPython's autoreload once, the kernel learns their modules
        off, on, parts = measure(k, "%%ddp\nbench_mod0.f(4.0)", repeats)
        return {"ranks": f"{n} (real)", "off": off, "on": on, "parts": parts} | _rank_cost(k)
    finally:
        k.shutdown()


def _rank_cost(k: Kernel) -> dict:
    k.run(RANK_COST, timeout=300).ok()
    watched, us = k.value("list(_)")[0]
    return {"rank_us": us, "watched": watched}


def simulated(n: int, repeats: int, folder: Path) -> dict:
    cwd = os.getcwd()
    os.chdir(folder)  # the kernel starts here: the notebook's directory
    try:
        k = simulated_kernel(256)
    finally:
        os.chdir(cwd)
    try:
        k.run("import " + ", ".join(f"bench_mod{i}" for i in range(5))).ok()
        k.run(TIMED).ok()
        k.run(f"%%ddp -n {n}\nsim.print(1)", timeout=300).ok()
        k.run("%ddp autoreload").ok()
        k.run("%%ddp\n7").ok()
        off, on, parts = measure(k, "%%ddp\n7", repeats)
        return {"ranks": f"{n:,} (simulated)", "off": off, "on": on, "parts": parts, "rank_us": None, "watched": 0}
    finally:
        k.shutdown()


def table(rows: List[dict]) -> str:
    out = ["| ranks | warm cell, off (ms) | warm cell, on (ms) | on − off, medians (ms) | kernel CPU a cell, off → on (ms) "
           "| kernel CPU autoreload's own steps (ms) | a rank adds (µs) |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        diff = (statistics.median(r["on"]) - statistics.median(r["off"])) * 1e3
        kern = (r["parts"]["before"] + r["parts"]["after"]) * 1e3
        rank = f"{r['rank_us']:.1f} ({r['watched']} modules watched)" if r["rank_us"] is not None else "— (simulated)"
        cpu = f"{r['parts']['cpu_off'] * 1e3:.1f} → {r['parts']['cpu_on'] * 1e3:.1f}"
        out.append(f"| {r['ranks']} | {fmt(r['off'])} | {fmt(r['on'])} | {diff:+.2f} | {cpu} | {kern:.3f} (before {r['parts']['before'] * 1e3:.3f}, "
                   f"after {r['parts']['after'] * 1e3:.3f}) | {rank} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ns", default="4,1024", help="rank counts: up to 8 real ranks, more simulated (default 4,1024)")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ddp-bench-autoreload-") as tmp:
        folder = Path(tmp)
        notebook(folder, 5)
        for n in (int(x) for x in args.ns.split(",")):
            rows.append(real(n, args.repeats, folder) if n <= 8 else simulated(n, args.repeats, folder))
            print(table(rows[-1:]), flush=True)
    load = os.getloadavg()
    text = (f"# autoreload: a warm cell with nothing changed, off and on\n\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"{os.cpu_count()} cores, load {load[0]:.1f}, {args.repeats} interleaved pairs\n\n{table(rows)}\n")
    print("\n" + text)
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "autoreload.md").write_text(text)


if __name__ == "__main__":
    main()
