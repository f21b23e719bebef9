"""The Slurm launcher: the ranks are the tasks of one job step, in an allocation the kernel found or made (slurm_alloc.py).

``acquire`` waits for the allocation (the ranks are QUEUED meanwhile) and learns its
nodes' addresses; ``launch`` starts one ``srun`` step whose every task runs
``python -m ddp_magic.procs.worker --slurm`` and dials back to the kernel. The step's env
carries what a task needs: the pool's secret, the control address, the certificate
fingerprint when the channel is TLS (ranks on other hosts, or DDP_MAGIC_FORCE_TLS=1),
and the plan's variables; Slurm's SLURM_PROCID/LOCALID/NODEID become RANK/LOCAL_RANK/
NODE_RANK on the task (procs/rank_slurm.py). MASTER_ADDR is the first node's NodeAddr.

A rank that died is started again alone (``spawn``): a step of one task on its node, in
the same allocation, told its RANK. The allocation outlives pool restarts (a new -n
inside it is a new step, no new queue wait) and ends with ``close``; an allocation the
kernel found is never cancelled, only our steps end.
"""
from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Dict, List, Optional

from ...logs import log
from ...plan.check import Check
from ...plan.net import address_family, is_local_ip, route_source
from ...wire import slurm_env, tls
from . import slurm_cli as cli
from .base import Exit, LaunchError, Launcher
from .slurm_alloc import Allocation, Progress, allocation_for, pdeathsig_prefix

if TYPE_CHECKING:
    from ...plan.plan import Plan

WORKER = ["-m", "ddp_magic.procs.worker", "--slurm"]
STEP_END_WAIT_S = 5.0  # an srun asked to end (SIGTERM) cancels its step within moments
MASTER_PORTS = (20000, 32767)  # where MASTER_PORT is drawn from
PER_RANK = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "ROLE_RANK")  # the task's own, from Slurm (never the plan's)


