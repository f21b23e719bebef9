"""%%ddp --ray across real hosts: a Ray cluster in the cluster in a box (a head on login with no CPU, n1 and n2 with 2 CPUs
and 2 fake GPUs each, token authentication on; scripts/box_ray.py), the kernel on login.

DDP trains on n1 and n2 with identical weights, each node's ranks with its Ray GPUs; -n 4 alone is packed by Ray 2 and 2
(one template a node, ranks numbered node by node), and %ddp_env --ray -n 4 says so before anything is placed; an
interrupt ends a cell and the ranks keep their state; --bg and --peek; a SIGKILLed kernel leaves no actor, no placement
group and no process on any host; n2's raylet killed mid-collective ends the cell within seconds naming n2 and its ranks,
the next cell says in one line what is missing while n2 is out (nothing ran, the others keep their state), and once n2
joins again the next cell places its ranks there again, healed from rank 0. Each twice, as a notebook user runs a cell
again."""
from __future__ import annotations

import os
import re
import sys
import threading
import time
from signal import SIGKILL
from typing import Any, Callable, Iterator, List

import box_fixtures
import box_ray
import cluster_box
import pytest
from kernel_helper import Kernel, alive

sys.path.insert(0, str(box_fixtures.ROOT / "tests" / "slurm"))
from slurm_helpers import run_interrupting, says  # noqa: E402

box = box_fixtures.box  # the fixtures, by name in this module
box_kernel = box_fixtures.box_kernel
ray_box = box_fixtures.ray_box

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

POOL = "%%ddp --ray --nodes 2 --ntasks-per-node 2 --gpus-per-rank 1 --backend gloo"
TRAIN = box_fixtures.DDP_TRAIN + """print(f"trained {dist.get_rank()}")
(socket.gethostname(), os.environ.get('GLOO_SOCKET_IFNAME'), w.tolist(), os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ['MASTER_ADDR'])
"""


@pytest.fixture
def rk(box_kernel: Kernel, ray_box: box_ray.Cluster) -> Iterator[Kernel]:
    """The box's shared kernel, reaching the box's Ray (its address and token in the kernel's env for this test)."""
    box_kernel.run(f"import os; os.environ.update({ray_box.env!r})").ok()
    try:
        yield box_kernel
    finally:
        box_kernel.run("%ddp stop", timeout=60)
        box_kernel.run(f"for _k in {list(ray_box.env)!r}: os.environ.pop(_k, None)").ok()


def ours(b: cluster_box.Box, cluster: box_ray.Cluster, node: str) -> List[int]:
    """ddp_magic's processes in ``node`` (its template and the ranks forked from it), children of our Ray's actors."""
    out = []
    net = os.readlink(f"/proc/{b.anchor(node)}/ns/net")
    for pid in cluster.pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"ddp_magic.procs" in f.read() and os.readlink(f"/proc/{pid}/ns/net") == net:
                    out.append(pid)
        except OSError:
            continue
    return out


def left_over(b: cluster_box.Box, cluster: box_ray.Cluster, seconds: float) -> dict:
    """Wait until no actor, no placement group of ours and no template or rank on n1 or n2; what is left then."""
    deadline = time.monotonic() + seconds
    while True:
        state = cluster.state()
        left = {"actors": [a for a in state["actors"] if a == "NodeActor"], "pgs": [p for p in state["pgs"] if p.startswith("ddp_magic")],
                "procs": ours(b, cluster, "n1") + ours(b, cluster, "n2")}
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def test_ddp_trains_on_n1_and_n2_placed_by_ray(box: cluster_box.Box, ray_box: box_ray.Cluster, rk: Kernel) -> None:
    for _attempt in range(2):
        ex = rk.run(POOL + TRAIN, timeout=300)
        assert ex.error is None, f"{ex.error}\n{ex.stdout[-3000:]}\n{ex.stderr[-3000:]}"
        values = rk.value("[list(v) for v in _]")
        hosts = [v[0] for v in values]
        assert sorted(hosts) == ["n1", "n1", "n2", "n2"] and hosts[0] == hosts[1] and hosts[2] == hosts[3], values
        assert {v[1] for v in values} == {"mgmt0"}, "each node chose the interface on its route to MASTER_ADDR"
        assert all(v[2] == values[0][2] for v in values), "identical weights on every rank"
        assert all(re.fullmatch(r"\d,\d", v[3]) for v in values), f"each node's 2 Ray GPUs: {values}"
        assert {v[4] for v in values} == {box.host(hosts[0]).mgmt}, "MASTER_ADDR: rank 0's node's address"
        assert f"[rank 3 {hosts[3]}] trained 3" in ex.stdout and ex.stdout.count("trained 3") == 1, ex.stdout
        state = ray_box.state()
        assert state["actors"].count("NodeActor") == 2, state
    rk.run("%ddp stop", timeout=60).ok()
    assert left_over(box, ray_box, 30) == {"actors": [], "pgs": [], "procs": []}


