"""%ddp_export's work, from the recorded history to the files on disk and what the user reads about them.

The magic (magics.py) parses the line into ExportOptions and prints the
ExportResult; everything between is here, free of IPython.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

from ..errors import DDPError
from ..words import plural
from .check import Expected
from .record import CellRecord
from .script import Launch, launch_line, sbatch_text, script_text
from .select import Selection, parse_cells, select


class ExportError(DDPError):
    """Nothing to export, or options that do not fit; nothing was written."""


@dataclass(frozen=True)
class ExportOptions:
    path: str = "train.py"
    cells: Optional[str] = None  # "3-9": In [n] numbers
    nproc: Optional[int] = None  # ranks in the launch line; None: the pool's
    slurm: bool = False
    nodes: Optional[int] = None
    gpus_per_node: Optional[int] = None
    accelerate: bool = False


@dataclass
class ExportResult:
    script: str
    sbatch: Optional[str]
    launch: Launch
    selection: Selection
    expected: Expected
    summary: List[str] = field(default_factory=list)

    @property
    def warnings(self) -> List[str]:
        return self.selection.warnings

    def text(self) -> str:
        return "\n".join(self.summary)


def _launch(sel: Selection, opts: ExportOptions) -> Launch:
    """The launch lines' numbers: ranks as the pool had them (or --n); for --slurm, nodes and ranks per node."""
    final = sel.final
    assert final is not None and final.run is not None
    run = final.run
    if (opts.nodes or opts.gpus_per_node) and not opts.slurm:
        raise ExportError("--nodes and --gpus-per-node describe the sbatch job: add --slurm")
    nproc = opts.nproc or run.nproc
    nodes = opts.nodes or (run.nnodes if opts.slurm else 1)
    if opts.slurm and not opts.gpus_per_node and nproc % nodes:
        raise ExportError(f"{nproc} ranks do not split evenly over --nodes {nodes}; give --gpus-per-node, or --n a multiple of {nodes}")
    gpus = opts.gpus_per_node or (run.gpus_per_node if opts.slurm else None)  # a --slurm pool's own, unless given
    return Launch(nproc=nproc, nodes=nodes, gpus_per_node=gpus, accelerate=opts.accelerate, backend=run.backend_asked,
                  job_options=run.slurm_options if opts.slurm else ())


def expected_of(sel: Selection) -> Expected:
    """What the exported %%ddp cells printed (per rank, in order) and what the last one returned."""
    final = sel.final
    assert final is not None and final.run is not None
    runs = [c.run for c in sel.cells if c.run is not None]
    lines = tuple(tuple(ln for r in runs for ln in (r.stdout[rank] if rank < len(r.stdout) else ())) for rank in range(final.run.nproc))
    return Expected(lines=lines, values=final.run.value_reprs(), final_cell=final.number)


def export_files(history: Sequence[CellRecord], opts: ExportOptions, notebook: str = "the notebook") -> ExportResult:
    """Choose the cells, write the script (and the sbatch file), and say what was done and what was not."""
    try:
        wanted = parse_cells(opts.cells) if opts.cells else None
    except ValueError as e:
        raise ExportError(str(e)) from None
    sel = select(list(history), wanted)
    if sel.final is None:
        where = f" among cells {opts.cells}" if opts.cells else ""
        raise ExportError(f"no %%ddp cell ran successfully{where}, so there is nothing to export; run the cells first (or widen --cells)")
    launch = _launch(sel, opts)
    if any(c.run is not None and c.run.mesh for c in sel.cells):
        sel.warnings.append("the pool made `mesh` (--mesh) on every rank; the script does not: create it with "
                            "torch.distributed.device_mesh.init_device_mesh at the top of the first %%ddp cell")
    path = opts.path if opts.path.endswith(".py") else opts.path + ".py"
    with open(path, "w") as f:
        f.write(script_text(sel, path, launch, notebook))
    sbatch = None
    if opts.slurm:
        sbatch = os.path.splitext(path)[0] + ".sbatch"
        with open(sbatch, "w") as f:
            f.write(sbatch_text(path, launch, sbatch))
    numbers = ", ".join(str(c.number) for c in sel.cells)
    summary = [f"wrote {path}: cells {numbers} ({sum(c.kind == 'ddp' for c in sel.cells)} %%ddp). Run it with:",
               f"  {launch_line(path, launch)}"]
    if sbatch:
        summary.append(f"wrote {sbatch} ({plural(launch.nodes, 'node')} x {plural(launch.per_node, 'rank')}); submit it with: sbatch {sbatch}")
    summary += sel.notes
    return ExportResult(path, sbatch, launch, sel, expected_of(sel), summary)
