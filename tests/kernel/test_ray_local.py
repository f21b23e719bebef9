"""%%ddp --ray on a real one-host Ray cluster (``ray start --head`` with 2 fake GPUs and token authentication, stopped by its
own pids: scripts/box_ray.py): ranks placed by a placement group, their env torchrun's with Ray's GPU ids, output only
through our channel; the checks before placing (resources that never fit, a wrong token, ray://); waiting for Ray shown
and ended by Ctrl-C or --start-timeout with the placement group removed; %ddp stop and a SIGKILLed kernel leave no
actor, no placement group and no process of ours; a kept pool outlives a SIGKILLed kernel, is attached by the next, and
its lease's end or %ddp stop leaves nothing. Each twice, as a notebook user runs a cell again."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, List

import pytest
from conftest import wait_until

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests" / "slurm"))

import box_ray  # noqa: E402
from ddp_magic.kernel.templates import WARM_ENV  # noqa: E402
from ddp_magic.wire import kept  # noqa: E402
from kernel_helper import Kernel, alive, drop_runtime_dir, own_runtime_dir  # noqa: E402
from keep_helper import TICKS, cell_texts, ticked, runtime_processes, sigkill_kept, ticks  # noqa: E402
from slurm_helpers import run_interrupting, says  # noqa: E402

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

TRAIN = """%%ddp --ray -n 2 --gpus-per-rank 1 --backend gloo
import os, socket, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(dist.get_rank())
m = DDP(torch.nn.Linear(4, 2))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad(); m(torch.randn(8, 4)).sum().backward(); opt.step()
print(f"trained {dist.get_rank()}")
e = os.environ
(e['LOCAL_RANK'], e.get('CUDA_VISIBLE_DEVICES'), e['MASTER_ADDR'], e['DDP_MAGIC_NODE_NAME'], [p.detach().flatten().tolist() for p in m.parameters()])
"""
NO_WARM = {WARM_ENV: "0"}  # the pools are Ray's: a local template warmed at %load_ext would cost each kernel CPU for nothing
HOLD = """
import sys, time, ray
from ray.util.placement_group import placement_group
ray.init(address=sys.argv[1], log_to_driver=False)
pg = placement_group([{"GPU": 2}], name="holder")
ray.get(pg.ready())
print("held", flush=True)
sys.stdin.read()
"""
# every line the kernel writes to the Ray driver, which sends all but its own ("watch") over Ray's RPC to the templates
TAP = """
import json
from ddp_magic.kernel.launchers.slurm_steps import TemplateStep
SENT, _untapped = [], TemplateStep._write
def _tapped(self, cmd):
    SENT.append(json.dumps(cmd))
    _untapped(self, cmd)
