#!/usr/bin/env python
"""Ranks over SSH on the cluster in a box (scripts/cluster_box.py, an sshd in each node): first cell to result and a
warm cell, side by side with what a user would otherwise run. One run, a printed table.

    .venv/bin/python bench/bench_ssh.py            # needs root: it builds the box (flock /tmp/ddp_box.lock)

On 2 hosts (n1, n2 behind a ProxyJump over n1) x 2 ranks, gloo, from login, each way in a process of its own:

- **floor**: ``ssh HOST python -c "import torch"`` on both hosts at once (the least any launcher over ssh pays);
- **ssh + torchrun by hand** (DeepSpeed's ssh runner, pdsh's way): ``ssh HOST torchrun --nnodes 2 ... script.py``
  on both at once, the script doing init_process_group and one all_reduce; the wall time until both exit;
- **%%ddp --hosts**: ``Pool(hosts=n1,n2)`` and its first cell (init and one all_reduce) to the result in hand,
  then the warm cell (one all_reduce) over 30 runs, median;
- **%%ddp --nnodes 2 by hand**: ``Pool(nnodes=2)`` on login (its node 0: 2 ranks there) and the printed torchrun
  command run on n2 over ssh the moment it is printed (a user who pastes with no delay, the secret file already
  there: the box's hosts share a file system, so no scp is timed); its first cell to the result in hand;
- **%%ddp --slurm** on the same hosts (the box's Slurm, n1 and n2): the same warm cell.

Writes bench/results/ssh.md (docs/bench/ssh.md holds a run).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "scripts"))
from harness import spread  # noqa: E402
PY = sys.executable
TORCHRUN = os.path.join(os.path.dirname(PY), "torchrun")
REPEATS = 3
N_WARM = 30
CELL = "import torch, torch.distributed as dist\nx = torch.ones(1)\ndist.all_reduce(x)\nx.item()"
SCRIPT = ("import torch, torch.distributed as dist\ndist.init_process_group('gloo')\nx = torch.ones(1)\ndist.all_reduce(x)\nprint(x.item())\n"
          "dist.destroy_process_group()\n")


# ------------------------------------------------------------ inside login (a process of its own per measurement)
def inner_first() -> dict:
    """A new pool over SSH and its first cell, to the result in hand; then its warm cell."""
    from cluster_pool import warm_ms
    from ddp_magic.kernel.pool import Pool

    t0 = time.monotonic()
    pool = Pool(None, ssh=dict(hosts="n1,n2", ntasks_per_node=2))
    try:
        out = pool.run(CELL)
        first = time.monotonic() - t0
        assert out.ok and out.values == [4.0] * 4, out
        return {"first_s": first, "warm_ms": warm_ms(pool, N_WARM), "tls": pool.tls_key is not None}
    finally:
        pool.stop()


def inner_manual(login_addr: str, prefix: List[str]) -> dict:
    """The by-hand ``--nnodes 2``: node 0 on login, node 1's command pasted on n2 at once; its first cell."""
    from cluster_pool import NodeAgent
    from ddp_magic.kernel.pool import Pool

    t0 = time.monotonic()
    pool = Pool(4, nnodes=2, master_addr=login_addr)  # 4 ranks in all, 2 a node
    agent = NodeAgent(pool, prefix)
    try:
        pool.start(listener=agent)
        out = pool.run(CELL)
        first = time.monotonic() - t0
        assert out.ok and out.values == [4.0] * 4, out
        return {"first_s": first, "hosts": sorted({i.host for i in pool.ranks.values()})}
    finally:
        pool.stop()
        agent.end()


def inner_slurm() -> dict:
    """The box's Slurm on the same two hosts: the warm cell (bench_cluster's measure)."""
    from cluster_pool import warm

    got = warm(2, 2, N_WARM, "--exclude=n3")
    return {"warm_ms": got["ms"], "tls": got["tls"]}


# ------------------------------------------------------------ the driver (root, on the machine)
def _both(argvs: List[List[str]], env: Dict[str, str]) -> float:
    """Run the commands at once; the wall time until both exit (each must succeed)."""
    t0 = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda a: subprocess.run(a, capture_output=True, text=True, env=env, timeout=300), argvs))
    took = time.monotonic() - t0
    for d in done:
        assert d.returncode == 0, (d.args, d.stdout[-500:], d.stderr[-1500:])
    return took


