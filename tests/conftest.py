from __future__ import annotations

import os
import sys
import time
from typing import Iterator, List

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from kernel_helper import Kernel  # noqa: E402

# What the user reads of a node whose link was lost (wire/liveness.py: nothing acknowledged for 8 s), written once and
# literally, as the user reads it: never rebuilt from the product's constants, so a wrong window or wording fails.
LOST_LINK = "no answer on the control channel for 8s (its link is down, or a firewall drops its traffic)"


def worker_pids_of(root_pid: int) -> List[int]:
    """Every live descendant of root_pid, from /proc (no psutil needed)."""
    children: dict = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        for c in children.get(pid, []):
            out.append(c)
            todo.append(c)
    return out


def ranks_of(root_pid: int) -> List[int]:
    """The kernel's descendants but its fork-server template, which %load_ext starts (kernel/templates.py): what cells spawned."""

    def template(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return b"ddp_magic.procs.forkserver" in f.read().split(b"\0") and _ppid(pid) == root_pid
        except OSError:
            return False

    return [p for p in worker_pids_of(root_pid) if not template(p)]


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except OSError:
        return False


def wait_until(pred, timeout: float = 10.0, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    """A real kernel with the extension loaded, shared by a test module."""
    k = Kernel()
    k.run("%load_ext ddp_magic").ok()
    yield k
    k.shutdown()


@pytest.fixture(scope="module")
def ddp2(kernel: Kernel) -> Kernel:
    """The shared kernel with a running pool of 2 ranks."""
    kernel.run("%%ddp -n 2\nimport torch, torch.distributed as dist\n", timeout=180).ok()
    return kernel