def test_an_interrupt_ends_the_cell_and_the_ranks_keep_their_state(ray_box: box_ray.Cluster, rk: Kernel) -> None:
    rk.run(POOL + "\nimport torch.distributed as dist\nkept = dist.get_rank() * 10", timeout=300).ok()
    for _attempt in range(2):
        ex = rk.run("%%ddp\nimport time\nprint('looping', flush=True)\nwhile True:\n    time.sleep(0.05)", timeout=120, interrupt_after=4.0)
        assert ex.error is not None and "KeyboardInterrupt" in ex.error[0] + ex.error[1] + "".join(ex.error[2]), ex.error
        assert re.search(r"\[rank 3 n[12]\] looping", ex.stdout), ex.stdout
        assert rk.run("%%ddp\nkept", timeout=120).ok().result == "RankResults(4 ranks):\n  [0] 0\n  [1] 10\n  [2] 20\n  [3] 30"


PACKED = "%%ddp --ray -n 4 --gpus-per-rank 1 --backend gloo"
PACKED_TRAIN = box_fixtures.DDP_TRAIN + """e = os.environ
(socket.gethostname(), w.tolist(), e['CUDA_VISIBLE_DEVICES'], e['MASTER_ADDR'], e['NODE_RANK'], e['LOCAL_RANK'], e['LOCAL_WORLD_SIZE'])
"""


def test_n_alone_is_packed_by_ray_two_ranks_a_node(box: cluster_box.Box, ray_box: box_ray.Cluster, rk: Kernel) -> None:
    """-n 4 alone: four one-rank bundles that Ray packs, 2 CPUs and 2 GPUs a node here, so 2 on n1 and 2 on n2; one
    template a node with both its bundles' GPUs; the ranks numbered node by node."""
    plan = rk.run("%ddp_env --ray -n 4 --gpus-per-rank 1", timeout=180).ok()
    shown = plan.stdout + (plan.result or "") + rk.run("print(_.full_text())").ok().stdout
    assert re.search(r"Ray 4 ranks, 1 GPU a rank \(PACK\) at \S+: fits .*with what is free now, 2 on n[12], 2 on n[12]", shown), shown
    assert "LOCAL_WORLD_SIZE=2" in shown and re.search(r"3 +1 +1", shown), f"the plan numbers them node by node: {shown}"
    assert left_over(box, ray_box, 5) == {"actors": [], "pgs": [], "procs": []}, "%ddp_env placed nothing"
    for attempt in range(2):
        ex = rk.run(PACKED + PACKED_TRAIN, timeout=300)
        assert ex.error is None, f"{ex.error}\n{ex.stdout[-3000:]}\n{ex.stderr[-3000:]}"
        if attempt == 0:
            assert re.search(r"placed on n[12] \(198\.51\.100\.1[12], 2 ranks, GPUs 0,1\), n[12] \(198\.51\.100\.1[12], 2 ranks, GPUs 0,1\)",
                             ex.stdout), ex.stdout
        values = rk.value("[list(v) for v in _]")
        hosts = [v[0] for v in values]
        assert sorted(hosts) == ["n1", "n1", "n2", "n2"] and hosts[0] == hosts[1] and hosts[2] == hosts[3], values
        assert all(v[1] == values[0][1] for v in values), "identical weights on every rank"
        assert all(v[2] == "0,1" for v in values), f"each node's template has both its bundles' GPUs: {values}"
        assert {v[3] for v in values} == {box.host(hosts[0]).mgmt}, "MASTER_ADDR: rank 0's node's address"
        assert [tuple(v[4:]) for v in values] == [("0", "0", "2"), ("0", "1", "2"), ("1", "0", "2"), ("1", "1", "2")], values
        assert ray_box.state()["actors"].count("NodeActor") == 2, "one actor (one template) a node"
    rk.run("%ddp stop", timeout=60).ok()
    assert left_over(box, ray_box, 30) == {"actors": [], "pgs": [], "procs": []}


BG = """%%ddp --bg --out job
import time, torch.distributed as dist
for step in range(40):
    time.sleep(0.1)
dist.get_rank()
"""


