"""Folding the same line from many ranks into one, and the budget of lines a cell shows: pure, the caller gives the time.

``LineFolder``: ``epoch 3 loss 0.41`` printed by 1,024 ranks becomes one line for ranks
0-1023. A line waits until every shown rank has sent it, or ``window`` seconds after its
latest copy came while copies keep coming (ranks that print it 50 ms apart are one line),
never more than ``HOLD_WINDOWS`` windows in all; a rank's own lines keep their order.
``OutputBudget``: what a notebook's output area can take (a token bucket of lines); past
it, lines are held back, counted, and kept by the session (kernel/output/output_log.py).
ui/output.py writes what these two let through.
"""
from __future__ import annotations

import heapq
import os
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from ...logs import log

FOLD_WINDOW = 0.3  # seconds a stdout line waits for the same line from the other ranks (DDP_MAGIC_FOLD_WINDOW)
HOLD_WINDOWS = 3  # a line whose copies keep coming waits at most this many windows (0.9 s by default)
FOLD_ABOVE = 8  # stdout is folded in pools larger than this; at 8 ranks or fewer each rank's lines show as they come
BUDGET_LINES = 50_000  # lines a cell shows at once (a notebook's output area stays usable; DDP_MAGIC_OUTPUT_LINES)
BUDGET_RATE = 50.0  # lines a second after that, for as long as the cell runs
BUDGET_RESUME = 1_000  # lines of budget back before a cell that held lines back shows lines again
LINE_BYTES = 256  # a longer line counts once per 256 bytes started


def setting(name: str, default: float, environ: Mapping[str, str] = os.environ) -> float:
    """A positive number from the kernel's env (DDP_MAGIC_FOLD_WINDOW, DDP_MAGIC_OUTPUT_LINES), else ``default``."""
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        log.warning("%s=%r is not a positive number; using %g", name, text, default)
        return default
    return value


_GLOG_TIME = re.compile(r"^\[([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+ ([^\]\s]+)\] ")


def without_log_time(line: str) -> str:
    """A line of torch's C++ log (glog: ``[W1201 20:17:46.189958604 socket.cpp:207] ...``) without its date and time,
    so that the warning every rank prints (c10d's ``The hostname of the client socket cannot be retrieved``) folds
    into one line: ``[W socket.cpp:207] ...``. Any other line is returned as it is."""
    return _GLOG_TIME.sub(r"[\1 \2] ", line, count=1) if line.startswith("[") else line


def fold_window() -> float:
    """Seconds a line may wait for its copies: FOLD_WINDOW, or DDP_MAGIC_FOLD_WINDOW from the kernel's env."""
    return setting("DDP_MAGIC_FOLD_WINDOW", FOLD_WINDOW)


@dataclass(eq=False)
class _Held:
    line: str
    since: float  # when its first copy came: its deadline is since + window, later while copies keep coming (due())
    pos: int  # its place in the output; a line joined by a rank that is further on moves to the end
    ranks: Set[int] = field(default_factory=set)
    moved_on: int = 0  # its ranks that have sent a later line since: while 0, it may move to the end
    done: bool = False
    last: float = 0.0  # when its latest copy came


