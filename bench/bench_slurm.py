#!/usr/bin/env python
"""%%ddp --slurm on the local two-node Slurm (scripts/local_slurm.py), against what a user would do instead.

    .venv/bin/python bench/bench_slurm.py                 # 3 repeats; needs root (it starts the local Slurm)
    .venv/bin/python bench/bench_slurm.py --repeats 5 --warm 200

In one run, every figure a median (min–max) over the repeats, the ways interleaved:

- **floor**: one ``srun -N1 -n1 python -c "import torch"`` (launch until the import is done): what any
  Slurm launch of torch costs at least; the goal is a first %%ddp --slurm cell within 1.3× of it.
- **%%ddp --slurm** (a fresh process, ``Pool`` with --nodes 2 --ntasks-per-node 2): the first cell, from the
  request to its first output line and to its result (salloc, srun, 4 torch imports, the process group);
  then a warm cell (an all_reduce) against a local pool's warm cell (-n 4 on this host), plain TCP and TLS;
  then a rank on n2 SIGKILLed: the next cell's time (the rank started again as a step) and the state kept.
- **sbatch** of the exported script (``%ddp_export --slurm``'s train.sbatch, srun torchrun on both nodes):
  submit → its first line → its end (the job gone from squeue).
- **submitit** (``AutoExecutor``, a function, ``tasks_per_node``; ``TorchDistributedEnvironment`` for the env):
  submit → the first line in task 0's log → the result; and **ipyparallel**'s Slurm engines
  (``Cluster(engines="slurm")``, then what ``%%px`` runs, ``view.execute``): the cluster's start → the first
  line → the result, and a warm ``%%px`` cell. Run with bench/.venv-peers's python (``bash bench/run_peers.sh
  --install-only`` makes it); without it the rows say "not run".
- **TLS cost**: a 256 MiB result frame from another process through the control channel's code, plain TCP
  against the TLS relay (wire/tls.py): what a rank on another host pays to return it.

Writes bench/results/slurm.md and .json and prints a Markdown table (docs/bench/slurm.md holds a run).
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
from typing import Dict, List, Optional

from harness import write_report  # bench/ is sys.path[0] when this runs as a script

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "scripts"))
PY = sys.executable
OUT = os.path.join(HERE, "results", "slurm")  # .md and .json (harness.write_report)

CELL = "import torch, torch.distributed as dist\nprint('first line', flush=True)\nx = torch.ones(1)\ndist.all_reduce(x)\nx.item()"
WARM = "x = torch.ones(1)\ndist.all_reduce(x)\nx.item()"

# One child per measurement: a fresh process, as a fresh kernel is.
CHILD = r'''
import json, os, signal, statistics, sys, time
from ddp_magic.kernel.pool import Pool
from ddp_magic.kernel.ranks import Listener
from ddp_magic.states import RankState
cell, warm, n_warm = sys.argv[1], sys.argv[2], int(sys.argv[3])
class First(Listener):
    first = None
    def on_output(self, rank, stream, text):
        if self.first is None and "first line" in text:
            self.first = time.monotonic()
def warm_ms(pool):
    times = []
    for _ in range(n_warm):
        t = time.monotonic(); out = pool.run(warm); times.append(1000 * (time.monotonic() - t)); assert out.ok
    return statistics.median(times)
t0 = time.monotonic(); seen = First()
p = Pool(None, slurm=dict(nodes=2, ntasks_per_node=2))
out = p.run(cell, listener=seen)
t1 = time.monotonic()
assert out.ok and out.values == [4.0] * 4, out
res = {"first_line_s": seen.first - t0, "result_s": t1 - t0, "warm_ms": warm_ms(p)}
p.run("kept = dist.get_rank() * 10")
os.kill(p.ranks[3].pid, signal.SIGKILL)
while p.ranks[3].state != RankState.DEAD:
    p.refresh(); time.sleep(0.01)
t = time.monotonic(); lost = p.run("import torch, torch.distributed as dist\n" + warm + "\nglobals().get('kept')")
res["lost_rank_cell_s"] = time.monotonic() - t
res["lost_rank_state"] = lost.values
p.stop()
local = Pool(4)
local.run(cell)
res["local_warm_ms"] = warm_ms(local)
local.stop()
print("BENCHJSON " + json.dumps(res), flush=True)
'''


def med(values: List[float], fmt: str = "{:.2f}") -> str:
    if not values:
        return "not run"
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def floor_srun() -> float:
    """srun of one task that imports torch: launch → the import done (the task prints a timestamp)."""
    t0 = time.time()
    out = subprocess.run(["srun", "-N1", "-n1", PY, "-c", "import time, torch; print(time.time())"], capture_output=True, text=True, timeout=300)
    return float(out.stdout.split()[-1]) - t0


def ddp(tls: bool, warm: int) -> dict:
    env = dict(os.environ, PYTHONPATH=REPO, DDP_MAGIC_FORCE_TLS="1" if tls else "0")
    out = subprocess.run([PY, "-c", CHILD, CELL, WARM, str(warm)], env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    for line in out.stdout.splitlines():
        if line.startswith("BENCHJSON "):
            return json.loads(line[len("BENCHJSON "):])
    raise RuntimeError(f"the %%ddp --slurm child failed: {out.stderr[-1500:]}")


SCRIPT = "import torch, torch.distributed as dist\ndist.init_process_group('gloo')\nprint('first line', flush=True)\n" \
         "x = torch.ones(1)\ndist.all_reduce(x)\nprint('result', x.item(), flush=True)\ndist.destroy_process_group()\n"


def sbatch(tmp: str) -> dict:
    """The exported sbatch file's way, submit → first line → the job gone."""
    from ddp_magic.export.script import Launch, sbatch_text

    script = os.path.join(tmp, "train.py")
    with open(script, "w") as f:
        f.write(SCRIPT)
    job_file = os.path.join(tmp, "train.sbatch")
    with open(job_file, "w") as f:
        f.write(sbatch_text(script, Launch(nproc=4, nodes=2), job_file))
    log = os.path.join(tmp, f"out-{time.monotonic_ns()}.txt")
    t0 = time.monotonic()
    job = subprocess.run(["sbatch", "--parsable", f"--output={log}", job_file], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PATH=os.path.dirname(PY) + os.pathsep + os.environ.get("PATH", ""))).stdout.strip()
    first = None
    while True:
        text = open(log).read() if os.path.exists(log) else ""
        if first is None and "first line" in text:
            first = time.monotonic() - t0
        if not subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
            break
        time.sleep(0.02)
    done = time.monotonic() - t0
    text = open(log).read() if os.path.exists(log) else ""
    if text.count("result 4.0") != 4:
        raise RuntimeError(f"the sbatch job did not finish right: {text[-800:]}")
    return {"first_line_s": first if first is not None else done, "done_s": done}


