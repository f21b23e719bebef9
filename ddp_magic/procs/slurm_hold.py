"""The command an allocation we made runs (``salloc ... python -m ddp_magic.procs.slurm_hold``): it ends when the kernel does.

salloc holds its allocation exactly as long as its command runs, and releases it
when the command exits. This command prints the job id and node list the kernel
waits for, then waits for the kernel to go: EOF on its stdin (a pipe the kernel
holds), or the kernel's pid gone (``DDP_MAGIC_KERNEL_PID``, watched through a pidfd).
Whichever comes first, even a SIGKILLed kernel's, the allocation is released
within moments. A kept pool's allocation (``%ddp keep``, docs/keep.md) follows the pool's lease
instead (``Follow``): released once the lease's lock is free. It imports nothing of torch.

salloc releases by asking the controller; with slurmctld unreachable it retries (one
such salloc, reparented to pid 1, ran for 48 minutes at 80% CPU). So before it exits
the holder leaves a watchdog (``_watch_salloc``, a fork in a session of its own): if
salloc is still there RELEASE_GRACE_S later, the watchdog SIGKILLs it, then asks
scancel for the job every SCANCEL_EVERY_S (asleep in between) until the controller
answers, for WATCH_MAX_S at most, so a controller that comes back frees the nodes.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

from ..logs import log
from ..wire import kept
from .lease_watch import LeaseWatch
from .parent import die_with_parent

KERNEL_PID_ENV = "DDP_MAGIC_KERNEL_PID"
READY = "ddp_magic_hold"  # the first word of the line the kernel waits for
RELEASE_GRACE_S = 10.0  # salloc releases in well under a second when the controller answers
SCANCEL_TIMEOUT_S = 10.0
SCANCEL_EVERY_S = 15.0
WATCH_MAX_S = 600.0  # a controller gone longer than this: the job ends at its time limit
LEASE_POLL_S = 0.5  # a kept pool's allocation: how often the lease's lock is looked at


def _kernel_fd() -> "int | None":
    """A descriptor readable when the kernel's process ends (a pidfd); None where pidfds do not exist."""
    pid = os.environ.get(KERNEL_PID_ENV, "")
    if not pid.isdigit() or not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(int(pid))
    except OSError:  # already gone
        sys.exit(0)


def _watch_salloc(salloc: int, job: str, grace: float = RELEASE_GRACE_S) -> None:
    """Fork a watchdog that ends ``salloc`` if it has not released within ``grace`` s of our exit; returns in the holder."""
    try:
        watched = os.pidfd_open(salloc)
    except (OSError, AttributeError):  # salloc gone already, or no pidfds: nothing to watch
        return
    if os.fork():
        os.close(watched)
        return
    try:
        os.setsid()  # not in salloc's group, nor killed with the holder
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        if not select.select([watched], [], [], grace)[0]:  # salloc still there: the controller does not answer it
            os.kill(salloc, signal.SIGKILL)
            deadline = time.monotonic() + WATCH_MAX_S
            while job and not _cancelled(job) and time.monotonic() < deadline:
                time.sleep(SCANCEL_EVERY_S)
    finally:
        os._exit(0)


def _cancelled(job: str) -> bool:
    """scancel ``job``: whether the controller answered (it cancelled the job, or knows it no more)."""
    try:
        done = subprocess.run(["scancel", job], timeout=SCANCEL_TIMEOUT_S, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    except (OSError, subprocess.TimeoutExpired):
        log.debug("scancel %s did not run", job, exc_info=True)
        return False
    return done.returncode == 0 or "Invalid job id" in done.stderr


class Follow:
    """What ends the allocation: the kernel (EOF on stdin, its pid gone), or, once kept, the pool's lease.

    The kernel writes one command a line on our stdin: ``lease PATH`` (``%ddp keep``: from now on the
    allocation ends when nothing holds the lease's lock, wire/kept.py: the lease ended, or its template
    died; the kernel's exit no longer counts), ``watch JSON`` (the same for a lease held on another host:
    we hold its lock here while our connection to it lives, procs/lease_watch.py) and ``kernel PID``
    (``%ddp keep --off``: that kernel's again)."""

    def __init__(self, kernel: "int | None") -> None:
        self.kernel = kernel  # the kernel's pidfd (None: none to watch)
        self.lease = ""  # the lock of the lease we follow ("": we follow the kernel)
        self.watch: "LeaseWatch | None" = None  # a lease on another host, watched from here
        self.stdin: "int | None" = sys.stdin.fileno()
        self.buf = b""

    def fds(self) -> "list[int]":
        return [fd for fd in (self.stdin, None if self.lease else self.kernel) if fd is not None]

    def read(self) -> bool:
        """Our stdin is readable: its commands; whether the allocation must end now (EOF while we follow the kernel)."""
        assert self.stdin is not None
        data = os.read(self.stdin, 4096)
        if not data:
            self.stdin = None  # a kept pool's kernel went: the lease decides
            return not self.lease
        self.buf += data
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            word, _, arg = line.decode(errors="replace").strip().partition(" ")
            if word == "lease":
                self.lease = arg
            elif word == "watch":
                self.watch = LeaseWatch(json.loads(arg))
                self.watch.start()
                self.lease = self.watch.lock
            elif word == "kernel" and arg.isdigit():
                self.lease = ""
                if self.watch is not None:
                    self.watch.stop()
                    self.watch = None
                try:
                    self.kernel = os.pidfd_open(int(arg))
                except (OSError, AttributeError):  # gone already: so is the allocation
                    return True
        return False

    def lease_over(self) -> bool:
        """The lease we follow is over (its lock is free), once whatever the kernel wrote before has been read."""
        if self.watch is not None and self.watch.failed:  # it never reached the lease: the kernel's again (its keep failed)
            self.watch, self.lease = None, ""
            return self.kernel is not None and bool(select.select([self.kernel], [], [], 0)[0])
        if not self.lease or kept.is_held(self.lease) or (self.watch is not None and not self.watch.over.is_set()):
            return False
        while self.stdin is not None and select.select([self.stdin], [], [], 0)[0]:  # a ``kernel`` line written before keep --off freed the lock
            if self.read():
                return True
        return bool(self.lease)


def main() -> int:
    salloc = os.getppid()
    die_with_parent(salloc)  # salloc itself gone: so are we
    follow = Follow(_kernel_fd())
    job = os.environ.get("SLURM_JOB_ID", "")
    nodes = os.environ.get("SLURM_JOB_NODELIST", "")
    print(READY, job, nodes, flush=True)
    while True:
        fds = follow.fds()
        ready, _, _ = select.select(fds, [], [], LEASE_POLL_S if follow.lease else None)
        end = follow.kernel in ready and not follow.lease
        if follow.stdin is not None and follow.stdin in ready:
            end = follow.read() or end
        if end or follow.lease_over():
            _watch_salloc(salloc, job)
            return 0


if __name__ == "__main__":
    sys.exit(main())
