"""The ranks' stdin in the kernel: their INPUT requests, answered one at a time in rank order, each prompt naming its rank.

The pool knows no IPython: the line comes from an ``Ask`` callback the front
end supplies (the magics: the kernel's own ``input``/``getpass``, which a
notebook shows as an input box). Without one, or when the front end has no
stdin, the rank gets EOF with the reason at once. Which ranks are in the
debugger or wait for input is also kept here: the status view shows it, the
failure policy's clocks pause for it, and every rank hears it (HOLD) so its
collective watchdog pauses too.

A background cell (``%%ddp --bg``) has no cell waiting on the kernel's stdin, and its
job's thread must not block (it pumps the hub: output, metrics, peeks, cancel). Its
``Ask`` is a ``Mailbox``: the job's thread posts each question there and goes on; the
notebook answers it from whichever cell runs (``job.answer``, ``%ddp_debug``, on the
main thread, whose input box belongs to that cell), and the job's thread sends the
answer at its next wake.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Protocol, Sequence, Set, Tuple

from ...states import RankState, Waiting
from ...wire import protocol as P
from ..ranks import RankInfo

Ask = Callable[[str, bool], str]  # (prompt, password) -> the line; EOFError: the front end has none to give

NO_STDIN = (
    "this front end does not allow input (e.g. nbval, or allow_stdin=False): "
    "a rank's input(), getpass and pdb read EOF; run the cell in a notebook or console that allows stdin"
)
NO_ASKER = "this pool was run without a way to ask for input (Pool.run(stdin=...)); the rank reads EOF"
CANCELLED = "the cell was interrupted while this rank waited for input"


class InputDesk:
    """The ranks' open questions and who sits in pdb, for one pool."""

    def __init__(self) -> None:
        self.pending: Dict[int, dict] = {}  # rank -> its INPUT request (one per rank: a rank asks one at a time)
        self.in_pdb: Set[int] = set()
        self.held = False  # what the ranks were last told (HOLD)

    def reset(self) -> None:
        self.pending.clear()
        self.in_pdb.clear()

    def request(self, rank: int, msg: dict) -> None:
        self.pending[rank] = msg

    def debugger(self, rank: int, on: bool) -> None:
        (self.in_pdb.add if on else self.in_pdb.discard)(rank)

    @property
    def idle(self) -> bool:
        """No rank asks or debugs, and none was told to hold: a DONE has nothing to settle here (asked of every DONE)."""
        return not self.pending and not self.in_pdb and not self.held

    def forget(self, rank: int) -> None:
        """The rank finished its cell (or died): it asks nothing any more."""
        self.pending.pop(rank, None)
        self.in_pdb.discard(rank)

    def what(self, rank: int) -> Waiting:
        """What the rank waits on the notebook for, if anything (the status view says it)."""
        if rank in self.in_pdb:
            return Waiting.DEBUGGER
        return Waiting.INPUT if rank in self.pending else Waiting.NO

    def holding(self, ranks: Optional[Mapping[int, RankInfo]] = None) -> bool:
        """Some rank (of ``ranks``, still running) debugs or waits for a line: the others' waits are not hangs."""
        if not self.pending and not self.in_pdb:  # the usual case, asked after every rank's DONE: O(1)
            return False
        asking = set(self.pending) | self.in_pdb
        if ranks is None:
            return bool(asking)
        return any(r in ranks and ranks[r].state == RankState.RUNNING for r in asking)

    def hold_change(self) -> Optional[dict]:
        """The HOLD message to send every rank when holding() changed since the last one; else None."""
        now = self.holding()
        if now == self.held:
            return None
        self.held = now
        return P.message(P.HOLD, on=now)

    def answer(self, rank: int, ask: Optional[Ask], cancelled: bool, node: str = "") -> dict:
        """The reply to ``rank``'s request (it is taken off the desk). KeyboardInterrupt from ``ask`` propagates:
        the cell is interrupted, and the rank's wait with it. ``node``: a Slurm rank's node, named in the prompt
        as in its output's prefix (``[rank 3 n2] name? ``)."""
        msg = self.pending.pop(rank)
        eof: Optional[str] = None
        text = ""
        if cancelled:
            eof = CANCELLED
        elif ask is None:
            eof = NO_ASKER
        else:
            try:
                text = ask(f"[{rank_name(rank, node)}] {msg.get('prompt', '')}", bool(msg.get("password")))
            except EOFError as e:
                eof = str(e) or NO_STDIN
        no_stdin = eof is not None and not cancelled  # pdb then continues instead of quitting (rank_debug.py)
        return P.message(P.INPUT, id=msg.get("id"), text=text, eof=eof, no_stdin=no_stdin)


