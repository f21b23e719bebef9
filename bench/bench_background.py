"""%%ddp --bg: what a background cell costs its training, what it costs the kernel, and what a peek costs.

    .venv/bin/python bench/bench_background.py                 # n=2 training, n=4 peeks; 5 rounds; about 8 min on 2 cores
    .venv/bin/python bench/bench_background.py --runs 3 --steps 600  # quicker, noisier

1. Training steps/s of one DDP loop (MLP 256→512→256, batch 64, SGD, one ``ddp_magic.log`` per step) at n ranks:
   in a foreground %%ddp cell; in a --bg cell while the notebook waits (``job.wait()``); in a --bg cell while the
   notebook runs a cell that plots ``job.metrics`` every 2 s; in a --bg cell peeked at once a second; and the same
   loop as a script under ``torchrun --standalone``. Each run times its own steps (perf_counter around the loop, after
   a warm-up and a barrier) and returns rank 0's rate. A round runs every condition once, back to back (the order
   rotates); a condition's ratio is the median over the rounds of its rate ÷ the foreground rate of the same round,
   so that the drift of a shared machine's load cancels out.
2. The kernel's own cost while a cell waits 50 ms per step and logs (nothing for the ranks to compute): CPU% (the
   kernel process's utime+stime over the window) and wake-ups/s (its threads' context switches), for the same loop
   in the foreground and in the background with the notebook idle, and for an idle kernel with a pool.
3. The round trip (execute request → idle, seen from the client) at n=4 of a plain cell ``1``, a warm ``%%ddp`` cell
   ``1``, a ``%%ddp --peek`` of ``1``, and the same peek while a background job runs.

Figures are medians (min–max). Prints Markdown and writes bench/results/background.{md,json}; docs/bench/background.md
keeps one run with what it means. Every kernel and pool it starts is stopped.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_core as core  # noqa: E402

OUT = os.path.join(core.RESULTS_DIR, "background")
CONDITIONS = ("foreground", "bg, notebook waits", "bg, a plot every 2 s", "bg, a peek every 1 s", "torchrun")

SETUP = """
import os, time, torch, torch.distributed as dist, ddp_magic
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
"""
LOOP = """
for _ in range({warmup}):
    one()
dist.barrier()
t0 = time.perf_counter()
for step in range({steps}):
    loss = one()
    ddp_magic.log(step=step, loss=loss.detach())
rate = {steps} / (time.perf_counter() - t0)
"""
PLOT = """
import io, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
_m = job.metrics
_fig, _ax = plt.subplots(figsize=(5, 2))
_ax.plot(_m["step"], _m["loss"])
_buf = io.BytesIO()
_fig.savefig(_buf, format="png")
plt.close(_fig)
len(_buf.getvalue())
"""
WAITING = "for i in range({n}):\n    time.sleep(0.05)\n    ddp_magic.log(step=i, x=1.0)\n"


def med(xs: List[float]) -> str:
    """median (min–max), three decimals under 10, one above."""
    if not xs:
        return "—"
    d = 3 if max(xs) < 10 else 1
    return f"{statistics.median(xs):.{d}f} ({min(xs):.{d}f}–{max(xs):.{d}f})"


def rank0(text: str) -> float:
    """Rank 0's value in a RankResults' text."""
    return float(text.split("[0]", 1)[1].split()[0])


# ====================================================================== 1. training
def bg_run(k: core.KernelSession, loop: str, mode: str) -> float:
    """A --bg run of the loop; meanwhile the client waits, plots every 2 s or peeks every 1 s. Rank 0's steps/s."""
    k.ok("%%ddp --bg --out job\n" + loop + "rate")
    if mode == "wait":
        k.ok("job.wait()", timeout=600)
    every, cell = (2.0, PLOT) if mode == "plot" else (1.0, "%%ddp --peek\nstep")
    while mode != "wait":
        time.sleep(every)
        if k.ok("job.done()")["value"] == "True":
            break
        ex = k.run(cell)
        if ex["error"] and "NameError" not in ex["error"]:  # a peek before the loop began has no `step` yet
            raise RuntimeError(ex["error"])
    return rank0(k.ok("job.result()")["value"])


