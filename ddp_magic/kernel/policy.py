"""The failure policy while a cell runs: who failed first, when to interrupt, when to stop ranks.

A rank that raises or dies makes the cell fail; the others get ``grace``
seconds to finish, then are asked where they are (their stacks) and
interrupted; ranks that still do not finish (a gloo or NCCL wait cannot be
interrupted) are stopped with SIGTERM, then SIGKILL, and the pool restarts on
the next cell. Failures are ordered so the one that explains the others
comes first.
"""
from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING, Dict, List, Optional

from ..wire import protocol as P
from ..errors import RankFailure
from .launchers import TorchrunLauncher, signal_pid

if TYPE_CHECKING:
    from .pool import Listener, Pool


class CellWatch:
    """The failure policy while a cell runs: who failed first, when to interrupt, when to stop ranks."""

    def __init__(self, pool: Pool, listener: Listener, timeout: Optional[float], t0: float) -> None:
        self.pool, self.listener, self.timeout, self.t0 = pool, listener, timeout, t0
        self.first_failure: Optional[float] = None
        self.order: List[int] = []  # ranks in the order they failed
        self.interrupt_sent: Optional[float] = None
        self.killed: List[int] = []
        self.notes: List[str] = []
        self.stacks: Dict[int, str] = {}
        self.cancelled = False
        self.user_interrupt = False
        self.timed_out = False
        self.state_lost = False

    def running(self) -> List[int]:
        return [r for r, i in self.pool.ranks.items() if i.state == "running"]

    def finished(self) -> bool:
        return not self.running()

    def _note_failures(self) -> None:
        for r, info in sorted(self.pool.ranks.items(), key=lambda kv: kv[1].finished or 0):
            if r in self.order:
                continue
            if info.state in ("failed", "dead", "interrupted") and not (info.state == "interrupted" and self.interrupt_sent):
                self.order.append(r)
                if self.first_failure is None:
                    self.first_failure = time.monotonic()

    def next_due(self) -> Optional[float]:
        """When tick() next has something to decide (the timeout, a grace period's end); None: only on events.

        Cheap on purpose (no pass over the ranks): the poll loop asks after every event."""
        times = []
        if self.timeout is not None and not self.timed_out:
            times.append(self.t0 + self.timeout)
        if self.first_failure is not None and self.interrupt_sent is None:
            times.append(self.first_failure + self.pool.grace)
        if self.interrupt_sent is not None:
            times.append(self.interrupt_sent + self.pool.grace)
        return min(times) if times else None

    def tick(self) -> None:
        self._note_failures()
        now = time.monotonic()
        running = self.running()
        if not running:
            return
        if self.timeout is not None and not self.timed_out and now - self.t0 >= self.timeout:
            self.timed_out = True
            self.cancelled = True
            self._capture_stacks(running)
            self.notes.append("where each rank was when the timeout expired:")
            self.notes += [f"--- rank {r} ---\n{self.stacks.get(r, '(no answer)').rstrip()}" for r in sorted(self.stacks)]
            self._interrupt(running)
            return
        if self.first_failure is not None and self.interrupt_sent is None and now - self.first_failure >= self.pool.grace:
            self.cancelled = True
            self._capture_stacks(running)
            where = ", ".join(f"rank {r} at {_last_cell_line(self.stacks.get(r, ''))}" for r in running)
            who = f"rank {running[0]} was" if len(running) == 1 else f"ranks {', '.join(map(str, running))} were"
            self.notes.append(f"after rank {self.order[0]} failed, {who} still running ({where}); interrupted")
            self._interrupt(running)
            return
        if self.interrupt_sent is not None and now - self.interrupt_sent >= self.pool.grace:
            self._stop_ranks(running)

    def _capture_stacks(self, ranks: List[int]) -> None:
        replies = self.pool.ask(P.STACK, timeout=1.0, listener=self.listener)
        for r in ranks:
            if r in replies:
                self.stacks[r] = replies[r]["text"]

    def _interrupt(self, ranks: List[int]) -> None:
        self.interrupt_sent = time.monotonic()
        self.pool._broadcast(P.message(P.INTERRUPT), ranks)

    def _stop_ranks(self, ranks: List[int]) -> None:
        """Escalate: SIGTERM, then SIGKILL for whoever is still there a moment later."""
        torchrun = isinstance(self.pool.launcher, TorchrunLauncher)
        for sig, wait in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 3.0)):
            alive = [r for r in ranks if self.pool.ranks[r].state == "running"]
            if not alive:
                break
            if torchrun:  # ranks on other nodes: their reader thread exits the process for us
                self.pool._broadcast(P.message(P.KILL), alive)
            for r in alive:
                pid = self.pool.ranks[r].pid
                if pid and (not torchrun or pid in self.pool.launcher.pids):
                    signal_pid(pid, sig)
                if r not in self.killed:
                    self.killed.append(r)
            deadline = time.monotonic() + wait
            while any(self.pool.ranks[r].state == "running" for r in alive) and time.monotonic() < deadline:
                for rank, pid, code in self.pool.launcher.poll(0.02):
                    self.pool._on_exit(rank, pid, code, self.listener)
        for r in ranks:
            info = self.pool.ranks[r]
            if info.state in ("running", "dead"):
                info.state = "dead"
                info.finished = info.finished or time.monotonic()
                self.listener.on_state(info)
        self.state_lost = True
        who, verb = (f"rank {ranks[0]}", "was") if len(ranks) == 1 else (f"ranks {', '.join(map(str, ranks))}", "were")
        self.pool.broken = f"{who} did not respond to the interrupt and {verb} stopped"
        self.notes.append(
            f"{who} did not respond to the interrupt (stuck in a collective or native code) and {verb} stopped; "
            "the pool restarts on the next cell and variables defined in earlier %%ddp cells are lost"
        )

    def interrupted_by_user(self) -> None:
        """Ctrl-C in the kernel: interrupt every rank now; stragglers are stopped after the grace."""
        self.user_interrupt = True
        self.cancelled = True
        running = self.running()
        self.notes.append("interrupted by the user (Ctrl-C / kernel interrupt)")
        if running:
            self._interrupt(running)

    def failures(self) -> List[RankFailure]:
        self._note_failures()
        out: List[RankFailure] = []
        for r in self.order + [r for r, i in self.pool.ranks.items() if i.state == "interrupted" and r not in self.order]:
            info = self.pool.ranks[r]
            msg = self.pool._done.get(r)
            if info.state == "dead":
                f = self.pool._death_failure(r)
                if r in self.killed:
                    f.kind = "killed"
                out.append(f)
            elif msg is not None and msg["status"] != "ok":
                err = msg["error"] or {}
                out.append(
                    RankFailure(rank=r, kind="interrupted" if msg["status"] == "interrupted" else "error", type=err.get("type", ""), message=err.get("message", ""), traceback=err.get("traceback", ""), pid=info.pid)
                )
        out.sort(key=_root_cause_rank)  # stable: arrival order within each kind
        if self.user_interrupt and not out:
            out.append(RankFailure(rank=0, kind="interrupted"))
        if self.timed_out and not self.order:
            out.insert(0, RankFailure(rank=min(self.stacks or {0: ""}), kind="timeout", type="TimeoutError", message=f"the cell ran past --timeout {self.timeout:g}s"))
        return out


_PEER_ERRORS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "connection closed")


def _root_cause_rank(f: RankFailure) -> int:
    """Which failure explains the others: a rank that died, then a real error, then the
    collectives that broke because a peer went away, then ranks we interrupted or stopped."""
    if f.kind == "died":
        return 0
    if f.kind == "error":
        return 2 if any(e in f.message for e in _PEER_ERRORS) else 1
    return 3


def _last_cell_line(stack: str) -> str:
    lines = [ln.strip() for ln in stack.splitlines() if ln.strip().startswith('File "<ddp-cell')]
    if not lines:
        return "an unknown place"
    last = lines[-1]
    try:
        lineno = last.split("line ", 1)[1].split(",", 1)[0]
    except IndexError:
        return last
    code_lines = stack.splitlines()
    idx = [i for i, ln in enumerate(code_lines) if ln.strip() == last][-1]
    code = code_lines[idx + 1].strip() if idx + 1 < len(code_lines) else ""
    return f"cell line {lineno}: {code}" if code else f"cell line {lineno}"
