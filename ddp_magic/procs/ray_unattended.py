"""A kept Ray pool's driver on its own: a node lost while no kernel is here is placed again and its template admitted by the driver.

While the kernel that kept the pool is here, it places a lost node again at its next cell (kernel/launchers/ray.py
``place_again``). Once it has gone (its pipe to the driver ended), nobody would: a kernel that attaches the pool reaches
the templates through the lease, and has no pipe to the driver. So the driver does it itself, for every node but the
lease holder's (its loss ends the lease and the pool): it asks Ray for the node's bundles again and waits for room as
long as the pool lives (the lease's ``--idle`` and ``--max`` still count), checks the new template's hello (the
kernel's code, the same check the kernel makes: this driver runs the kernel's ddp_magic), and gives it what the
keeping kernel would have: its first line, the pool's secret sealed to its key (wire/seal.py), then the keep and follow
lines the keeping kernel handed over in the watch (procs/ray_keep.py ``admit``). The template then follows the lease
under the node's name in the pool, so the next kernel that attaches forks that node's ranks there and heals them (as
for any rank started again).

A placing that fails (Ray split the node's bundles over several nodes, the actor did not start) is tried again every
``RETRY_S``; a template whose code is not ours is dropped and not tried again.
"""
from __future__ import annotations

import json
import threading
from typing import Any, Dict, List, Protocol, Set

from ..logs import log
from .ray_keep import DriverKeep

RETRY_S = 5.0


class Placer(Protocol):
    """What this needs of procs/ray_group.py's Driver: its nodes, its kept-pool part, and its way to place a node again."""

    held: List[Any]  # the Driver's Held, a node each (its actor, name, admitted, superseded)
    keeping: DriverKeep
    ending: threading.Event
    lost: Set[int]  # node indexes whose actor or template ended, not yet placed again
    again: Dict[int, threading.Event]  # the kernel's placings (node index -> its cancel)
    lock: threading.Lock

    def place_again(self, i: int, timeout: float, cancel: threading.Event, asked: Any = None) -> bool: ...

    def supersede(self, held: Any) -> None: ...


class Unattended:
    """The Driver's part while kept with no kernel here."""

    def __init__(self, driver: Placer) -> None:
        self.driver = driver
        self.placing: Set[int] = set()  # nodes being placed again by us

    def on_lost(self, i: int) -> None:
        """Node ``i`` was lost: placed again by us when nobody else will (``DriverKeep.places_alone``)."""
        if self.driver.keeping.places_alone(i):
            self.place(i)

    def after_kernel_left(self) -> None:
        """The kernel's pipe ended: the nodes lost while it was here, and not yet placed again by it, are ours to place. A
        placing it had asked for is stopped, and a template placed for it but never admitted (its hello went to a kernel
        that is gone) is dropped: we place those nodes again ourselves."""
        d = self.driver
        if not d.keeping.alone:
            return
        for cancel in list(d.again.values()):
            cancel.set()
        with d.lock:
            half = [h for h in d.held if not h.admitted and not h.superseded]
        for held in half:
            d.supersede(held)
            with d.lock:
                d.lost.add(d.held.index(held))
        with d.lock:
            lost = sorted(d.lost)
        for i in lost:
            self.on_lost(i)

    def place(self, i: int) -> None:
        with self.driver.lock:
            if i in self.placing:
                return
            self.placing.add(i)
        threading.Thread(target=self._place, args=(i,), name="ddp-ray-alone", daemon=True).start()

    def _place(self, i: int) -> None:
        """Until node ``i`` is placed again (then its template's hello admits it: ``admit``) or the pool ends."""
        d = self.driver
        log.info("node %d of a kept pool was lost with no kernel here: placing it again", i)
        cancel = threading.Event()
        try:
            while not d.ending.is_set() and not d.place_again(i, 0.0, cancel, "alone"):
                if d.ending.wait(RETRY_S):
                    return
        finally:
            with d.lock:
                self.placing.discard(i)

    def admit(self, held: Any, lines: List[str]) -> None:
        """A template placed again while no kernel is here: its hello checked and its first lines given by us, or dropped."""
        d = self.driver
        hello = next((json.loads(ln) for ln in lines if ln.startswith('{"event": "hello"')), None)
        if hello is None:
            return
        words = d.keeping.first_words(held.name, hello)
        if not words:
            d.supersede(held)
            return
        for line in words:
            held.actor.write.remote(line + "\n")
        held.admitted = True
        with d.lock:
            if held in d.held:
                d.lost.discard(d.held.index(held))
        log.info("%s placed again and admitted with no kernel here", held.name)
