#!/usr/bin/env python
"""Notebook data, restarts and the warm cell: what a user waits for, against ipyparallel and a memcpy.

    .venv/bin/python bench/bench_data.py [--ns 1,2,4,8] [--sizes 1,64,256] [--repeats R] [--quick]
                                         [--peers-python PY] [--sections data,restart,first,warm]

1. data: a notebook tensor (1/64/256 MiB) used by a cell at n ranks: first use (written once to /dev/shm),
   reuse (unchanged: nothing written), scatter; the old path (pickled into every rank's message, as before
   wire/notebook_data.py) once per size at one n; ipyparallel's push and scatter of the same array
   (run with --peers-python, a Python that has ipyparallel); a memcpy of the tensor into fresh memory (the floor).
2. restart: a size change (the template is kept), a same-size restart, a cold start (a new template imports torch).
3. first: the first %%ddp cell of a real kernel, right after %load_ext and after a pause, and with no warm template.
4. warm: a trivial cell in a real kernel: plain, %%ddp (status view), %%ddp --no-widget.

1 and 2 go through the Session API (what the magics call); 3 and 4 through a real kernel (jupyter_client).
Prints Markdown and writes bench/results/data.md and data.json (--out names them). Figures: median [min–max] in seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from ddp_magic.kernel import Listener  # noqa: E402 (after the path: the working tree's package)
from ddp_magic.states import RankState  # noqa: E402

MIB = 1 << 20
RESULTS: Dict[str, List[float]] = {}
NOTES: List[str] = []


def log(msg: str) -> None:
    print(f"[bench_data {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def timed(key: str, fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    took = time.perf_counter() - t0
    RESULTS.setdefault(key, []).append(took)
    return took


def fmt(key: str, scale: float = 1.0, unit: str = "s") -> str:
    vals = RESULTS.get(key)
    if not vals:
        return "—"
    med = statistics.median(vals) * scale
    digits = 1 if unit == "ms" else (4 if med < 0.1 else 3)
    rng = f" [{min(vals) * scale:.{digits}f}–{max(vals) * scale:.{digits}f}]" if len(vals) > 1 else ""
    return f"{med:.{digits}f}{rng}"


def med(key: str) -> Optional[float]:
    vals = RESULTS.get(key)
    return statistics.median(vals) if vals else None


# ------------------------------------------------------------ 1. notebook data
def bench_data_n(n: int, sizes: List[int], repeats: int, old_path: bool) -> None:
    """One pool of n: the trivial cell, then per size first use, reuse, scatter (and the old path)."""
    import torch

    from ddp_magic.session import Session, scatter
    from ddp_magic.wire import transfer

    s = Session()
    s.start(s.spec_for(n))
    cell = "x.shape[0]"
    for _ in range(repeats):
        timed(f"data.trivial.n{n}", lambda: s.run("1", {}))
    for size in sizes:
        x = torch.ones(size * MIB // 4)
        sent = s.data.sent
        timed(f"data.first.n{n}.s{size}", lambda x=x: s.run(cell, {"x": x}))
        RESULTS.setdefault(f"data.first_bytes.n{n}.s{size}", []).append(s.data.sent - sent)
        sent = s.data.sent
        for _ in range(repeats):  # interleaved with the trivial cell: the machine's load hits both alike
            timed(f"data.reuse.n{n}.s{size}", lambda x=x: s.run(cell, {"x": x}))
            timed(f"data.pair.n{n}.s{size}", lambda: s.run("1", {}))
        RESULTS.setdefault(f"data.reuse_bytes.n{n}.s{size}", []).append((s.data.sent - sent) / repeats)
        xs = scatter(x)
        timed(f"data.scatter_first.n{n}.s{size}", lambda xs=xs: s.run(cell, {"x": xs}))
        for _ in range(repeats):
            timed(f"data.scatter_reuse.n{n}.s{size}", lambda xs=xs: s.run(cell, {"x": xs}))
        if old_path:  # as before: cloudpickled into every rank's RUN message, every cell
            pool = s.pool
            assert pool is not None
            timed(f"data.old.n{n}.s{size}", lambda x=x, pool=pool: pool.run(cell, transfer.dumps_names({"x": x})[0]))
        log(f"n={n} {size} MiB: first {fmt(f'data.first.n{n}.s{size}')} reuse {fmt(f'data.reuse.n{n}.s{size}')} old {fmt(f'data.old.n{n}.s{size}')}")
    s.stop()


def bench_memcpy(sizes: List[int], repeats: int) -> None:
    import torch

    for size in sizes:
        x = torch.ones(size * MIB // 4)
        for _ in range(repeats):
            timed(f"data.memcpy.s{size}", lambda x=x: torch.empty_like(x).copy_(x))


IPP_CHILD = r'''
import json, sys, time, numpy as np, ipyparallel as ipp
n, sizes, repeats = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
out = {}
cluster = ipp.Cluster(n=n, log_level=40)
rc = cluster.start_and_connect_sync()
try:
    rc.wait_for_engines(n, timeout=300)
    dv = rc[:]
    dv.block = True
    for size in sizes:
        a = np.ones(size * (1 << 20) // 4, dtype=np.float32)
        for op in ("push", "scatter"):
            for i in range(repeats):
                t0 = time.perf_counter()
                dv.push({"x": a}) if op == "push" else dv.scatter("x", a)
                dv.execute("x.shape[0]")
                out.setdefault(f"ipp.{op}.n{n}.s{size}", []).append(time.perf_counter() - t0)
finally:
    cluster.stop_cluster_sync()
print("JSON " + json.dumps(out))
'''


def bench_ipp(py: str, ns: List[int], sizes: List[int], repeats: int) -> None:
    """ipyparallel's push and scatter (each followed by a trivial execute, as a %%ddp cell runs one), in its own Python."""
    for n in ns:
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, IPYTHONDIR=os.path.join(tmp, "ipython"))
            proc = subprocess.run([py, "-c", IPP_CHILD, str(n), ",".join(map(str, sizes)), str(repeats)], capture_output=True, text=True, env=env, timeout=1800)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("JSON ")]
        if not lines:
            NOTES.append(f"ipyparallel n={n} failed: {proc.stderr.strip()[-300:]}")
            continue
        for key, vals in json.loads(lines[-1][5:]).items():
            RESULTS.setdefault(key, []).extend(vals)
        log(f"ipyparallel n={n} done")