TemplateStep._write = _tapped
"""
SECRET = "get_ipython().magics_manager.registry['DDPMagics'].pool.secret.hex()"


@pytest.fixture(scope="module")
def cluster() -> Iterator[box_ray.Cluster]:
    why = box_ray.missing()
    if why:
        pytest.skip(f"no Ray here: {why}")
    c = box_ray.local()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def rk(cluster: box_ray.Cluster) -> Iterator[Kernel]:
    k = Kernel(extra_env=dict(cluster.env, PYTHONPATH=str(ROOT), **NO_WARM))
    try:
        k.run("%load_ext ddp_magic").ok()
        yield k
    finally:
        k.shutdown()


def ours(cluster: box_ray.Cluster) -> List[int]:
    """The templates and ranks on the cluster's host (the actors' children and theirs)."""
    out = []
    for pid in cluster.pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"ddp_magic.procs" in f.read():
                    out.append(pid)
        except OSError:
            continue
    return out


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def gone(cluster: box_ray.Cluster, seconds: float) -> dict:
    """Wait until no actor, no placement group of ours and no template or rank is left; what is left then."""
    deadline = time.monotonic() + seconds
    while True:
        state = cluster.state()
        left = {"actors": [a for a in state["actors"] if a == "NodeActor"], "pgs": [p for p in state["pgs"] if p.startswith("ddp_magic")],
                "procs": ours(cluster)}
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def test_ddp_on_a_ray_head_with_rays_gpus_then_stop_leaves_nothing(cluster: box_ray.Cluster, rk: Kernel) -> None:
    rk.run(TAP).ok()
    secrets = set()
    try:
        for _attempt in range(2):
            ex = rk.run(TRAIN, timeout=300)
            assert ex.error is None, f"{ex.error}\n{ex.stdout[-3000:]}\n{ex.stderr[-3000:]}"
            values = rk.value("[list(v) for v in _]")
            secrets.add(rk.value(SECRET))
            assert [v[0] for v in values] == ["0", "1"], values
            gpus = values[0][1]
            assert re.fullmatch(r"\d,\d", gpus) and values[1][1] == gpus, f"each rank sees its node's 2 Ray GPUs: {values}"
            node = values[0][3]
            addr = cluster.state()["nodes"][node]
            assert {v[2] for v in values} == {addr}, "MASTER_ADDR: the first node's Ray address"
            assert values[0][4] == values[1][4], "identical weights on both ranks"
            assert f"[rank 1 {node}] trained 1" in ex.stdout and ex.stdout.count("trained 1") == 1, ex.stdout
            state = cluster.state()
            assert state["actors"].count("NodeActor") == 1 and len([p for p in state["pgs"] if p.startswith("ddp_magic")]) == 1, state
            procs = ours(cluster)
            templates = [p for p in procs if _ppid(p) not in procs]
            assert len(templates) == 1 and len(procs) >= 3, f"one template a node, its ranks forked from it: {procs}"
        env = rk.run("%ddp_env", timeout=60).ok().result or ""
        assert f"MASTER_ADDR={addr}" in env.replace("'", "").replace(": ", "="), env
        sent = [json.loads(line) for line in rk.value("SENT")]
        assert [c for c in sent if "sealed_to" in c], f"the templates' first line, its secret sealed to their keys: {sent}"
        to_ray = [json.dumps(c) for c in sent if c.get("op") != "watch"]
        assert not [c for c in to_ray for s in secrets if s in c], "the pool's secret crossed Ray's RPC as it is"
    finally:
        rk.run("TemplateStep._write = _untapped")
        stop = rk.run("%ddp stop", timeout=60)
    assert "its Ray placement group was removed" in stop.stdout, stop.stdout
    assert gone(cluster, 30) == {"actors": [], "pgs": [], "procs": []}


def test_checks_before_anything_is_placed(cluster: box_ray.Cluster, rk: Kernel) -> None:
    for _attempt in range(2):
        ex = rk.run("%%ddp --ray -n 8 --gpus-per-rank 1\n1", timeout=120)
        assert ex.error is not None and re.search(r"8 GPUs asked, the cluster has 2: 2 on \S+", ex.error[1]), ex.error
        ex = rk.run("%%ddp --ray -n 2 --address ray://127.0.0.1:10001\n1", timeout=60)
        assert ex.error is not None and "ray:// (Ray Client) cannot run ddp_magic's ranks" in ex.error[1] and "head node" in ex.error[1], ex.error
        rk.run("import os; os.environ['RAY_AUTH_TOKEN'] = 'not-the-token'").ok()
        try:
            ex = rk.run("%%ddp --ray -n 2\n1", timeout=180)
        finally:
            rk.run(f"os.environ['RAY_AUTH_TOKEN'] = {cluster.token!r}").ok()
        assert ex.error is not None and "token authentication refused this kernel" in ex.error[1] and "RAY_AUTH_TOKEN" in ex.error[1], ex.error
        rk.run("%ddp_env --ray -n 2", timeout=180).ok()
        said = rk.value("_.full_text()")
        assert "Ray 2.60.0, Python" in said and "fits" in said and "nothing was placed" in said, said
        assert rk.run("%%ddp --ray -n 2 --gpus-per-rank 5\n1", timeout=120).error is not None  # refused: never fits
        ex = rk.run("%%ddp --ray -n 2\n1", timeout=300).ok()  # the pools refused above never ran: this is a first start
        assert "restarting the pool" not in ex.stdout and "variables defined in earlier" not in ex.stdout, ex.stdout
        rk.run("%ddp stop", timeout=60).ok()
    assert gone(cluster, 30) == {"actors": [], "pgs": [], "procs": []}


def test_waiting_for_ray_is_shown_and_ctrl_c_or_start_timeout_removes_the_group(cluster: box_ray.Cluster, rk: Kernel) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, cluster.address], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, **cluster.env))
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        for _attempt in range(2):
            ex = run_interrupting(rk, "%%ddp --ray -n 2 --gpus-per-rank 1\n1", lambda m: says(m, "waiting for Ray: 0 of 2 GPUs free"), timeout=240)
            assert ex.error is not None and ex.error[0] == "KeyboardInterrupt", ex.error
            assert gone(cluster, 30)["pgs"] == [], "Ctrl-C removed the pending placement group"
            ex = rk.run("%%ddp --ray -n 2 --gpus-per-rank 1 --start-timeout 3\n1", timeout=180)
            assert ex.error is not None and "still pending after --start-timeout 3s (0 of 2 GPUs free); it was removed" in ex.error[1], ex.error
            assert gone(cluster, 30)["pgs"] == []
        assert "holder" in cluster.state()["pgs"], "the other placement group was never touched"
    finally:
        holder.kill()
        holder.wait()


def test_a_sigkilled_kernel_leaves_no_actor_group_or_process(cluster: box_ray.Cluster) -> None:
    for _attempt in range(2):
        k = Kernel(extra_env=dict(cluster.env, PYTHONPATH=str(ROOT), **NO_WARM))
        try:
            k.run("%load_ext ddp_magic").ok()
            k.run("%%ddp --ray -n 2\nimport os\nos.getpid()", timeout=300).ok()
            procs = ours(cluster)
            assert len(procs) >= 3 and cluster.state()["actors"].count("NodeActor") == 1
            os.kill(k.pid, signal.SIGKILL)
            left = gone(cluster, 60)  # Ray ends a dead driver's actors within seconds; their templates go with them
            assert left == {"actors": [], "pgs": [], "procs": []}, f"left after the kernel's SIGKILL: {left}"
            assert not [p for p in procs if alive(p)]
        finally:
            k.kc.stop_channels()
            k.km.shutdown_kernel(now=True)


def test_a_sigkilled_actor_takes_its_template_and_ranks_and_the_next_pool_is_placed_again(cluster: box_ray.Cluster, rk: Kernel) -> None:
    try:
        for _attempt in range(2):
            rk.run("%%ddp --ray -n 2\nimport os\nos.getpid()", timeout=300).ok()
            procs = ours(cluster)
            template = next(p for p in procs if _ppid(p) not in procs)
            os.kill(_ppid(template), signal.SIGKILL)  # the actor (Ray's worker process), without any cleanup of its own
            deadline = time.monotonic() + 30  # the promise: at once (the template's parent-death signal, its stdin's end)
            while [p for p in procs if alive(p)] and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not [p for p in procs if alive(p)], "the template and its ranks went with their actor"
            ex = rk.run("%ddp restart", timeout=300)
            assert ex.error is None and "placed on" in ex.stdout, f"{ex.error}\n{ex.stdout[-2000:]}"
            assert rk.run("%%ddp\nimport torch.distributed as dist\ndist.get_rank()", timeout=120).ok().result == "RankResults(2 ranks):\n  [0] 0\n  [1] 1"
            rk.run("%ddp stop", timeout=60).ok()
    finally:
        rk.run("%ddp stop", timeout=60)
    assert gone(cluster, 30) == {"actors": [], "pgs": [], "procs": []}


def test_an_interrupt_ends_the_cell_and_the_ranks_keep_their_state(cluster: box_ray.Cluster, rk: Kernel) -> None:
    """The ranks' SIGINT is not blocked (Ray's worker threads block it, and a child inherits its thread's mask)."""
    try:
        rk.run("%%ddp --ray -n 2\nimport torch.distributed as dist\nkept = dist.get_rank() * 10", timeout=300).ok()
        for _attempt in range(2):
            ex = rk.run("%%ddp\nimport time\nprint('looping', flush=True)\nwhile True:\n    time.sleep(0.05)", timeout=120, interrupt_after=6.0)
            assert ex.error is not None and "KeyboardInterrupt" in ex.error[0] + ex.error[1] + "".join(ex.error[2]), ex.error
            assert rk.run("%%ddp\nkept", timeout=120).ok().result == "RankResults(2 ranks):\n  [0] 0\n  [1] 10"
    finally:
        rk.run("%ddp stop", timeout=60)


