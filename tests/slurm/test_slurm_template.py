"""A Slurm node's template without Slurm: the real ``python -m ddp_magic.procs.slurm_template`` driven through the kernel's
TemplateStep (the command line without srun), a real rank forked from it dialling a real Admission. Runs everywhere.

What it checks: spawns for another node are ignored (srun gives every template every command); a rank's env is the
template's with the kernel's changes (set and removed) and its Slurm task variables; a later pool's secret arrives
sealed and the rank proves it; the template reports the fork, and the rank's exit; it answers a ping for its own node
(the kernel asks a node whose ranks were unreachable before it starts them again), never one for another node."""
from __future__ import annotations

import json
import os
import select
import shutil
import socket
import sys
import tempfile
import time

import pytest
from conftest import wait_until

from ddp_magic.kernel.admission import Admission
from ddp_magic.kernel.keep.launcher import KeptSlurmLauncher
from ddp_magic.kernel.launchers import LaunchError
from ddp_magic.kernel.launchers.base import worker_env
from ddp_magic.kernel.launchers.slurm_steps import TemplateStep, env_changes
from ddp_magic.plan.plan import make_plan
from ddp_magic.plan.spec import PoolSpec
from ddp_magic.wire import kept
from ddp_magic.wire import protocol as P
from ddp_magic.wire import slurm_env


def _joined(admission: Admission, want: int, seconds: float = 120.0) -> list:
    out: list = []
    deadline = time.monotonic() + seconds
    while len(out) < want and time.monotonic() < deadline:
        select.select([admission.fileno()], [], [], 0.2)
        out += admission.take()
    return out


def _events(step: TemplateStep, kind: str, count: int, seconds: float = 30.0) -> list:
    seen: list = []
    deadline = time.monotonic() + seconds
    while len([e for e in seen if e["event"] == kind]) < count and time.monotonic() < deadline:
        seen += step.take_events()
        time.sleep(0.05)
    return seen


def test_a_node_template_forks_its_own_nodes_ranks_with_their_env_and_the_sealed_secret():
    first, pool = P.new_secret(), P.new_secret()  # the step's secret, and a later pool's (a new -n in the same templates)
    admission = Admission("127.0.0.1", pool, 8, lambda: None)
    env = dict(worker_env(), SLURMD_NODENAME="nA", OLD_VAR="from the first pool", DDP_MAGIC_INIT="0")
    env[slurm_env.SECRET_ENV] = first.hex()
    step = TemplateStep([sys.executable, "-m", "ddp_magic.procs.slurm_template"], env, first, ["nA"], tempfile.TemporaryFile())
    try:
        for attempt in range(2):  # the same template forks again (a rank lost, or the next pool)
            wanted = {k: v for k, v in step.env.items() if k != "OLD_VAR"}
            wanted.update(RANK="2", LOCAL_RANK="0", WORLD_SIZE="4", NEW_VAR=f"try {attempt}", **slurm_env.task_vars(2, 0, 1, 4, 2))
            env_set, env_unset = env_changes(step.env, wanted)
            config = {"env_set": env_set, "env_unset": env_unset, "kernel_addr": "127.0.0.1", "kernel_port": admission.port, "tls": None}
            step.spawn(3, "nB", dict(config, env_set=dict(env_set, RANK="3")), pool)  # another node's: this template ignores it
            step.spawn(2, "nA", config, pool)
            joined = _joined(admission, 3)  # the control channel and the two output streams
            hello = [(sock, msg) for sock, msg in joined if msg["op"] == P.HELLO]
            assert len(hello) == 1 and len(joined) == 3, [m["op"] for _, m in joined]
            sock, msg = hello[0]
            assert msg["rank"] == 2 and msg["node_name"] == "nA", "the rank proved the later pool's secret, unsealed by its template"
            sock.settimeout(60)
            P.send(sock, P.message(P.ENV))
            reply = P.recv(sock)
            while reply["op"] != P.ENV:
                reply = P.recv(sock)
            got = reply["env"]["env"]
            assert got["NEW_VAR"] == f"try {attempt}" and "OLD_VAR" not in got, "the kernel's changes, set and removed"
            assert (got["RANK"], got["SLURM_PROCID"], got["SLURM_NODEID"], got["SLURM_NTASKS"]) == ("2", "2", "1", "4")
            assert got["SLURMD_NODENAME"] == "nA" and slurm_env.SECRET_ENV not in got
            P.send(sock, P.message(P.SHUTDOWN))
            events = _events(step, "exited", 1)
            assert [(e["event"], e["rank"]) for e in events] == [("spawned", 2), ("exited", 2)], events
            for s, _ in joined:
                s.close()
            asked = {"nA": step.ping("nA"), "nB": step.ping("nB")}  # nB has no template in this step: nobody answers for it
            t0 = time.monotonic()
            assert step.wait_pongs(asked, t0 + 0.5) == ["nB"]
            assert time.monotonic() - t0 >= 0.45, "it waited for nB until the deadline"
            assert step.wait_pongs({"nA": asked["nA"]}, time.monotonic() + 30) == [], "nA's answer is kept"
        assert step.serves("nA") and not step.lost_nodes()
    finally:
        step.end()
        step.wait_end(time.monotonic() + 10)
        admission.close()
    assert step.proc.returncode is not None


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _parent_env(pid: int) -> dict:
    with open(f"/proc/{pid}/stat") as f:
        parent = int(f.read().rsplit(")", 1)[1].split()[1])
    with open(f"/proc/{parent}/environ", "rb") as f:
        return dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)


