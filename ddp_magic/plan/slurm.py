"""What ``--slurm`` asked for: a frozen SlurmRequest whose ``materialize()`` is the salloc and srun argv, pure and unit-tested.

Nothing here starts a process or asks Slurm anything: the request is built from
the magic's options and the kernel's env (``resolve``: an ``SLURM_JOB_ID`` there
means the kernel runs inside an allocation, which the pool uses and never
cancels), and turned into command lines. The launcher
(kernel/launchers/slurm.py) runs them; ``%ddp_env --slurm`` shows them.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import List, Mapping, NamedTuple, Optional, Sequence, Tuple

from ..errors import PlanError
from ..words import plural

JOB_ENV = "SLURM_JOB_ID"  # set in the kernel's env: it runs inside an allocation (salloc, sbatch, Open OnDemand)
JOB_NAME = "ddp_magic"
# What a process inside a Slurm job inherits that names a task: a rank of a local pool (or of our own step, which
# Slurm gives its own) must not see the kernel's, or Lightning, submitit and the like take every rank for task 0.
TASK_VARS = (
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "SLURM_NPROCS",
    "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES", "SLURM_GTIDS", "SLURM_TASK_PID",
)
# The options the pool writes itself; in --slurm-args they would contradict the step it starts.
OWN_OPTIONS = ("--jobid", "--ntasks", "-n", "--nodes", "-N", "--ntasks-per-node", "--nodelist", "-w", "--overlap", "--export", "--input")


def _positive(name: str, value: Optional[int]) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise PlanError(f"--{name.replace('_', '-')} must be a whole number, 1 or more (got {value!r})")


def split_args(text: str) -> Tuple[str, ...]:
    """--slurm-args "--qos=high --constraint=a100" as words, split like a shell."""
    try:
        return tuple(shlex.split(text or ""))
    except ValueError as e:
        raise PlanError(f"--slurm-args {text!r}: {e}") from None


def check_args(words: Sequence[str]) -> None:
    """The pool's own options in --slurm-args are a PlanError naming them (they would contradict the step it starts)."""
    own = [w for w in words if w.split("=")[0] in OWN_OPTIONS]
    if own:
        raise PlanError(f"--slurm-args {' '.join(words)!r}: {', '.join(own)} is the pool's to set; use --nodes / --ntasks-per-node / -n instead")


def _cpus_per_task(words: Sequence[str]) -> Tuple[int, List[str]]:
    """(CPUs a rank asked for in --slurm-args (--cpus-per-task / -c; 1 when not), the other words): the node's template,
    one task for all the node's ranks, asks that many times its ranks."""
    per_rank, rest, i = 1, [], 0
    while i < len(words):
        word = words[i]
        name, eq, value = word.partition("=")
        if name in ("--cpus-per-task", "-c"):
            if not eq and i + 1 < len(words):
                i, value = i + 1, words[i + 1]
            per_rank = int(value) if value.isdigit() else per_rank
        elif word.startswith("-c") and word[2:].isdigit():
            per_rank = int(word[2:])
        else:
            rest.append(word)
        i += 1
    return per_rank, rest