KEEP_START = "%%ddp --ray -n 2\nimport os, torch.distributed as dist\nkept = 100 + dist.get_rank()\nos.getpid()"
N, AT = 20, 10


def _drivers(runtime: str) -> List[int]:
    """The kept pool's driver and its anchor on this host."""
    return runtime_processes(runtime, b"ddp_magic.procs.ray_driver")


def _nothing_left(cluster: box_ray.Cluster, runtime: str, seconds: float) -> dict:
    deadline = time.monotonic() + seconds
    while True:
        locks = [os.path.join(runtime, n) for n in os.listdir(runtime) if n.startswith("ddp-kept-") and n.endswith(".lock")]
        left = dict(gone(cluster, 0), drivers=_drivers(runtime), held=[p for p in locks if kept.is_held(p)])
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_a_kept_ray_pool_outlives_its_kernel_and_ends_with_its_lease_or_stop(cluster: box_ray.Cluster) -> None:
    """keep (a ticking --bg --keep job), SIGKILL the kernel, attach from the next (its state, every tick), then the lease's
    --idle (after a SIGKILL of the attached kernel) or %ddp stop: no actor, no placement group, no template, rank or driver."""
    runtime = own_runtime_dir()
    try:
        for end in ("idle", "stop"):
            _kept_round(cluster, runtime, end)
        _kept_actor_killed(cluster, runtime)
        _kept_stopped_from_a_terminal(cluster, runtime)
    finally:
        drop_runtime_dir(runtime)


