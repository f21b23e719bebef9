"""What a front end sees of a pool: each rank's state (RankInfo), a cell's outcome (and the last one's), and the Listener.

Plain data and callbacks, shared by the pool, the control hub, the failure
policy and every view (status view, JupyterLab comm, benchmarks).
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from ..errors import RankFailure
from ..logs import log
from ..states import RankState, Waiting
from .results.combine import combine
from .memory import Memory
from ..words import ranks_phrase
from .failures.blame import causes

FAULT_HEAD = "Fatal Python error"  # how faulthandler's report begins
CRASH_CHARS = 20_000  # of it kept at most
Tick = Callable[[], None]  # runs after each wake of the poll loop
Due = Callable[[], Optional[float]]  # when the next tick is needed at the latest (monotonic), or None


@dataclass
class RankInfo:
    """What the kernel knows of one rank right now."""

    rank: int
    state: RankState = RankState.STARTING
    pid: Optional[int] = None
    device: str = ""
    host: str = ""
    node: int = 0
    node_name: str = ""  # the scheduler's name of its node (Slurm's n2), else its host's
    local_rank: Optional[int] = None
    exit_code: Optional[int] = None
    started: float = field(default_factory=time.monotonic)
    finished: Optional[float] = None
    memory: Optional[int] = None  # bytes CUDA holds (its DONE's), shown on a GPU
    mem: Optional[Memory] = None  # RSS, peak, CUDA's figures, its cgroup: the newest it sent (kernel/memory.py)
    last_line: str = ""
    debugging: Waiting = Waiting.NO  # what a RUNNING rank waits on the notebook for (kernel/jobs/stdin.py)
    tail: Deque[str] = field(default_factory=lambda: deque(maxlen=20))
    silent: bool = False  # its node stopped answering (wire/liveness.py): DEAD as unreachable, not as exited
    crash: str = ""  # faulthandler's block as it died (a segfault, an abort): kernel/failures/deaths.py
    death: str = ""  # how it died, with the evidence ("was killed by the kernel's OOM killer (…)"), set by recovery

    @property
    def elapsed(self) -> float:
        return (self.finished or time.monotonic()) - self.started

    def note_output(self, text: str) -> None:
        """Keep the last lines a rank printed: a failure report quotes them, the view shows the last."""
        if self.crash or FAULT_HEAD in text:  # from here on: the stack faulthandler writes as the rank dies
            at = 0 if self.crash else text.index(FAULT_HEAD)
            self.crash = (self.crash + text[at:])[:CRASH_CHARS]
            text = text[:at]
        pieces = text.replace("\r", "\n").split("\n")
        for piece in pieces[:-1]:
            if piece.strip():
                self.tail.append(piece[-300:])
        if pieces[-1].strip():
            self.last_line = pieces[-1][-300:]
        elif len(pieces) > 1 and self.tail:
            self.last_line = self.tail[-1]


@dataclass
class CellOutcome:
    """What a cell produced: per-rank values, failures (root cause first) and notes for the user."""

    values: List[Any]
    failures: List[RankFailure]
    notes: List[str]
    elapsed: float
    stacks: Dict[int, str] = field(default_factory=dict)
    state_lost: bool = False
    recovered: bool = False  # it failed, and the pool is whole again: every rank READY, the workers' variables kept
    cancelled: bool = False  # a background job's cancel() interrupted it (kernel/cell.py), not a Ctrl-C nor a failure
    interrupted: bool = False  # the user's Ctrl-C interrupted it (not a job's cancel)
    cancel_text: str = ""  # then what every view says of it (texts.cancelled_text; the session knows the step)
    restarted: Tuple[int, ...] = ()  # ranks started again alone that still lack names the others have (Recovery.restarted)
    combined: Any = field(init=False, default=None)  # one value for all ranks when they returned pieces of the same DTensors

    def __post_init__(self) -> None:
        """Put the ranks' DTensor shards together here, so every outcome has its one value (kernel/results/combine.py)."""
        self.combined = None if self.failures else combine(self.values, self.notes)

    @property
    def ok(self) -> bool:
        return not self.failures


