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
- A node lost once the kernel has gone is placed again by the driver itself (procs/ray_unattended.py), with what the
  watch line handed over for it (``admit``: the templates' env, the keep and follow lines).
"""
from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Optional

from ..logs import log
from ..wire import node_hello
from .lease_watch import LeaseWatch

WATCH, UNWATCH = '{"op": "watch"', '{"op": "unwatch"'  # the kernel's lines for the driver alone (kernel/launchers/ray_keep.py)


class DriverKeep:
    """The driver's part in a kept pool: the lease watched, and what the kernel's leaving and the lease's end do."""

    def __init__(self, end: Callable[[], None]) -> None:
        self.end = end  # the driver's: kill the actors, remove the placement group, exit
        self.watch: Optional[LeaseWatch] = None
        self.alone = False  # the kernel's pipe ended while kept: a lost node is ours to place again (procs/ray_unattended.py)
        self.admit: Dict[str, Any] = {}  # the watch's: the env the templates share, the keep and follow lines for a follower

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
        self.admit = dict(spec.get("admit") or {})
        self.watch.start()

    @property
    def kept(self) -> bool:
        return self.watch is not None and not self.watch.stopping and not self.watch.failed

    def kernel_left(self, actors: List[Any]) -> bool:
        """The kernel's pipe ended: while kept, each template hears it (its stdin ends) and the pool goes on; whether kept."""
        if not self.kept:
            return False
        log.info("the kernel left a kept pool: it goes on under its lease")
        self.alone = True
        for actor in actors:
            actor.close_stdin.remote()
        return True

    def places_alone(self, index: int) -> bool:
        """Whether node ``index``, lost, is ours to place again: kept, its kernel gone, not the lease holder's node (its
        loss ended the lease), and the keeping kernel said how to admit it."""
        return self.alone and self.kept and index > 0 and bool(self.admit)

    def first_words(self, node: str, hello: dict) -> List[str]:
        """What ``node``'s template placed again by us hears first (its first line, the pool's secret sealed to its key,
        then the keep and follow lines), as the keeping kernel would have said them; [] when it is not our code."""
        why = node_hello.sealed_refusal(hello)
        if why or self.watch is None:
            log.warning("%s placed again is dropped: %s", node, why or "the pool is not kept")
            return []
        first = node_hello.first_line(self.watch.secret, dict(self.admit.get("env") or {}), {node: str(hello["key"])})
        return [json.dumps(first)] + [json.dumps(line) for line in self.admit.get("then") or []]
