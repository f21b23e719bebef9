"""The Slurm launcher: one template a node (a task of one srun step) forks that node's ranks, in an allocation the kernel found or made (slurm_alloc.py).

``acquire`` waits for the allocation (the ranks are QUEUED meanwhile) and learns its
nodes' addresses; ``launch`` starts one ``srun --ntasks-per-node=1`` step whose task on
each node is ``python -m ddp_magic.procs.slurm_template``: it imports torch once and forks
the node's ranks as the kernel asks (spawn commands on srun's stdin, slurm_steps.py), each
with torchrun's env for its rank (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
NODE_RANK/GROUP_RANK, MASTER_ADDR, MASTER_PORT) and its own Slurm task variables; a rank
dials back to the kernel. The step's env carries what every rank shares: the pool's
secret, the control address, the certificate fingerprint when the channel is TLS (ranks on
other hosts, or DDP_MAGIC_FORCE_TLS=1). MASTER_ADDR is the first node's NodeAddr.

A rank that died is forked again by its node's template (``spawn``); only a node whose
template is gone gets a new one, a one-task step on it in the same allocation. The
allocation and the templates outlive pool restarts (a new -n inside it forks from the same
templates: no new queue wait, no new import) and end with ``close``; an allocation the
kernel found is never cancelled, only our steps end.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from ...plan.check import Check
from ...plan.checks_slurm import TEMPLATE
from ...logs import log
from ...plan.net import address_family, is_local_ip, master_port, route_source
from ...wire import slurm_env, tls
from ...wire.kept import is_held
# not ``from . import slurm_cli``: that imports this package, whose __init__ imports this module
from .slurm_cli import down_nodes, hostnames, installed, job as slurm_job, node_addr, test_request
from .base import Exit, LaunchError, Launcher
from .forkserver import import_env
from .slurm_alloc import Allocation, OwnAllocation, Progress, allocation_for, released_text
from .slurm_steps import END_WAIT_S, TemplateStep, rank_env, spawn_config

if TYPE_CHECKING:
    from ...plan.plan import Plan


@dataclass
class Pending:
    """A rank asked of a template that has not joined yet: where, its pid once forked, and how to ask again."""

    node: str
    step: TemplateStep
    args: Tuple[Dict[str, str], str, int]
    pid: Optional[int] = None
    retried: bool = False


class SlurmLauncher(Launcher):
    """Ranks forked by one template a node (the tasks of an srun step); the allocation and the templates are held across restarts and released by ``close``."""

    name = "slurm"
    remote_ranks = True  # the nodes may be other hosts: ranks are asked to exit by message, a closed connection is an exit
    reports_exits = False  # srun's tasks are not our children: a lost control connection is the exit
    keeps_template = True  # the allocation is this launcher's template: a restart keeps it
    replaces_ranks = True  # a dead rank is forked again by its node's template (a new one only if that is gone)
    released = ""  # once the pool stopped: what became of its job (released_text), for %ddp stop to say

    def __init__(self, secret: bytes, python: str = sys.executable) -> None:
        super().__init__(secret, python)
        self.alloc: Optional[Allocation] = None
        self.steps: List[TemplateStep] = []  # our srun steps of node templates: the pool's, and one a node whose template was lost
        self._pending: Dict[int, Pending] = {}  # ranks asked for that have not joined yet
        self.tls_key: Optional[tls.ServerKey] = None
        self.plan: Optional[Plan] = None
        self._pids: Dict[int, int] = {}  # pid -> rank, as the ranks said in their HELLO (not ours to signal)

    def start(self, timeout: float = 0) -> str:
        return "slurm (a template a node, in srun job steps)"

    # ------------------------------------------------------------ the allocation
    def acquire(self, plan: Plan, progress: Progress) -> Optional[str]:
        """The allocation the plan's request runs in: the one held if it fits, else the kernel's own, else a new one (queued meanwhile)."""
        why = installed()
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
        return replace(plan, master_addr=addr, master_port=master_port(addr, avoid, local=is_local_ip(address_family(addr), addr)))

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
        """Every rank, forked by its node's template: the templates running already (a new -n in the same allocation)
        where their imports still fit, else one new step of them. ``store_path`` is unused: ranks on several hosts meet
        at rank 0's TCP store."""
        assert self.alloc is not None and self.alloc.job_id is not None and plan.slurm is not None
        self.plan = plan
        nodes = self.alloc.nodes[: plan.slurm.nodes]
        if not self._templates_fit(nodes, base_env):
            self._end_steps()
            env = dict(base_env, **{slurm_env.CONNECT_ENV: f"{control_addr}:{control_port}"})
            if self.tls_key is not None:
                env[slurm_env.TLS_ENV] = self.tls_key.fingerprint
            self._start_step(nodes, env)
        self._pids.clear()
        for rank in range(plan.world_size):
            self._spawn(rank, base_env, control_addr, control_port)
        return None

    def _templates_fit(self, nodes: List[str], base_env: Dict[str, str]) -> bool:
        """Whether the running templates serve ``nodes`` and imported what ``base_env`` would import (forkserver's rule)."""
        steps = [self._step_for(n) for n in nodes]
        return all(s is not None and import_env(s.env) == import_env(base_env) for s in steps)

    def _start_step(self, nodes: List[str], env: Dict[str, str]) -> TemplateStep:
        assert self.alloc is not None and self.alloc.job_id is not None and self.plan is not None and self.plan.slurm is not None
        argv = self.plan.slurm.srun_argv(self.alloc.job_id, [self.python, *TEMPLATE], node=nodes[0] if len(nodes) == 1 else None)
        env = dict(env, **slurm_env.secret_env(self.secret, len(nodes), env))  # sealed by MUNGE: srun's wire is clear
        step = TemplateStep(argv, env, self.secret, nodes, self.log)
        self.steps.append(step)
        return step

    def _step_for(self, node: str) -> Optional[TemplateStep]:
        """The newest step whose template on ``node`` is still there."""
        return next((s for s in reversed(self.steps) if s.serves(node)), None)

    def _spawn(self, rank: int, env: Dict[str, str], control_addr: str, control_port: int) -> None:
        """Ask ``rank``'s node's template to fork it; a node whose template is gone gets a new one (a one-task step)."""
        assert self.alloc is not None and self.plan is not None
        node_rank, wanted = rank_env(self.plan, rank, env)
        node = self.alloc.nodes[node_rank]
        step = self._step_for(node)
        if step is None:
            first = self.steps[0].env if self.steps else wanted
            step = self._start_step([node], first)
        config = spawn_config(step.env, wanted, control_addr, control_port, self.tls_key.fingerprint if self.tls_key is not None else None)
        self._pending[rank] = Pending(node, step, (env, control_addr, control_port))
        step.spawn(rank, node, config, self.secret)

    def spawn(self, rank: int, config: dict) -> None:
        """Start one rank again, alone: its node's template forks it (recovery.py); a new template only if that one is gone."""
        assert self.plan is not None
        self._pids = {pid: r for pid, r in self._pids.items() if r != rank}  # its new process has not joined yet
        self._spawn(rank, config["env"], config["kernel_addr"], config["kernel_port"])

    def node_of(self, rank: int) -> str:
        """The Slurm node a rank runs on (the block distribution the step asks for)."""
        if self.alloc is None or self.plan is None or self.plan.slurm is None:
            return ""
        return self.alloc.nodes[rank // self.plan.slurm.ntasks_per_node]

    def placement(self, plan: Plan) -> Dict[int, str]:
        """The block distribution the step asks for, over the allocation held."""
        per_node, nodes = (plan.slurm.ntasks_per_node, self.alloc.nodes) if self.alloc is not None and plan.slurm is not None else (1, [])
        return {r: nodes[r // per_node] for r in range(plan.world_size) if r // per_node < len(nodes)}

    def adopt(self, pid: int, rank: int, host: str) -> None:
        self._pids[pid] = rank
        self._pending.pop(rank, None)

    def live_pids(self) -> Dict[int, int]:
        """None to signal: the ranks are the templates' children, perhaps on other hosts; they end by message or with the step."""
        return {}

    def owns(self, pid: int) -> bool:
        return False

    def poll(self, timeout: float = 0.0) -> List[Exit]:
        """Ranks that ended before they joined: a fork that failed, or its template gone (srun's words in the log). A
        joined rank's exit is its lost connection (remote_ranks); ours to report are only those the kernel cannot see."""
        if timeout:
            time.sleep(min(timeout, 0.05))
        out: List[Exit] = [e for step in list(self.steps) for e in self._exits_before_joining(step)]
        for rank, waiting in list(self._pending.items()):
            if waiting.step.serves(waiting.node):
                continue
            del self._pending[rank]
            if waiting.pid is None and not waiting.retried:  # asked of a template that was already gone: a new one forks it
                self._spawn(rank, *waiting.args)
                self._pending[rank].retried = True
            else:  # its template ended (or never started): srun's words are in the log
                out.append((rank, waiting.pid or 0, 1))
        return out

    def _exits_before_joining(self, step: TemplateStep) -> List[Exit]:
        """What ``step``'s templates said of the ranks still pending: their pids, and the exits of those that never joined."""
        out: List[Exit] = []
        for ev in step.take_events():
            rank, pid = ev.get("rank"), int(ev.get("pid") or 0)
            waiting = self._pending.get(rank) if isinstance(rank, int) else None
            if not isinstance(rank, int) or waiting is None or waiting.step is not step:
                continue
            if ev.get("event") == "spawned":
                waiting.pid = pid
            elif ev.get("event") == "exited" and waiting.pid == pid:
                del self._pending[rank]
                out.append((rank, pid, int(ev.get("code") or 1)))
        return out

    def alive(self) -> bool:
        return self.alloc is not None and self.alloc.alive()

    def lost(self) -> str:
        """Slurm ended our allocation under us (a node failed, the job was cancelled): the next start allocates again."""
        alloc = self.alloc
        if isinstance(alloc, OwnAllocation) and alloc.job_id and not alloc.alive():
            return f"{alloc.gone_why(down_nodes(alloc.nodes))}; a new allocation replaces it"
        return ""

    def unanswered(self, nodes: List[str], within: float) -> List[str]:
        """Each node's template is pinged over srun (the way a new rank's spawn and events take); the nodes that did not
        answer within ``within`` seconds. A node with no template left is not asked: a new step there says for itself."""
        deadline = time.monotonic() + within
        asked: Dict[TemplateStep, Dict[str, int]] = {}
        for node in nodes:
            step = self._step_for(node)
            if step is not None:
                asked.setdefault(step, {})[node] = step.ping(node)
        return [n for step, pings in asked.items() for n in step.wait_pongs(pings, deadline)]

    def cannot_reach(self) -> List[dict]:
        return [ev for step in self.steps for ev in step.unreachable]

    def give_up(self) -> str:
        """End the steps, and release the allocation if we made it (one the kernel found stays: it is the user's)."""
        alloc = self.alloc
        self._release()
        if alloc is None or alloc.job_id is None:
            return "nothing is held"
        return f"Slurm job {alloc.job_id} was released" if isinstance(alloc, OwnAllocation) else f"Slurm job {alloc.job_id} (yours) stays"

    def job_id(self) -> Optional[str]:
        return self.alloc.job_id if self.alloc is not None else None

    def where(self) -> str:
        """'Slurm job 18 running on n1,n2: allocated for this kernel, ...' (squeue asked now)."""
        if self.alloc is None or self.alloc.job_id is None:
            return ""
        info = slurm_job(self.alloc.job_id)
        return self.alloc.describe().replace(f"job {self.alloc.job_id} ", f"job {self.alloc.job_id} ({info.state}) ", 1)

    # ------------------------------------------------------------ a kept pool (kernel/keep/keeping.py, docs/keep.md)
    def keepable(self) -> str:
        """Why this pool cannot outlive its kernel ("" when it can): the allocation must be ours (the kernel's own job ends
        with it), and its templates one step (the lease's holder and followers hear the keep together)."""
        alloc = self.alloc
        if not isinstance(alloc, OwnAllocation) or alloc.proc is None:
            return f"it runs in the kernel's own Slurm job {self.job_id()}, which ends with its kernel"
        if len(self.steps) != 1:
            return "a node's template was started again in a step of its own"
        return ""

    @property
    def lease_node(self) -> str:
        """The node whose template holds a kept pool's lease (its other templates follow it)."""
        return self.alloc.nodes[0] if self.alloc is not None and self.alloc.nodes else ""

    def lease_bind(self) -> str:
        """Where the lease holder listens when its node is another host (over TCP and TLS: procs/lease.py); "" when every
        node is this host (its lease socket in the runtime directory, as a fork server's)."""
        alloc = self.alloc
        if alloc is None or all(is_local_ip(address_family(a), a) for a in alloc.addrs):
            return ""
        return alloc.addrs[0]

    def follow_lease(self, pool_id: str, at: Dict[str, object], spools: str, secret: bytes) -> None:
        """The holder's lease is up: every other node's template follows it there (procs/template_keep.py ``follow``)."""
        self._write({"op": "follow", "node": self.lease_node, "id": pool_id, "lease": at, "dir": spools, "secret": secret.hex()})

    def kept_blob(self) -> Dict[str, object]:
        """What a kernel that attaches the kept pool needs to fork a rank again (kernel/keep/launcher.py): nodes, step env."""
        assert self.alloc is not None and self.plan is not None and self.plan.slurm is not None
        return {"nodes": self.alloc.nodes[: self.plan.slurm.nodes], "step_env": self.steps[0].env, "job": self.job_id()}

    @property
    def notes(self) -> List[dict]:
        """What the templates answered to keep and unkeep."""
        return self.steps[0].notes if self.steps else []

    def _write(self, cmd: dict) -> None:
        """A command to every template (keep, unkeep)."""
        for step in self.steps:
            step.command(cmd)

    def outlive_kernel(self, lock: str, watch: Optional[Dict[str, object]] = None) -> None:
        """``%ddp keep``: the allocation follows the lease's ``lock``, and salloc and srun outlive this kernel; ``lock=""``
        (``keep --off``): they go with this kernel again. ``watch``: a lease on another host, whose ``lock`` here the
        allocation's holder takes while it follows the lease over the network (procs/lease_watch.py)."""
        alloc = self.alloc
        assert isinstance(alloc, OwnAllocation)
        line = (f"watch {json.dumps(watch)}" if watch else f"lease {lock}") if lock else f"kernel {os.getpid()}"
        for follow in [lambda: alloc.follow(line, keep=bool(lock))] + [lambda s=s: s.outlive_kernel(bool(lock)) for s in self.steps]:
            try:
                follow()
            except OSError:  # salloc's or srun's side is gone (the job was cancelled): nothing of it to tie to this kernel
                if lock:
                    raise
                log.debug("a kept pool's allocation or step was gone already", exc_info=True)
        self.lease_lock = lock

    def detach(self) -> None:
        """The kept pool is no more this kernel's (its exit, or another kernel took it): forget it, end nothing."""
        for proc in [s.proc for s in self.steps] + [getattr(self.alloc, "proc", None)]:
            if proc is not None and proc.stdin is not None:
                try:
                    proc.stdin.close()
                except OSError:
                    log.debug("a kept pool's pipe was closed already", exc_info=True)
        self.steps, self.alloc, self._pids, self.lease_lock = [], None, {}, ""
        self._pending.clear()

    lease_lock = ""  # a kept pool's: the lock its lease holds (outlive_kernel)

    def _end_steps(self) -> None:
        """End every step of templates (srun cancels it: every rank ends), then make sure. A kept pool's lease ends
        first as ``%ddp stop`` ends it (its files go), not as a job Slurm ended."""
        if self.lease_lock:
            self._write({"op": "exit"})
            deadline = time.monotonic() + END_WAIT_S
            while is_held(self.lease_lock) and time.monotonic() < deadline:
                time.sleep(0.02)
            self.lease_lock = ""
        steps, self.steps = self.steps, []
        for step in steps:
            step.end()
        deadline = time.monotonic() + END_WAIT_S
        for step in steps:
            step.wait_end(deadline)
        self._pids.clear()
        self._pending.clear()

    def _release(self) -> None:
        self._end_steps()
        alloc, self.alloc = self.alloc, None
        if alloc is not None:
            alloc.release()
            self.released = released_text(alloc, self.silent_since)
        self.tls_key = None

    def close(self) -> None:
        """End our steps, and release the allocation if it is ours (one the kernel found stays)."""
        self._release()


def preview(plan: Plan) -> "tuple[Plan, List[Check]]":
    """What %ddp_env --slurm shows without allocating: Slurm's verdict on the request (--test-only) and, inside an
    allocation, the first node's real address as MASTER_ADDR."""
    request = plan.slurm
    assert request is not None
    why = installed()
    if why:
        return plan, [Check("Slurm commands", False, why)]
    argv = request.step_test_argv(str(request.job_id)) if request.found else request.test_argv()
    refused = test_request(argv)
    verdict = Check("Slurm takes the request", not refused, f"{argv[0]} --test-only: " + (refused or "accepted (nothing was submitted)"))
    if not request.found:
        return replace(plan, master_addr="(NodeAddr of the first node, once allocated)"), [verdict]
    nodes = hostnames(os.environ.get("SLURM_JOB_NODELIST") or slurm_job(str(request.job_id)).nodelist)
    return (replace(plan, master_addr=node_addr(nodes[0])) if nodes else plan), [verdict]
