"""``%%ddp --peek`` in the kernel: a short read-only cell sent to the ranks beside the running cell, and their answers.

The request goes out on each rank's control socket (PEEK); the rank runs it on its peek
thread, beside whatever its main thread runs (procs/rank_peek.py), and answers on the same
socket. Whichever thread pumps the hub files the answers in the ``PeekDesk``: a background
job's thread while one holds the pool's turn (the peek then only waits on the desk), else
the peek's own thread, which takes the turn for that moment (kernel/jobs/turns.py) so that no
cell starts pumping beside it. Nothing here waits for the running cell, and the running
cell never waits for a peek.
"""
from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...errors import RankFailure
from ...logs import log
from ...states import FailureKind
from ...wire import protocol as P
from ...wire import transfer
from .turns import Ticket, Turns

PEEK_TIMEOUT_S = 10.0  # how long a peek waits for every rank's answer (%%ddp --peek --timeout S)
SLICE_S = 0.05  # while another thread pumps: how often a waiting peek looks whether that thread is gone
_ids = itertools.count(1)


class PeekDesk:
    """The answers of the peeks in flight, by peek id and rank; filled by whichever thread pumps the hub."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._open: Dict[int, Dict[int, dict]] = {}

    def open(self) -> int:
        with self._cond:
            pid = next(_ids)
            self._open[pid] = {}
            return pid

    def put(self, rank: int, msg: dict) -> None:
        """An answer came (an answer to a peek nobody waits for any more is dropped)."""
        with self._cond:
            box = self._open.get(msg.get("id", -1))
            if box is not None:
                box[rank] = msg
                self._cond.notify_all()

    def answered(self, pid: int, ranks: Sequence[int]) -> bool:
        with self._cond:
            box = self._open.get(pid, {})
            return all(r in box for r in ranks)

    def wait(self, pid: int, ranks: Sequence[int], until: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: all(r in self._open.get(pid, {}) for r in ranks), max(0.0, until - time.monotonic()))

    def answers(self, pid: int) -> Dict[int, dict]:
        """The answers so far, the request still open."""
        with self._cond:
            return dict(self._open.get(pid, {}))

    def close(self, pid: int) -> Dict[int, dict]:
        with self._cond:
            return self._open.pop(pid, {})


@dataclass
class PeekOutcome:
    """What a peek gave: each asked rank's value (None elsewhere), what it printed, and the ranks whose peek failed."""

    values: List[Any]
    output: Dict[int, Tuple[str, str]] = field(default_factory=dict)  # rank -> (stdout, stderr)
    failures: List[RankFailure] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    elapsed: float = 0.0


def peek(pool: Any, turns: Turns, source: str, ranks: Optional[Sequence[int]] = None, timeout: float = PEEK_TIMEOUT_S) -> PeekOutcome:
    """Run ``source`` on ``ranks`` (default: every rank) on their peek threads; wait up to ``timeout`` for the answers."""
    hub = pool.hub
    wanted = sorted(set(ranks)) if ranks is not None else list(range(pool.nproc))
    asked = [r for r in wanted if r in hub.conns]
    t0 = time.monotonic()
    pid = hub.peeks.open()
    try:
        hub.broadcast(P.message(P.PEEK, id=pid, source=source, filename=f"<ddp-peek-{pid}>"), asked)
        await_answers(hub, turns, pid, asked, t0 + timeout)
    finally:
        answers = hub.peeks.close(pid)
    out = _outcome(pool.nproc, asked, answers, timeout)
    out.notes += [f"rank {r} was not asked: it is not connected (%ddp status)" for r in wanted if r not in asked]
    out.elapsed = time.monotonic() - t0
    return out


def await_answers(hub: Any, turns: Turns, pid: int, ranks: Sequence[int], deadline: float) -> None:
    """Until every asked rank answered (or left, or the deadline): pump the hub ourselves when nobody else does."""
    me = Ticket("a peek")

    def settled() -> bool:  # a rank that left meanwhile is waited for no longer (its peek counts as unanswered)
        return hub.peeks.answered(pid, [r for r in ranks if r in hub.conns])

    while not settled() and time.monotonic() < deadline:
        if turns.try_take(me):
            try:
                hub.pump(settled, deadline)
            finally:
                turns.give_back(me)
            return
        hub.peeks.wait(pid, ranks, min(deadline, time.monotonic() + SLICE_S))


def _outcome(nproc: int, asked: Sequence[int], answers: Dict[int, dict], timeout: float) -> PeekOutcome:
    out = PeekOutcome(values=[None] * nproc)
    for rank in asked:
        msg = answers.get(rank)
        if msg is None:
            why = f"rank {rank} did not answer the peek within {timeout:g} s (its peek thread may still run an earlier peek)"
            out.failures.append(RankFailure(rank=rank, kind=FailureKind.TIMEOUT, message=why))
            continue
        out.output[rank] = (str(msg.get("stdout", "")), str(msg.get("stderr", "")))
        err = msg.get("error")
        if err:
            out.failures.append(RankFailure(rank=rank, kind=FailureKind.ERROR, type=err["type"], message=err["message"], traceback=err["traceback"]))
        elif msg.get("result") is not None:
            out.values[rank] = _unpack(rank, msg["result"], out.notes)
    return out


def _unpack(rank: int, packed: dict, notes: List[str]) -> Any:
    try:
        return transfer.unpack(packed)
    except Exception as e:  # unpickling runs the value's own code: anything can raise
        log.debug("a peek's value from rank %s could not be unpickled", rank, exc_info=True)
        notes.append(f"rank {rank}'s peek value could not be unpickled in the kernel: {type(e).__name__}: {e}")
        return transfer.Unpicklable(rank, "peek value", f"{type(e).__name__}: {e}")
