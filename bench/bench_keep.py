"""Kept pools (docs/keep.md): what keeping costs a warm cell, how long an attach takes, what the output spool costs training.

    .venv/bin/python bench/bench_keep.py                       # about 5 min on 2 cores
    .venv/bin/python bench/bench_keep.py --rounds 2 --pairs 2  # a smoke run

1. **Warm cell**: the round trip (execute request → idle, seen from the client) of ``%%ddp`` ``1`` at n = 4, on one
   pool, in blocks of ``--cells`` cells, the pool kept (``%ddp keep``) in one block and not kept (``--off``) in the
   other, the order alternating round by round; a round's ratio is its kept block's median ÷ its normal block's
   (the machine's drifting load cancels within a round). Goal: the median ratio ≤ 1.10 (no extra hop on the hot path).
2. **Attach** at n = 8 with a job running: a kept ``--bg`` job sleeps in a loop; its kernel is SIGKILLed; a new kernel
   runs ``%ddp attach --out job``: the cell's round trip, and the time the attach itself reports (ranks re-dialled,
   queued messages read). Goal: ≤ 1 s.
3. **The output spool while detached**: a DDP training loop (MLP 256→512→256, batch 64) printing one line a step, at
   n = 2, in pairs: the loop in the foreground of a normal pool with its kernel attached, and the same loop as a kept
   ``--bg`` job whose kernel was SIGKILLed as it started (its output goes only to the spool), its rate read back by
   the next kernel's attach. The pair's ratio is detached ÷ attached. Goal: ≥ 0.97.

Prints Markdown and writes bench/results/keep.{md,json}; docs/bench/keep.md keeps one run with what it means.
Every kernel and kept pool it starts is stopped.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PY, REPO, RESULTS_DIR, Store, write_report  # noqa: E402
from kernels import KernelSession  # noqa: E402

OUT = os.path.join(RESULTS_DIR, "keep")
START = "%%ddp -n {n}\nimport os, time, torch, torch.distributed as dist, ddp_magic\n1"
SETUP = """%%ddp
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
net = DDP(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
xb = torch.randn(64, 256)
def one():
    opt.zero_grad()
    loss = net(xb).pow(2).mean()
    loss.backward()
    opt.step()
    return loss
def train(steps):
    for _ in range(20):
        one()
    dist.barrier()
    t0 = time.perf_counter()
    for step in range(steps):
        loss = one()
        print('step', step, 'loss', round(loss.item(), 5), flush=True)
    return steps / (time.perf_counter() - t0)
1
"""


class Kernels:
    """Kernels of one runtime directory (its kept pools are this bench's alone)."""

    def __init__(self) -> None:
        self.runtime = tempfile.mkdtemp(prefix="k33b-", dir="/tmp")
        self.env = {"JUPYTER_RUNTIME_DIR": self.runtime, "JPY_SESSION_NAME": "bench_keep.ipynb", "DDP_MAGIC_WARM_TEMPLATE": "1"}

    def new(self) -> KernelSession:
        k = KernelSession(env=self.env)
        k.ok("%load_ext ddp_magic")
        return k

    def kill(self, k: KernelSession) -> None:
        os.kill(k.pid, signal.SIGKILL)
        try:
            k.kc.stop_channels()
        except Exception as e:  # the kernel is gone: its channels may complain
            print(f"bench_keep: closing a killed kernel's channels: {e}", file=sys.stderr)

    def close(self) -> None:
        env = dict(os.environ, JUPYTER_RUNTIME_DIR=self.runtime, PYTHONPATH=REPO)
        for name in os.listdir(self.runtime):
            if name.endswith(".json"):
                subprocess.run([PY, "-m", "ddp_magic", "stop", name[len("ddp-kept-"):-5]], env=env, capture_output=True, timeout=60)
        shutil.rmtree(self.runtime, ignore_errors=True)


def warm_cells(ks: Kernels, store: Store, rounds: int, cells: int) -> None:
    k = ks.new()
    try:
        k.ok(START.format(n=4), timeout=300)
        for r in range(rounds):
            for mode in (("normal", "kept") if r % 2 == 0 else ("kept", "normal")):
                k.ok("%ddp keep" if mode == "kept" else "%ddp keep --off")
                for _ in range(3):
                    k.ok("%%ddp\n1")
                times = [k.ok("%%ddp\n1")["elapsed"] for _ in range(cells)]
                store.add(f"warm {mode}", [statistics.median(times)])
        k.ok("%ddp stop")
    finally:
        k.shutdown()


def attach_times(ks: Kernels, store: Store, repeats: int, n: int = 8) -> None:
    for _ in range(repeats):
        k = ks.new()
        k.ok(START.format(n=n), timeout=300)
        k.ok("%%ddp --bg --out job --keep\nwhile True:\n    time.sleep(0.05)")
        time.sleep(1.0)
        ks.kill(k)
        k2 = ks.new()
        try:
            ex = k2.ok("%ddp attach --out job", timeout=120)
            said = re.search(r"in ([0-9.]+) s:", ex["stdout"])
            store.add(f"attach n={n} (cell)", [ex["elapsed"]])
            if said:
                store.add(f"attach n={n} (reported)", [float(said.group(1))])
            k2.ok("job.cancel(); job.wait(60)")
            k2.ok("%ddp stop")
        finally:
            k2.shutdown()


def spool_pairs(ks: Kernels, store: Store, pairs: int, steps: int) -> None:
    k = ks.new()
    try:
        k.ok(START.format(n=2), timeout=300)
        k.ok(SETUP, timeout=300)
        for _ in range(pairs):
            attached = k.ok(f"%%ddp\ntrain({steps})", timeout=600)["value"]
            k.ok("%ddp keep")
            k.ok(f"%%ddp --bg --out job --keep\ntrain({steps})")
            ks.kill(k)
            k = ks.new()
            k.ok("%ddp attach --out job", timeout=120)
            detached = k.ok("job.result()", timeout=600)["value"]
            k.ok("%ddp keep --off")
            a, d = _rate(attached), _rate(detached)
            store.add("steps/s attached, not kept", [a])
            store.add("steps/s detached, kept", [d])
            store.add("spool ratio", [d / a])
        k.ok("%ddp stop")
    finally:
        k.shutdown()


def attach_simulated(store: Store, n: int, per_host: int = 256) -> None:
    """Attach at ``n`` simulated ranks (bench/simranks, the kernel's side for real), a job running: this process is both
    kernels; the lease (procs/lease.py) runs on a thread of it, as a template would run it."""
    import threading

    import simranks
    from ddp_magic.kernel.keep import attach, keeping
    from ddp_magic.procs.lease import Lease
    from ddp_magic.wire import kept
    from ddp_magic.wire import protocol as P

    where = tempfile.mkdtemp(prefix="k33s-", dir="/tmp")
    pool = simranks.sim_pool(n, per_host=per_host)
    pool.start()
    pool.run("1")
    info = {"notebook": "sim.ipynb", "nproc": n, "job": "cell [2]", "pool": keeping.pool_blob(pool), "shm_prefix": pool.shm_prefix}
    lease = Lease({"id": "sim", "where": where, "idle": 3600, "max": 3600, "info": info}, pool.secret, lambda: {10 ** 6 + r: r for r in range(n)})
    stop = threading.Event()

    def serve() -> None:
        from ddp_magic.procs.forkserver import readable

        while not stop.is_set():
            for fd in readable(lease.fds(), 0.1):
                lease.handle(fd)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    new = None
    try:
        pool.ask(P.KEEP, 120, fields={"on": True, "lease": {"path": kept.socket_path("sim", where)}, "dir": kept.pool_dir("sim", where)})
        deadline = time.monotonic() + 120
        while sum(p.rank is not None for p in list(lease.peers.values())) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        joined = sum(p.rank is not None for p in list(lease.peers.values()))
        assert joined == n, f"{joined} of {n} ranks joined the lease: {pool.launcher.log_text(3000)}"
        pool._send_cell("sim.sleep(600)\n1", {}, "auto", None, None, ())  # the job, running when its kernel goes
        time.sleep(1.0)
        pool.hub.close_all()  # the kernel is gone (the template reads EOF on its stdin)
        lease.kernel_left()
        time.sleep(2.0)
        found = attach.Found(kept.discovery_path("sim", where), kept.read(kept.discovery_path("sim", where)), True)
        t0 = time.perf_counter()
        done = attach.attach(found, force=False)
        store.add(f"attach n={n} simulated", [time.perf_counter() - t0])
        new = done.pool
        assert new is not None and len(new.hub.conns) == n and done.resumed, f"{len(new.hub.conns) if new else 0} of {n} ranks joined"
    finally:
        if new is not None:
            new.hub.shutdown_all()
            new.hub.close_all()
        stop.set()
        thread.join()
        lease.off()
        pool.launcher.close()
        shutil.rmtree(where, ignore_errors=True)


def _rate(text: str) -> float:
    """Rank 0's steps/s from a RankResults' text."""
    return float(re.search(r"\[0\] ([0-9.]+)", text).group(1))  # type: ignore[union-attr]


def report(store: Store) -> str:
    def med(key: str) -> float:
        return statistics.median(store.get(key).values)

    warm = [k / n for k, n in zip(store.get("warm kept").values, store.get("warm normal").values)]
    lines = ["| what | median | all | goal |", "|---|---|---|---|"]
    if warm:
        lines += [f"| warm `%%ddp 1`, n = 4, normal | {med('warm normal') * 1000:.1f} ms | {_all(store.get('warm normal').values, 1000)} ms | |",
                  f"| warm `%%ddp 1`, n = 4, kept | {med('warm kept') * 1000:.1f} ms | {_all(store.get('warm kept').values, 1000)} ms | |",
                  f"| kept ÷ normal, per round | {statistics.median(warm):.3f} | {_all(warm)} | ≤ 1.10 |"]
    for key in [k for k in store.series if k.startswith("attach") and k.endswith("simulated")]:
        lines.append(f"| {key} | {med(key):.3f} s | {_all(store.get(key).values)} s | ≤ 3 s |")
    for key in ("attach n=8 (cell)", "attach n=8 (reported)"):
        if store.get(key).values:
            lines.append(f"| {key} | {med(key):.3f} s | {_all(store.get(key).values)} s | ≤ 1 s |")
    if store.get("spool ratio").values:
        att, det = store.get("steps/s attached, not kept").values, store.get("steps/s detached, kept").values
        lines += [f"| steps/s, n = 2, attached, not kept | {statistics.median(att):.1f} | {_all(att, 1, 1)} | |",
                  f"| steps/s, n = 2, detached, kept (spool) | {statistics.median(det):.1f} | {_all(det, 1, 1)} | |",
                  f"| detached ÷ attached, per pair | {med('spool ratio'):.3f} | {_all(store.get('spool ratio').values)} | ≥ 0.97 |"]
    return "\n".join(lines)


def _all(values: List[float], scale: float = 1.0, digits: int = 3) -> str:
    return ", ".join(f"{v * scale:.{digits}f}" for v in values)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6, help="warm-cell rounds (a kept and a normal block each)")
    ap.add_argument("--cells", type=int, default=20, help="warm cells a block")
    ap.add_argument("--attaches", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=6, help="spool pairs")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--sim", type=int, default=1024, help="simulated ranks of the attach at scale (0: skip it)")
    ap.add_argument("--only-sim", action="store_true", help="only the attach at scale")
    args = ap.parse_args()
    store, ks = Store(), Kernels()
    meta: Dict[str, object] = {"rounds": args.rounds, "cells": args.cells, "attaches": args.attaches, "pairs": args.pairs, "steps": args.steps,
                               "cpus": os.cpu_count(), "when": time.strftime("%Y-%m-%d %H:%M")}
    try:
        for _ in range(args.attaches if args.sim else 0):
            attach_simulated(store, args.sim)
        if not args.only_sim:
            warm_cells(ks, store, args.rounds, args.cells)
            attach_times(ks, store, args.attaches)
            spool_pairs(ks, store, args.pairs, args.steps)
    finally:
        ks.close()
    write_report(OUT + ("_sim" if args.only_sim else ""), report(store), store.payload(meta))


if __name__ == "__main__":
    main()
