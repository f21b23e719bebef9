"""A kept Ray pool across hosts (the cluster in a box; docs/keep.md, "On Ray").

The kernel runs on ``login``, the box's Ray has its head there (no CPU) and n1 and n2 as nodes (2 CPUs, 2 fake GPUs
each; scripts/box_ray.py). ``%%ddp --ray -n 4`` alone is packed by Ray, 2 ranks on each node, one template a node. At
keep, the first node's template holds the lease on TCP and TLS, the other's follows it, and the pool's driver on login
stops ending with the kernel and watches the lease instead (procs/ray_keep.py). A kept background job through a
SIGKILL of its kernel: a new kernel on login attaches over the network, every tick shown once, the result and the
variables kept. Then either ``--idle 5s`` and a SIGKILL of the attached kernel, or ``%ddp stop`` in it: no actor and no
placement group of ours in Ray, no template or rank on n1 or n2, no driver on login and no lease lock held there. Twice
in a row. And a kept pool's second node lost (its raylet killed, the kernel alive) and placed again by the next cell
once it joined again: its new template follows the lease, so the next kernel attaches all four ranks.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from signal import SIGKILL
from typing import Any, List

import box_fixtures
import box_ray
import cluster_box
import pytest
import test_box_ray
from conftest import wait_until
from kernel_helper import Kernel, alive
from keep_helper import TICKS, cell_texts, ticked, kept_record, runtime_processes, sigkill_kept, ticks

from ddp_magic.wire import kept

box = box_fixtures.box  # the fixtures, by name in this module
ray_box = box_fixtures.ray_box

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

START = ("%%ddp --ray -n 4 --gpus-per-rank 1 --backend gloo\nimport os, socket, torch, torch.distributed as dist\n"
         "kept = 100 + dist.get_rank()\n(socket.gethostname(), os.getpid())")
N, AT = 30, 15
GONE = {"actors": [], "pgs": [], "procs": [], "drivers": [], "held": []}
DRIVER = b"ddp_magic.procs.ray_driver"


def _on_nodes(b: cluster_box.Box) -> List[int]:
    """Every template and rank of ddp_magic in n1 and n2, whatever their parent now (an actor's child or not)."""
    nets = {os.readlink(f"/proc/{b.anchor(h)}/ns/net") for h in ("n1", "n2")}
    out = []
    for pid in b.processes():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"ddp_magic.procs" in f.read() and os.readlink(f"/proc/{pid}/ns/net") in nets:
                    out.append(pid)
        except OSError:
            continue
    return out


def _left(b: cluster_box.Box, cluster: box_ray.Cluster, runtime: str, seconds: float) -> dict:
    """Wait until the pool left nothing: no actor or placement group of ours in Ray, no template or rank on n1 or n2,
    no driver on login (the kernel's host), no lease lock held there; what is left then."""
    deadline = time.monotonic() + seconds
    while True:
        state = cluster.state()
        locks = [os.path.join(runtime, n) for n in os.listdir(runtime) if n.startswith("ddp-kept-") and n.endswith(".lock")]
        left = {"actors": [a for a in state["actors"] if a == "NodeActor"], "pgs": [p for p in state["pgs"] if p.startswith("ddp_magic")],
                "procs": _on_nodes(b), "drivers": runtime_processes(runtime, DRIVER), "held": [p for p in locks if kept.is_held(p)]}
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def _kept_ticking(b: cluster_box.Box, k: Kernel, runtime: str) -> "tuple[List[int], str, Any]":
    """The packed pool on n1 and n2, kept with a ticking job held at tick AT: the ranks' pids, the gate, the job's cell."""
    k.run(START, timeout=300).ok()
    values = k.value("[tuple(v) for v in _]")
    assert [v[0] for v in values] in (["n1", "n1", "n2", "n2"], ["n2", "n2", "n1", "n1"]), f"packed 2 a node: {values}"
    gate = os.path.join(runtime, "gate")
    open(gate, "w").close()
    ex = k.run(TICKS.format(n=N, at=AT, gate=gate), timeout=120).ok()
    assert "kept pool" in ex.stdout, (ex.stdout, ex.stderr)
    ticked(k, ex, 4)
    record = kept_record(runtime)
    holder = values[0][0]  # the first node's template holds the lease, at the node's Ray address
    assert record.get("holder") == holder and record["lease"].get("host") == b.host(holder).mgmt, record
    return [v[1] for v in values], gate, ex


def _attached(k: Kernel, first: str, gate: str) -> None:
    """A new kernel on login attaches the kept pool over the network: every tick shown once, the result and variables."""
    t0 = time.monotonic()
    att = k.run("%ddp attach --out job", timeout=120).ok()
    assert "attached the kept pool" in att.stdout and "4 ranks alive" in att.stdout, (att.stdout, att.stderr)
    assert "is still running: its output follows" in att.stdout, att.stdout
    print(f"attach on the box: the cell {time.monotonic() - t0:.2f} s, said {re.findall(r'in [0-9.]+ s', att.stdout)}")
    os.unlink(gate)
    assert k.value("job.wait(120)") is True
    result = k.run("job.result()", timeout=60).ok().result or ""
    assert all(f"('done', {100 + r})" in result for r in range(4)), result
    shown, second = ticks(first), ticks(cell_texts(k, att))
    for r in range(4):
        assert set(shown.get(r, []) + second.get(r, [])) == set(range(N)), (r, shown.get(r), second.get(r))
        assert len(second.get(r, [])) == len(set(second.get(r, []))), (r, second.get(r))
    assert re.search(r"\[rank 3 n[12]\] tick", cell_texts(k, att)), "the rank's node, in its prefix"
    assert k.run("%%ddp\nkept", timeout=120).ok().result == "RankResults(4 ranks):\n  [0] 100\n  [1] 101\n  [2] 102\n  [3] 103"
    off = k.run("%ddp keep --off", timeout=60)
    assert off.error is not None and "this kernel attached a kept Ray pool" in off.error[1], off.error


def _kept_round(b: cluster_box.Box, cluster: box_ray.Cluster, end: str) -> None:
    runtime = tempfile.mkdtemp(prefix="k-ray-", dir="/tmp")
    env = dict(cluster.env, JUPYTER_RUNTIME_DIR=runtime, JPY_SESSION_NAME="box.ipynb")
    k = box_fixtures.login_kernel(b, **env)
    try:
        ranks, gate, ex = _kept_ticking(b, k, runtime)
        first = sigkill_kept(k, ex)
        state = cluster.state()
        assert all(alive(p) for p in ranks) and state["actors"].count("NodeActor") == 2, f"kept through a SIGKILL: {state}"
        assert runtime_processes(runtime, DRIVER), "the driver outlives its kernel on login"
        k = box_fixtures.login_kernel(b, **env)
        _attached(k, first, gate)
        if end == "idle":
            k.run("%ddp keep --idle 5s", timeout=60).ok()
            sigkill_kept(k)
            t0 = time.monotonic()
        else:
            t0 = time.monotonic()
            said = k.run("%ddp stop", timeout=60).ok().stdout
            assert re.search(r"its Ray actors \(n[12], n[12]\) and placement group were removed with the lease", said), said
        left = _left(b, cluster, runtime, 90)
        print(f"{end}: nothing left in Ray, on login, n1 or n2 {time.monotonic() - t0:.1f} s after "
              f"{'the SIGKILL' if end == 'idle' else 'the stop cell began'}")
        assert left == GONE, f"left after the lease's end ({end}): {left}"
        assert not [p for p in ranks if alive(p)]
    finally:
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=True)
        shutil.rmtree(runtime, ignore_errors=True)