# ------------------------------------------------------------ 2. restarts
def bench_restart(ns: List[int], repeats: int) -> None:
    """Size changes between the ns (template kept), same-size restarts, and cold starts (a fresh template)."""
    from ddp_magic.procs.forkserver import SPARE_IDLE_S
    from ddp_magic.session import Session

    s = Session()
    s.start(s.spec_for(ns[0]))
    for _ in range(repeats):
        for n in ns[1:] + ns[:1]:
            joined = Joined()
            t0 = time.perf_counter()
            timed(f"restart.size.n{n}", lambda n=n, joined=joined: s.start(s.spec_for(n), joined))
            RESULTS.setdefault(f"restart.stop.n{n}", []).append(joined.begin - t0)
            RESULTS.setdefault(f"restart.joined.n{n}", []).append(joined.last - joined.begin)
            timed(f"restart.same.n{n}", lambda: s.restart())
    for _ in range(repeats):  # as a user would: a pause first, in which the template forks its spare ranks
        for n in ns[1:] + ns[:1]:
            time.sleep(SPARE_IDLE_S + 0.5)
            timed(f"restart.paused.n{n}", lambda n=n: s.start(s.spec_for(n)))
    s.stop()
    for _ in range(max(1, repeats // 2)):
        for n in ns[:2]:
            cold = Session()
            timed(f"restart.cold.n{n}", lambda cold=cold, n=n: cold.start(cold.spec_for(n)))
            cold.stop()
    log("restarts done")


class Joined(Listener):
    """Notes when the last rank joined the control channel (the rest of a start is the process group's init)."""

    def __init__(self) -> None:
        self.begin = self.last = 0.0

    def on_state(self, info: Any) -> None:
        if info.state == RankState.STARTING and not self.begin:  # the old ranks are gone, the new ones asked for
            self.begin = time.perf_counter()
        if info.state == RankState.CONNECTING:
            self.last = time.perf_counter()


# ------------------------------------------------------------ 3, 4. a real kernel
def bench_first_cell(repeats: int, pause: float) -> None:
    """The first %%ddp -n 2 cell of a kernel: right after %load_ext, after a pause, and with no warm template."""
    from kernels import KernelSession

    for _ in range(repeats):
        for how in ("immediately", "paused", "no_warm"):
            os.environ["DDP_MAGIC_WARM_TEMPLATE"] = "0" if how == "no_warm" else "1"
            k = KernelSession()
            try:
                k.ok("%load_ext ddp_magic")
                if how != "immediately":
                    time.sleep(pause)
                RESULTS.setdefault(f"first.{how}", []).append(k.ok("%%ddp -n 2\n1", timeout=600)["elapsed"])
            finally:
                k.shutdown()
                os.environ.pop("DDP_MAGIC_WARM_TEMPLATE", None)
    log("first cells done")


def bench_warm(n: int, repeats: int) -> None:
    """A trivial warm cell, interleaved: plain, %%ddp with the default status view, %%ddp --no-widget."""
    from kernels import KernelSession

    k = KernelSession()
    try:
        k.ok("%load_ext ddp_magic")
        k.ok(f"%%ddp -n {n}\n1", timeout=600)
        cells = {"plain": "1", "view": "%%ddp\n1", "no_widget": "%%ddp --no-widget\n1"}
        for _ in range(3):  # warm up every path
            for code in cells.values():
                k.ok(code)
        for _ in range(repeats):
            for key, code in cells.items():
                RESULTS.setdefault(f"warm.{key}.n{n}", []).append(k.ok(code)["elapsed"])
    finally:
        k.shutdown()
    log("warm cells done")


# ------------------------------------------------------------ report
def render_data(ns: List[int], sizes: List[int]) -> List[str]:
    out = ["## 1. A notebook tensor used by a `%%ddp` cell (s)\n",
           "Cell `x.shape[0]` with `x` a float32 CPU tensor from the notebook. *first*: the first cell that uses it "
           "(written once to /dev/shm); *reuse*: later cells, `x` unchanged (nothing written); *over trivial*: reuse − the "
           "trivial cell `1` on the same pool, run in turns with it, in ms; *scatter*: `ddp_magic.scatter(x)`, first and reuse; *old path*: "
           "cloudpickled into every rank's message (as before); *ipyparallel*: `dv.push` / `dv.scatter` of a numpy array of "
           "the same size, then `dv.execute('x.shape[0]')`; *memcpy*: `torch.empty_like(x).copy_(x)` (fresh pages).\n",
           "| n | MiB | first | reuse | over trivial (ms) | bytes sent on reuse | scatter first | scatter reuse | old path "
           "| ipyparallel push | ipyparallel scatter | memcpy |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in ns:
        for size in sizes:
            reuse, trivial = med(f"data.reuse.n{n}.s{size}"), med(f"data.pair.n{n}.s{size}")
            over = f"{(reuse - trivial) * 1000:.1f}" if reuse is not None and trivial is not None else "—"
            rb = med(f"data.reuse_bytes.n{n}.s{size}")
            out.append(
                f"| {n} | {size} | {fmt(f'data.first.n{n}.s{size}')} | {fmt(f'data.reuse.n{n}.s{size}')} | {over} "
                f"| {'—' if rb is None else f'{rb:.0f}'} | {fmt(f'data.scatter_first.n{n}.s{size}')} | {fmt(f'data.scatter_reuse.n{n}.s{size}')} "
                f"| {fmt(f'data.old.n{n}.s{size}')} | {fmt(f'ipp.push.n{n}.s{size}')} | {fmt(f'ipp.scatter.n{n}.s{size}')} | {fmt(f'data.memcpy.s{size}')} |"
            )
    out.append("\nTrivial cell per n (s): " + ", ".join(f"n={n} {fmt(f'data.trivial.n{n}')}" for n in ns) + "\n")
    return out


def render_rest(ns: List[int], warm_n: int) -> List[str]:
    out = ["## 2. Restarts (s)\n", "*size change*: `%%ddp -n N` right after another N (ranks fork from the same template); "
           "*after a pause*: the same with 2.5 s between cells (the template has forked spare ranks meanwhile); "
           "*same size*: `%ddp restart`; *cold*: a new session's first pool (a template imports torch).\n",
           "Of the size change: *old ranks stopped* (SHUTDOWN, their exits seen), then *forked and joined* (the last "
           "rank connected to the control channel); the rest is the process group's init (gloo over the FileStore) and READY.\n",
           "| n | size change to n | old ranks stopped | forked and joined | after a pause | same-size restart | cold start |",
           "|---|---|---|---|---|---|---|"]
    out += [f"| {n} | {fmt(f'restart.size.n{n}')} | {fmt(f'restart.stop.n{n}')} | {fmt(f'restart.joined.n{n}')} | {fmt(f'restart.paused.n{n}')} "
            f"| {fmt(f'restart.same.n{n}')} | {fmt(f'restart.cold.n{n}')} |" for n in ns]
    out += ["\n## 3. The first `%%ddp -n 2` cell of a kernel (s, execute → idle)\n",
            "| right after `%load_ext` | after a pause | no warm template (`DDP_MAGIC_WARM_TEMPLATE=0`) |",
            "|---|---|---|", f"| {fmt('first.immediately')} | {fmt('first.paused')} | {fmt('first.no_warm')} |",
            f"\n## 4. A warm trivial cell in a real kernel, n={warm_n} (ms, execute → idle)\n",
            "| plain cell | `%%ddp` (status view) | `%%ddp --no-widget` | view − plain | no-widget − plain |", "|---|---|---|---|---|"]
    p, v, w = (med(f"warm.{k}.n{warm_n}") for k in ("plain", "view", "no_widget"))
    diff = lambda a, b: f"{(a - b) * 1000:.1f}" if a is not None and b is not None else "—"  # noqa: E731
    cells = " | ".join(fmt(f"warm.{k}.n{warm_n}", 1000, "ms") for k in ("plain", "view", "no_widget"))
    out.append(f"| {cells} | {diff(v, p)} | {diff(w, p)} |")
    return out


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ns", default="1,2,4,8")
    p.add_argument("--sizes", default="1,64,256")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--old-path-n", type=int, default=4, help="the n at which the old path is measured (0: never)")
    p.add_argument("--peers-python", default=None, help="a Python with ipyparallel (default: this one, if it has it)")
    p.add_argument("--sections", default="data,restart,first,warm")
    p.add_argument("--warm-n", type=int, default=4)
    p.add_argument("--pause", type=float, default=15.0, help="seconds between %%load_ext and the first cell when paused")
    p.add_argument("--quick", action="store_true", help="2 repeats")
    p.add_argument("--out", default="data", help="bench/results/OUT.md and OUT.json (default data)")
    a = p.parse_args()
    a.ns, a.sizes, a.sections = [int(x) for x in a.ns.split(",")], [int(x) for x in a.sizes.split(",")], a.sections.split(",")
    a.repeats = 2 if a.quick else a.repeats
    return a


def peers_python(given: Optional[str]) -> Optional[str]:
    for py in [given] if given else [sys.executable]:
        if subprocess.run([py, "-c", "import ipyparallel"], capture_output=True).returncode == 0:
            return py
    NOTES.append(f"ipyparallel is not installed for {given or sys.executable}: its columns are empty (pass --peers-python)")
    return None


def main() -> None:
    a = parse_args()
    if "data" in a.sections:
        for n in a.ns:
            bench_data_n(n, a.sizes, a.repeats if n < 8 else max(2, a.repeats // 2), old_path=n == a.old_path_n)
        bench_memcpy(a.sizes, a.repeats)
        py = peers_python(a.peers_python)
        if py:
            bench_ipp(py, a.ns, a.sizes, max(2, a.repeats // 2))
    if "restart" in a.sections:
        bench_restart(a.ns, a.repeats)
    if "first" in a.sections:
        bench_first_cell(max(1, a.repeats // 2), a.pause)
    if "warm" in a.sections:
        bench_warm(a.warm_n, a.repeats * 4)
    md = "\n".join(render_data(a.ns, a.sizes) + render_rest(a.ns, a.warm_n) + ["", *(f"- {n}" for n in NOTES)]) + "\n"
    print(md)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", f"{a.out}.md"), "w") as f:
        f.write(md)
    with open(os.path.join(HERE, "results", f"{a.out}.json"), "w") as f:
        json.dump({"results": RESULTS, "notes": NOTES, "args": vars(a)}, f, indent=1)


if __name__ == "__main__":
    main()
