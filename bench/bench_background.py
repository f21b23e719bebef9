"""%%ddp --bg: what a background cell costs its training, what it costs the kernel, and what a peek costs.

    .venv/bin/python bench/bench_background.py                        # n=2; 12–40 pairs a condition; about 15 min on 2 cores
    .venv/bin/python bench/bench_background.py --min-pairs 4 --max-pairs 4 --steps 200 --skip-cost  # a smoke run

1. Training steps/s of one DDP loop (MLP 256→512→256, batch 64, SGD, one ``ddp_magic.log`` per step) at n ranks, in
   **short paired runs on one warm pool**: each pair is a foreground %%ddp run and, right before or after it (the
   order alternates pair by pair), one run of another condition: a --bg cell while the notebook plots
   ``job.metrics`` every 2 s; a --bg cell peeked at
   (``%%ddp --peek step``) once a second; and the same loop on **warm** ``torchrun --standalone`` workers started
   once, at the start, that run one timed loop each time the bench drops a file (so torchrun pays no start-up
   in a pair either). Each run times its own steps (perf_counter around the loop, after a warm-up and a barrier)
   and returns rank 0's rate and its CPU time per step (``time.process_time``: every thread of the rank, so a
   peek's own work counts; another process's load does not); the pair's ratio is the condition's rate ÷ its foreground partner's, so the load of a
   shared machine, which drifts over seconds to minutes, cancels within a pair. Rounds (one pair per condition, the
   conditions' order rotating) go on until every condition is decided against the goal (the distribution-free 95%
   confidence interval of the median ratio, from the binomial order statistics, lies wholly above or wholly below
   0.97), at least ``--min-pairs`` and at most ``--max-pairs`` rounds, or ``--minutes``.
2. The kernel's own cost while a cell waits 50 ms per step and logs (nothing for the ranks to compute): CPU% (the
   kernel process's utime+stime over the window) and wake-ups/s (its threads' context switches), for the same loop
   in the foreground and in the background with the notebook idle, and for an idle kernel with a pool.
3. The round trip (execute request → idle, seen from the client) at n=4 of a plain cell ``1``, a warm ``%%ddp`` cell
   ``1``, a ``%%ddp --peek`` of ``1``, and the same peek while a background job runs.
4. What a peek costs the ranks: each rank's CPU (/proc utime + stime) over 100 peeks, minus its CPU over as long idle
   right after, per peek, for a peek of ``step`` and of a 256×256 weight's norm (``--only-peek-cost``: this alone).

Prints Markdown and writes bench/results/background.{md,json}; docs/bench/background.md keeps one run with what it
means. Every kernel, pool and torchrun it starts is stopped.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PY, RESULTS_DIR, Store, write_report  # noqa: E402
from kernels import KernelSession  # noqa: E402
from processes import child_env, tail  # noqa: E402

OUT = os.path.join(RESULTS_DIR, "background")
GOAL = 0.97  # the issue's: a background cell's steps/s ≥ 0.97 × the foreground's
PAIRED = ("bg, a plot every 2 s", "bg, a peek every 1 s", "torchrun")  # each paired with a foreground run

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
t0, c0 = time.perf_counter(), time.process_time()
for step in range({steps}):
    loss = one()
    ddp_magic.log(step=step, loss=loss.detach())
rate = ({steps} / (time.perf_counter() - t0), 1000 * (time.process_time() - c0) / {steps})
"""
WARM_TORCHRUN = """
import sys
import torch.distributed as _d
_d.init_process_group('gloo')
{setup}
ctl, i = sys.argv[1], 0
if dist.get_rank() == 0:
    open(os.path.join(ctl, 'ready'), 'w').close()
while True:  # one timed loop per go.<i> file the bench drops (its text: the steps); 'quit' ends it
    go = os.path.join(ctl, f'go.{{i}}')
    while not os.path.exists(go) and not os.path.exists(os.path.join(ctl, 'quit')):
        time.sleep(0.02)
    if not os.path.exists(go):
        break
    time.sleep(0.01)
    steps = int(open(go).read())
{loop}
    if dist.get_rank() == 0:
        with open(os.path.join(ctl, f'rate.{{i}}.part'), 'w') as f:
            f.write(repr(rate))
        os.replace(os.path.join(ctl, f'rate.{{i}}.part'), os.path.join(ctl, f'rate.{{i}}'))
    i += 1
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


def median_ci(xs: List[float], conf: float = 0.95) -> Optional[Tuple[float, float]]:
    """The distribution-free confidence interval of the median: order statistics k and n+1-k, where k is the largest
    with P(Binomial(n, 1/2) < k) ≤ (1 − conf)/2 (n ≥ 6 for a 95% one); None with too few samples."""
    s, n = sorted(xs), len(xs)
    k, below = 0, 0.0
    while k < n:
        p = math.comb(n, k) / 2 ** n
        if below + p > (1 - conf) / 2:
            break
        below += p
        k += 1
    return (s[k - 1], s[n - k]) if k >= 1 else None


def verdict(xs: List[float]) -> str:
    """Decided against the goal by the interval, or not (yet)."""
    ci = median_ci(xs)
    if ci is None:
        return "undecided"
    return f"≥ {GOAL}" if ci[0] >= GOAL else f"< {GOAL}" if ci[1] < GOAL else "undecided"


def rank0(text: str) -> Tuple[float, dict]:
    """Rank 0's (steps/s, CPU ms per step) in a RankResults' text: the rate, with the CPU time as the sample's info."""
    rate, cpu = re.findall(r"[\d.]+", text.split("[0]", 1)[1].split(")", 1)[0])[:2]
    return float(rate), {"cpu_ms": float(cpu)}


