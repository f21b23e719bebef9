"""ddp_magic: run PyTorch DistributedDataParallel code from a notebook cell.

    %load_ext ddp_magic
    %%ddp -n 4
    ...

The package by role (each folder imports only the roles below it; tests/unit/test_structure.py
checks the rules, docs/architecture.md explains them):

- magics.py   the IPython magics %%ddp, %ddp, %ddp_env: parse, call the session, render
- session.py  one kernel's pool and the names on its workers: start, restart, stop, status, env, run
- ui/         what the notebook shows: status view, %ddp_env report, rank output, results, JupyterLab comm
- kernel/     the pool in the kernel: lifecycle, control hub, failure policy, launchers, results
- plan/       the options as a frozen PoolSpec, the plan of every rank's env, and the checks of it
- wire/       both ends of each cross-process mechanism: framing, values and tensors, capture, names
- procs/      the separate programs: rank, fork-server template, rendezvous store
- states.py, errors.py, logs.py   rank states and failure kinds, user-facing errors, ddp_magic's log

Loading the extension starts the template (which imports torch) at low priority, and the kernel imports torch once
idle (kernel/templates.py; DDP_MAGIC_WARM_TEMPLATE=0: neither); the first %%ddp cell starts the pool.
"""
from __future__ import annotations

from typing import Any, Dict, List

from ._version import __version__

__all__ = ["__version__", "load_ipython_extension", "unload_ipython_extension", "Pool", "save", "scatter", "log", "safe_point"]


def load_ipython_extension(ipython: Any) -> None:
    from .ui import labcomm
    from .magics import DDPMagics

    magics = DDPMagics(ipython)  # owns the kernel's Session: the pool and the names on the workers
    ipython.register_magics(magics)
    labcomm.register(ipython, magics.session)  # the JupyterLab extension's comm target; nothing without a kernel
    magics.session.template.begin()  # imports torch in a template now, at low priority: the first %%ddp cell need not wait


def unload_ipython_extension(ipython: Any) -> None:
    from .ui import labcomm

    labcomm.unregister(ipython)
    magics = ipython.magics_manager.registry.get("DDPMagics")
    if magics is not None:
        ipython.events.unregister("post_run_cell", magics.record_cell)  # %ddp_export's history of this load
        for job in magics.jobs:
            job.cancel()
        magics.session.stop(force=True)  # a background job's thread sees its pool go, and ends


def _jupyter_labextension_paths() -> List[Dict[str, str]]:
    """Where the prebuilt JupyterLab extension lives (``jupyter labextension develop``; the wheel installs it itself)."""
    return [{"src": "labextension", "dest": "ddp-magic"}]


def __getattr__(name: str) -> Any:
    if name == "Pool":
        from .kernel.pool import Pool

        return Pool
    if name == "breakpoint":  # ddp_magic.breakpoint(rank=1) in a %%ddp cell: pdb on that rank only (docs/debugging.md)
        from .procs.rank_debug import breakpoint

        return breakpoint
    if name == "log":  # ddp_magic.log(step=i, loss=loss) in a %%ddp cell: the live chart and %ddp metrics (docs/metrics.md)
        from .procs.rank_metrics import log

        globals()["log"] = log  # found directly from now on: a call per training step pays no lookup here
        return log
    if name == "safe_point":  # ddp_magic.safe_point(step) in a %%ddp cell: a save asked for meanwhile is taken here (docs/snapshots.md)
        from .procs.rank_safepoint import safe_point

        globals()["safe_point"] = safe_point
        return safe_point
    if name == "scatter":  # ddp_magic.scatter(x, dim=0) in the notebook: rank r of a %%ddp cell gets only its shard of x
        from .session import scatter

        return scatter
    if name == "save":  # ddp_magic.save(state_dict, "model.pt"): sharded results written as full tensors
        from .kernel.results.combine import save

        return save
    raise AttributeError(name)