def test_bg_and_peek_on_ray(ray_box: box_ray.Cluster, rk: Kernel) -> None:
    rk.run(POOL + "\nstep = -1", timeout=300).ok()
    for _attempt in range(2):
        rk.run(BG, timeout=120).ok()
        deadline, seen = time.monotonic() + 60, ""
        while time.monotonic() < deadline:
            seen = rk.run("%%ddp --peek\nstep", timeout=60).ok().result or ""
            if re.fullmatch(r"RankResults\(4 ranks\):\n(  \[\d\] ([1-9]\d*)\n?){4}", seen):
                break
            time.sleep(0.2)
        assert re.fullmatch(r"RankResults\(4 ranks\):\n(  \[\d\] ([1-9]\d*)\n?){4}", seen), seen
        assert rk.value("job.wait(120)") is True
        assert rk.value("list(job.result())") == [0, 1, 2, 3]


LOOP = "%%ddp\nimport torch, torch.distributed as dist\nprint('reducing', flush=True)\nwhile True:\n    t = torch.ones(1); dist.all_reduce(t)"


def _raylet(b: cluster_box.Box, cluster: box_ray.Cluster, node: str) -> int:
    net = os.readlink(f"/proc/{b.anchor(node)}/ns/net")
    for pid in cluster.pids():
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "raylet" and os.readlink(f"/proc/{pid}/ns/net") == net:
                    return pid
        except OSError:
            continue
    raise AssertionError(f"no raylet of ours on {node}")


def test_a_sigkilled_kernel_leaves_nothing_on_any_host(box: cluster_box.Box, ray_box: box_ray.Cluster) -> None:
    for _attempt in range(2):
        k = box_fixtures.login_kernel(box, **ray_box.env)
        try:
            k.run(POOL + "\nimport os\nos.getpid()", timeout=300).ok()
            procs = ours(box, ray_box, "n1") + ours(box, ray_box, "n2")
            assert ours(box, ray_box, "n1") and ours(box, ray_box, "n2") and ray_box.state()["actors"].count("NodeActor") == 2
            os.kill(k.pid, SIGKILL)
            left = left_over(box, ray_box, 60)  # Ray ends a dead driver's actors within seconds; their templates go with them
            assert left == {"actors": [], "pgs": [], "procs": []}, f"left after the kernel's SIGKILL: {left}"
            assert not [p for p in procs if alive(p)]
        finally:
            k.kc.stop_channels()
            k.km.shutdown_kernel(now=True)


def _during(k: Kernel, code: str, fault: Callable[[], None]) -> "tuple[Any, float]":
    """Run ``code``; once a rank printed, the fault. The execution and the seconds from the fault to the cell's end."""
    printed, at = threading.Event(), []

    def later() -> None:
        if printed.wait(120):
            fault()
            at.append(time.monotonic())

    t = threading.Thread(target=later)
    t.start()
    ex = k.run(code, timeout=180, on_stream=lambda name, text: printed.set() if "reducing" in text else None)
    t.join()
    assert at, f"no rank printed: {ex.stdout[-2000:]}"
    return ex, time.monotonic() - at[0]


AGAIN = POOL + " --start-timeout 8"  # a lost node's ranks wait this long for room, then the cell says what is missing
# The ranks left are released (their collective aborted) and must end the cell within the pool's grace, or be stopped:
# 1 s, which rank 0 missed once as a loaded run began (fc25: "did not respond to the interrupt", the pool restarted).
# This test is of what is kept, not of how fast (a released rank ends its cell as soon as it can either way): 10 s
GRACE = "get_ipython().magics_manager.registry['DDPMagics'].session.pool.grace = 10"
HEALED = ("%%ddp\nt = torch.ones(1) * (dist.get_rank() + 1)\ndist.all_reduce(t)\n"  # torch and dist: no import, healing brings them
          "(globals().get('kept'), t.item(), os.environ['DDP_MAGIC_NODE_NAME'], os.environ['CUDA_VISIBLE_DEVICES'])")


def _counted_out(cluster: box_ray.Cluster, node: str, seconds: float = 90) -> None:
    """Wait until Ray counts ``node`` out (its health check: about 5 s after its raylet died on the test bed, box_ray.HEALTH)."""
    deadline = time.monotonic() + seconds
    while node in cluster.state()["nodes"] and time.monotonic() < deadline:
        time.sleep(1)
    assert node not in cluster.state()["nodes"], f"Ray still counts {node} in {seconds:.0f}s after its raylet died"


