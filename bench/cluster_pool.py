#!/usr/bin/env python
"""bench_cluster.py's pools, run on the box's login host (as a kernel there would): one process per measurement.

    python bench/cluster_pool.py result-slurm MIB REPEATS        # a Slurm pool, rank 0 on n1, rank 1 on n2 (TLS)
    python bench/cluster_pool.py result-manual MIB REPEATS N2_PREFIX_JSON LOGIN_ADDR   # --nnodes 2 by hand, login + n2 (plain TCP)
    python bench/cluster_pool.py warm NODES TASKS N_WARM [ARGS]  # a Slurm pool's warm all_reduce cell, median ms
    python bench/cluster_pool.py link-down PORT ROOT_PID         # 2 x 2 on n1, n2; n2's link cut mid-cell: the time to the error

Each prints one line ``BENCHJSON {...}``. A result cell returns the tensor of MIB MiB of the rank on n2 (the
other rank returns None, so no gather): the time is the whole cell, ``Pool.run`` to the value in hand. The tensor
is made and touched in an untimed cell first, a small tensor result first makes the kernel import torch, and each
value is dropped (its memory unmapped by an untimed cell) before the next.
"""
from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
import threading
import time
from typing import List

from ddp_magic.errors import CellError
from ddp_magic.kernel.pool import Pool
from ddp_magic.kernel.ranks import Listener

BOX = "--exclude=n3"  # the box's pools: n1 and n2 (n3 is spare)
WARM = "x = torch.ones(1)\ndist.all_reduce(x)\nx.item()"
SETUP = ("import os, socket, torch, torch.distributed as dist\n"  # one rank on n2 holds it: its local rank 0
         "t = torch.ones({n}) if socket.gethostname() == 'n2' and os.environ['LOCAL_RANK'] == '0' else None")


