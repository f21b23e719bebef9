"""A template's later imports: ``torch._dynamo`` (DDP's constructor) and ``torch.distributed.checkpoint``, once, when the kernel says snapshots are in use.

The kernel says so (``warm``) once a snapshot was saved, or before the ranks of a pool that loads one fork
(kernel/launchers/base.py ``import_later``). Every rank forked after that (the next pool, a rank started again and
healed, a spare) has them already, through fork: about 1 s of CPU a rank otherwise, 4 s at -n 4
(docs/bench/snapshots.md). Not at every template's start: most pools never save, and a first cell must not wait for
them. Imported on the template's own thread, between commands, so no fork can happen while an import holds its lock (a
child would inherit it held). Spares forked before lack them: they are let go, and the next idle moment forks others.

A mixin of procs/forkserver.py's ``Template``.
"""
from __future__ import annotations

import importlib
import os
import time
from typing import Dict, Set

from ..logs import log

LATER_IMPORTS = ("torch._dynamo", "torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict")


class LaterImports:
    """The ``warm`` command: import LATER_IMPORTS once, then let the spares forked without them go."""

    spares: Dict[int, int]  # the Template's: spare pid -> the write end of its command pipe
    imported_later = False
    retired: Set[int]  # spares let go (their pipe closed: they exit), reaped as spares, never reported as ranks

    def import_later(self) -> None:
        if self.imported_later:
            return
        self.imported_later = True
        t0 = time.monotonic()
        for name in LATER_IMPORTS:
            try:
                importlib.import_module(name)
            except Exception:  # an older torch without one: the rank imports what it has when it needs it
                log.info("the template could not import %s ahead of its ranks", name, exc_info=True)
        log.debug("later imports in %.2f s", time.monotonic() - t0)
        for pid, fd in list(self.spares.items()):
            del self.spares[pid]
            self.retired.add(pid)
            os.close(fd)  # the spare reads EOF and exits (procs/forkserver.py _spare)