# ====================================================================== 1. training
class WarmTorchrun:
    """``torchrun --standalone`` workers, started once, that run one timed loop each time they are told (a file)."""

    def __init__(self, n: int, tmp: str) -> None:
        self.ctl, self.i = os.path.join(tmp, "torchrun"), 0
        os.makedirs(self.ctl)
        loop = "\n".join("    " + ln for ln in LOOP.format(warmup=30, steps="steps").strip().splitlines())
        path = os.path.join(tmp, "warm_train.py")
        with open(path, "w") as f:
            f.write(WARM_TORCHRUN.format(setup=SETUP, loop=loop))
        torchrun = os.path.join(os.path.dirname(PY), "torchrun")
        argv = ([torchrun] if os.path.exists(torchrun) else [PY, "-m", "torch.distributed.run"]) + ["--standalone", f"--nproc-per-node={n}"]
        self.log = open(os.path.join(tmp, "torchrun.log"), "w")
        self.proc = subprocess.Popen(argv + [path, self.ctl], stdout=self.log, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True)
        self._wait(os.path.join(self.ctl, "ready"), 300)

    def _wait(self, path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not os.path.exists(path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                with open(self.log.name) as f:
                    raise RuntimeError(f"warm torchrun: no {os.path.basename(path)}: {tail(f.read())}")
            time.sleep(0.02)

    def run(self, steps: int) -> float:
        go = os.path.join(self.ctl, f"go.{self.i}")
        with open(go + ".part", "w") as f:
            f.write(str(steps))
        os.replace(go + ".part", go)
        rate = os.path.join(self.ctl, f"rate.{self.i}")
        self.i += 1
        self._wait(rate, 600)
        with open(rate) as f:
            return rank0("[0] " + f.read())

    def stop(self) -> None:
        open(os.path.join(self.ctl, "quit"), "w").close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(10)
        self.log.close()


def bg_run(k: KernelSession, loop: str, every: Optional[float], cell: str = "") -> Tuple[float, dict]:
    """A --bg run of the loop; meanwhile the client waits (``every`` None) or runs ``cell`` every ``every`` s from
    ``every / 2`` on. Rank 0's steps/s, and how many times the cell ran."""
    k.ok("%%ddp --bg --out job\n" + loop + "rate")
    done = 0
    if every is None:
        k.ok("job.wait()", timeout=600)
    else:
        t0 = time.monotonic()
        while k.ok("job.done()")["value"] != "True":
            time.sleep(max(0.0, t0 + every / 2 + done * every - time.monotonic()))
            ex = k.run(cell)
            if ex["error"] and "NameError" not in ex["error"]:  # a peek before the loop began has no `step` yet
                raise RuntimeError(ex["error"])
            done += 1
    rate, info = rank0(k.ok("job.result()")["value"])
    return rate, dict(info, actions=done)


def training(k: KernelSession, n: int, a: argparse.Namespace, store: Store, tmp: str) -> None:
    """Paired rounds, each condition against a foreground run next to it, until each is decided (module docstring)."""
    k.ok(f"%%ddp -n {n}\n" + SETUP, timeout=300)
    loop = LOOP.format(warmup=30, steps=a.steps)
    warm = WarmTorchrun(n, tmp)
    how: Dict[str, Callable[[], object]] = {
        "foreground": lambda: rank0(k.ok("%%ddp\n" + loop + "rate", timeout=600)["value"]),
        "bg, a plot every 2 s": lambda: bg_run(k, loop, 2.0, PLOT),
        "bg, a peek every 1 s": lambda: bg_run(k, loop, 1.0, "%%ddp --peek\nstep"),
        "torchrun": lambda: warm.run(a.steps),
    }
    try:
        for _ in range(2):  # warm: the first runs of a pool pay for lazy imports and allocator growth
            how["foreground"]()
        t_end, r = time.monotonic() + 60 * a.minutes, 0
        while r < a.max_pairs and time.monotonic() < t_end:
            for j, cond in enumerate(PAIRED[r % len(PAIRED):] + PAIRED[: r % len(PAIRED)]):
                order = ("foreground", cond) if (r + j) % 2 == 0 else (cond, "foreground")
                got = {c: store.measure(f"train.{c}", how[c]) for c in order}  # type: ignore[arg-type]
                fg, other = got["foreground"], got[cond]
                if fg and other is not None:
                    store.get(f"ratio.{cond}").values.append(other / fg)
                    cpu = {c: store.get(f"train.{c}").info[-1]["cpu_ms"] for c in order}
                    store.get(f"cpu.{cond}").values.append(cpu[cond] / cpu["foreground"])
            r += 1
            store.get("load").values.append(os.getloadavg()[0])
            if r >= a.min_pairs and all(verdict(store.get(f"ratio.{c}").values) != "undecided" for c in PAIRED):
                break
        store.notes.append(f"{r} rounds of {len(PAIRED)} pairs")
    finally:
        warm.stop()


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


def kernel_cost(k: KernelSession, runs: int, store: Store, seconds: float = 5.0) -> None:
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


def cost_sample(got: Tuple[float, float], store: Store, tag: str) -> Tuple[float, dict]:
    cpu, wakeups = got
    store.get(f"wakeups.{tag}").values.append(wakeups)
    return cpu, {"wakeups_per_s": wakeups}


def wait_idle(k: KernelSession, msg_id: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = k.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return
    raise TimeoutError("the cell did not end")


# ====================================================================== 3. a peek's round trip
def peek_round_trips(k: KernelSession, repeats: int, store: Store) -> None:
    k.ok("%%ddp -n 4\nimport time, ddp_magic\n1", timeout=300)
    cells = {"plain cell `1`": "1", "warm %%ddp cell `1`": "%%ddp --no-widget\n1", "%%ddp --peek `1`": "%%ddp --peek\n1"}
    for _ in range(3):  # warm
        for code in cells.values():
            k.ok(code)
    for _ in range(repeats):
        for name, code in cells.items():
            store.measure(f"peek.{name}", lambda code=code: k.ok(code)["elapsed"], quiet=True)
    k.ok("%%ddp --bg --out job\n" + WAITING.format(n=100000))
    for _ in range(repeats):
        store.measure("peek.%%ddp --peek `1` while a bg job runs", lambda: k.ok("%%ddp --peek\n1")["elapsed"], quiet=True)
    k.ok("job.cancel()")
    k.ok("job.wait(60)")


# ====================================================================== 4. what a peek costs the ranks
PEEK_SOURCES = {"`step`": "step", "`float(model.weight.norm())`, 256×256": "float(model.weight.norm())"}


def rank_cpu(pid: int) -> float:
    """CPU seconds (utime + stime, every thread) of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peek_cost(k: KernelSession, repeats: int, store: Store, peeks: int = 100) -> None:
    """Each rank's CPU per peek: its CPU over ``peeks`` peeks minus its CPU over as long idle right after (n = 2)."""
    k.ok("%%ddp -n 2 --restart\nimport os, torch\nstep = 1\nmodel = torch.nn.Linear(256, 256)\nos.getpid()", timeout=300)
    pids = [int(x) for x in re.findall(r"\[\d\] (\d+)", k.ok("%%ddp --no-widget\nos.getpid()")["value"])]
    for name, src in PEEK_SOURCES.items():
        for _ in range(5):  # warm: the peek thread starts, its imports load
            k.ok("%%ddp --peek\n" + src)
        for _ in range(repeats):
            c0, t0 = [rank_cpu(p) for p in pids], time.perf_counter()
            for _ in range(peeks):
                k.ok("%%ddp --peek\n" + src)
            busy = time.perf_counter() - t0
            c1 = [rank_cpu(p) for p in pids]
            time.sleep(busy)
            c2 = [rank_cpu(p) for p in pids]
            for a, b, c in zip(c0, c1, c2):
                store.get(f"peekcpu.{name}").values.append(1000 * ((b - a) - (c - b)) / peeks)


# ====================================================================== report
def iqr(xs: List[float]) -> str:
    if len(xs) < 4:
        return "—"
    q = statistics.quantiles(xs, n=4)
    return f"{q[0]:.3f}–{q[2]:.3f}"


def report(store: Store, n: int, steps: int, load: Tuple[str, str]) -> str:
    v = lambda key: store.get(key).values  # noqa: E731
    loads = v("load")
    lines = [f"# %%ddp --bg (n = {n} for training, n = 4 for peeks; {os.cpu_count()} cores; load {load[0]} → {load[1]}"
             f"{', ' + med(loads) + ' after each round' if loads else ''})", "",
             f"## Training steps/s: paired runs of {steps} timed steps ({'; '.join(store.notes)})", "",
             "| condition | steps/s, every run | pairs | ÷ foreground partner: median | 95% CI of the median | IQR | min–max | goal ≥ 0.97 |",
             "|---|---|---|---|---|---|---|---|"]
    fg = store.get("train.foreground")
    lines.append(f"| foreground | {med(fg.values)} | — | 1 | — | — | — | — |")
    for cond in PAIRED:
        xs, errors = v(f"ratio.{cond}"), store.get(f"train.{cond}").errors + fg.errors
        interval = median_ci(xs)
        ci = f"{interval[0]:.3f}–{interval[1]:.3f}" if interval is not None else "—"
        ratio = f"{statistics.median(xs):.3f}" if xs else "—"
        mm = f"{min(xs):.3f}–{max(xs):.3f}" if xs else "—"
        lines.append(f"| {cond} | {med(v('train.' + cond))} | {len(xs)} | {ratio} | {ci} | {iqr(xs)} | {mm} | {verdict(xs)}"
                     f"{' (' + '; '.join(errors) + ')' if errors else ''} |")
    lines += ["", "## Rank 0's CPU time per step (process_time: every thread of the rank, the peek thread's too), ÷ its foreground partner's", "",
              "| condition | CPU ms per step, every run | pairs | ÷ foreground partner: median | 95% CI of the median | IQR |", "|---|---|---|---|---|---|",
              f"| foreground | {med([i['cpu_ms'] for i in fg.info])} | — | 1 | — | — |"]
    for cond in PAIRED:
        xs = v(f"cpu.{cond}")
        interval = median_ci(xs)
        ci = f"{interval[0]:.3f}–{interval[1]:.3f}" if interval is not None else "—"
        lines.append(f"| {cond} | {med([i['cpu_ms'] for i in store.get('train.' + cond).info])} | {len(xs)} | "
                     f"{statistics.median(xs):.3f} | {ci} | {iqr(xs)} |" if xs else f"| {cond} | — | 0 | — | — | — |")
    lines += ["", "## The kernel's own cost while the cell waits 50 ms per step (5 s windows)", "",
              "| | kernel CPU % | wake-ups/s |", "|---|---|---|"]
    for key, tag in (("idle kernel with a pool", "idle"), ("foreground cell", "fg"), ("background cell, notebook idle", "bg")):
        lines.append(f"| {key} | {med(v('cost.' + key))} | {med(v('wakeups.' + tag))} |")
    lines += ["", "## Round trip at n = 4 (ms, execute request → idle)", "", "| cell | ms | repeats |", "|---|---|---|"]
    for key in ("plain cell `1`", "warm %%ddp cell `1`", "%%ddp --peek `1`", "%%ddp --peek `1` while a bg job runs"):
        xs = [x * 1000 for x in v("peek." + key)]
        lines.append(f"| {key} | {med(xs)} | {len(xs)} |")
    lines += ["", "## A rank's CPU per peek (ms; n = 2, 100 peeks a sample minus as long idle; /proc ticks are 10 ms: ±0.1 ms)", "",
              "| peek | ms of rank CPU per peek | samples (ranks × repeats) |", "|---|---|---|"]
    for name in PEEK_SOURCES:
        xs = v("peekcpu." + name)
        lines.append(f"| {name} | {med(xs)} | {len(xs)} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=2, help="ranks for the training runs (default 2)")
    p.add_argument("--steps", type=int, default=600, help="timed steps per training run (default 600: a few seconds)")
    p.add_argument("--min-pairs", type=int, default=12, help="rounds (one pair per condition each) before a decision may stop them (default 12)")
    p.add_argument("--max-pairs", type=int, default=40, help="rounds at most (default 40)")
    p.add_argument("--minutes", type=float, default=12.0, help="no new round after this many minutes of training rounds (default 12)")
    p.add_argument("--runs", type=int, default=5, help="windows of the kernel-cost section (default 5)")
    p.add_argument("--peeks", type=int, default=30, help="round trips of each kind (default 30)")
    p.add_argument("--skip-cost", action="store_true", help="only the training section")
    p.add_argument("--only-peek-cost", action="store_true", help="only section 4, a rank's CPU per peek")
    a = p.parse_args()
    os.makedirs(RESULTS_DIR, exist_ok=True)
    load0 = f"{os.getloadavg()[0]:.2f}"
    store, tmp = Store(), tempfile.mkdtemp(prefix="ddp_bench_bg_")
    k = KernelSession()
    try:
        k.ok("%load_ext ddp_magic")
        if not a.only_peek_cost:
            training(k, a.n, a, store, tmp)
        if not a.skip_cost and not a.only_peek_cost:
            kernel_cost(k, a.runs, store)
            peek_round_trips(k, a.peeks, store)
        if not a.skip_cost:
            peek_cost(k, 3, store)
    finally:  # what was measured is written even when a later section failed
        k.shutdown()
        md = report(store, a.n, a.steps, (load0, f"{os.getloadavg()[0]:.2f}"))
        write_report(OUT, md, {key: s.to_dict() for key, s in store.series.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