def test_a_kept_ray_pool_on_n1_and_n2_outlives_its_kernel_and_ends_with_its_lease(box: cluster_box.Box, ray_box: box_ray.Cluster) -> None:
    """keep (a ticking --bg --keep job), SIGKILL the kernel, attach from the next on login, then the lease's --idle (after
    a SIGKILL of the attached kernel), then again with %ddp stop: each time nothing of the pool left anywhere."""
    for end in ("idle", "stop"):
        _kept_round(box, ray_box, end)


def _lost_and_placed_again(b: cluster_box.Box, cluster: box_ray.Cluster) -> None:
    runtime = tempfile.mkdtemp(prefix="k-ray-", dir="/tmp")
    env = dict(cluster.env, JUPYTER_RUNTIME_DIR=runtime, JPY_SESSION_NAME="box.ipynb")
    k = box_fixtures.login_kernel(b, **env)
    joined = True
    try:
        k.run(START, timeout=300).ok()
        node = k.value("[v[0] for v in _]")[3]  # ranks 2-3's node: not the lease holder's
        assert "kept pool" in k.run("%ddp keep", timeout=60).ok().stdout
        os.kill(test_box_ray._raylet(b, cluster, node), SIGKILL)
        joined = False
        test_box_ray._counted_out(cluster, node)
        box_ray.join(b, cluster, node)
        joined = True
        t0 = time.monotonic()
        ex = k.run("%%ddp\nimport os\nos.getpid()", timeout=300)
        assert ex.error is None, f"{ex.error}\n{ex.stdout[-3000:]}"
        assert re.search(rf"{node}'s ranks placed again on {node} ", ex.stdout), ex.stdout
        print(f"a kept pool's {node} placed again: the cell {time.monotonic() - t0:.1f} s")
        ranks = [int(p) for p in re.findall(r"\[\d\] (\d+)", ex.result or "")]
        sigkill_kept(k)
        assert all(alive(p) for p in ranks), "all four ranks outlive the kernel, the placed-again node's too"
        # lost again with no kernel at all: the pool's driver places it again itself and admits its template
        os.kill(test_box_ray._raylet(b, cluster, node), SIGKILL)
        joined = False
        test_box_ray._counted_out(cluster, node)
        assert wait_until(lambda: node not in kept_record(runtime).get("templates", []), 30), "its template went with its raylet"
        box_ray.join(b, cluster, node)
        joined = True
        t0 = time.monotonic()
        placed = wait_until(lambda: node in kept_record(runtime).get("templates", []), 180, 0.5)
        assert placed, f"no kernel: the driver placed {node} again ({kept_record(runtime)})"
        print(f"a kept pool's {node} placed again by its driver, no kernel: its template follows the lease {time.monotonic() - t0:.1f} s after it joined")
        assert all(alive(p) for p in ranks[:2]) and not any(alive(p) for p in ranks[2:]), "ranks 2-3 went with their node"
        k = box_fixtures.login_kernel(b, **env)
        att = k.run("%ddp attach", timeout=120).ok().stdout
        assert "attached the kept pool" in att and f"{node}'s template joined the lease again" in att, att
        reduced = k.run("%%ddp\nt = torch.ones(1); dist.all_reduce(t); t.item()", timeout=180)
        assert reduced.ok().result == "RankResults(4 ranks):\n  [0] 4.0\n  [1] 4.0\n  [2] 4.0\n  [3] 4.0", (reduced.result, reduced.stdout)
        assert re.search(r"started it again in .* \(rank 2 is pid \d+, rank 3 is pid \d+\); healed in .*copied from rank 0 \(dist, os, socket, torch\)",
                         reduced.stdout), reduced.stdout
        assert "removed with the lease" in k.run("%ddp stop", timeout=60).ok().stdout
        assert _left(b, cluster, runtime, 90) == GONE
    finally:
        if not joined:
            box_ray.join(b, cluster, node)
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=True)
        shutil.rmtree(runtime, ignore_errors=True)