def torchrun_run(n: int, loop: str, tmp: str) -> float:
    path = os.path.join(tmp, "train.py")
    with open(path, "w") as f:
        f.write("import torch.distributed as _d\n_d.init_process_group('gloo')\n" + SETUP + loop + "if dist.get_rank() == 0:\n    print('RATE', rate)\n")
    out = subprocess.run(core_torchrun(n) + [path], capture_output=True, text=True, timeout=600, env=core.child_env())
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RATE")]
    if not lines:
        raise RuntimeError(f"torchrun failed: {core.tail(out.stderr)}")
    return float(lines[-1].split()[1])


def core_torchrun(n: int) -> List[str]:
    torchrun = os.path.join(os.path.dirname(core.PY), "torchrun")
    return ([torchrun] if os.path.exists(torchrun) else [core.PY, "-m", "torch.distributed.run"]) + ["--standalone", f"--nproc-per-node={n}"]


def training(k: core.KernelSession, n: int, runs: int, steps: int, store: core.Store, tmp: str) -> None:
    k.ok(f"%%ddp -n {n}\n" + SETUP, timeout=300)
    loop = LOOP.format(warmup=30, steps=steps)
    how = {
        "foreground": lambda: rank0(k.ok("%%ddp\n" + loop + "rate", timeout=600)["value"]),
        "bg, notebook waits": lambda: bg_run(k, loop, "wait"),
        "bg, a plot every 2 s": lambda: bg_run(k, loop, "plot"),
        "bg, a peek every 1 s": lambda: bg_run(k, loop, "peek"),
        "torchrun": lambda: torchrun_run(n, loop, tmp),
    }
    for r in range(runs):
        order = CONDITIONS[r % len(CONDITIONS):] + CONDITIONS[: r % len(CONDITIONS)]
        got = {cond: store.measure(f"train.{cond}", how[cond]) for cond in order}
        for cond, rate in got.items():
            if rate is not None and got["foreground"]:
                store.get(f"ratio.{cond}").values.append(rate / got["foreground"])


# ====================================================================== 2. the kernel's own cost
def kernel_ticks(pid: int) -> Tuple[float, int]:
    """(CPU seconds, context switches) of every thread of ``pid`` so far."""
    cpu, switches = 0.0, 0
    tck = os.sysconf("SC_CLK_TCK")
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / tck
            with open(f"/proc/{pid}/task/{task}/status") as f:
                switches += sum(int(ln.split()[1]) for ln in f if "ctxt_switches" in ln)
        except OSError:
            continue  # a thread that ended meanwhile
    return cpu, switches


def window(pid: int, seconds: float) -> Tuple[float, float]:
    """(CPU %, wake-ups/s) of the kernel over the next ``seconds``."""
    c0, s0 = kernel_ticks(pid)
    time.sleep(seconds)
    c1, s1 = kernel_ticks(pid)
    return 100.0 * (c1 - c0) / seconds, (s1 - s0) / seconds


def kernel_cost(k: core.KernelSession, runs: int, store: core.Store, seconds: float = 5.0) -> None:
    cell = WAITING.format(n=int((seconds + 3) / 0.05))
    for _ in range(runs):
        store.measure("cost.idle kernel with a pool", lambda: cost_sample(window(k.pid, seconds), store, "idle"))
        mid = k.kc.execute("%%ddp\n" + cell)
        time.sleep(1.5)
        store.measure("cost.foreground cell", lambda: cost_sample(window(k.pid, seconds), store, "fg"))
        wait_idle(k, mid)
        k.ok("%%ddp --bg --out job\n" + cell)
        time.sleep(1.5)
        store.measure("cost.background cell, notebook idle", lambda: cost_sample(window(k.pid, seconds), store, "bg"))
        k.ok("job.wait()", timeout=120)


def cost_sample(got: Tuple[float, float], store: core.Store, tag: str) -> Tuple[float, dict]:
    cpu, wakeups = got
    store.get(f"wakeups.{tag}").values.append(wakeups)
    return cpu, {"wakeups_per_s": wakeups}