RECEIVER = r'''
import socket, sys, time
from ddp_magic.wire import protocol as P, tls
mode, size = sys.argv[1], int(sys.argv[2])
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen()
key = tls.ServerKey() if mode == "tls" else None
print(ls.getsockname()[1], key.fingerprint if key else "-", flush=True)
s, _ = ls.accept()
s = tls.wrap_server(s, key, 30) if key else s
s.settimeout(None)
reader = P.FrameReader(); msgs = reader.feed(s.recv(1 << 20)); t = time.monotonic()  # from the first byte: not the sender's pickling
while not msgs:
    msgs = reader.feed(s.recv(1 << 20))
print(time.monotonic() - t, len(msgs[0]["blob"]), flush=True)
'''


def frame_seconds(mode: str, mib: int) -> float:
    """A result frame of ``mib`` MiB from a sender process to a receiver, as a rank sends DONE: plain TCP or TLS."""
    from ddp_magic.wire import protocol as P
    from ddp_magic.wire import tls

    env = dict(os.environ, PYTHONPATH=REPO)
    rx = subprocess.Popen([PY, "-c", RECEIVER, mode, str(mib << 20)], stdout=subprocess.PIPE, text=True, env=env)
    assert rx.stdout is not None
    port, fingerprint = rx.stdout.readline().split()
    sock = tls.connect(("127.0.0.1", int(port)), fingerprint) if mode == "tls" else __import__("socket").create_connection(("127.0.0.1", int(port)))
    frame = P.encode(P.message(P.DONE, blob=os.urandom(mib << 20)))
    sock.sendall(frame)
    seconds, size = rx.stdout.readline().split()
    rx.wait(timeout=60)
    sock.close()
    assert int(size) == mib << 20
    return float(seconds)


PEERS_PY = os.path.join(HERE, ".venv-peers", "bin", "python")
BENCH_CELL = ("import os, torch, torch.distributed as dist\n"
              "dist.init_process_group('gloo')\nprint('first line', flush=True)\nx = torch.ones(1)\ndist.all_reduce(x)\n")

