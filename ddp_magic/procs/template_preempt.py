"""A template's part in ``--save-on-preempt`` (docs/snapshots.md "Preemption"): a SIGTERM from outside, and SIGUSR1.

Armed ranks (their marker in /dev/shm, procs/rank_preempt.py) get SIGUSR1 and time to save while a kernel hears us:
that kernel saves, then ends them. The template goes once they have gone, or after PREEMPT_GRACE_S (Slurm's SIGKILL
after KillWait comes first), looked at on each turn of its loop (``preempt_due``), which serves on meanwhile: a kernel
attached to a kept pool reaches the template through its lease, on that loop. With no armed rank, or no kernel to
save, a SIGTERM ends everything at once (``kernel_gone``), as it always did. A kept pool's kernel is whichever kernel
is attached now (``kept_terminated``); with none attached its lease ends at once, ranks and all: a save needs a kernel.
"""
from __future__ import annotations

import os
import signal
import time
from typing import Callable, Dict, Set, Tuple

from ..logs import log
from ..wire import shm
from .template_end import TemplateEnd, tell

PREEMPT_GRACE_S = 120.0  # after our SIGTERM, armed ranks get this long to save (Slurm's SIGKILL after KillWait comes first)


class PreemptibleTemplate:
    """A mixin of procs/forkserver.py's ``Template``: what a SIGTERM or SIGUSR1 does to it and its ranks."""

    children: Dict[int, int]
    prefixes: Set[str]
    kernel_fd: int
    kernel_pid: int
    kernel_gone: Callable[..., None]
    node = ""  # a node template's name (procs/node_template.py); the local template has none
    preempt_until = 0.0  # a SIGTERM found armed ranks: they save, and we go once they have gone (or then)

    def terminated(self, *_: object) -> None:
        """SIGTERM to a pool's template. Its kernel hears it while the kernel is our parent (a node template's kernel is on
        another host, and hears it over srun, ssh or Ray)."""
        self.preempt_or_end(not self.kernel_pid or os.getppid() == self.kernel_pid)

    def kept_terminated(self, *_: object) -> None:
        """SIGTERM to a kept pool's template: the kernel that hears it is the one attached now (stdin, or the lease)."""
        self.preempt_or_end(self.kernel_fd >= 0)

    def preempt_or_end(self, kernel_hears: bool, end: "Tuple[TemplateEnd, Dict[str, object]]" = (TemplateEnd.SIGTERM, {})) -> None:
        """Armed ranks save first where a kernel hears them; else, and on a SIGTERM with no kernel, everything ends now
        (``end``: why, told to a kernel that may still hear it)."""
        if kernel_hears and self.preempt_until:
            return  # a second SIGTERM while they save changes nothing
        if kernel_hears and self.warned():
            self.preempt_until = time.monotonic() + PREEMPT_GRACE_S
            log.info("SIGTERM: the armed ranks save before they go (at most %.0f s)", PREEMPT_GRACE_S)
            return
        tell(self.node, self.children, end[0], **end[1])
        self.kernel_gone()

    def preempt_due(self) -> None:
        """Each turn of the template's loop (a second at most): after a preemption, go once the ranks have gone, or then."""
        if self.preempt_until and (not self.children or time.monotonic() > self.preempt_until):
            log.info("preempted: %s", "the ranks are gone" if not self.children else "the grace ran out")
            self.kernel_gone()

    def warned(self, *_: object) -> bool:
        """SIGUSR1 (Slurm's warning before the time limit), or our SIGTERM: passed on to armed ranks; whether there were any."""
        armed = bool(self.children) and any(os.path.exists(shm.armed_file(p)) for p in self.prefixes)
        for pid in list(self.children) if armed else ():
            try:
                os.kill(pid, signal.SIGUSR1)  # Slurm may signal every process of the step; a plain kill of us reached only us
            except ProcessLookupError:
                pass
        return armed