def _kernel(cluster: box_ray.Cluster, runtime: str) -> Kernel:
    k = Kernel(extra_env=dict(cluster.env, PYTHONPATH=str(ROOT), **NO_WARM, JUPYTER_RUNTIME_DIR=runtime, JPY_SESSION_NAME="ray.ipynb"))
    k.run("%load_ext ddp_magic").ok()
    return k


def _kept_round(cluster: box_ray.Cluster, runtime: str, end: str) -> None:
    k = _kernel(cluster, runtime)
    try:
        ranks = [int(p) for p in re.findall(r"\[\d\] (\d+)", k.run(KEEP_START, timeout=300).ok().result or "")]
        assert len(ranks) == 2, ranks
        gate = os.path.join(runtime, "gate")
        open(gate, "w").close()
        ex = k.run(TICKS.format(n=N, at=AT, gate=gate), timeout=120).ok()
        assert "kept pool" in ex.stdout, ex.stdout
        kept_id = re.findall(r"kept pool ([0-9a-f]{8})", ex.stdout)[0]
        assert ticked(k, ex, 2)
        first = sigkill_kept(k, ex)
        state = cluster.state()
        assert all(alive(p) for p in ranks) and state["actors"].count("NodeActor") == 1, f"kept through a SIGKILL: {state}"
        assert len([p for p in state["pgs"] if p.startswith("ddp_magic")]) == 1 and _drivers(runtime), state
        k = _kernel(cluster, runtime)
        t0 = time.monotonic()
        att = k.run("%ddp attach --out job", timeout=120).ok()
        assert "attached the kept pool" in att.stdout and "2 ranks alive" in att.stdout, att.stdout
        print(f"attach: {time.monotonic() - t0:.2f} s the cell, {re.findall(r'in [0-9.]+ s', att.stdout)} said")
        os.unlink(gate)
        assert k.value("job.wait(60)") is True
        shown, second = ticks(first), ticks(cell_texts(k, att))
        assert all(set(shown.get(r, []) + second.get(r, [])) == set(range(N)) for r in range(2)), (shown, second)
        assert k.run("%%ddp\nkept", timeout=120).ok().result == "RankResults(2 ranks):\n  [0] 100\n  [1] 101"
        off = k.run("%ddp keep --off", timeout=60)
        assert off.error is not None and "this kernel attached a kept Ray pool" in off.error[1], off.error
        if end == "idle":
            k.run("%ddp keep --idle 5s", timeout=60).ok()
            sigkill_kept(k)
            t0 = time.monotonic()
        else:
            t0 = time.monotonic()
            said = k.run("%ddp stop", timeout=60).ok().stdout
            assert "its Ray actors" in said and "placement group were removed with the lease" in said, said
        left = _nothing_left(cluster, runtime, 60)
        print(f"{end}: nothing left {time.monotonic() - t0:.1f} s after the {'SIGKILL' if end == 'idle' else 'stop'}")
        assert left == {"actors": [], "pgs": [], "procs": [], "drivers": [], "held": []}, f"left after the lease's end ({end}): {left}"
        assert not [p for p in ranks if alive(p)]
        if end == "idle":  # from a terminal: why it ended
            said = subprocess.run([sys.executable, "-m", "ddp_magic", "stop", kept_id], capture_output=True, text=True,
                                  env=dict(os.environ, JUPYTER_RUNTIME_DIR=runtime))
            assert "its lease's --idle" in said.stdout + said.stderr, said
    finally:
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=True)