def main() -> int:
    import box_ssh
    import cluster_box

    box = cluster_box.Box()
    print(box.up(), flush=True)
    try:
        if box.ssh_missing:
            print(f"no sshd in the box: {box.ssh_missing}")
            return 1
        where = tempfile.mkdtemp(prefix="bench_ssh-")
        login = box_ssh.Login.make(box, where)
        env = dict(os.environ, PYTHONPATH=REPO, DDP_MAGIC_SSH_ARGS=f"-F {login.config}", **box.env())
        ssh = lambda host, cmd: box.enter("login", cwd=REPO) + ["ssh", "-F", login.config, host, "--", cmd]  # noqa: E731
        script = os.path.join(where, "allreduce.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        rows: Dict[str, List[float]] = {"floor": [], "torchrun": [], "manual": [], "ddp": [], "ddp_warm": [], "slurm_warm": []}
        to_n2 = json.dumps(["ssh", "-F", login.config, "n2", "--", "cd", REPO, "&&"])
        master = box.host("n1").mgmt
        for rep in range(REPEATS):
            rows["floor"].append(_both([ssh(h, f"{PY} -c 'import torch'") for h in ("n1", "n2")], env))
            port = 29400 + rep
            rows["torchrun"].append(_both([ssh(h, f"cd {REPO} && {TORCHRUN} --nnodes 2 --nproc-per-node 2 --node-rank {i} "
                                                  f"--master-addr {master} --master-port {port} {script}")
                                           for i, h in enumerate(("n1", "n2"))], env))
            rows["manual"].append(_inner(box, "manual", env, (box.host("login").mgmt, to_n2))["first_s"])
            got = _inner(box, "first", env)
            rows["ddp"].append(got["first_s"])
            rows["ddp_warm"].append(got["warm_ms"])
            rows["slurm_warm"].append(_inner(box, "slurm", env)["warm_ms"])
            print(f"repeat {rep + 1}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in rows.items()), flush=True)
        _report(rows)
    finally:
        box.down()
    return 0


def _inner(box, what: str, env: Dict[str, str], args: Tuple[str, ...] = ()) -> dict:  # type: ignore[no-untyped-def]
    done = subprocess.run(box.enter("login", cwd=REPO) + [PY, __file__, "--inner", what, *args], capture_output=True, text=True, env=env, timeout=600)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("BENCHJSON ")), None)
    assert line is not None, (done.stdout[-1500:], done.stderr[-3000:])
    return json.loads(line[len("BENCHJSON "):])


def _med(values: List[float], unit: str = "s", digits: int = 2) -> str:
    return spread(values, digits, f" {unit}")


def _report(rows: Dict[str, List[float]]) -> None:
    floor, ddp = statistics.median(rows["floor"]), statistics.median(rows["ddp"])
    lines = [
        f"2 hosts (n1, n2 through a ProxyJump over n1) x 2 ranks, gloo, from login; median (min–max) of {REPEATS}; warm: median of {N_WARM} cells",
        "",
        "| | time | vs the floor |",
        "|---|---|---|",
        f"| floor: `ssh HOST python -c 'import torch'` on both at once | {_med(rows['floor'])} | 1.00 |",
        f"| ssh + torchrun by hand (init, one all_reduce), both at once | {_med(rows['torchrun'])} | {statistics.median(rows['torchrun']) / floor:.2f} |",
        f"| `%%ddp --nnodes 2` by hand (login + n2, its command pasted on n2 over ssh at once): first cell to result "
        f"| {_med(rows['manual'])} | {statistics.median(rows['manual']) / floor:.2f} |",
        f"| `%%ddp --hosts n1,n2 --ntasks-per-node 2`: first cell (init, one all_reduce) to result | {_med(rows['ddp'])} | {ddp / floor:.2f} |",
        f"| warm cell (one all_reduce), `--hosts` | {_med(rows['ddp_warm'], 'ms', 1)} | |",
        f"| warm cell (one all_reduce), `--slurm` on the same hosts | {_med(rows['slurm_warm'], 'ms', 1)} | |",
    ]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "ssh.md"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--inner":
        ways = {"first": inner_first, "slurm": inner_slurm, "manual": lambda: inner_manual(sys.argv[3], json.loads(sys.argv[4]))}
        print("BENCHJSON " + json.dumps(ways[sys.argv[2]]()), flush=True)
        sys.exit(0)
    sys.exit(main())