def test_a_kernel_that_attached_a_kept_pool_forks_a_rank_on_every_node_the_lease_reaches():
    """docs/keep.md, "Slurm": nA's template holds the lease, nB's follows it; both kernels' pipes (srun's stdin) close as
    the kernel dies. A kernel that attaches then asks the holder for a rank on nB: the holder hands the spawn to nB's
    template over nB's own connection to the lease, and passes nB's events back (spawned; exited before joining). A node
    with no template on the lease is refused at once, saying why; the holder's own node forks as before. ``exit`` ends
    the holder, and the follower with it (its ranks too): nothing is left."""
    secret = P.new_secret()
    where = tempfile.mkdtemp(prefix="k33t-", dir="/tmp")  # short: the lease socket's path must fit AF_UNIX
    admission = Admission("127.0.0.1", secret, 8, lambda: None)
    deaf = socket.socket()  # a kernel that never answers: a rank dialling it waits, unjoined
    deaf.bind(("127.0.0.1", 0))
    deaf.listen(8)
    steps = {}
    try:
        for node in ("nA", "nB"):
            env = dict(worker_env(), SLURMD_NODENAME=node, DDP_MAGIC_INIT="0", **{slurm_env.SECRET_ENV: secret.hex()})
            steps[node] = TemplateStep([sys.executable, "-m", "ddp_magic.procs.slurm_template"], env, secret, [node], tempfile.TemporaryFile())
        assert wait_until(lambda: all(s.ready for s in steps.values()), 180), {n: s.lost_nodes() for n, s in steps.items()}
        keep = {"op": "keep", "id": "t33", "node": "nA", "where": where, "idle": 600.0, "max": 600.0, "secret": secret.hex(),
                "kernel": "test", "pid": os.getpid(), "info": {"nproc": 3, "shm_prefix": ""}}
        for step in steps.values():
            step.command(dict(keep))
        assert wait_until(lambda: any(n.get("event") == "kept" for n in steps["nA"].notes), 60), "nA's template took the lease"
        lease = next(n for n in steps["nA"].notes if n.get("event") == "kept")["lease"]
        for step in steps.values():  # where the holder listens: the others follow it there (kernel/keep/keeping.py)
            step.command({"op": "follow", "node": "nA", "id": "t33", "lease": lease, "dir": "", "secret": secret.hex()})
        found = lambda: json.load(open(kept.discovery_path("t33", where))).get("templates") == ["nB"]  # noqa: E731
        assert wait_until(lambda: os.path.exists(kept.discovery_path("t33", where)) and found(), 60), "nB's template joined the lease"
        for step in steps.values():
            step.proc.stdin.close()  # the kernel died: srun's stdin closes on every node
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(30)
        sock.connect(kept.socket_path("t33", where))
        P.client_handshake(sock, secret)
        sock.sendall((json.dumps({"op": "attach", "kernel": "k2", "pid": os.getpid(), "addr": "127.0.0.1", "port": admission.port}) + "\n").encode())
        reply = b""
        while not reply.endswith(b"\n"):
            reply += sock.recv(1)
        assert json.loads(reply)["event"] == "attached"
        sock.settimeout(None)
        plan = make_plan(PoolSpec.from_options(None, slurm=dict(nodes=3, ntasks_per_node=1), environ={}), environ={})
        step_env = {k: v for k, v in steps["nA"].env.items() if k != "SLURMD_NODENAME"}  # Slurm's own, per node
        launcher = KeptSlurmLauncher(secret, sock, {}, kept.lock_path("t33", where), plan, {"nodes": ["nA", "nB", "nC"], "step_env": step_env})
        for _attempt in range(2):
            launcher.spawn(1, {"env": dict(step_env, OURS="yes"), "kernel_addr": "127.0.0.1", "kernel_port": admission.port})
            joined = _joined(admission, 3)
            hello = [(s, m) for s, m in joined if m["op"] == P.HELLO]
            assert len(hello) == 1 and hello[0][1]["rank"] == 1 and hello[0][1]["node_name"] == "nB", [m for _, m in joined]
            pid = hello[0][1]["pid"]
            assert _parent_env(pid)[b"SLURMD_NODENAME"] == b"nB", "nB's template forked it"
            launcher.adopt(pid, 1, "127.0.0.1")
            P.send(hello[0][0], P.message(P.SHUTDOWN))
            assert wait_until(lambda p=pid: _gone(p), 60)
            assert launcher.poll(0.5) == [], "a joined rank's exit is its lost connection, not the launcher's to say"
            for s, _ in joined:
                s.close()
            launcher.spawn(1, {"env": step_env, "kernel_addr": "127.0.0.1", "kernel_port": deaf.getsockname()[1]})
            unjoined = launcher._pending[1]
            assert unjoined and _parent_env(unjoined)[b"SLURMD_NODENAME"] == b"nB"
            os.kill(unjoined, 9)
            exits: list = []
            assert wait_until(lambda got=exits: bool(got.extend(launcher.poll(0.1)) or got), 30)
            assert exits == [(1, unjoined, -9)], "nB's event of a rank that died before joining came through the holder"
            with pytest.raises(LaunchError, match="nC's template could not fork rank 2: that template holds no connection"):
                launcher.spawn(2, {"env": step_env, "kernel_addr": "127.0.0.1", "kernel_port": admission.port})
            launcher.spawn(0, {"env": step_env, "kernel_addr": "127.0.0.1", "kernel_port": admission.port})
            joined = _joined(admission, 3)
            (rank0,) = [m for _, m in joined if m["op"] == P.HELLO]
            assert rank0["rank"] == 0 and _parent_env(rank0["pid"])[b"SLURMD_NODENAME"] == b"nA", "the holder's own node"
            launcher.adopt(rank0["pid"], 0, "127.0.0.1")
            for s, m in joined:
                if m["op"] == P.HELLO:
                    P.send(s, P.message(P.SHUTDOWN))
                s.close()
        templates = [s.proc for s in steps.values()]
        launcher.close()  # %ddp stop: the holder ends its lease and exits; the follower's lease connection closes
        for proc in templates:
            proc.wait(timeout=30)
        assert not os.path.exists(kept.discovery_path("t33", where))
    finally:
        for step in steps.values():
            step.end()
            step.wait_end(time.monotonic() + 10)
        admission.close()
        deaf.close()
        shutil.rmtree(where, ignore_errors=True)