class _Hub(Protocol):
    """The part of the control hub (hub.py) that answering needs."""

    stdin: InputDesk

    def pump(self, until: Callable[[], bool], deadline: Optional[float]) -> bool: ...

    def drain_outs(self, rank: int, timeout: float = 0.5) -> None: ...

    def broadcast(self, msg: dict, ranks: Optional[Sequence[int]] = None) -> None: ...

    def debug_changed(self, rank: int) -> None: ...


def rank_name(rank: int, node: str = "") -> str:
    """``rank 3``, or ``rank 3 n2`` for a rank on a Slurm node: the words inside a prompt's brackets."""
    return f"rank {rank} {node}" if node else f"rank {rank}"


SETTLE_S = 0.1  # a question sent at the same moment by a lower rank arrives first


def answer_all(hub: _Hub, ranks: Mapping[int, RankInfo], ask: Optional[Ask], cancelled: bool) -> None:
    """Answer the ranks' questions, lowest rank first, one at a time; what a rank printed before asking shows first.

    A ``Mailbox`` (a background cell) is not asked and waited for: its questions are posted, its answers sent once given."""
    desk = hub.stdin
    if isinstance(ask, Mailbox):
        if not cancelled:
            ask.sync(hub, ranks)
            return
        ask.close()  # an interrupted job's questions are answered EOF below, as a foreground cell's
    if desk.pending:
        hub.pump(lambda: False, time.monotonic() + SETTLE_S)
    while desk.pending:
        rank = min(desk.pending)
        if ranks[rank].state != RankState.RUNNING:
            desk.forget(rank)
        else:
            hub.drain_outs(rank, 0.2)
            hub.broadcast(desk.answer(rank, ask, cancelled, ranks[rank].node_name), [rank])
        hub.debug_changed(rank)


@dataclass(frozen=True)
class Question:
    """One rank's open question in a background cell."""

    rank: int
    id: Any  # the rank's request id (a reply names it)
    prompt: str
    password: bool
    debugger: bool  # the rank sits in pdb: this is its (Pdb) prompt
    node: str = ""  # a Slurm rank's node ("n2"); a rank on this kernel's machine has none

    @property
    def name(self) -> str:
        """``rank 3`` or ``rank 3 n2``: what its prompt and its output's prefix call the rank."""
        return rank_name(self.rank, self.node)

    def text(self) -> str:
        """``rank 0 waits for input: 'lr? '`` (``waits in the debugger`` at a pdb prompt)."""
        return f"rank {self.rank} {'waits in the debugger' if self.debugger else 'waits for input'}: {self.prompt!r}"