@dataclass(frozen=True)
class SlurmRequest:
    """A pool's Slurm request: the allocation's shape and options (or the allocation found), and the step's."""

    nodes: int = 1
    ntasks_per_node: int = 1
    partition: Optional[str] = None
    time: Optional[str] = None  # --time as Slurm reads it (2:00:00, 1-0, 30)
    gpus_per_node: Optional[int] = None
    account: Optional[str] = None
    extra: Tuple[str, ...] = ()  # --slurm-args, split like a shell (a str is split)
    job_id: Optional[str] = None  # the allocation the kernel runs inside: used, never cancelled
    queue_timeout: Optional[float] = None  # --start-timeout: how long the job may stay queued (None: until Ctrl-C)

    def __post_init__(self) -> None:
        for name in ("nodes", "ntasks_per_node", "gpus_per_node"):
            _positive(name, getattr(self, name))
        object.__setattr__(self, "extra", split_args(self.extra) if isinstance(self.extra, str) else tuple(self.extra))
        check_args(self.extra)
        if self.queue_timeout is not None and self.queue_timeout <= 0:
            raise PlanError(f"--start-timeout must be more than 0 seconds (got {self.queue_timeout!r})")

    @property
    def world_size(self) -> int:
        return self.nodes * self.ntasks_per_node

    @property
    def found(self) -> bool:
        """The kernel runs inside an allocation: the pool launches into it and never cancels it."""
        return self.job_id is not None

    def allocation_options(self) -> List[str]:
        """What salloc (and sbatch --test-only) is given: the allocation's shape, then the user's own options."""
        opts = [f"--nodes={self.nodes}", f"--ntasks-per-node={self.ntasks_per_node}", f"--job-name={JOB_NAME}"]
        for flag, value in (("--partition", self.partition), ("--time", self.time), ("--gpus-per-node", self.gpus_per_node), ("--account", self.account)):
            if value is not None:
                opts.append(f"{flag}={value}")
        return opts + list(self.extra)

    def job_options(self) -> List[str]:
        """The options a batch job of the same request carries (%ddp_export --slurm's #SBATCH lines; the shape is its own)."""
        opts = [f"{flag}={value}" for flag, value in (("--partition", self.partition), ("--time", self.time), ("--account", self.account))
                if value is not None]
        return opts + list(self.extra)

    def salloc_argv(self, hold: Sequence[str]) -> List[str]:
        """salloc running ``hold`` (a process that ends when the kernel does, so the allocation ends with it)."""
        return ["salloc", *self.allocation_options(), *hold]

    def test_argv(self) -> List[str]:
        """sbatch --test-only: Slurm checks the request (partition, account, gres, limits) and submits nothing."""
        return ["sbatch", "--test-only", *self.allocation_options(), "--wrap", "true"]

    def srun_argv(self, job_id: str, command: Sequence[str], node: Optional[str] = None) -> List[str]:
        """One job step in ``job_id`` with one task a node, the node's template (procs/slurm_template.py), which forks
        the node's ranks: on every node of the request (``node`` None), or on ``node`` alone (its template was lost).

        The task gets the CPUs (and --gpus-per-node GPUs) of the node's ranks; --overlap lets a replacement step share
        the first step's; --kill-on-bad-exit=0 keeps the other nodes when one template dies; --input=all gives every
        template the kernel's commands (srun's stdin); the env (the secret in it) travels with --export=ALL, never argv."""
        count = 1 if node else self.nodes
        per_rank, extra = _cpus_per_task(self.extra)
        shape = [f"--nodes={count}", f"--ntasks={count}", "--ntasks-per-node=1", f"--cpus-per-task={self.ntasks_per_node * per_rank}"]
        shape += [f"--nodelist={node}"] if node else []
        gpus = [f"--gpus-per-node={self.gpus_per_node}"] if self.gpus_per_node else []
        extra = extra if self.found else []  # inside an allocation found, the step is all we submit
        return ["srun", f"--jobid={job_id}", *shape, *gpus, "--overlap", "--kill-on-bad-exit=0", "--mpi=none", "--input=all",
                "--export=ALL", f"--job-name={JOB_NAME}", *extra, *command]

    def step_test_argv(self, job_id: str) -> List[str]:
        """srun --test-only of the step: Slurm reads every option (--slurm-args too) and starts nothing."""
        argv = self.srun_argv(job_id, ["true"])
        return [argv[0], "--test-only", *argv[1:]]

    def materialize(self, command: Sequence[str], hold: Sequence[str], job_id: Optional[str] = None) -> "SlurmCommands":
        """The command lines of a pool: salloc (None inside an allocation) and the ranks' step (job id ``$JOB`` until known)."""
        job = job_id or self.job_id
        salloc = None if self.found else self.salloc_argv(hold)
        return SlurmCommands(salloc, self.srun_argv(job or "$SLURM_JOB_ID", command))

    def shape_text(self) -> str:
        """'2 nodes × 4 tasks (partition gpu, time 2:00:00)': what a change of request says."""
        opts = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in (("partition", self.partition), ("time", self.time),
                         ("gpus_per_node", self.gpus_per_node), ("account", self.account)) if v is not None)
        extra = (" " + " ".join(self.extra)) if self.extra else ""
        return f"{plural(self.nodes, 'node')} × {plural(self.ntasks_per_node, 'task')}" + (f" ({opts})" if opts else "") + extra

    def describe(self) -> str:
        """One line for %ddp_env and %ddp status: where the ranks run."""
        shape = self.shape_text()
        if self.found:
            return f"inside Slurm job {self.job_id} (found in the kernel's env; ddp_magic never cancels it): {shape}"
        return f"a new Slurm allocation, ours (released when the pool stops or the kernel ends): {shape}"


class SlurmCommands(NamedTuple):
    salloc: Optional[List[str]]
    srun: List[str]


def _env_int(environ: Mapping[str, str], *names: str) -> Optional[int]:
    for name in names:
        text = environ.get(name, "").split("(")[0]  # SLURM_TASKS_PER_NODE reads "2(x2)"
        if text.isdigit():
            return int(text)
    return None


def resolve(nproc: Optional[int], nodes: Optional[int], ntasks_per_node: Optional[int], environ: Mapping[str, str],
            **options: object) -> Tuple[int, SlurmRequest]:
    """(world size, request) from the options and the kernel's env: inside an allocation its shape fills what was not given.

    -n alone inside an allocation of N nodes spreads over them when it divides evenly; -n with --nodes
    gives each node -n / nodes; nothing given outside an allocation is one node with -n tasks."""
    job = environ.get(JOB_ENV) or None
    for name, value in (("n", nproc), ("nodes", nodes), ("ntasks_per_node", ntasks_per_node)):
        _positive(name, value)
    if nodes is None and job is not None:
        there = _env_int(environ, "SLURM_JOB_NUM_NODES", "SLURM_NNODES") or 1
        nodes = there if nproc is None or nproc % there == 0 else 1
    nodes = nodes or 1
    if ntasks_per_node is None:
        if nproc is not None:
            if nproc % nodes:
                raise PlanError(f"-n {nproc} ranks do not split evenly over {nodes} nodes; give a multiple of {nodes} or --ntasks-per-node")
            ntasks_per_node = nproc // nodes
        else:
            ntasks_per_node = (_env_int(environ, "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE") if job else None) or 1
    if nproc is not None and nproc != nodes * ntasks_per_node:
        raise PlanError(f"-n {nproc} is not --nodes {nodes} × --ntasks-per-node {ntasks_per_node}; leave -n out or make them agree")
    request = SlurmRequest(nodes=nodes, ntasks_per_node=ntasks_per_node, job_id=job, **options)  # type: ignore[arg-type]
    return request.world_size, request