def wait_idle(k: core.KernelSession, msg_id: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = k.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return
    raise TimeoutError("the cell did not end")


# ====================================================================== 3. a peek's round trip
def peek_round_trips(k: core.KernelSession, repeats: int, store: core.Store) -> None:
    k.ok("%%ddp -n 4\nimport time, ddp_magic\n1", timeout=300)
    cells = {"plain cell `1`": "1", "warm %%ddp cell `1`": "%%ddp --no-widget\n1", "%%ddp --peek `1`": "%%ddp --peek\n1"}
    for _ in range(3):  # warm
        for code in cells.values():
            k.ok(code)
    for _ in range(repeats):
        for name, code in cells.items():
            store.measure_quiet(f"peek.{name}", lambda code=code: k.ok(code)["elapsed"])
    k.ok("%%ddp --bg --out job\n" + WAITING.format(n=100000))
    for _ in range(repeats):
        store.measure_quiet("peek.%%ddp --peek `1` while a bg job runs", lambda: k.ok("%%ddp --peek\n1")["elapsed"])
    k.ok("job.cancel()")
    k.ok("job.wait(60)")


# ====================================================================== report
def report(store: core.Store, n: int, steps: int, load: Tuple[str, str]) -> str:
    v = lambda key: store.get(key).values  # noqa: E731
    fg = v("train.foreground")
    lines = [f"# %%ddp --bg (n = {n} for training, n = 4 for peeks; {os.cpu_count()} cores; load {load[0]} → {load[1]})", "",
             f"## Training steps/s ({steps} timed steps per run; ÷ foreground: the median over rounds of the run's rate ÷ that round's foreground rate)",
             "", "| condition | steps/s | ÷ foreground | runs |", "|---|---|---|---|"]
    for cond in CONDITIONS:
        xs, errors = v(f"train.{cond}"), store.get(f"train.{cond}").errors
        ratio = med(v(f"ratio.{cond}")) if fg else "—"
        lines.append(f"| {cond} | {med(xs)} | {ratio} | {len(xs)}{' (' + '; '.join(errors) + ')' if errors else ''} |")
    lines += ["", "## The kernel's own cost while the cell waits 50 ms per step (5 s windows)", "",
              "| | kernel CPU % | wake-ups/s |", "|---|---|---|"]
    for key, tag in (("idle kernel with a pool", "idle"), ("foreground cell", "fg"), ("background cell, notebook idle", "bg")):
        lines.append(f"| {key} | {med(v('cost.' + key))} | {med(v('wakeups.' + tag))} |")
    lines += ["", "## Round trip at n = 4 (ms, execute request → idle)", "", "| cell | ms | repeats |", "|---|---|---|"]
    for key in ("plain cell `1`", "warm %%ddp cell `1`", "%%ddp --peek `1`", "%%ddp --peek `1` while a bg job runs"):
        xs = [x * 1000 for x in v("peek." + key)]
        lines.append(f"| {key} | {med(xs)} | {len(xs)} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=2, help="ranks for the training runs (default 2)")
    p.add_argument("--runs", type=int, default=5, help="rounds of the training conditions, and cost windows (default 5)")
    p.add_argument("--steps", type=int, default=1500, help="timed steps per training run (default 1500)")
    p.add_argument("--peeks", type=int, default=30, help="round trips of each kind (default 30)")
    a = p.parse_args()
    os.makedirs(core.RESULTS_DIR, exist_ok=True)
    load0 = f"{os.getloadavg()[0]:.2f}"
    store, tmp = core.Store(), tempfile.mkdtemp(prefix="ddp_bench_bg_")
    k = core.KernelSession()
    try:
        k.ok("%load_ext ddp_magic")
        training(k, a.n, a.runs, a.steps, store, tmp)
        kernel_cost(k, a.runs, store)
        peek_round_trips(k, a.peeks, store)
    finally:
        k.shutdown()
    md = report(store, a.n, a.steps, (load0, f"{os.getloadavg()[0]:.2f}"))
    core.write_report(OUT, md, {k: s.to_dict() for k, s in store.series.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