def _kept_actor_killed(cluster: box_ray.Cluster, runtime: str) -> None:
    """A kept pool's actor SIGKILLed (its kernel alive): its template goes with it, kept or not, its ranks with that, and
    the driver, hearing its lease holder gone, removes the placement group and ends."""
    k = _kernel(cluster, runtime)
    try:
        k.run(KEEP_START, timeout=300).ok()
        assert "kept pool" in k.run("%ddp keep", timeout=60).ok().stdout
        procs = ours(cluster)
        template = next(p for p in procs if _ppid(p) not in procs)
        os.kill(_ppid(template), signal.SIGKILL)
        t0 = time.monotonic()
        left = _nothing_left(cluster, runtime, 60)
        print(f"actor: nothing left {time.monotonic() - t0:.1f} s after its SIGKILL")
        assert left == {"actors": [], "pgs": [], "procs": [], "drivers": [], "held": []}, f"left after the actor's SIGKILL: {left}"
        assert not [p for p in procs if alive(p)]
        k.run("%ddp stop", timeout=60)
    finally:
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=True)


def _kept_stopped_from_a_terminal(cluster: box_ray.Cluster, runtime: str) -> None:
    """A kept Ray pool whose kernel was SIGKILLed, ended with ``python -m ddp_magic stop ID`` (no kernel): its lease ends,
    its driver hears it and removes the placement group and the actors; nothing of it is left."""
    k = _kernel(cluster, runtime)
    try:
        ranks = [int(p) for p in re.findall(r"\[\d\] (\d+)", k.run(KEEP_START, timeout=300).ok().result or "")]
        kept_id = re.findall(r"kept pool ([0-9a-f]{8})", k.run("%ddp keep", timeout=60).ok().stdout)[0]
        sigkill_kept(k)
        assert all(alive(p) for p in ranks) and cluster.state()["actors"].count("NodeActor") == 1
        t0 = time.monotonic()
        said = subprocess.run([sys.executable, "-m", "ddp_magic", "stop", kept_id], capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, JUPYTER_RUNTIME_DIR=runtime))
        assert f"stopped the kept pool {kept_id}" in said.stdout, (said.stdout, said.stderr)
        left = _nothing_left(cluster, runtime, 60)
        print(f"python -m ddp_magic stop: nothing left {time.monotonic() - t0:.1f} s after it began")
        assert left == {"actors": [], "pgs": [], "procs": [], "drivers": [], "held": []}, f"left after the stop from a terminal: {left}"
        assert not [p for p in ranks if alive(p)]
    finally:
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=True)


def test_sigterm_to_a_ray_template_saves_at_a_safe_point_and_a_new_pool_goes_on(cluster: box_ray.Cluster, rk: Kernel, tmp_path: Path) -> None:
    """--save-on-preempt (docs/snapshots.md "Preemption"): SIGTERM to a Ray node's template while its actor lives (a
    node's shutdown, a ``kill``; not its parent-death signal, the actor's end) saves the armed ranks at their next safe
    point, the job's cell says the step, and a new Ray pool loads that step with its values."""
    from test_snapshots import JOB, SETUP

    folder = tmp_path / "ckpt"
    try:
        rk.run("%%ddp --ray -n 2\n" + SETUP, timeout=300).ok()
        since = len(rk.elsewhere)
        job = JOB.format(every="", stop=str(tmp_path / "never")).replace("--save-every 1s \n", f"--save-on-preempt {folder}\n")
        rk.run(job, timeout=60).ok()
        assert wait_until(lambda: len(rk.value("job.metrics['step']")) > 20, timeout=120)
        assert rk.armed(), "the ranks heard the arming (a SIGTERM before it ends the pool unsaved)"
        procs = ours(cluster)
        template = next(p for p in procs if _ppid(p) not in procs)
        t0 = time.monotonic()
        os.kill(template, signal.SIGTERM)
        rk.run("job.wait()", timeout=300).ok()
        said = "".join(m["content"].get("text", "") for m in rk.elsewhere[since:] if m["msg_type"] == "stream")
        where = re.escape(str(folder))
        preempted = re.search(rf"preempted: saved step (\d+) to {where}/step-\S+ \([\d.]+ s\); %ddp load {where} on the next allocation", said)
        assert preempted, said[-3000:]
        print(f"SIGTERM to a Ray template -> the job ended with the line said after {time.monotonic() - t0:.1f} s")
        step = int(preempted.group(1))
        loaded = rk.run(f"%ddp load {folder} --ray -n 2", timeout=300).ok()
        assert f"(step {step}, saved by 2 ranks) into 2 ranks" in loaded.stdout, loaded.stdout
        rk.run("%%ddp --out after\n(step, max(seen))", timeout=120).ok()
        assert rk.value("list(after)") == [(step, step), (step, step)]
    finally:
        rk.run("%ddp stop", timeout=60)
    assert gone(cluster, 30) == {"actors": [], "pgs": [], "procs": []}
