"""ddp_magic: run PyTorch DistributedDataParallel code from a notebook cell.

    %load_ext ddp_magic
    %%ddp -n 4
    ...

Imports stay lazy: loading the extension imports neither torch nor the pool.
"""
from __future__ import annotations

from typing import Any, Dict, List

from ._version import __version__

__all__ = ["__version__", "load_ipython_extension", "unload_ipython_extension", "Pool"]


def load_ipython_extension(ipython: Any) -> None:
    from .ui import labcomm
    from .magics import DDPMagics

    magics = DDPMagics(ipython)
    ipython.register_magics(magics)
    labcomm.register(ipython, magics)  # the JupyterLab extension's comm target; nothing without a kernel


def unload_ipython_extension(ipython: Any) -> None:
    from .ui import labcomm

    labcomm.unregister(ipython)
    magics = ipython.magics_manager.registry.get("DDPMagics")
    if magics is not None and magics.pool is not None:
        magics.pool.stop()
        magics.pool = None


def _jupyter_labextension_paths() -> List[Dict[str, str]]:
    """Where the prebuilt JupyterLab extension lives (``jupyter labextension develop``; the wheel installs it itself)."""
    return [{"src": "labextension", "dest": "ddp-magic"}]


def __getattr__(name: str) -> Any:
    if name == "Pool":
        from .kernel.pool import Pool

        return Pool
    raise AttributeError(name)
