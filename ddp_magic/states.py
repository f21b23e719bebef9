"""The states a rank goes through, the kinds of failure, a background job's and a scheduler job's states: one home for all.

Plain data, imported by the kernel, the session and the views alike (and
mirrored name for name by ``labextension/src/model.ts``; a test checks the
two lists match). Both are ``str`` enums so a state is its own JSON value.

Rank state transitions (the kernel's view of one rank)::

    QUEUED ──the scheduler's job started──▶ STARTING   (Slurm pools only: the job waits in the queue)
    STARTING ──joined──▶ CONNECTING ──process group up──▶ READY
    READY ──cell sent──▶ RUNNING ──▶ DONE | FAILED | INTERRUPTED
    DONE ──next cell──▶ RUNNING
    FAILED / INTERRUPTED ──the cell over, the pool whole (its group re-formed)──▶ READY

After a failed cell every rank of a pool that is whole is READY again: FAILED and
INTERRUPTED are what a cell's own view shows of it; the cell's outcome outlives it
as the session's last cell (session.py ``LastCell``), not as the ranks' states.
    any live state ──process exit seen──▶ DEAD
    any state but DEAD / FAILED ──pool stopped by us──▶ STOPPED

DEAD is terminal for that process: the next cell restarts the pool.
"""
from __future__ import annotations

from enum import Enum


class RankState(str, Enum):
    """Where one rank is, as the kernel last saw it."""

    QUEUED = "queued"  # the scheduler (Slurm) has not started the job yet: no process exists
    STARTING = "starting"  # asked for; no process has joined yet
    CONNECTING = "connecting"  # joined the control channel; process group not yet up
    READY = "ready"  # idle, process group up, waiting for a cell
    RUNNING = "running"  # executing the current cell
    DONE = "done"  # finished the current cell without error
    FAILED = "failed"  # the current cell raised on this rank
    INTERRUPTED = "interrupted"  # the current cell was interrupted on this rank
    DEAD = "dead"  # the process exited (or its connection was lost)
    STOPPED = "stopped"  # stopped by ddp_magic itself (stop, restart, teardown)

    def __str__(self) -> str:
        return self.value

    @property
    def finished(self) -> bool:
        """The rank holds no cell any more (a cell's end, or the process's)."""
        return self in (RankState.DONE, RankState.FAILED, RankState.INTERRUPTED, RankState.DEAD, RankState.STOPPED)


class Waiting(str, Enum):
    """Why a RUNNING rank is not hung though it makes no progress: it waits on the notebook (kernel/jobs/stdin.py)."""

    NO = ""  # it does not: its waits are the cell's own
    DEBUGGER = "in debugger"  # it sits in pdb (breakpoint(), post-mortem)
    INPUT = "waiting for input"  # input(), getpass or sys.stdin asked the notebook for a line

    def __str__(self) -> str:
        return self.value


class FailureKind(str, Enum):
    """Why a rank counts as failed in a cell's outcome; the root-cause order lives in kernel/failures/policy.py."""

    ERROR = "error"  # the cell raised on the rank
    INTERRUPTED = "interrupted"  # the rank honoured an interrupt (Ctrl-C, a peer's failure)
    DIED = "died"  # the process exited on its own (crash, os._exit, OOM kill)
    KILLED = "killed"  # ddp_magic stopped it after it ignored an interrupt
    INIT = "init"  # it could not start or join the process group
    TIMEOUT = "timeout"  # the cell ran past --timeout

    def __str__(self) -> str:
        return self.value


class JobState(str, Enum):
    """Where a background cell (``%%ddp --bg``, ui/jobs.py) is: queued, running, then one of the three ends.

    QUEUED ──its turn (kernel/jobs/turns.py)──▶ RUNNING ──▶ DONE | FAILED | CANCELLED;
    QUEUED ──cancel()──▶ CANCELLED (it never ran).
    """

    QUEUED = "queued"  # waits for the cell that runs on the pool now
    RUNNING = "running"  # runs on the ranks
    DONE = "done"  # every rank finished without error: result() is its RankResults
    FAILED = "failed"  # a rank failed (or the cell could not start): result() raises the CellError
    CANCELLED = "cancelled"  # cancel() interrupted it (or took it out of the queue)

    def __str__(self) -> str:
        return self.value

    @property
    def finished(self) -> bool:
        return self in (JobState.DONE, JobState.FAILED, JobState.CANCELLED)


class SchedulerState(str, Enum):
    """A scheduler job (a Slurm allocation) as ddp_magic acts on it: Slurm's two dozen job states, mapped once
    (``from_slurm``)."""

    QUEUED = "queued"  # waiting to start: its reason (Resources, Priority, a limit) says why
    RUNNING = "running"  # its nodes are ours: steps can start
    SUSPENDED = "suspended"  # held by the scheduler with its nodes
    ENDING = "ending"  # completing: its processes are being ended
    COMPLETED = "completed"  # ended on its own
    CANCELLED = "cancelled"  # ended by someone (scancel, preemption, a deadline)
    FAILED = "failed"  # ended by a failure (a node, the boot, memory)
    TIMEOUT = "timeout"  # ran past its time limit
    GONE = "gone"  # the scheduler no longer lists it

    def __str__(self) -> str:
        return self.value

    @property
    def ended(self) -> bool:
        return self in (SchedulerState.COMPLETED, SchedulerState.CANCELLED, SchedulerState.FAILED, SchedulerState.TIMEOUT, SchedulerState.GONE)

    @classmethod
    def from_slurm(cls, name: str) -> "SchedulerState":
        """squeue's ``%T`` (or scontrol's JobState=) as one of ours; "CANCELLED by 0" is CANCELLED; unknown names are QUEUED if
        Slurm still lists the job (it may add states; a listed job has not ended)."""
        word = (name or "").strip().split(" ")[0].upper()
        return _SLURM_STATES.get(word, cls.QUEUED if word else cls.GONE)


_SLURM_STATES = {
    **dict.fromkeys(("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD"), SchedulerState.QUEUED),
    **dict.fromkeys(("RUNNING", "RESIZING", "SIGNALING"), SchedulerState.RUNNING),
    **dict.fromkeys(("SUSPENDED", "STOPPED"), SchedulerState.SUSPENDED),
    **dict.fromkeys(("COMPLETING", "STAGE_OUT"), SchedulerState.ENDING),
    "COMPLETED": SchedulerState.COMPLETED,
    **dict.fromkeys(("CANCELLED", "REVOKED", "PREEMPTED", "DEADLINE"), SchedulerState.CANCELLED),
    **dict.fromkeys(("FAILED", "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY", "SPECIAL_EXIT"), SchedulerState.FAILED),
    "TIMEOUT": SchedulerState.TIMEOUT,
}