SUBMITIT = r'''
import json, os, sys, time
import submitit
folder, cell = sys.argv[1], sys.argv[2]
def train():
    import submitit
    env = submitit.helpers.TorchDistributedEnvironment().export()  # RANK, WORLD_SIZE, MASTER_ADDR... from Slurm's task vars
    # its MASTER_PORT is drawn from the job id anywhere up to 60000, into the ephemeral range, where it once met
    # EADDRINUSE here (rank 0 died, the others waited in the rendezvous): below that range, as %%ddp --slurm draws it
    os.environ["MASTER_PORT"] = str(20000 + int(os.environ["SLURM_JOB_ID"]) % 12000)
    ns = {}
    exec(cell, ns)
    value = ns["x"].item()
    ns["dist"].destroy_process_group()
    return value
t0 = time.monotonic()
ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
ex.update_parameters(nodes=2, tasks_per_node=2, timeout_min=10, name="ddp_bench_submitit")
job = ex.submit(train)
first = None
while not job.done():
    try:
        text = job.stdout() or ""
    except Exception:
        text = ""
    if first is None and "first line" in text:
        first = time.monotonic() - t0
    time.sleep(0.02)
values = job.results()
done = time.monotonic() - t0
assert values == [4.0] * 4, values
print("BENCHJSON " + json.dumps({"first_line_s": first if first is not None else done, "result_s": done}), flush=True)
'''

IPP = r'''
import json, os, statistics, sys, time
import ipyparallel as ipp
cell, warm, n_warm = sys.argv[1], sys.argv[2], int(sys.argv[3])
template = """#!/bin/sh
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --job-name=ddp_bench_ipp
#SBATCH --output=/dev/null
srun {program_and_args}
"""
t0 = time.monotonic()
cluster = ipp.Cluster(engines="slurm", n=4, controller_ip="127.0.0.1", log_level=40)
cluster.config.SlurmEngineSetLauncher.batch_template = template
cluster.start_cluster_sync()
try:
    rc = cluster.connect_client_sync()
    rc.wait_for_engines(4, timeout=300)
    view = rc[:]
    # what %%px runs: the cell on every engine; each engine is a Slurm task, so its rank is SLURM_PROCID
    setup = "import os\nos.environ.update(RANK=os.environ['SLURM_PROCID'], WORLD_SIZE='4', MASTER_ADDR='127.0.0.1', MASTER_PORT='29533')\n"
    ar = view.execute(setup + cell, block=False)
    first = None
    while not ar.ready():
        if first is None and any("first line" in (out or "") for out in ar.stdout):
            first = time.monotonic() - t0
        time.sleep(0.005)
    ar.get()
    done = time.monotonic() - t0
    if first is None:
        first = done
    assert view.pull("x.item()", block=True) == [4.0] * 4
    times = []
    for _ in range(n_warm):
        t = time.monotonic(); view.execute(warm, block=True); times.append(1000 * (time.monotonic() - t))
    print("BENCHJSON " + json.dumps({"first_line_s": first, "result_s": done, "warm_ms": statistics.median(times)}), flush=True)
finally:
    cluster.stop_cluster_sync()
'''


def peer(script: str, *args: str, cwd: str = REPO) -> dict:
    """One peer's run with bench/.venv-peers's python, in ``cwd`` (ipyparallel writes its sbatch file there); the error,
    short, when it fails."""
    out = subprocess.run([PEERS_PY, "-c", script, *args], capture_output=True, text=True, timeout=600, cwd=cwd,
                         env=dict(os.environ, PATH=os.path.dirname(PEERS_PY) + os.pathsep + os.environ.get("PATH", "")))
    for line in out.stdout.splitlines():
        if line.startswith("BENCHJSON "):
            return json.loads(line[len("BENCHJSON "):])
    raise RuntimeError(f"exit {out.returncode}: {(out.stderr or out.stdout)[-600:]}")


