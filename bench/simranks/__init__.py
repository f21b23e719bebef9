"""Simulated ranks: the kernel side of a pool runs for real, its ranks are cheap stand-ins that speak the wire protocol.

The kernel's session, pool, hub, admission, failure policy, recovery, forensics
and views all run as they do for real ranks; each rank is a ``SimRank``
(rank.py) that answers the control protocol as procs/worker.py does, without
torch, hundreds per process (host.py), started by ``SimLauncher`` (launcher.py,
the pool's Launcher ABC). A cell's source is a script of ``sim.*`` calls
(script.py). Benchmarks (bench/bench_scale.py) and tests (tests/kernel/test_scale.py)
use it; nothing in ddp_magic/ imports it.

    import sys; sys.path.insert(0, "bench")
    import simranks
    pool = simranks.sim_pool(1024)            # a ddp_magic Pool whose ranks are simulated
    pool.run("sim.print(1)\\n7").values       # [7, 7, ...]
    pool.stop()

In a Jupyter kernel, ``simranks.install()`` makes every pool the kernel's
session starts (``%%ddp -n 256``) a pool of simulated ranks.
"""
from __future__ import annotations

from typing import Any

from .launcher import SimLauncher

__all__ = ["SimLauncher", "install", "sim_pool"]


def sim_pool(n: int, per_host: int = 0, **options: Any) -> Any:
    """A ``ddp_magic.Pool`` of ``n`` simulated ranks (not started yet); options as for ``Pool(n, ...)``."""
    from ddp_magic.kernel.pool import Pool

    options.setdefault("start_method", "spawn")  # the launcher it would make is replaced before it starts anything
    pool = Pool(n, **options)
    pool.hub.launcher.close()
    pool.hub.launcher = SimLauncher(pool.secret, **({"per_host": per_host} if per_host else {}))
    return pool


def install(per_host: int = 0) -> None:
    """Every pool made in this process from now on gets simulated ranks (a kernel's %%ddp included)."""
    from ddp_magic.kernel import pool as pool_module

    def make_launcher(method: str, secret: bytes) -> SimLauncher:
        return SimLauncher(secret, **({"per_host": per_host} if per_host else {}))

    pool_module.make_launcher = make_launcher  # type: ignore[assignment]
