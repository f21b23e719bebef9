"""bench_peers.py, section 6: memory. Each worker's RSS and USS against a bare `import torch`, each pool's Σ PSS, kernel RSS after many cells."""
from __future__ import annotations

import argparse
import subprocess
import time
from typing import Dict

import processes as P
from harness import PY, Store, short_error, log
from peers_tools import Tool

def live_memory(n: int, pools: Dict[str, Tool], args: argparse.Namespace, store: Store, tmp: str, cleanup: P.Watch) -> None:
    """6a. memory of the workers, beyond a bare `import torch` process; 6b. kernel RSS after 500 cells."""
    bare_mem(n, store)
    for key, t in pools.items():
        if t.setup_error:
            store.error(f"mem.{key}.rank.rss.n{n}", t.setup_error)
            continue
        pids = t.worker_pids()
        for role, plist in pids.items():
            mems = [P.proc_mem_kib(p) for p in plist]
            mems = [m for m in mems if m[0]]
            if mems:
                store.get(f"mem.{key}.{role}.rss.n{n}").values += [m[0] / 1024 for m in mems]
                store.get(f"mem.{key}.{role}.uss.n{n}").values += [m[1] / 1024 for m in mems]
                store.get(f"mem.{key}.{role}.pss.n{n}").values += [m[2] / 1024 for m in mems]
                store.get(f"mem.{key}.{role}.count.n{n}").values.append(len(mems))
        if not pids.get("rank"):
            store.error(f"mem.{key}.rank.rss.n{n}", "no worker process found among the kernel's descendants")
    if n == args.mem_n:
        kernel_memory(n, pools, args, store, tmp, cleanup)


def bare_mem(n: int, store: Store) -> None:
    """RSS and USS of one `python -c "import torch"` process, measured at the same moment as the workers."""
    p = subprocess.Popen([PY, "-c", "import torch, sys; sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=P.child_env(), text=True)
    try:
        p.stdout.readline()
        time.sleep(0.2)
        rss, uss, pss = P.proc_mem_kib(p.pid)
        store.get(f"mem.bare.rss.n{n}").values.append(rss / 1024)
        store.get(f"mem.bare.uss.n{n}").values.append(uss / 1024)
        store.get(f"mem.bare.pss.n{n}").values.append(pss / 1024)
    finally:
        p.stdin.close()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def kernel_memory(n: int, pools: Dict[str, Tool], args: argparse.Namespace, store: Store, tmp: str, cleanup: P.Watch) -> None:
    """Kernel RSS before and after `--mem-cells` cells (half `1`, half one all_reduce); a plain kernel running `1` as the baseline."""
    cells = args.mem_cells
    plain = Tool(n, args, tmp, cleanup)
    plain.key = "plain"
    try:
        plain.start_kernel()
        plain.ok("1")
        runs = [("plain", plain, ["1"])]
    except Exception as e:
        store.error(f"mem.kernel.plain.before.n{n}", short_error(e))
        runs = []
    for key, t in pools.items():
        if t.setup_error:
            store.error(f"mem.kernel.{key}.before.n{n}", t.setup_error)
            continue
        runs.append((key, t, [t.cell("1"), t.cell("x = torch.ones(1, device=t.device)\ndist.all_reduce(x)")]))
    try:
        for key, t, codes in runs:
            try:
                before = P.proc_mem_kib(t.k.pid)[0] / 1024
                t0 = time.perf_counter()
                for i in range(cells):
                    t.ok(codes[i % len(codes)], timeout=120)
                    if i % 100 == 99:
                        t.ok("%reset -f out")
                dt = time.perf_counter() - t0
                after = P.proc_mem_kib(t.k.pid)[0] / 1024
                store.get(f"mem.kernel.{key}.before.n{n}").values.append(before)
                store.get(f"mem.kernel.{key}.after.n{n}").values.append(after)
                store.get(f"mem.kernel.{key}.cells_s.n{n}").values.append(dt)
                log(f"kernel memory {key}: {before:.0f} → {after:.0f} MiB after {cells} cells ({dt:.1f}s)")
            except Exception as e:
                store.error(f"mem.kernel.{key}.before.n{n}", short_error(e))
    finally:
        plain.stop()