def test_a_kept_pools_lost_node_placed_again_follows_the_lease(box: cluster_box.Box, ray_box: box_ray.Cluster) -> None:
    """n1's or n2's raylet killed under a kept pool, its kernel alive; the node joins again and the next cell places its
    ranks there again. The new template heard the keep: all four ranks live through a SIGKILL of the kernel. Then the
    node's raylet killed again, with no kernel at all: once it joined again the pool's driver places it again itself and
    its template follows the lease; the next kernel attaches, its first cell starts ranks 2-3 again there, heals them
    (torch and dist copied: no import in the cell) and runs an all_reduce on all four; %ddp stop leaves nothing. Once:
    a node lost and placed again twice in a row is test_box_ray.py's (the suite's time: the box's critical path)."""
    _lost_and_placed_again(box, ray_box)


def test_a_kept_pools_lease_holder_node_lost_with_no_kernel_ends_the_pool_everywhere(box: cluster_box.Box, ray_box: box_ray.Cluster) -> None:
    """The kernel SIGKILLed, then the raylet of the node whose template holds the lease killed: nothing can hold the pool
    now (the lease, its lock and the ranks' meeting point went with that node), so the driver on login, which watched the
    lease, ends the rest: the other node's actor and template, its ranks, the placement group, itself and its lock. A
    terminal then says why the pool ended. Once: the suite's time (the box's critical path)."""
    runtime = tempfile.mkdtemp(prefix="k-ray-", dir="/tmp")
    env = dict(ray_box.env, JUPYTER_RUNTIME_DIR=runtime, JPY_SESSION_NAME="box.ipynb")
    k = box_fixtures.login_kernel(box, **env)
    holder, joined = "", True
    try:
        k.run(START, timeout=300).ok()
        values = k.value("[tuple(v) for v in _]")
        holder = values[0][0]
        said = k.run("%ddp keep --max 1h", timeout=60).ok().stdout
        kept_id = re.findall(r"kept pool ([0-9a-f]{8})", said)[0]
        sigkill_kept(k)
        assert all(alive(v[1]) for v in values), "kept through the SIGKILL"
        os.kill(test_box_ray._raylet(box, ray_box, holder), SIGKILL)
        joined = False
        t0 = time.monotonic()
        left = _left(box, ray_box, runtime, 90)
        print(f"the lease holder's node {holder} lost, no kernel: nothing left {time.monotonic() - t0:.1f} s later")
        assert left == GONE, f"left after the lease holder's node was lost: {left}"
        assert not [v for v in values if alive(v[1])]
        stopped = subprocess.run([sys.executable, "-m", "ddp_magic", "stop", kept_id], capture_output=True, text=True,
                                 env=dict(os.environ, JUPYTER_RUNTIME_DIR=runtime))
        assert f"its lease holder on {holder} went away" in stopped.stdout + stopped.stderr, stopped
    finally:
        if not joined:
            test_box_ray._counted_out(ray_box, holder)
            box_ray.join(box, ray_box, holder)
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=True)
        shutil.rmtree(runtime, ignore_errors=True)
