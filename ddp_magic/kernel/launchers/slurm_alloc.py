"""The allocation a Slurm pool's ranks run in: one the kernel found (its own job, never cancelled) or one we made and always release.

Ours is ``salloc <options> python -m ddp_magic.procs.slurm_hold``, a child of the kernel
started under procs/anchor.py (a parent-death signal a kept pool can lift): salloc holds the allocation exactly as long
as the holder runs, and the holder ends when the kernel does (EOF on the pipe the
kernel holds, or the kernel's pid gone). So ``%ddp stop``, a shutdown, a restart and
a SIGKILLed kernel all release it, the last without any cleanup code of ours running;
while the job is still queued, the parent-death SIGTERM makes salloc cancel it.

While the job waits in the queue, ``wait`` tells its caller "queued: job 1234 pending
(Resources)" about once a second; Ctrl-C (KeyboardInterrupt) or the request's
``queue_timeout`` cancels the job, and the error says Slurm's reason.
"""
from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from typing import Callable, Collection, List, Optional, Sequence

from ...logs import log
from ...wire.kept import ANCHOR_KEEP, ANCHOR_UNKEEP
from ...plan.slurm import SlurmRequest
from ...states import SchedulerState
# not ``from . import slurm_cli``: that imports this package, whose __init__ imports this module
from .slurm_cli import cancel, hostnames, job as slurm_job, node_addr, parse_salloc, short_error, test_request
from .base import LaunchError, popen, worker_env
from ...words import plural

Progress = Callable[[str], None]
HOLD = ["-m", "ddp_magic.procs.slurm_hold"]
RELEASE_WAIT_S = 5.0  # salloc relinquishes within moments of its command's exit
QUEUE_POLL_S = 1.0  # how often squeue is asked for a pending job's reason
QUEUE_AFTER_S = 0.5  # a job granted sooner was never queued, as far as the views say


def anchored(python: str = sys.executable) -> List[str]:
    """The prefix that makes salloc or srun go with the kernel (SIGTERM when it goes, SIGKILL included) unless a kept
    pool lets it stay: procs/anchor.py, its parent."""
    return [python, "-m", "ddp_magic.procs.anchor"]


def queued_text(job_id: Optional[str], reason: str) -> str:
    """What the views say while the job waits: "queued: job 1234 pending (Resources)"."""
    return f"queued: job {job_id or '?'} pending" + (f" ({reason})" if reason else "")


class Allocation:
    """A job's nodes, as names and the addresses they are reached at."""

    ours = False

    def __init__(self, request: SlurmRequest) -> None:
        self.request = request
        self.job_id: Optional[str] = request.job_id
        self.nodes: List[str] = []
        self.addrs: List[str] = []

    def wait(self, progress: Progress) -> None:
        """Until the nodes are ours (at once for an allocation found); a step Slurm would refuse is refused here, in its words."""
        refused = test_request(self.request.step_test_argv(str(self.job_id)))
        if refused:
            raise LaunchError(f"srun refused the step in job {self.job_id}: {refused}")
        info = slurm_job(str(self.job_id))
        nodelist = os.environ.get("SLURM_JOB_NODELIST") or info.nodelist
        if info.state != SchedulerState.RUNNING and not nodelist:
            raise LaunchError(f"the kernel's Slurm job {self.job_id} is {info.state} ({info.reason or 'squeue says no more'}): no nodes to run on")
        self._place(nodelist)

    def _place(self, nodelist: str) -> None:
        self.nodes = hostnames(nodelist)
        self.addrs = [node_addr(n) for n in self.nodes]
        if len(self.nodes) < self.request.nodes:
            raise LaunchError(f"Slurm job {self.job_id} has {plural(len(self.nodes), 'node')} ({nodelist}) but {self.request.nodes} were asked for")

    def fits(self, request: SlurmRequest) -> bool:
        """Whether ``request``'s ranks can run in this allocation (a new -n inside it: no new queue wait)."""
        return request.job_id == self.job_id and request.nodes <= len(self.nodes)

    def alive(self) -> bool:
        return True  # the kernel's own job: it lives as long as the kernel can ask

    def describe(self) -> str:
        return f"Slurm job {self.job_id} on {','.join(self.nodes)}: the kernel runs inside it (found SLURM_JOB_ID); ddp_magic never cancels it"

    def release(self) -> None:
        """Nothing to release: the allocation is the kernel's, not ours."""


