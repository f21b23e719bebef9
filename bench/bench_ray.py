#!/usr/bin/env python
"""Ranks on a Ray cluster: first cell to result and a second cell, side by side with Ray's own ways. One run, a printed table.

    .venv/bin/python bench/bench_ray.py            # a one-host `ray start --head` (scripts/box_ray.py), 2 nodes' worth of CPUs
    .venv/bin/python bench/bench_ray.py --box      # the cluster in a box: head on login, n1 and n2 (root; flock /tmp/ddp_box.lock)

N = 4 ranks (2 bundles x 2 on the box, STRICT_SPREAD; one node of 4 locally), gloo, CPU 0.5 a rank; each way in a process
of its own:

- **floor**: a bare driver: ``ray.init``, a placement group of N bundles, N actors that each ``import torch``, their answers;
- **TorchTrainer.fit()** (when ``ray[train]`` is installed): init and one all_reduce a call, a first and a second call;
- **%%ddp --ray**: ``Pool(ray=...)`` and its first cell (init, one all_reduce) to the result in hand, then the warm cell
  (one all_reduce) over 30 runs, median; the kernel's RSS and every Ray process's RSS while idle;
- on the box also: a 256 MiB result from a rank on n2 (``--ray`` and ``--slurm`` on the same hosts, the median of 3 a
  repeat) against the floor of 256 MiB sent from n2 to login over Python's ``ssl`` (bench/cluster_wire.py), and the
  warm cell of a ``--slurm`` pool on the same hosts.

Writes bench/results/ray.md (docs/bench/ray.md holds a run).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "scripts"))
from harness import spread  # noqa: E402
PY = sys.executable
REPEATS = 3
N_WARM = 30
RESULT_MIB = 256
CELL = "import torch, torch.distributed as dist\nx = torch.ones(1)\ndist.all_reduce(x)\nx.item()"
FLOOR = """
import sys, time, ray
t0 = time.monotonic()
ray.init(address=sys.argv[1], log_to_driver=False)
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
n, nodes = int(sys.argv[2]), int(sys.argv[3])
pg = placement_group([{"CPU": 0.5 * n / nodes}] * nodes, strategy="STRICT_SPREAD" if nodes > 1 else "PACK")
ray.get(pg.ready())
@ray.remote(num_cpus=0.5)
class A:
    def go(self):
        import torch
        return torch.__version__
actors = [A.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i * nodes // n)).remote() for i in range(n)]
ray.get([a.go.remote() for a in actors])
print("BENCHJSON", '{"floor_s": %f}' % (time.monotonic() - t0), flush=True)
"""
TRAIN = """
import sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False)
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer
def loop(config):
    import torch, torch.distributed as dist
    x = torch.ones(1); dist.all_reduce(x)
n, nodes = int(sys.argv[2]), int(sys.argv[3])
times = []
for _ in range(2):
    t0 = time.monotonic()
    TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=n, resources_per_worker={"CPU": 0.5},
                 placement_strategy="SPREAD" if nodes > 1 else "PACK")).fit()
    times.append(time.monotonic() - t0)
print("BENCHJSON", '{"fit1_s": %f, "fit2_s": %f}' % tuple(times), flush=True)
"""


def inner_ddp(nodes: int, per_node: int) -> dict:
    """A new Ray pool and its first cell, to the result in hand; its warm cell; the kernel's idle RSS; on the box, a
    RESULT_MIB result from a rank on n2 (the median of 3)."""
    from cluster_pool import results, warm_ms
    from ddp_magic.kernel.pool import Pool

    t0 = time.monotonic()
    pool = Pool(None, ray=dict(nodes=nodes, ntasks_per_node=per_node, cpus_per_rank=0.5))
    try:
        out = pool.run(CELL)
        first = time.monotonic() - t0
        assert out.ok and out.values == [float(nodes * per_node)] * (nodes * per_node), out
        got = {"first_s": first, "warm_ms": warm_ms(pool, N_WARM), "kernel_mib": _rss(os.getpid()), "tls": pool.tls_key is not None}
        if nodes > 1:
            got["result_s"] = statistics.median(results(pool, RESULT_MIB, 3))
        return got
    finally:
        pool.stop()


def inner_slurm() -> dict:
    """The box's Slurm on the same two hosts: the warm cell (2 x 2), and a RESULT_MIB result from its rank on n2 (1 x 2)."""
    from cluster_pool import result_slurm, warm

    return {"warm_ms": warm(2, 2, N_WARM, "--exclude=n3")["ms"], "result_s": statistics.median(result_slurm(RESULT_MIB, 3)["seconds"])}


def _rss(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS")) / 1024
    except (OSError, StopIteration):
        return 0.0


def _ray_memory(cluster) -> Dict[str, float]:  # type: ignore[no-untyped-def]
    """Every process of the idle cluster, MiB by its name (several of a name summed)."""
    out: Dict[str, float] = {}
    for pid in cluster.pids():
        try:
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        out[name] = out.get(name, 0.0) + _rss(pid)
    return out


def _run(prefix: List[str], argv: List[str], env: Dict[str, str]) -> dict:
    done = subprocess.run(prefix + argv, capture_output=True, text=True, env=env, timeout=900)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("BENCHJSON ")), None)
    assert line is not None, (done.stdout[-1500:], done.stderr[-3000:])
    return json.loads(line[len("BENCHJSON "):])


