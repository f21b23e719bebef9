"""The kernel's host's part of a kept SSH pool: a small process of its own that watches the lease on the first host.

A kept Slurm pool has a process on the kernel's host that already outlives the kernel (salloc's holder,
procs/slurm_hold.py), and it runs the ``LeaseWatch``. An SSH pool has none: its ssh clients die with the kernel
(the templates detach from their sessions at keep, procs/ssh_template.py). So ``%ddp keep`` starts this one
(``python -m ddp_magic.procs.lease_keeper``, in a session of its own, no parent-death signal): it reads the watch
(the lease's address and certificate, the pool's secret, id and runtime directory) as one JSON line on its stdin,
never from argv or env, and runs procs/lease_watch.py's ``LeaseWatch``: this host's liveness lock and discovery
file, so ``%ddp attach``, ``--list`` and ``python -m ddp_magic kept|stop`` work here as on one host.

It exits when the watch is over: the lease ended (its word is written here), ``keep --off`` or a stop (the files
go), the lease holder's host or template went away (its TLS connection closed, or went silent: keepalive), or
the lease never answered (the kernel's keep fails and says so). It imports nothing of torch.
"""
from __future__ import annotations

import json
import signal
import sys

from ..logs import log
from .lease_watch import LeaseWatch

POLL_S = 1.0


def main() -> int:
    for sig in (signal.SIGHUP, signal.SIGINT):  # the kernel's terminal or group: not ours to hear
        signal.signal(sig, signal.SIG_IGN)
    line = sys.stdin.readline()
    if not line.strip():
        log.warning("lease_keeper: no watch on stdin; nothing to do")
        return 1
    watch = LeaseWatch(json.loads(line))
    watch.start()
    while not watch.over.wait(POLL_S):
        pass
    return 1 if watch.failed else 0


if __name__ == "__main__":
    sys.exit(main())