def table(g: Dict[str, List[float]], a: argparse.Namespace, notes: List[str]) -> str:
    floor = statistics.median(g["floor"]) if g["floor"] else float("nan")
    ratio = lambda key: f"{statistics.median(g[key]) / floor:.2f}×" if g.get(key) else "–"  # noqa: E731
    rows = [
        f"Local Slurm, 2 nodes × 2 tasks on one 2-core machine; median (min–max) of {a.repeats}; gloo.",
        "",
        "| way | first line (s) | result / done (s) | ÷ floor (result) |",
        "|---|---|---|---|",
        f"| floor: `srun -N1 -n1 python -c 'import torch'` | – | {med(g['floor'])} | 1.00× |",
        f"| %%ddp --slurm (plain TCP) | {med(g['ddp.first'])} | {med(g['ddp.result'])} | {ratio('ddp.result')} |",
        f"| %%ddp --slurm (TLS) | {med(g['tls.first'])} | {med(g['tls.result'])} | {ratio('tls.result')} |",
        f"| sbatch of the exported script (srun torchrun) | {med(g['sbatch.first'])} | {med(g['sbatch.done'])} | {ratio('sbatch.done')} |",
        f"| submitit (AutoExecutor, a function, tasks_per_node) | {med(g['submitit.first'])} | {med(g['submitit.result'])} | {ratio('submitit.result')} |",
        f"| ipyparallel Slurm engines (Cluster(engines=\"slurm\") + %%px) | {med(g['ipp.first'])} | {med(g['ipp.result'])} | {ratio('ipp.result')} |",
        "",
        "| warm cell (all_reduce), ms | %%ddp --slurm plain | %%ddp --slurm TLS | local pool -n 4 | ipyparallel %%px |",
        "|---|---|---|---|---|",
        f"| median of {a.warm}, per repeat | {med(g['ddp.warm'], '{:.1f}')} | {med(g['tls.warm'], '{:.1f}')} | {med(g['local.warm'], '{:.1f}')} "
        f"| {med(g['ipp.warm'], '{:.1f}')} |",
        "",
        f"A cell after rank 3 (n2) was SIGKILLed, the rank forked again by n2's template: {med(g['ddp.lost'])} s "
        f"(TLS: {med(g['tls.lost'])} s); state kept on the other ranks: {all(g['kept'])}.",
        "",
        f"A 256 MiB result frame from another process: plain TCP {med(g['frame.tcp'])} s, TLS {med(g['frame.tls'])} s "
        f"({256 / statistics.median(g['frame.tcp']):.0f} vs {256 / statistics.median(g['frame.tls']):.0f} MiB/s).",
    ]
    return "\n".join(rows + [""] + [f"- {n}" for n in notes])


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warm", type=int, default=50, help="warm cells per measurement (default 50)")
    a = p.parse_args(argv)
    import local_slurm

    print(local_slurm.start(), flush=True)
    subprocess.run([PY, "-c", "import torch"], check=True)  # the page cache holds torch for every way alike
    g: Dict[str, List[float]] = {k: [] for k in ("floor", "ddp.first", "ddp.result", "ddp.warm", "ddp.lost", "tls.first", "tls.result",
                                                 "tls.warm", "tls.lost", "local.warm", "kept", "sbatch.first", "sbatch.done",
                                                 "frame.tcp", "frame.tls", "submitit.first", "submitit.result", "ipp.first",
                                                 "ipp.result", "ipp.warm")}
    failed: Dict[str, str] = {}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ddp_bench_slurm_") as tmp:
        for i in range(a.repeats):
            g["floor"].append(floor_srun())
            for name, tls in (("ddp", False), ("tls", True)):
                r = ddp(tls, a.warm)
                g[f"{name}.first"].append(r["first_line_s"])
                g[f"{name}.result"].append(r["result_s"])
                g[f"{name}.warm"].append(r["warm_ms"])
                g[f"{name}.lost"].append(r["lost_rank_cell_s"])
                g["local.warm"].append(r["local_warm_ms"])
                g["kept"].append(r["lost_rank_state"][:3] == [0, 10, 20] and r["lost_rank_state"][3] is None)
            try:
                s = sbatch(tmp)
                g["sbatch.first"].append(s["first_line_s"])
                g["sbatch.done"].append(s["done_s"])
            except RuntimeError as e:  # torchrun's rendezvous failed once here (a port taken): the run goes on, the note says so
                failed[f"sbatch (repeat {i + 1})"] = " ".join(str(e).split())[:300]
            for name, script, args in (("submitit", SUBMITIT, (os.path.join(tmp, f"submitit-{i}"), BENCH_CELL)),
                                       ("ipp", IPP, (BENCH_CELL, WARM, str(a.warm)))):
                if not os.path.exists(PEERS_PY):
                    failed[name] = "bench/.venv-peers is not there (bash bench/run_peers.sh --install-only)"
                    continue
                try:
                    r = peer(script, *args, cwd=tmp)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    failed[name] = str(e)
                    continue
                for key, value in r.items():
                    g[f"{name}.{key.split('_')[0]}"].append(value)  # first_line_s -> .first, result_s, warm_ms
            g["frame.tcp"].append(frame_seconds("tcp", 256))
            g["frame.tls"].append(frame_seconds("tls", 256))
            print(f"repeat {i + 1}: floor {g['floor'][-1]:.2f}s, %%ddp --slurm {g['ddp.result'][-1]:.2f}s (TLS {g['tls.result'][-1]:.2f}s), "
                  f"sbatch {g['sbatch.done'][-1]:.2f}s", flush=True)
    notes = [f"load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end (other work on the machine skews every figure)"]
    notes += [f"{name}: failed or not run: {why}" for name, why in failed.items()]
    text = table(g, a, notes)
    write_report(OUT, text, {"args": vars(a), "results": g, "table": text})
    return 0


if __name__ == "__main__":
    sys.exit(main())
