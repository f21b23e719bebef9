"""ddp_magic: run PyTorch DistributedDataParallel code from a notebook cell.

    %load_ext ddp_magic
    %%ddp -n 4
    ...

Imports stay lazy: loading the extension imports neither torch nor the pool.
"""
from __future__ import annotations

from typing import Any

from ._version import __version__

__all__ = ["__version__", "load_ipython_extension", "unload_ipython_extension", "Pool"]


def load_ipython_extension(ipython: Any) -> None:
    from .magics import DDPMagics

    ipython.register_magics(DDPMagics(ipython))


def unload_ipython_extension(ipython: Any) -> None:
    magics = ipython.magics_manager.registry.get("DDPMagics")
    if magics is not None and magics.pool is not None:
        magics.pool.stop()
        magics.pool = None


def __getattr__(name: str) -> Any:
    if name == "Pool":
        from .pool import Pool

        return Pool
    raise AttributeError(name)