class OwnAllocation(Allocation):
    """An allocation we asked salloc for, held by the holder process, released on every path."""

    ours = True

    def __init__(self, request: SlurmRequest, python: str = sys.executable) -> None:
        super().__init__(request)
        self.python = python
        self.proc: Optional[subprocess.Popen] = None
        self.said = ""  # what salloc printed (its errors name the cause)
        self.reason = ""
        self.revoked = False  # salloc said "Job allocation N has been revoked" (a node of it failed, or it was cancelled)

    def wait(self, progress: Progress) -> None:
        env = dict(worker_env(), DDP_MAGIC_KERNEL_PID=str(os.getpid()))
        argv = anchored(self.python) + self.request.salloc_argv([self.python, *HOLD])
        self.proc = popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                     start_new_session=True, close_fds=True)  # Ctrl-C on the cell is ours to handle, not salloc's
        try:
            self._await(progress)
        except BaseException:
            self.release()
            raise

    def _await(self, progress: Progress) -> None:
        """Read salloc and the holder until the holder's line; queue updates on the way; the timeout or an error raises."""
        assert self.proc is not None and self.proc.stdout is not None and self.proc.stderr is not None
        t0, asked = time.monotonic(), 0.0
        limit = self.request.queue_timeout
        out, streams = b"", [self.proc.stdout, self.proc.stderr]
        while True:
            ready = select.select(streams, [], [], 0.25)[0] if streams else []
            for stream in ready:
                data = os.read(stream.fileno(), 65536)
                if not data:
                    streams.remove(stream)
                elif stream is self.proc.stderr:
                    self._heard(data.decode(errors="replace"))
                else:
                    out += data
            words = out.split(b"\n", 1)[0].decode(errors="replace").split() if b"\n" in out else []
            if len(words) >= 3 and words[0] == "ddp_magic_hold":
                self.job_id = words[1]
                self._place(words[2])
                return
            if not streams and self.proc.wait() is not None:  # both pipes closed: salloc has ended
                raise LaunchError(f"salloc could not allocate: {short_error(self.said)}")
            now = time.monotonic()
            if self.job_id and now - t0 >= QUEUE_AFTER_S and now - asked >= QUEUE_POLL_S:
                asked = now
                self.reason = slurm_job(self.job_id).reason or self.reason
                progress(queued_text(self.job_id, self.reason))
            if limit is not None and now - t0 > limit:
                raise LaunchError(f"Slurm job {self.job_id or '(not yet numbered)'} did not start within --start-timeout {limit:g} s: "
                                  f"it was still pending ({self.reason or 'no reason given'}); cancelled it")

    def _heard(self, text: str) -> None:
        self.said += text
        for line in text.splitlines():
            kind, number = parse_salloc(line)
            if kind in ("pending", "granted") and number:
                self.job_id = number
            self.revoked = self.revoked or (kind == "revoked" and number == self.job_id)

    def fits(self, request: SlurmRequest) -> bool:
        mine = self.request
        same = all(getattr(request, k) == getattr(mine, k) for k in ("partition", "time", "gpus_per_node", "account", "extra"))
        return same and not request.found and request.nodes <= mine.nodes and request.ntasks_per_node <= mine.ntasks_per_node

    def alive(self) -> bool:
        """The holder runs and salloc has not said that Slurm revoked the job (read now, without waiting: each cell asks)."""
        if self.proc is None:
            return False
        stderr = self.proc.stderr  # read first: a salloc that has exited said why before it went
        while stderr is not None and not stderr.closed and select.select([stderr], [], [], 0)[0]:
            data = os.read(stderr.fileno(), 65536)
            if not data:
                break
            self._heard(data.decode(errors="replace"))
        return self.proc.poll() is None and not self.revoked

    def gone_why(self, down: Sequence[str] = ()) -> str:
        """Why the allocation ended under us, in one line of our words (salloc's told us, else ``down``: the nodes Slurm
        holds down now), never raw srun lines."""
        failed = list(dict.fromkeys(_NODE_FAILURE.findall(self.said))) or list(down)
        if self.revoked:
            return f"Slurm revoked job {self.job_id}" + (f" when {'node' if len(failed) == 1 else 'nodes'} {', '.join(failed)} failed" if failed else "")
        return f"Slurm job {self.job_id} ended (salloc exited: {short_error(self.said)})"

    def describe(self) -> str:
        return f"Slurm job {self.job_id} on {','.join(self.nodes)}: allocated for this kernel, released when the pool stops or the kernel ends"

    def follow(self, line: str, keep: bool) -> None:
        """A kept pool (``keep``): salloc outlives this kernel and the holder follows ``line`` (``lease PATH``: the lease's
        lock); or ``keep --off``: ``kernel PID`` again (procs/slurm_hold.py ``Follow``, procs/anchor.py)."""
        if self.proc is None or self.proc.stdin is None or self.proc.poll() is not None:
            raise OSError("no holder runs for this allocation")
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()
        os.kill(self.proc.pid, ANCHOR_KEEP if keep else ANCHOR_UNKEEP)  # our child, not reaped: its pid is its own

    def release(self) -> None:
        """End the holder (salloc then releases the allocation); a job still queued is cancelled. Waits a few seconds at most."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            assert proc.stdin is not None
            proc.stdin.close()  # the holder reads EOF and exits: salloc relinquishes
        except OSError:
            log.debug("the holder's pipe was closed already", exc_info=True)
        if self.job_id and not self.nodes:
            cancel(self.job_id)  # still queued: no holder runs yet
        try:
            proc.wait(timeout=RELEASE_WAIT_S)
        except subprocess.TimeoutExpired:
            log.debug("salloc did not exit after its holder; cancelling job %s", self.job_id, exc_info=True)
            if self.job_id:
                cancel(self.job_id)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


_NODE_FAILURE = re.compile(r"Node failure on (\S+)")  # salloc's words when Slurm lost a node of the job


def allocation_for(request: SlurmRequest, python: str = sys.executable) -> Allocation:
    """The allocation a request runs in: the kernel's own (SLURM_JOB_ID) or a new one of ours."""
    return Allocation(request) if request.found else OwnAllocation(request, python)


def released_text(alloc: Allocation, silent: Collection[str] = ()) -> str:
    """What ``%ddp stop`` (and the panel's Stop) adds about the Slurm job: ours is released (cancelled while it was still
    queued), the kernel's own stays. ``silent``: nodes not heard from, which Slurm frees only once they answer."""
    if not alloc.job_id:
        return ""
    if not alloc.ours:
        return f"; Slurm job {alloc.job_id} kept: the kernel runs inside it"
    if not alloc.nodes:
        return f"; Slurm job {alloc.job_id} cancelled while it was queued"
    held = [n for n in alloc.nodes if n in silent]
    if not held:
        return f"; Slurm job {alloc.job_id} released: its nodes are free"
    free = [n for n in alloc.nodes if n not in silent]
    return (f"; Slurm job {alloc.job_id} released: " + (f"{','.join(free)} free, " if free else "") +
            f"{','.join(held)} once {'it answers' if len(held) == 1 else 'they answer'}")