def results(pool: Pool, mib: int, repeats: int) -> List[float]:
    out = pool.run(SETUP.format(n=(mib << 20) // 4))
    assert out.ok, out
    pool.run("torch.ones(1)")  # the kernel imports torch at its first tensor result: untimed, as a kernel that had one before
    seconds = []
    for _ in range(repeats):
        pool.run("None")  # the last result's memory is given back at the next cell's start: untimed
        t = time.monotonic()
        got = pool.run("t")
        seconds.append(time.monotonic() - t)
        [value] = [v for v in got.values if v is not None]  # the rank on n2's (the other returns None: no gather)
        assert got.ok and value.numel() == (mib << 20) // 4 and float(value[-1]) == 1.0, got
        del got, value
    return seconds


def result_slurm(mib: int, repeats: int) -> dict:
    pool = Pool(None, slurm=dict(nodes=2, ntasks_per_node=1, extra=BOX))
    try:
        seconds = results(pool, mib, repeats)
        hosts = [pool.ranks[r].host for r in (0, 1)]
        return {"seconds": seconds, "hosts": hosts, "tls": pool.tls_key is not None}
    finally:
        pool.stop()


class NodeAgent(Listener):
    """Starts the other node's torchrun agent as soon as the pool prints the command for it: a user who pastes it
    with no delay. ``prefix`` enters that node (nsenter, or ``ssh HOST --``: then the command is one quoted line)."""

    def __init__(self, pool: Pool, prefix: List[str]) -> None:
        self.pool, self.prefix, self.proc = pool, prefix, None

    def on_notice(self, text: str) -> None:
        if self.proc is None and self.pool.node_command:
            argv = [sys.executable, "-m", "torch.distributed.run"] + shlex.split(self.pool.node_command)[1:]
            if os.path.basename(self.prefix[0]) == "ssh":
                argv = [shlex.join(argv)]
            self.proc = subprocess.Popen(self.prefix + argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def end(self) -> None:
        """Wait for the agent (the pool's stop ends its ranks); kill it if it lingers."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def result_manual(mib: int, repeats: int, prefix: List[str], addr: str) -> dict:
    pool = Pool(2, nnodes=2, master_addr=addr)
    agent = NodeAgent(pool, prefix)
    try:
        pool.start(listener=agent)
        seconds = results(pool, mib, repeats)
        hosts = [pool.ranks[r].host for r in (0, 1)]
        return {"seconds": seconds, "hosts": hosts, "tls": pool.tls_key is not None}
    finally:
        pool.stop()
        agent.end()


def warm(nodes: int, tasks: int, n_warm: int, box: str) -> dict:
    """A Slurm pool's warm all_reduce cell (``box``: the box's Slurm args, "" on the one-host Slurm), median ms."""
    pool = Pool(None, slurm=dict(nodes=nodes, ntasks_per_node=tasks, extra=box))
    try:
        out = pool.run("import torch, torch.distributed as dist\n" + WARM)
        assert out.ok and out.values == [float(nodes * tasks)] * (nodes * tasks), out
        return {"ms": warm_ms(pool, n_warm), "tls": pool.tls_key is not None, "hosts": sorted({i.host for i in pool.ranks.values()})}
    finally:
        pool.stop()


def warm_ms(pool: Pool, n_warm: int) -> float:
    """The median ms of ``n_warm`` warm all_reduce cells on a pool whose cells imported torch, after 5 not counted:
    the one measure of a warm cell every launcher's bench compares."""
    for _ in range(5):
        pool.run(WARM)
    times = []
    for _ in range(n_warm):
        t = time.monotonic()
        out = pool.run(WARM)
        times.append(1000 * (time.monotonic() - t))
        assert out.ok, out
    return statistics.median(times)


LONG = "import time\nfor _ in range(600):\n    x = torch.ones(1)\n    dist.all_reduce(x)\n    time.sleep(0.1)"


def after(pool: Pool) -> str:
    """The next cell, on the same pool, once the link is back: what it says."""
    try:
        out = pool.run("import torch, torch.distributed as dist\n" + WARM)
    except Exception as e:  # the pool may say it must restart: that is what the user reads
        return f"{type(e).__name__}: {e}"[:1500]
    return f"ok: {out.values}" if out.ok else CellError(out.failures, out.notes).render()[:1500]


def link_down(port: str, root_pid: str) -> dict:
    """n2's management link cut (from the machine's side) while every rank runs a long loop of all_reduces: the time
    from the cut to the cell's end, and what the cell says."""
    pool = Pool(None, slurm=dict(nodes=2, ntasks_per_node=2, extra=BOX))
    cut = ["nsenter", "-t", root_pid, "--net", "ip", "link", "set", port]  # the machine's side of n2's link (the bench's namespace)
    try:
        out = pool.run("import torch, torch.distributed as dist\n" + WARM)
        assert out.ok, out
        box: dict = {}
        cell = threading.Thread(target=lambda: box.update(out=pool.run(LONG), end=time.monotonic()))
        cell.start()
        time.sleep(3)
        subprocess.run(cut + ["down"], check=True)
        t_cut = time.monotonic()
        cell.join(timeout=300)
        subprocess.run(cut + ["up"], check=True)
        res = box.get("out")
        if res is None:
            return {"seconds": None, "text": "the cell did not end within 300 s"}
        text = CellError(res.failures, res.notes).render() if res.failures else "the cell ended without an error"
        return {"seconds": box["end"] - t_cut, "text": text[:3000], "after": after(pool)}
    finally:
        subprocess.run(cut + ["up"], capture_output=True)
        pool.stop()


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "result-slurm":
        res = result_slurm(int(args[0]), int(args[1]))
    elif mode == "result-manual":
        res = result_manual(int(args[0]), int(args[1]), json.loads(args[2]), args[3])
    elif mode == "warm":
        res = warm(int(args[0]), int(args[1]), int(args[2]), args[3] if len(args) > 3 else "")
    elif mode == "link-down":
        res = link_down(args[0], args[1])
    else:
        raise SystemExit(f"mode {mode!r}?")
    print("BENCHJSON " + json.dumps(res), flush=True)