class SlurmLauncher(Launcher):
    """Ranks as tasks of an srun step; the allocation is held across restarts and released by ``close``."""

    name = "slurm"
    remote_ranks = True  # the nodes may be other hosts: ranks are asked to exit by message, a closed connection is an exit
    reports_exits = False  # srun's tasks are not our children: a lost control connection is the exit
    keeps_template = True  # the allocation is this launcher's template: a restart keeps it
    replaces_ranks = True  # a dead rank comes back as a one-task step on its node

    def __init__(self, secret: bytes, python: str = sys.executable) -> None:
        super().__init__(secret, python)
        self.alloc: Optional[Allocation] = None
        self.steps: Dict[subprocess.Popen, List[int]] = {}  # our srun clients -> their ranks (the pool's step, one per rank started again)
        self.tls_key: Optional[tls.ServerKey] = None
        self.plan: Optional[Plan] = None
        self._pids: Dict[int, int] = {}  # pid -> rank, as the ranks said in their HELLO (not ours to signal)
        self._step_env: Dict[str, str] = {}

    def start(self, timeout: float = 0) -> str:
        return "slurm (srun job steps)"

    # ------------------------------------------------------------ the allocation
    def acquire(self, plan: Plan, progress: Progress) -> Optional[str]:
        """The allocation the plan's request runs in: the one held if it fits, else the kernel's own, else a new one (queued meanwhile)."""
        why = cli.installed()
        if why:
            raise LaunchError(why)
        request = plan.slurm
        assert request is not None, "a Slurm launcher needs a plan with a Slurm request"
        if self.serves(plan):  # the same allocation: no queue, no notice; a new key for the new pool
            self.tls_key = tls.ServerKey() if self._needs_tls() else None
            return None
        self._release()
        alloc = allocation_for(request, self.python)
        alloc.wait(progress)
        self.alloc = alloc
        self.tls_key = tls.ServerKey() if self._needs_tls() else None
        return alloc.describe() + (" (control channel: TLS)" if self.tls_key else "")

    def serves(self, plan: Plan) -> bool:
        """Whether the allocation held can run ``plan``'s ranks (a pool of another -n inside it)."""
        return plan.slurm is not None and self.alloc is not None and self.alloc.alive() and self.alloc.fits(plan.slurm)

    def _needs_tls(self) -> bool:
        """TLS whenever a node is not this machine (its address is not ours), or when forced."""
        assert self.alloc is not None
        return tls.forced() or not all(is_local_ip(address_family(a), a) for a in self.alloc.addrs)

    def placed(self, plan: Plan, avoid: int = 0) -> Plan:
        """The plan with MASTER_ADDR the first node's address and a MASTER_PORT for it: below the usual ephemeral range
        (32768-60999, where the ranks' own connections take their source ports), not the control port, free if it is here."""
        assert self.alloc is not None
        addr = self.alloc.addrs[0]
        if plan.port_was_given:
            return replace(plan, master_addr=addr)
        local = is_local_ip(address_family(addr), addr)
        for _ in range(100):
            port = random.randint(MASTER_PORTS[0], MASTER_PORTS[1])
            if port != avoid and (not local or port_free(addr, port)):
                break
        return replace(plan, master_addr=addr, master_port=port)

    def listen_addr(self, asked: Optional[str], default: str) -> str:
        """--control-addr, else the address this machine reaches the first node from (never every interface)."""
        if asked:
            return asked
        assert self.alloc is not None
        addr = self.alloc.addrs[0]
        return route_source(address_family(addr), addr) or default

    def tls_server(self) -> Optional[tls.ServerKey]:
        return self.tls_key

    # ------------------------------------------------------------ steps
    def launch(self, plan: Plan, base_env: Dict[str, str], control_addr: str, control_port: int, store_path: Optional[str] = None) -> Optional[str]:
        """One step, every rank a task of it. ``store_path`` is unused: ranks on several hosts meet at rank 0's TCP store."""
        assert self.alloc is not None and self.alloc.job_id is not None and plan.slurm is not None
        self._end_steps()
        self.plan = plan
        common = {k: v for k, v in plan.rank_env(0).items() if k not in PER_RANK}
        env = dict(base_env, **common)
        env[slurm_env.SECRET_ENV] = self.secret.hex()
        env[slurm_env.CONNECT_ENV] = f"{control_addr}:{control_port}"
        if self.tls_key is not None:
            env[slurm_env.TLS_ENV] = self.tls_key.fingerprint
        self._step_env = env
        self._srun(plan.slurm.srun_argv(self.alloc.job_id, [self.python, *WORKER]), env, list(range(plan.world_size)))
        return None

    def _srun(self, argv: List[str], env: Dict[str, str], ranks: List[int]) -> None:
        proc = subprocess.Popen(pdeathsig_prefix() + argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, env=env,
                                start_new_session=True, close_fds=True)
        self.steps[proc] = ranks

    def spawn(self, rank: int, config: dict) -> None:
        """Start one rank again, alone: a one-task step on the node it ran on, told its place (recovery.py)."""
        assert self.alloc is not None and self.alloc.job_id is not None and self.plan is not None and self.plan.slurm is not None
        per_node = self.plan.slurm.ntasks_per_node
        node = rank // per_node
        env = dict(self._step_env, **{k: v for k, v in config["env"].items() if k not in PER_RANK})
        env.update({"DDP_MAGIC_RANK": str(rank), "DDP_MAGIC_LOCAL_RANK": str(rank % per_node), "DDP_MAGIC_NODE_RANK": str(node)})
        env[slurm_env.CONNECT_ENV] = f"{config['kernel_addr']}:{config['kernel_port']}"
        self._pids = {pid: r for pid, r in self._pids.items() if r != rank}  # its new process has not joined yet
        self._srun(self.plan.slurm.srun_argv(self.alloc.job_id, [self.python, *WORKER], node=self.alloc.nodes[node]), env, [rank])

    def node_of(self, rank: int) -> str:
        """The Slurm node a rank runs on (the block distribution the step asks for)."""
        if self.alloc is None or self.plan is None or self.plan.slurm is None:
            return ""
        return self.alloc.nodes[rank // self.plan.slurm.ntasks_per_node]

    def adopt(self, pid: int, rank: int, host: str) -> None:
        self._pids[pid] = rank

    def live_pids(self) -> Dict[int, int]:
        """None to signal: the tasks are slurmstepd's children, perhaps on other hosts; they end by message or with the step."""
        return {}

    def owns(self, pid: int) -> bool:
        return False

    def poll(self, timeout: float = 0.0) -> List[Exit]:
        """Reap srun clients whose step ended. A joined rank's exit is its lost connection (no exit code reaches us); a step
        that ended before its ranks joined (srun refused it, a task failed to start) is every such rank's exit, with srun's code."""
        if timeout:
            time.sleep(min(timeout, 0.05))
        out: List[Exit] = []
        for proc, ranks in list(self.steps.items()):
            code = proc.poll()
            if code is None:
                continue
            del self.steps[proc]
            joined = set(self._pids.values())
            out += [(r, 0, code or 1) for r in ranks if r not in joined]
        return out

    def alive(self) -> bool:
        return self.alloc is not None and self.alloc.alive()

    def job_id(self) -> Optional[str]:
        return self.alloc.job_id if self.alloc is not None else None

    def where(self) -> str:
        """'Slurm job 18 running on n1,n2: allocated for this kernel, ...' (squeue asked now)."""
        if self.alloc is None or self.alloc.job_id is None:
            return ""
        info = cli.job(self.alloc.job_id)
        return self.alloc.describe().replace(f"job {self.alloc.job_id} ", f"job {self.alloc.job_id} ({info.state}) ", 1)

    def _end_steps(self) -> None:
        """SIGTERM to each srun still running (it cancels its step: every task ends), then make sure."""
        steps, self.steps = list(self.steps), {}
        for proc in steps:
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + STEP_END_WAIT_S
        for proc in steps:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.debug("srun %s did not end on SIGTERM; killing it", proc.pid, exc_info=True)
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        self._pids.clear()

    def _release(self) -> None:
        self._end_steps()
        alloc, self.alloc = self.alloc, None
        if alloc is not None:
            alloc.release()
        self.tls_key = None

    def close(self) -> None:
        """End our steps, and release the allocation if it is ours (one the kernel found stays)."""
        self._release()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        log.debug("srun %s: already gone", proc.pid, exc_info=True)



def port_free(addr: str, port: int) -> bool:
    """Whether ``port`` binds on ``addr`` now (this machine's address only)."""
    try:
        with socket.socket(address_family(addr), socket.SOCK_STREAM) as s:
            s.bind((addr, port))
        return True
    except OSError:
        return False


def preview(plan: Plan) -> "tuple[Plan, List[Check]]":
    """What %ddp_env --slurm shows without allocating: Slurm's verdict on the request (--test-only) and, inside an
    allocation, the first node's real address as MASTER_ADDR."""
    request = plan.slurm
    assert request is not None
    why = cli.installed()
    if why:
        return plan, [Check("Slurm commands", False, why)]
    argv = request.step_test_argv(str(request.job_id)) if request.found else request.test_argv()
    refused = cli.test_request(argv)
    verdict = Check("Slurm takes the request", not refused, f"{argv[0]} --test-only: " + (refused or "accepted (nothing was submitted)"))
    if not request.found:
        return replace(plan, master_addr="(NodeAddr of the first node, once allocated)"), [verdict]
    nodes = cli.hostnames(os.environ.get("SLURM_JOB_NODELIST") or cli.job(str(request.job_id)).nodelist)
    return (replace(plan, master_addr=cli.node_addr(nodes[0])) if nodes else plan), [verdict]
