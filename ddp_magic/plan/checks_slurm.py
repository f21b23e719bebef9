"""A Slurm pool's checks, and what a local pool inherits from a kernel inside a Slurm job: pure functions over the request and env.

Whether Slurm itself would take the request (``sbatch --test-only`` / ``srun --test-only``)
asks Slurm, so it is the launcher's (kernel/launchers/slurm.py ``preflight``), not a check here.
"""
from __future__ import annotations

import shlex
import sys
from typing import List, Mapping

from .check import Check
from .slurm import TASK_VARS, SlurmRequest

TEMPLATE = ["-m", "ddp_magic.procs.slurm_template"]  # the task a node runs: its template, which forks the ranks
HOLD = ["-m", "ddp_magic.procs.slurm_hold"]


def slurm_checks(request: SlurmRequest, python: str = sys.executable) -> List[Check]:
    """Where the ranks run and the command lines that start them (what %ddp_env --slurm shows; nothing is allocated)."""
    commands = request.materialize([python, *TEMPLATE], [python, *HOLD])
    lines = ([f"salloc: {shlex.join(commands.salloc)}"] if commands.salloc else []) + [f"srun: {shlex.join(commands.srun)}"]
    checks = [Check("Slurm allocation", True, request.describe(), level="info"), Check("Slurm commands", True, "; ".join(lines), level="info")]
    if request.gpus_per_node and request.gpus_per_node < request.ntasks_per_node:
        checks.append(Check("GPUs per node", False, f"--gpus-per-node {request.gpus_per_node} for --ntasks-per-node {request.ntasks_per_node}: "
                            f"nccl needs one GPU per rank; give --gpus-per-node {request.ntasks_per_node} or --backend gloo", level="warning"))
    return checks


def check_task_vars(environ: Mapping[str, str], slurm: bool) -> Check:
    """SLURM_PROCID and friends in the kernel's env (it runs inside a Slurm job): never passed on to a rank."""
    found = [k for k in TASK_VARS if k in environ]
    name = "Slurm task variables"
    if not found:
        return Check(name, True, "none in the kernel's env", level="info")
    listed = ", ".join(f"{k}={environ[k]}" for k in found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
    if slurm:
        return Check(name, True, f"the kernel has {listed}: its ranks get their own from Slurm (RANK from SLURM_PROCID, ...)", level="info")
    return Check(name, True, f"the kernel has {listed} (it runs inside Slurm job {environ.get('SLURM_JOB_ID', '?')}): removed from the "
                 "local ranks' env, so no library takes them for Slurm task 0; %%ddp --slurm runs the ranks in that job", level="info")
