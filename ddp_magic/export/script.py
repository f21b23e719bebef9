"""The exported files' text: the script (process group as the pool had it, then the cells) and the sbatch file.

Pure functions of a Selection (export/select.py) and the options: no files,
no processes, so every line is unit-tested. The script runs unchanged under
``torchrun --standalone --nproc-per-node N`` (one node), ``srun torchrun``
(the sbatch file, c10d rendezvous, the same options as the pool's own
multi-node command) or ``accelerate launch``: all of them set RANK,
LOCAL_RANK and WORLD_SIZE, which is all the script reads.
"""
from __future__ import annotations

import ast
import os
import shlex
from dataclasses import dataclass
from typing import List, Optional, Tuple

from ..kernel.launchers.torchrun import rendezvous_args
from ..kernel.texts import srun_prefix
from .record import DdpRun
from .select import Cell, Selection

RULE = "# " + "-" * 76
RESULT = "_ddp_result"
RESULTS_ENV = "DDP_EXPORT_RESULTS"  # --check: the folder each rank writes the final cell's value (its repr) to
PORT = 29500


@dataclass(frozen=True)
class Launch:
    """How the script is started: the ranks, nodes and launcher, as the emitted lines say."""

    nproc: int  # ranks in all
    nodes: int = 1
    gpus_per_node: Optional[int] = None  # None: as many ranks per node as the notebook's pool had
    accelerate: bool = False
    backend: str = "gloo"
    job_options: Tuple[str, ...] = ()  # more #SBATCH lines: a --slurm pool's partition, time, account, --slurm-args

    @property
    def per_node(self) -> int:
        return self.gpus_per_node or max(1, self.nproc // self.nodes)


def launch_line(script: str, launch: Launch) -> str:
    """The one-node command: what the user (or ``!`` in the notebook) runs."""
    name = shlex.quote(script)
    if launch.accelerate:
        multi = " --multi_gpu" if launch.backend != "gloo" and launch.nproc > 1 else ""
        return f"accelerate launch{multi} --num_processes {launch.nproc} {name}"
    return f"torchrun --standalone --nproc-per-node {launch.nproc} {name}"


def srun_line(script: str, launch: Launch) -> str:
    """The sbatch file's launch: one torchrun agent per node on a c10d rendezvous, as the pool's --nnodes command."""
    name = shlex.quote(script)
    if launch.accelerate:
        inner = (f"accelerate launch --num_machines {launch.nodes} --num_processes {launch.per_node * launch.nodes} "
                 f"--machine_rank $SLURM_NODEID --main_process_ip $MASTER_ADDR --main_process_port $MASTER_PORT "
                 f"--rdzv_backend c10d {name}")
        return f"{srun_prefix(launch.nodes)} bash -c {shlex.quote(inner)}"
    rdzv = rendezvous_args(launch.nodes, launch.per_node, '"$MASTER_ADDR:$MASTER_PORT"', '"$SLURM_JOB_ID"')
    return " ".join([srun_prefix(launch.nodes), "torchrun", *rdzv, name])


def sbatch_text(script: str, launch: Launch, job: str) -> str:
    """A Slurm batch file: the allocation, the rendezvous host (the job's first node) and the srun line."""
    gpus = [f"#SBATCH --gpus-per-node={launch.per_node}"] if launch.backend != "gloo" or launch.gpus_per_node else []
    return "\n".join([
        "#!/bin/bash",
        f"# Written by ddp_magic's %ddp_export for {script}. Submit it with: sbatch {shlex.quote(job)}",
        f"#SBATCH --job-name={os.path.splitext(os.path.basename(script))[0]}",
        f"#SBATCH --nodes={launch.nodes}",
        "#SBATCH --ntasks-per-node=1",
        *gpus,
        *(f"#SBATCH {opt}" for opt in launch.job_options),
        "set -euo pipefail",
        "# The job's first node hosts torchrun's c10d rendezvous; every node runs one agent with its ranks.",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"MASTER_PORT={PORT}",
        "export MASTER_ADDR MASTER_PORT",
        srun_line(script, launch),
        "",
    ])


def _init_function(run: DdpRun) -> List[str]:
    """The process group as the pool made it: its backend ("auto" decided per machine), timeout, one device per LOCAL_RANK."""
    if run.backend_asked == "auto":
        backend = 'backend = "nccl" if torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", "1")) else "gloo"'
        said = "nccl with a GPU per rank, else gloo (the pool's auto)"
    else:
        backend, said = f"backend = {run.backend_asked!r}", run.backend_asked
    return [
        "def _ddp_init_process_group():",
        f'    """The process group as the notebook\'s pool had it: {said}, timeout {run.pg_timeout:g} s, one device per LOCAL_RANK."""',
        "    import os",
        "    from datetime import timedelta",
        "",
        "    import torch",
        "    import torch.distributed as dist",
        "",
        '    local_rank = int(os.environ.get("LOCAL_RANK", "0"))',
        f"    {backend}",
        f'    kwargs = {{"timeout": timedelta(seconds={run.pg_timeout!r})}}',
        '    if backend == "nccl":',
        "        torch.cuda.set_device(local_rank)",
        '        kwargs["device_id"] = torch.device("cuda", local_rank)',
        "    dist.init_process_group(backend=backend, **kwargs)",
        "",
        "",
    ]


FINISH = [
    "def _ddp_save_result(value):",
    f'    """%ddp_export --check reads each rank\'s final value (its repr) from ${RESULTS_ENV}; otherwise nothing is written."""',
    "    import os",
    "",
    f'    folder = os.environ.get("{RESULTS_ENV}")',
    "    if folder:",
    '        with open(os.path.join(folder, "rank%s.txt" % os.environ.get("RANK", "0")), "w") as f:',
    "            f.write(repr(value))",
    "",
    "",
    "def _ddp_finish(namespace):",
    '    """The cells\' objects go first, then every rank leaves the group together.',
    "",
    "    A DDP model that outlives its process group aborts the process at exit (torch 2.x, gloo:",
    '    "terminate called without an active exception"), so the names the cells left are dropped here.',
    '    """',
    "    import gc",
    "",
    "    import torch.distributed as dist",
    "",
    '    for name in [n for n in namespace if not n.startswith("_")]:',
    "        del namespace[name]",
    "    gc.collect()",
    "    if dist.is_initialized():",
    "        dist.barrier()",
    "        dist.destroy_process_group()",
    "",
    "",
]


def with_result(code: str) -> str:
    """The final cell with its last expression kept as ``_ddp_result`` (the value the notebook showed)."""
    tree = ast.parse(code)
    last = tree.body[-1] if tree.body else None
    if not isinstance(last, ast.Expr) or last.end_lineno is None or last.end_col_offset is None:
        return f"{code}\n{RESULT} = None"
    lines = code.split("\n")
    head = "\n".join(lines[: last.lineno - 1] + [lines[last.lineno - 1][: last.col_offset]])
    expr = ast.get_source_segment(code, last) or "None"
    tail = lines[last.end_lineno - 1][last.end_col_offset:]
    rest = "\n".join([tail] + lines[last.end_lineno:]).rstrip()
    rest = "" if rest.strip() in ("", ";") else rest
    return f"{head}{RESULT} = ({expr}){rest}"


def _cell_block(cell: Cell, final: bool) -> List[str]:
    assert cell.code is not None
    if cell.kind == "ddp":
        head = f"{RULE}\n# In [{cell.number}]: %%ddp cell (every rank runs it)"
        code = with_result(cell.code.strip("\n")) if final else cell.code.strip("\n")
    else:
        head = f"{RULE}\n# In [{cell.number}]: defines what the %%ddp cells use"
        code = cell.code.strip("\n")
    return [head, code, "", ""]


def script_text(sel: Selection, script: str, launch: Launch, notebook: str = "the notebook") -> str:
    """The whole script: docstring with its launch lines, the process group set-up, the cells, the end."""
    final = sel.final
    assert final is not None and final.run is not None, "a selection with no %%ddp cell has no script"
    numbers = ", ".join(str(c.number) for c in sel.cells)
    run = final.run
    own_init = any("init_process_group(" in (c.code or "") for c in sel.cells)
    doc = [
        '"""' + f"{os.path.basename(script)}: {notebook}'s cells {numbers} (In [n]), exported by ddp_magic's %ddp_export.",
        "",
        f"Run it as the notebook's pool did ({run.nproc} ranks):",
        f"    {launch_line(script, launch)}",
        "Each rank prints plainly (the notebook prefixed its lines with [rank r]); torchrun --tee 3 labels them.",
        "The last %%ddp cell's value is kept in _ddp_result on every rank.",
        '"""',
    ]
    out = doc + [""] + _init_function(run) + FINISH
    if own_init:
        out += ["# The cells initialise the process group themselves (the pool kept its own instead).", ""]
    else:
        out += ["_ddp_init_process_group()" if run.init else "# The pool ran with --no-init: the cells set up torch.distributed.", "", ""]
    for name, _size in sel.loads:
        out += [f"# `{name}` was built interactively in the notebook; save it there with torch.save({name}, {name + '.pt'!r})",
                f"# and load it here: import torch; {name} = torch.load({name + '.pt'!r})", ""]
    for cell in sel.cells:
        out += _cell_block(cell, cell is final)
    out += [RULE, f"_ddp_save_result({RESULT})", "_ddp_finish(globals())", ""]
    return "\n".join(out)
