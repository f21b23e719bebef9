"""A kept Ray pool's driver: it outlives its kernel under the lease, holds the placement group and the actors, and ends them with it.

Why not detached actors and a detached placement group: Ray fixes an actor's and a group's lifetime when it creates
them, and a pool is kept long after it was placed (``%ddp keep`` on a running pool). Detached from the start, every
pool that is not kept would be left to our own cleanup on every path, and a driver lost on its own (not through the
kernel) would leave the group and its GPUs held for ever (ray#24947's orphans). So the group and the actors stay the
driver's (Ray ends them when the driver ends, whatever ends it), and at ``%ddp keep`` the driver itself outlives the
kernel instead: its anchor lifts its parent-death signal (procs/anchor.py, as for a kept srun) and the driver follows
the lease from the kernel's host (procs/lease_watch.py, as salloc's holder does for Slurm and the lease keeper for
SSH): the liveness lock and the discovery file here, so ``%ddp attach``, ``--list`` and ``python -m ddp_magic
kept|stop`` work as on one host. The lease is held by the first node's template (TCP and TLS), the other nodes'
templates follow it, and every template still dies with its actor (procs/ray_template.py).

- The kernel leaves (SIGKILL, shutdown, ``--force`` elsewhere): the driver's stdin ends; the driver closes each
  template's stdin (the kernel is gone: the lease's idle timer starts) and goes on holding the pool.
- The lease ends (``--idle``, ``--max``, ``%ddp stop``, ``python -m ddp_magic stop``) or its holder goes away: the
  driver kills the actors and removes the placement group, then exits; its lock goes last, so a free lock means no
  actor, no group, no template and no rank is left.
- ``keep --off``: the watch stops, the driver is its kernel's again (its anchor's signal asked for again).
"""
from __future__ import annotations

import json
from typing import Any, Callable, List, Optional

from ..logs import log
from .lease_watch import LeaseWatch

WATCH, UNWATCH = '{"op": "watch"', '{"op": "unwatch"'  # the kernel's lines for the driver alone (kernel/launchers/ray_keep.py)


class DriverKeep:
    """The driver's part in a kept pool: the lease watched, and what the kernel's leaving and the lease's end do."""

    def __init__(self, end: Callable[[], None]) -> None:
        self.end = end  # the driver's: kill the actors, remove the placement group, exit
        self.watch: Optional[LeaseWatch] = None

    def take(self, line: str) -> bool:
        """Whether ``line`` (from the kernel) was the driver's own: a watch of the lease (``%ddp keep``), or its end (``--off``)."""
        if line.startswith(WATCH):
            self._start(json.loads(line)["watch"])
            return True
        if line.startswith(UNWATCH):
            watch, self.watch = self.watch, None
            if watch is not None:
                watch.stop()
            return True
        return False

    def _start(self, spec: dict) -> None:
        if self.watch is not None and not self.watch.over.is_set():  # keep again (new timers): the same lease
            return
        self.watch = LeaseWatch(spec)
        self.watch.on_end = self.end
        self.watch.start()

    @property
    def kept(self) -> bool:
        return self.watch is not None and not self.watch.stopping and not self.watch.failed

    def kernel_left(self, actors: List[Any]) -> bool:
        """The kernel's pipe ended: while kept, each template hears it (its stdin ends) and the pool goes on; whether kept."""
        if not self.kept:
            return False
        log.info("the kernel left a kept pool: it goes on under its lease")
        for actor in actors:
            actor.close_stdin.remote()
        return True
