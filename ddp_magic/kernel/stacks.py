"""``%ddp stacks``, ``job.stacks()`` and the panel's Stacks in the kernel: every rank's stack now, grouped.

The request is a STACK with an id on each rank's control socket; the rank's reader thread
answers at once, whatever its main thread runs (procs/rank_stacks.py), on every launcher
(the control channel is the same for local, torchrun and Slurm ranks). The answers are
filed by id on the peek desk by whichever thread pumps the hub: a running cell's (the
foreground's, or a ``--bg`` job's) while one holds the pool's turn, else this request's
own thread, which takes the turn for that moment (kernel/jobs/peek.py ``await_answers``). So it
works from a cell while a job runs, and from the comm's thread while a foreground cell runs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..wire import protocol as P
from . import stack_groups
from .jobs.peek import await_answers
from .jobs.turns import Turns

STACKS_TIMEOUT_S = 2.0  # how long to wait for every rank's answer (the reader thread answers in ms)
NATIVE_TIMEOUT_S = 12.0  # with --native: py-spy's dump takes a second or more per rank


@dataclass
class Stacks:
    """What the ranks answered: ``replies`` by rank, who did not answer in time, who is not connected; its repr is the grouped view."""

    replies: Dict[int, dict]
    unanswered: List[int] = field(default_factory=list)
    absent: List[int] = field(default_factory=list)
    numbers: Mapping[str, Optional[int]] = field(default_factory=dict)  # cell label -> prompt number: Cell In[12]
    elapsed: float = 0.0
    timeout: float = STACKS_TIMEOUT_S

    @property
    def groups(self) -> List[List[int]]:
        """The ranks grouped by stack (equal up to line numbers), smallest group first."""
        return stack_groups.group(self.replies)

    def lines(self) -> List[str]:
        return [stack_groups.summary(self.replies, self.elapsed)] + stack_groups.render(
            self.replies, self.numbers, self.unanswered, self.absent, self.timeout)

    def text(self) -> str:
        return "\n".join(self.lines())

    def __repr__(self) -> str:
        return self.text()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.text())


def stacks(pool: Any, turns: Turns, ranks: Optional[Sequence[int]] = None, all_threads: bool = False, native: bool = False,
           timeout: Optional[float] = None, numbers: Optional[Mapping[str, Optional[int]]] = None) -> Stacks:
    """Ask ``ranks`` (default: every rank) for their stacks; wait up to ``timeout`` for the answers."""
    hub = pool.hub
    wait = timeout if timeout is not None else (NATIVE_TIMEOUT_S if native else STACKS_TIMEOUT_S)
    wanted = sorted(set(ranks)) if ranks is not None else list(range(pool.nproc))
    asked = [r for r in wanted if r in hub.conns]
    t0 = time.monotonic()
    pid = hub.peeks.open()
    try:
        hub.broadcast(P.message(P.STACK, id=pid, all_threads=all_threads, native=native), asked)
        await_answers(hub, turns, pid, asked, t0 + wait)
    finally:
        answers = hub.peeks.close(pid)
    return Stacks(
        replies=answers, unanswered=[r for r in asked if r not in answers], absent=[r for r in wanted if r not in asked],
        numbers=dict(numbers or {}), elapsed=time.monotonic() - t0, timeout=wait,
    )
