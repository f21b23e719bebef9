"""A Slurm node's template without Slurm: the real ``python -m ddp_magic.procs.slurm_template`` driven through the kernel's
TemplateStep (the command line without srun), a real rank forked from it dialling a real Admission. Runs everywhere.

What it checks: spawns for another node are ignored (srun gives every template every command); a rank's env is the
template's with the kernel's changes (set and removed) and its Slurm task variables; a later pool's secret arrives
sealed and the rank proves it; the template reports the fork, and the rank's exit; it answers a ping for its own node
(the kernel asks a node whose ranks were unreachable before it starts them again), never one for another node."""
from __future__ import annotations

import select
import sys
import tempfile
import time

from ddp_magic.kernel.admission import Admission
from ddp_magic.kernel.launchers.base import worker_env
from ddp_magic.kernel.launchers.slurm_steps import TemplateStep, env_changes
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
