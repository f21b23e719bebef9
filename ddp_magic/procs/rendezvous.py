"""A c10d rendezvous store owned by the kernel, for pools that span nodes.

torchrun's c10d rendezvous needs one TCPStore that outlives every agent. If
the kernel node's agent hosted it, that agent exiting first would leave the
other nodes' agents waiting 300 s in their exit barrier. So the store lives in
this small process of ours instead, started before the agents
(``--rdzv-conf is_host=false``) and stopped after them. It exits when the
kernel closes our stdin or dies (parent-death signal).

    python -m ddp_magic.procs.rendezvous HOST PORT
"""
from __future__ import annotations

import os
import sys
from datetime import timedelta

from .parent import die_with_parent


def main() -> None:
    die_with_parent(os.getppid())
    host, port = sys.argv[1], int(sys.argv[2])
    from torch.distributed import TCPStore

    store = TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=3600))
    os.write(1, b"ready\n")
    while sys.stdin.buffer.read(1):
        pass
    del store


if __name__ == "__main__":
    main()