class LineFolder:
    """Complete lines held briefly so that the same line from several ranks goes out once, with all their ranks.

    A line goes out once every expected rank has sent it, or when it (or a line placed
    after it) has waited ``window`` seconds: no line waits longer. Lines go out in their
    places, so each rank's lines keep the order it wrote them in: a rank joins a held
    copy of its line that is placed after its previous line, or one it can move to the
    end (none of that copy's ranks has written anything since); else its line is a
    new one. Each ``add`` costs the held copies of that one line, not every line held.
    """

    def __init__(self, window: Optional[float] = None) -> None:
        self.window = fold_window() if window is None else window
        self._need: Optional[int] = None  # how many ranks may send a line (None: unknown, wait the window)
        self._expected: Set[int] = set()
        self._places: List[Tuple[int, int, _Held]] = []  # a heap by place; a moved line's old entry is skipped
        self._made: Deque[_Held] = deque()  # in the order they came: the oldest deadline first
        self._by_line: Dict[str, List[_Held]] = {}
        self._last: Dict[int, _Held] = {}  # rank -> the line it sent last
        self._pos = 0
        self._count = 0

    @property
    def expected(self) -> Optional[Set[int]]:
        return self._expected if self._need is not None else None

    @expected.setter
    def expected(self, ranks: Optional[Set[int]]) -> None:
        """The ranks that may send a line (the caller feeds only these): a line all of them sent goes out at once."""
        self._expected = set(ranks) if ranks is not None else set()
        self._need = len(self._expected) if ranks is not None else None

    def add(self, rank: int, line: str, now: float) -> None:
        prev = self._last.get(rank)
        after = prev.pos if prev is not None and not prev.done else -1
        for held in self._by_line.get(line, ()):
            if rank in held.ranks:
                continue
            if held.pos < after:
                if held.moved_on:
                    continue  # one of its ranks wrote on since: moving it would reorder that rank's lines
                self._place(held)
            held.ranks.add(rank)
            held.last = max(held.last, now)
            self._moved(prev, held)
            self._last[rank] = held
            return
        held = _Held(line, now, 0, {rank}, last=now)
        self._place(held)
        self._made.append(held)
        self._by_line.setdefault(line, []).append(held)
        self._count += 1
        self._moved(prev, held)
        self._last[rank] = held

    def _place(self, held: _Held) -> None:
        held.pos = self._pos
        self._pos += 1
        heapq.heappush(self._places, (held.pos, id(held), held))

    @staticmethod
    def _moved(prev: Optional[_Held], now_at: _Held) -> None:
        if prev is not None and prev is not now_at and not prev.done:
            prev.moved_on += 1

    def _head(self) -> Optional[_Held]:
        while self._places and (self._places[0][2].done or self._places[0][0] != self._places[0][2].pos):
            heapq.heappop(self._places)
        return self._places[0][2] if self._places else None

    def _oldest(self) -> Optional[_Held]:
        while self._made and self._made[0].done:
            self._made.popleft()
        return self._made[0] if self._made else None

    def ready(self, now: float, final: bool = False) -> List[Tuple[Set[int], str]]:
        """The lines due now (all of them when ``final``), as (ranks, line), in order."""
        out: List[Tuple[Set[int], str]] = []
        while True:
            head, oldest = self._head(), self._oldest()
            if head is None or oldest is None:
                return out
            complete = self._need is not None and len(head.ranks) >= self._need
            if not (final or complete or now >= self._due(oldest)):  # a line due takes the lines before it along
                return out
            heapq.heappop(self._places)
            head.done = True
            self._count -= 1
            copies = self._by_line[head.line]
            copies.remove(head)
            if not copies:
                del self._by_line[head.line]
            out.append((head.ranks, head.line))

    def _due(self, held: _Held) -> float:
        """When a held line goes out: ``window`` after its first copy, or, while the other expected ranks are still
        sending it (a copy came within the window), ``window`` after its latest copy; at most HOLD_WINDOWS windows."""
        if self._need is None or len(held.ranks) < 2:
            return held.since + self.window
        return min(held.since + HOLD_WINDOWS * self.window, max(held.since, held.last) + self.window)

    def holds(self, line: str) -> bool:
        """Whether a copy of ``line`` is still held (a new copy would join it)."""
        return bool(self._by_line.get(line))

    def next_due(self) -> Optional[float]:
        oldest = self._oldest()
        return self._due(oldest) if oldest is not None else None

    def __len__(self) -> int:
        return self._count


def line_cost(pieces: Iterable[str]) -> int:
    """What lines cost of a budget: one each, a long one once per LINE_BYTES started."""
    return sum(1 + max(0, len(p) - 1) // LINE_BYTES for p in pieces)


class OutputBudget:
    """How many lines a cell may still show: ``lines`` at once, then ``rate`` a second (a token bucket).

    Once it runs out, lines are held back until ``resume`` lines of budget are back (so a
    flood shows in stretches, not one line in a thousand); ``gap`` says how many were held
    back since the last line shown, and from which ranks.
    """

    def __init__(self, lines: Optional[int] = None, rate: float = BUDGET_RATE, resume: int = BUDGET_RESUME) -> None:
        lines = int(setting("DDP_MAGIC_OUTPUT_LINES", BUDGET_LINES)) if lines is None else lines
        self.lines, self.rate, self.resume = lines, rate, min(resume, lines)
        self._tokens = float(lines)
        self._stamp: Optional[float] = None
        self.holding = False
        self.held = 0  # lines held back in all
        self._gap = 0
        self._gap_ranks: Set[int] = set()

    def allow(self, ranks: Iterable[int], lines: int, cost: int, now: float) -> bool:
        """Whether these lines may be shown now; if not they are counted as held back."""
        if self._stamp is not None:
            self._tokens = min(float(self.lines), self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        if self.holding and self._tokens < self.resume:
            return self._hold(ranks, lines)
        if self._tokens < cost:
            self.holding = True
            return self._hold(ranks, lines)
        self._tokens -= cost
        self.holding = False
        return True

    def _hold(self, ranks: Iterable[int], lines: int) -> bool:
        self.held += lines
        self._gap += lines
        self._gap_ranks.update(ranks)
        return False

    def gap(self) -> Optional[Tuple[int, Set[int]]]:
        """(lines, ranks) held back since the last call, or None; the count starts again."""
        if not self._gap:
            return None
        out = (self._gap, self._gap_ranks)
        self._gap, self._gap_ranks = 0, set()
        return out
