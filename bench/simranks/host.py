"""A process that hosts many simulated ranks on one asyncio loop: ``python -m simranks.host``, its config on stdin.

The launcher (launcher.py) starts a few of these. Each reads one JSON line (the
kernel's address and port, the pool's secret, its ranks, the world size, the
env a rank would get), runs every rank's ``SimRank.serve`` at once, and writes
one JSON line per rank exit to stdout, which is the launcher's event pipe (as
the fork server reports its children's exits). It exits when its last rank has,
and with its parent (procs/parent.py), like every program of ours.
"""
from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
from typing import List

from ddp_magic.procs.parent import die_with_parent

from .rank import SimRank


def _raise_fd_limit(ranks: int) -> None:
    """Three sockets per rank: more than the usual soft limit of 1024 for a few hundred ranks."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 3 * ranks + 64
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))


def _report(rank: int, code: int) -> None:
    """One exit event; a line under PIPE_BUF is written whole, so hosts can share the pipe."""
    line = json.dumps({"event": "exited", "rank": rank, "pid": os.getpid(), "code": code}) + "\n"
    os.write(1, line.encode())


async def _main(config: dict) -> None:
    ranks: List[int] = list(config["ranks"])
    sims = [SimRank(r, int(config["world"]), config, _report) for r in ranks]
    await asyncio.gather(*(s.serve() for s in sims), return_exceptions=False)


def main() -> None:
    config = json.loads(sys.stdin.readline())
    if config.get("parent_pid"):
        die_with_parent(int(config["parent_pid"]))
    os.environ.update(config.get("env", {}))  # the pool's /dev/shm prefix for result files, as a rank has it
    _raise_fd_limit(len(config["ranks"]))
    asyncio.run(_main(config))


if __name__ == "__main__":
    main()
