"""The command an allocation we made runs (``salloc ... python -m ddp_magic.procs.slurm_hold``): it ends when the kernel does.

salloc holds its allocation exactly as long as its command runs, and releases it
when the command exits. This command prints the job id and node list the kernel
waits for, then waits for the kernel to go: EOF on its stdin (a pipe the kernel
holds), or the kernel's pid gone (``DDP_MAGIC_KERNEL_PID``, watched through a pidfd).
Whichever comes first, even a SIGKILLed kernel's, the allocation is released
within moments. It imports nothing of torch: it starts in milliseconds.
"""
from __future__ import annotations

import os
import select
import sys

from .parent import die_with_parent

KERNEL_PID_ENV = "DDP_MAGIC_KERNEL_PID"
READY = "ddp_magic_hold"  # the first word of the line the kernel waits for


def _kernel_fd() -> "int | None":
    """A descriptor readable when the kernel's process ends (a pidfd); None where pidfds do not exist."""
    pid = os.environ.get(KERNEL_PID_ENV, "")
    if not pid.isdigit() or not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(int(pid))
    except OSError:  # already gone
        sys.exit(0)


def main() -> int:
    die_with_parent(os.getppid())  # salloc itself gone: so are we
    watch = [sys.stdin.fileno()]
    kernel = _kernel_fd()
    if kernel is not None:
        watch.append(kernel)
    job = os.environ.get("SLURM_JOB_ID", "")
    nodes = os.environ.get("SLURM_JOB_NODELIST", "")
    print(READY, job, nodes, flush=True)
    while True:
        ready, _, _ = select.select(watch, [], [])
        if kernel in ready:
            return 0
        if sys.stdin.fileno() in ready and not os.read(sys.stdin.fileno(), 4096):
            return 0


if __name__ == "__main__":
    sys.exit(main())
