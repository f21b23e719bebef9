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
from dataclasses import replace
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from ...plan.check import Check
from ...plan.checks_slurm import TEMPLATE
from ...logs import log
from ...plan.net import address_family, is_local_ip, master_port, route_source
from ...wire import slurm_env, tls
# not ``from . import slurm_cli``: that imports this package, whose __init__ imports this module
from .slurm_cli import down_nodes, hostnames, installed, job as slurm_job, node_addr, test_request
from .base import LaunchError
from .forkserver import import_env
from .nodes import NodeLauncher
from .slurm_alloc import Allocation, OwnAllocation, Progress, allocation_for, released_text
from .slurm_steps import TemplateStep, rank_env

if TYPE_CHECKING:
    from ...plan.plan import Plan


class SlurmLauncher(NodeLauncher):
    """Ranks forked by one template a node (the tasks of an srun step); the allocation and the templates are held across
    restarts and released by ``close``. What it shares with SSH's launcher is nodes.py's."""

    name = "slurm"

    def __init__(self, secret: bytes, python: str = sys.executable) -> None:
        super().__init__(secret, python)
        self.alloc: Optional[Allocation] = None

    def nodes(self) -> List[str]:
        return self.alloc.nodes if self.alloc is not None else []

    def _rank_env(self, rank: int, env: Dict[str, str]) -> Tuple[int, Dict[str, str]]:
        assert self.plan is not None
        return rank_env(self.plan, rank, env)

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

    def alive(self) -> bool:
        return self.alloc is not None and self.alloc.alive()

    def lost(self) -> str:
        """Slurm ended our allocation under us (a node failed, the job was cancelled): the next start allocates again."""
        alloc = self.alloc
        if isinstance(alloc, OwnAllocation) and alloc.job_id and not alloc.alive():
            return f"{alloc.gone_why(down_nodes(alloc.nodes))}; a new allocation replaces it"
        return ""

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

    def lease_bind(self) -> str:
        """Where the lease holder listens when its node is another host (over TCP and TLS: procs/lease.py); "" when every
        node is this host (its lease socket in the runtime directory, as a fork server's)."""
        alloc = self.alloc
        if alloc is None or all(is_local_ip(address_family(a), a) for a in alloc.addrs):
            return ""
        return alloc.addrs[0]

    def kept_blob(self) -> Dict[str, object]:
        """What a kernel that attaches the kept pool needs to fork a rank again (kernel/keep/launcher.py): nodes, step env."""
        assert self.alloc is not None and self.plan is not None and self.plan.slurm is not None
        return {"nodes": self.alloc.nodes[: self.plan.slurm.nodes], "step_env": self.steps[0].env, "job": self.job_id()}

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
