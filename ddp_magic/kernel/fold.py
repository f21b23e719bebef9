"""Folding the same line from many ranks into one, and the budget of lines a cell shows: pure, the caller gives the time.

``LineFolder``: ``epoch 3 loss 0.41`` printed by 1,024 ranks becomes one line for ranks
0-1023. A line waits until every shown rank has sent it, or ``window`` seconds, so no
line is held back longer than that; a rank's own lines keep their order.
``OutputBudget``: what a notebook's output area can take (a token bucket of lines); past
it, lines are held back, counted, and kept by the session (kernel/output_log.py).
ui/output.py writes what these two let through.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, Iterable, List, Optional, Set, Tuple

FOLD_WINDOW = 0.3  # seconds a stdout line waits for the same line from the other ranks (no line waits longer)
FOLD_ABOVE = 8  # stdout is folded in pools larger than this; at 8 ranks or fewer each rank's lines show as they come
BUDGET_LINES = 50_000  # lines a cell shows at once (a notebook's output area stays usable)
BUDGET_RATE = 50.0  # lines a second after that, for as long as the cell runs
BUDGET_RESUME = 1_000  # lines of budget back before a cell that held lines back shows lines again
LINE_BYTES = 256  # a longer line counts once per 256 bytes started


@dataclass
class _Held:
    line: str
    since: float
    seq: int
    ranks: Set[int] = field(default_factory=set)


class LineFolder:
    """Complete lines held briefly so that the same line from several ranks goes out once, with all their ranks.

    A line goes out, in arrival order, once every expected rank has sent it or it has
    waited ``window`` seconds. A rank joins the oldest held copy of a line that comes
    after the last line it joined, so its own lines keep the order it wrote them in.
    Each ``add`` costs the copies of that one line held, not every line held.
    """

    def __init__(self, window: float = FOLD_WINDOW) -> None:
        self.window = window
        self._need: Optional[int] = None  # how many ranks may send a line (None: unknown, wait the window)
        self._held: Deque[_Held] = deque()
        self._by_line: Dict[str, Deque[_Held]] = {}
        self._last: Dict[int, int] = {}  # rank -> seq of the held line it joined last
        self._seq = 0

    @property
    def expected(self) -> Optional[Set[int]]:
        return self._expected if self._need is not None else None

    @expected.setter
    def expected(self, ranks: Optional[Set[int]]) -> None:
        """The ranks that may send a line (the caller feeds only these): a line all of them sent goes out at once."""
        self._expected = set(ranks) if ranks is not None else set()
        self._need = len(self._expected) if ranks is not None else None

    def add(self, rank: int, line: str, now: float) -> None:
        last = self._last.get(rank, -1)
        for held in self._by_line.get(line, ()):
            if held.seq > last:  # after this rank's previous line: joining it keeps the rank's order
                held.ranks.add(rank)
                self._last[rank] = held.seq
                return
        held = _Held(line, now, self._seq, {rank})
        self._seq += 1
        self._held.append(held)
        self._by_line.setdefault(line, deque()).append(held)
        self._last[rank] = held.seq

    def ready(self, now: float, final: bool = False) -> List[Tuple[Set[int], str]]:
        """The lines due now (all of them when ``final``), as (ranks, line), in order."""
        out = []
        while self._held:
            head = self._held[0]
            complete = self._need is not None and len(head.ranks) >= self._need
            if not (final or complete or now - head.since >= self.window):
                break
            self._held.popleft()
            copies = self._by_line[head.line]
            copies.popleft()  # the oldest line of all is the oldest copy of its own text
            if not copies:
                del self._by_line[head.line]
            out.append((head.ranks, head.line))
        return out

    def next_due(self) -> Optional[float]:
        return self._held[0].since + self.window if self._held else None

    def __len__(self) -> int:
        return len(self._held)


def line_cost(pieces: Iterable[str]) -> int:
    """What lines cost of a budget: one each, a long one once per LINE_BYTES started."""
    return sum(1 + max(0, len(p) - 1) // LINE_BYTES for p in pieces)


class OutputBudget:
    """How many lines a cell may still show: ``lines`` at once, then ``rate`` a second (a token bucket).

    Once it runs out, lines are held back until ``resume`` lines of budget are back (so a
    flood shows in stretches, not one line in a thousand); ``gap`` says how many were held
    back since the last line shown, and from which ranks.
    """

    def __init__(self, lines: int = BUDGET_LINES, rate: float = BUDGET_RATE, resume: int = BUDGET_RESUME) -> None:
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