def test_a_killed_raylet_mid_collective_names_its_node_and_ranks_and_they_are_placed_again(
        box: cluster_box.Box, ray_box: box_ray.Cluster, rk: Kernel) -> None:
    """Last in the module: n2 (or n1) leaves the cluster each time. While it is out, a cell says in one line what is
    missing and nothing runs; once it joined again, the next plain cell places its ranks there again and runs on all."""
    for _attempt in range(2):
        rk.run(AGAIN + "\nimport os, torch, torch.distributed as dist\nkept = dist.get_rank() * 10", timeout=300).ok()
        rk.run(GRACE).ok()
        node = rk.value("get_ipython().magics_manager.registry['DDPMagics'].session.pool.ranks[3].node_name")
        other = "n1" if node == "n2" else "n2"
        on_node = ours(box, ray_box, node)
        joined = False
        try:
            ex, took = _during(rk, LOOP, lambda n=node: os.kill(_raylet(box, ray_box, n), SIGKILL))
            text = "\n".join(ex.error[2]) if ex.error else ex.stdout
            print(f"raylet of {node} killed: the cell ended {took:.1f}s later\n{text}")
            assert ex.error is not None, ex.stdout
            assert re.search(rf"rank [23] \(pid \d+\) on {node} lost its connection to the kernel", text), text  # the node, in the error
            assert re.search(r"rank [23] failed the same way", text), text
            assert "ranks 2-3 will be started again at the next cell" in text and re.search(r"\branks? 0\b", text), text  # the others, released
            assert re.search(rf"\[rank [23] {node}\S*\] reducing", ex.stdout), "the node is named in its ranks' prefix"
            assert took < 45, f"the error came {took:.1f}s after the raylet's death"  # promise: within 15 s; 3x
            deadline = time.monotonic() + 30
            while [p for p in on_node if alive(p)] and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not [p for p in on_node if alive(p)], "the lost node's template and ranks went with their actor"

            _counted_out(ray_box, node)  # no room: n1 holds its own bundle, the head has no CPU
            ex = run_interrupting(rk, "%%ddp\nkept", lambda m, n=node: says(m, f"{n} is lost and the cluster has no room for its ranks (ranks 2-3)"),
                                  timeout=180)
            assert ex.error is not None and ex.error[0] == "KeyboardInterrupt", ex.error  # Ctrl-C while the ranks wait for room
            t0 = time.monotonic()
            ex = rk.run("%%ddp\nkept", timeout=180)
            waited = time.monotonic() - t0
            assert ex.error is not None and ex.error[0] == "NodeLost", f"{ex.error}\n{ex.stdout[-2000:]}"
            assert ex.error[1] == (f"{node} is lost and the cluster has no room for its ranks (ranks 2-3): 2 CPUs, 2 GPUs asked, free: "
                                   f"{other} 0 CPUs, 0 GPUs; start a node (ray start --address {ray_box.address}) or %ddp restart --ray "
                                   "--nodes 1 --ntasks-per-node 2 --gpus-per-rank 1 --address " + ray_box.address
                                   + " (still so after --start-timeout 8s): nothing ran, ranks 0-1 keep their variables"), ex.error[1]
            print(f"no room for {node}'s ranks: said after {waited:.1f}s")

            box_ray.join(box, ray_box, node)
            joined = True
            t0 = time.monotonic()
            ex = rk.run(HEALED, timeout=300)
            assert ex.error is None, f"{ex.error}\n{ex.stdout[-3000:]}"
            print(f"{node} joined again: the next cell placed its ranks again and ran in {time.monotonic() - t0:.1f}s\n{ex.stdout[-1500:]}")
            assert re.search(rf"{node}'s ranks placed again on {node} \({re.escape(box.host(node).mgmt)}\) in ", ex.stdout), ex.stdout
            assert re.search(r"healed in [^:]+: \d+ names copied from rank 0 \([^)]*\bdist\b[^)]*\btorch\b", ex.stdout), ex.stdout
            assert "kept: it differs by rank" in ex.stdout, ex.stdout
            values = rk.value("[list(v) for v in _]")
            assert [v[0] for v in values] == [0, 10, None, None], f"ranks 0-1 kept their state, 2-3 are new: {values}"
            assert [v[1] for v in values] == [10.0] * 4, f"a right all_reduce on every rank: {values}"
            assert [v[2] for v in values] == [other, other, node, node] and all(re.fullmatch(r"\d,\d", v[3]) for v in values), values
            assert ray_box.state()["actors"].count("NodeActor") == 2, ray_box.state()
        finally:
            rk.run("%ddp stop", timeout=60)
            if not joined:
                box_ray.join(box, ray_box, node)