def main(box_mode: bool) -> int:
    import box_ray

    box = None
    if box_mode:
        import cluster_box

        box = cluster_box.Box()
        print(box.up(), flush=True)
    try:
        cluster = box_ray.in_box(box) if box is not None else box_ray.local(num_cpus=4, num_gpus=0)
        nodes, per_node = (2, 2) if box is not None else (1, 4)
        prefix = box.enter("login", cwd=REPO) if box is not None else []
        env = dict(os.environ, PYTHONPATH=REPO, **cluster.env, **(box.env() if box is not None else {}))  # the box's Slurm too
        rows: Dict[str, List[float]] = {"floor": [], "fit1": [], "fit2": [], "ddp": [], "ddp_warm": [], "kernel_mib": [],
                                        "ddp_result": [], "slurm_warm": [], "slurm_result": [], "wire": []}
        try:
            trains = subprocess.run([PY, "-c", "import ray.train.torch"], capture_output=True).returncode == 0
            args = [cluster.address, str(nodes * per_node), str(nodes)]
            for rep in range(REPEATS):
                rows["floor"].append(_run(prefix, [PY, "-c", FLOOR, *args], env)["floor_s"])
                if trains:
                    fit = _run(prefix, [PY, "-c", TRAIN, *args], env)
                    rows["fit1"].append(fit["fit1_s"])
                    rows["fit2"].append(fit["fit2_s"])
                got = _run(prefix, [PY, __file__, "--inner", str(nodes), str(per_node)], env)
                rows["ddp"].append(got["first_s"])
                rows["ddp_warm"].append(got["warm_ms"])
                rows["kernel_mib"].append(got["kernel_mib"])
                if box is not None:
                    import bench_cluster

                    rows["ddp_result"].append(got["result_s"])
                    slurm = _run(prefix, [PY, __file__, "--inner-slurm"], env)
                    rows["slurm_warm"].append(slurm["warm_ms"])
                    rows["slurm_result"].append(slurm["result_s"])
                    rows["wire"].append(bench_cluster.wire(box, "ssl", REPO)[0])
                print(f"repeat {rep + 1}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in rows.items() if v), flush=True)
            _report(rows, _ray_memory(cluster), "the cluster in a box (head on login, n1, n2)" if box else "a one-host head", nodes, per_node)
        finally:
            cluster.stop()
    finally:
        if box is not None:
            box.down()
    return 0


def _med(values: List[float], unit: str = "s", digits: int = 2) -> str:
    if not values:
        return "not measured (`ray[train]` not installed)"
    return spread(values, digits, f" {unit}")


def _box_rows(rows: Dict[str, List[float]]) -> List[str]:
    """The box's rows: a warm Slurm pool on the same hosts, and a RESULT_MIB result from n2 against Python's TLS floor."""
    if not rows["wire"]:
        return []
    def rate(k: str) -> str:
        return f"{RESULT_MIB / statistics.median(rows[k]):.0f} MiB/s, {statistics.median(rows['wire']) / statistics.median(rows[k]):.2f}× the floor"

    return [
        f"| `%%ddp --slurm` on the same hosts: the same warm cell | {_med(rows['slurm_warm'], 'ms', 1)} | |",
        f"| floor: {RESULT_MIB} MiB from n2 to login over Python's `ssl` (TLS 1.3), one thread a side | {_med(rows['wire'])} "
        f"| {RESULT_MIB / statistics.median(rows['wire']):.0f} MiB/s |",
        f"| a {RESULT_MIB} MiB result from a rank on n2, `--ray` (TLS) | {_med(rows['ddp_result'])} | {rate('ddp_result')} |",
        f"| a {RESULT_MIB} MiB result from a rank on n2, `--slurm` (TLS) | {_med(rows['slurm_result'])} | {rate('slurm_result')} |",
    ]


def _report(rows: Dict[str, List[float]], memory: Dict[str, float], where: str, nodes: int, per_node: int) -> None:
    floor = statistics.median(rows["floor"])
    ratio = (lambda k: f"{statistics.median(rows[k]) / floor:.2f}" if rows[k] else "")  # noqa: E731
    lines = [
        f"{where}: {nodes} node(s) x {per_node} ranks, gloo, CPU 0.5 a rank; median (min–max) of {REPEATS}; warm: median of {N_WARM} cells",
        "",
        "| | time | ÷ floor |",
        "|---|---|---|",
        f"| floor: a bare `ray.get` of {nodes * per_node} actors in a placement group, each importing torch | {_med(rows['floor'])} | 1.00 |",
        f"| `TorchTrainer.fit()` (init, one all_reduce), first call | {_med(rows['fit1'])} | {ratio('fit1')} |",
        f"| `%%ddp --ray`: first cell (init, one all_reduce) to the result | {_med(rows['ddp'])} | {ratio('ddp')} |",
        f"| second `TorchTrainer.fit()` | {_med(rows['fit2'])} | {ratio('fit2')} |",
        f"| `%%ddp --ray`: second cell (one all_reduce, warm pool) | {_med(rows['ddp_warm'], 'ms', 1)} | |",
        f"| the kernel's RSS, pool up and idle | {_med(rows['kernel_mib'], 'MiB', 0)} | |",
        *_box_rows(rows),
        "",
        "Idle Ray processes after the runs (RSS, MiB): " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(memory.items(), key=lambda kv: -kv[1])),
    ]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "ray.md"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--inner-slurm"]:
        print("BENCHJSON " + json.dumps(inner_slurm()), flush=True)
        sys.exit(0)
    if len(sys.argv) > 3 and sys.argv[1] == "--inner":
        print("BENCHJSON " + json.dumps(inner_ddp(int(sys.argv[2]), int(sys.argv[3]))), flush=True)
        sys.exit(0)
    sys.exit(main("--box" in sys.argv))