class Mailbox:
    """A background cell's questions and their answers; the job's thread posts and sends (``sync``), any thread answers.

    ``before()`` runs on the job's thread before a question is shown (pending rank output first);
    ``tell(question)`` says a new question when no cell is attached to answer it; ``reroute(where)``
    runs on the job's thread when a cell attaches (``where``: what ``attach`` was given) or leaves (None):
    the front end sends the job's output to that cell meanwhile."""

    def __init__(self, before: Callable[[], None] = lambda: None, tell: Callable[[Question], None] = lambda q: None,
                 reroute: Callable[[Any], None] = lambda where: None) -> None:
        self._cond = threading.Condition()
        self.asking: Dict[int, Question] = {}
        self._answers: Dict[int, Tuple[Any, str, Optional[str]]] = {}  # rank -> (question id, text, eof)
        self.in_pdb: Set[int] = set()
        self.closed = False
        self._attached: Any = None
        self._routed: Any = None  # what the job's thread last rerouted to
        self.before, self.tell, self.reroute = before, tell, reroute

    def __call__(self, prompt: str, password: bool) -> str:
        """An ``Ask`` in name only: answer_all posts a mailbox's questions instead of asking it."""
        raise EOFError("a background cell's questions are answered through its job's mailbox (%ddp_debug, job.answer)")

    # ------------------------------------------------------------ the job's thread (answer_all, each wake)
    def sync(self, hub: _Hub, ranks: Mapping[int, RankInfo]) -> None:
        """Post the ranks' new questions, send the answers given since, follow an attached cell."""
        if self._attached is not self._routed:
            self._routed = self._attached
            self.reroute(self._routed)
        desk = hub.stdin
        for rank in sorted(desk.pending):
            msg = desk.pending[rank]
            if ranks[rank].state != RankState.RUNNING:
                desk.forget(rank)
                self._drop(rank)
            elif self._has(rank, msg.get("id")):
                reply = self._take(rank, msg.get("id"))
                if reply is None:
                    continue
                desk.pending.pop(rank)
                no_stdin = reply[1] is not None  # the answering cell's front end had no stdin: pdb continues, as in a foreground cell
                hub.broadcast(P.message(P.INPUT, id=msg.get("id"), text=reply[0], eof=reply[1], no_stdin=no_stdin), [rank])
            else:
                hub.drain_outs(rank, 0.2)
                self.before()
                self._post(Question(rank, msg.get("id"), str(msg.get("prompt", "")), bool(msg.get("password")), rank in desk.in_pdb,
                                    ranks[rank].node_name))
            hub.debug_changed(rank)
        if self.in_pdb != desk.in_pdb:  # the usual wake (nobody in pdb, nobody asking) takes no lock
            with self._cond:
                self.in_pdb = set(desk.in_pdb)
                self._cond.notify_all()

    def _has(self, rank: int, qid: Any) -> bool:
        with self._cond:
            q = self.asking.get(rank)
            return q is not None and q.id == qid

    def _take(self, rank: int, qid: Any) -> Optional[Tuple[str, Optional[str]]]:
        with self._cond:
            got = self._answers.get(rank)
            if got is None or got[0] != qid:
                return None
            del self._answers[rank], self.asking[rank]
            self._cond.notify_all()
            return got[1], got[2]

    def _post(self, question: Question) -> None:
        with self._cond:
            self.asking[question.rank] = question
            self._answers.pop(question.rank, None)  # an answer to an abandoned question (the rank was interrupted) is void
            attached = self._attached is not None
            self._cond.notify_all()
        if not attached:
            self.tell(question)

    def _drop(self, rank: int) -> None:
        with self._cond:
            self.asking.pop(rank, None)
            self._answers.pop(rank, None)
            self._cond.notify_all()

    def close(self) -> None:
        """The job ended or was interrupted: no question is open any more."""
        with self._cond:
            self.closed = True
            self.asking.clear()
            self._answers.clear()
            self._cond.notify_all()

    # ------------------------------------------------------------ any thread (the notebook's cells)
    def question(self, rank: Optional[int] = None) -> Optional[Question]:
        """The open question of ``rank`` (default: the lowest rank asking) that has no answer yet; None: none."""
        with self._cond:
            open_ = {r: q for r, q in self.asking.items() if r not in self._answers}
            if rank is not None:
                return open_.get(rank)
            return open_[min(open_)] if open_ else None

    def text(self) -> Optional[str]:
        """What the ranks wait for (``rank 0 waits for input: 'lr? '``), or None."""
        with self._cond:
            qs = [self.asking[r] for r in sorted(self.asking)]
        return "; ".join(q.text() for q in qs) if qs else None

    def answer(self, question: Question, text: str, eof: Optional[str] = None) -> None:
        """Give ``question`` its line (``eof``: an EOFError with this reason instead); the job's thread sends it."""
        with self._cond:
            if self.asking.get(question.rank) is question:
                self._answers[question.rank] = (question.id, text, eof)
                self._cond.notify_all()

    def next_question(self, after: Question, settle: float, timeout: float = 30.0) -> Optional[Question]:
        """After ``after`` was answered: its rank's next question, waited for while the rank sits in pdb and for
        ``settle`` seconds after; None when none comes (the rank went on) or the job ended."""
        rank = after.rank
        with self._cond:
            self._cond.wait_for(lambda: self.closed or self.asking.get(rank) is not after, timeout)  # the answer went out
            quiet_since = time.monotonic()
            while not self.closed:
                q = self.asking.get(rank)
                if q is not None and q is not after and rank not in self._answers:
                    return q
                if rank in self.in_pdb:
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since >= settle:
                    return None
                self._cond.wait(0.05)
            return None

    def attach(self, where: Any) -> None:
        """A cell answers the questions now: the job's output goes there (``reroute``), no notice is needed."""
        with self._cond:
            self._attached = where

    def detach(self) -> None:
        with self._cond:
            self._attached = None