@dataclass(frozen=True)
class LastCell:
    """The last %%ddp cell's outcome, for the views that outlive its output (``%ddp status``, the JupyterLab panel).

    A failed cell's ranks are READY again once the pool is whole (recovery.py): what failed, and who is to
    blame, is kept here (the session holds the last one), the one copy those views read."""

    number: Optional[int]  # the prompt number it ran under (In [n]); None outside a notebook
    label: str  # the session's label of the cell (<ddp-cell-L>)
    ok: bool
    headline: str = ""  # its root cause, as the cell's error names it
    recovered: bool = False  # it failed and the pool is whole again: every rank ready, the workers' variables kept
    causes: Mapping[int, Tuple[str, str]] = field(default_factory=dict)  # rank -> (kind, root | stopped): kernel.failures.blame.causes
    generation: int = 0  # the start of the pool it ran on: a restart leaves it behind
    cancelled: bool = False  # job.cancel() ended it: the headline says so, and whether the state was kept
    kept: str = ""  # which ranks kept their variables (``variables_kept``), when it recovered

    @property
    def name(self) -> str:
        """The cell as the notebook names it: "In[4]" (or "<ddp-cell-3>" with no prompt number)."""
        return f"In[{self.number}]" if self.number is not None else f"<ddp-cell-{self.label}>"

    @property
    def root(self) -> List[int]:
        """The ranks whose failure explains the cell's, in rank order."""
        return sorted(r for r, (_, cause) in self.causes.items() if cause == "root")

    def text(self) -> str:
        """"last cell In[4]: rank 1 raised ValueError: bad shard; recovered: every rank is ready, the workers' variables
        intact" (or which ranks kept them: ``variables_kept``)."""
        if self.ok:
            return f"last cell {self.name}: ok"
        kept = f"; {self.kept}" if self.kept else ", the workers' variables intact"
        after = f"; recovered: every rank is ready{kept}" if self.recovered and not self.cancelled else ""
        return f"last cell {self.name}: {self.headline}{after}"

    @classmethod
    def of(cls, outcome: CellOutcome, number: Optional[int], label: str, generation: int) -> "LastCell":
        """What the views that outlive a cell's output keep of it (``Session.last``)."""
        found = causes(outcome.failures)
        headline = outcome.failures[0].headline() if outcome.failures else ""
        if found and all(cause == "stopped" for _, cause in found.values()):  # nobody to blame: Ctrl-C
            who = sorted(found)
            headline = f"{ranks_phrase(who)} {'was' if len(who) == 1 else 'were'} interrupted"
        headline = outcome.cancel_text or headline  # job.cancel(): nobody failed, and no Ctrl-C either
        kept = variables_kept(range(len(outcome.values)), outcome.restarted) if outcome.restarted else ""
        return cls(number, label, outcome.ok, headline, outcome.recovered, found, generation, bool(outcome.cancel_text), kept)

    def to_dict(self) -> Dict[str, Any]:
        """What the JupyterLab panel is told (ui/labsnap.py)."""
        return {
            "number": self.number, "ok": self.ok, "headline": self.headline, "recovered": self.recovered, "root": self.root, "text": self.text(),
            "cancelled": self.cancelled,
            "causes": {str(r): {"kind": kind, "cause": cause} for r, (kind, cause) in sorted(self.causes.items())},
        }


def variables_kept(ranks: Iterable[int], restarted: Iterable[int]) -> str:
    """'ranks 0, 2 kept their variables; rank 1 was started again: it lacks names the others have' (``restarted``: the
    ranks started again alone since the pool started whole, and not given every name since, by a heal or a cell);
    'your variables are intact' when none was."""
    every, fresh = sorted(set(ranks)), sorted(set(restarted) & set(ranks))
    if not fresh:
        return "your variables are intact"
    kept = [r for r in every if r not in fresh]
    one = len(fresh) == 1
    gone = f"{ranks_phrase(fresh)} {'was' if one else 'were'} started again: {'it lacks' if one else 'they lack'} names the others have"
    return f"{ranks_phrase(kept)} kept {'its' if len(kept) == 1 else 'their'} variables; {gone}" if kept else gone


class Listener:
    """What a front end hears from a pool. Override what you need; all are called on the caller's thread."""

    def on_output(self, rank: int, stream: str, text: str) -> None:
        pass

    def on_state(self, info: RankInfo) -> None:
        pass

    def on_states(self, infos: Sequence[RankInfo]) -> None:
        """Every rank changed at once (a cell sent to all): one call down a chain of listeners instead of one per rank."""
        for info in infos:
            self.on_state(info)

    def on_notice(self, text: str) -> None:
        pass

    def on_metrics(self, rank: int, rows: List[Tuple[int, float, Dict[str, float]]]) -> None:
        """Rows of ``ddp_magic.log`` from one rank, in the order it logged them: (step, wall time, {name: value})."""


class GuardedListener(Listener):
    """Wraps a front end's listener: a bug in a view must not leave a cell half-run.

    The first failure becomes a note in the cell's outcome (``errors``); every one is logged. While ``holding``
    (the poll loop of a cell, Pool.pump), the ranks' states wait for the end of the wake, or for the next event of
    another kind so that the order stays: a wake that reads 1,024 DONEs tells the views once, not 1,024 times.
    """

    def __init__(self, inner: Listener) -> None:
        self.inner = inner
        self.errors: List[str] = []
        self._held: Optional[List[RankInfo]] = None  # None: not holding
        self._lock = threading.Lock()  # a peek's thread may tell a state while the cell's thread flushes

    def _call(self, name: str, *args: Any) -> None:
        try:
            getattr(self.inner, name)(*args)
        except Exception as e:  # report once, keep the pool's bookkeeping going
            log.debug("the listener's %s failed", name, exc_info=True)
            if not self.errors:
                self.errors.append(f"the listener's {name} failed ({type(e).__name__}: {e}); its view may be incomplete")

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Hold the states told meanwhile until ``flush`` (each wake) or the end."""
        outer = self._held is not None
        self._held = self._held if outer else []
        try:
            yield
        finally:
            self.flush()
            self._held = self._held if outer else None

    def each_wake(self, tick: Optional[Tick]) -> Tick:
        """The poll loop's ``tick``, after the held states are told (what the policy does next is told after them)."""
        def wake() -> None:
            self.flush()
            if tick is not None:
                tick()

        return wake

    def flush(self) -> None:
        with self._lock:
            held, self._held = self._held, ([] if self._held is not None else None)
        if held:
            self._call("on_states", held)

    def on_output(self, rank: int, stream: str, text: str) -> None:
        self.flush()
        self._call("on_output", rank, stream, text)

    def on_state(self, info: RankInfo) -> None:
        with self._lock:
            if self._held is not None:
                self._held.append(info)
                return
        self._call("on_state", info)

    def on_states(self, infos: Sequence[RankInfo]) -> None:
        self.flush()
        self._call("on_states", infos)

    def on_notice(self, text: str) -> None:
        self.flush()
        self._call("on_notice", text)

    def on_metrics(self, rank: int, rows: List[Tuple[int, float, Dict[str, float]]]) -> None:
        self.flush()
        self._call("on_metrics", rank, rows)
