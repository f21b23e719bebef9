"""Rank-attributed output: ``[rank 2] loss 0.31`` lines in the cell's own streams.

Chunks arrive from several ranks at once, cut anywhere. Complete lines go out
at once with their rank's prefix; a partial line waits for its end (or for the
cell's end). A ``\\r`` keeps its meaning per rank: a line redrawn in place (a
tqdm bar) is not written while it changes, only its final state is, once it
ends with a newline or the cell ends; the live state is the status view's
(ui/progress.py), so four ranks' bars never flood the cell. The prefix is
coloured per rank with ANSI codes (``ui/colours.py``), which every front end
and a saved notebook show; ``NO_COLOR`` or ``DDP_MAGIC_COLOR=0`` turns that off.
Hidden ranks (``--ranks``) are dropped here and nowhere else: the pool and the
widget still see everything.

Identical stderr lines from several ranks (the same warning from every rank)
become one line, ``[ranks 0-3] UserWarning: …`` (``LineMerger``): a stderr line
waits until every shown rank has sent it, or ``MERGE_WINDOW`` seconds. stdout is
never merged: users read it rank by rank.
"""
from __future__ import annotations

import contextvars
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Set, TextIO, Tuple

from .colours import rank_ansi

_PIECES = re.compile(r"[^\r\n]*(?:\r\n|\n|\r)|[^\r\n]+$")
MAX_PARTIAL = 1 << 16  # an endless line is shown in pieces of this size, never held forever
MERGE_WINDOW = 0.5  # seconds a stderr line waits for the same line from the other ranks


def parse_ranks(spec: str, world: Optional[int] = None) -> Set[int]:
    """'0', '0,2', '1-3', '0,2-3' -> a set of ranks; ValueError with the fix otherwise."""
    out: Set[int] = set()
    for part in spec.replace(" ", "").split(","):
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(f"--ranks {spec!r}: use rank numbers and ranges, e.g. 0 or 0,2 or 1-3")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ValueError(f"--ranks {spec!r}: the range {part} runs backwards")
        out.update(range(lo, hi + 1))
    if world is not None and out and max(out) >= world:
        raise ValueError(f"--ranks {spec!r}: the pool has ranks 0..{world - 1}")
    return out


def use_colour(environ: Mapping[str, str] = os.environ) -> bool:
    """ANSI-coloured prefixes unless NO_COLOR (no-color.org) or DDP_MAGIC_COLOR=0 says otherwise."""
    return "NO_COLOR" not in environ and environ.get("DDP_MAGIC_COLOR", "1").strip().lower() not in ("0", "off", "false", "no")


def ranks_label(ranks: Iterable[int], colour: bool = False, node: str = "") -> str:
    """``[rank 2] `` or ``[ranks 0-3] `` / ``[ranks 0,2] ``: the prefix of a line from these ranks.

    ``colour``: the words inside the brackets in the rank's ANSI colour (``[`` and ``]`` stay plain,
    so ``"] "`` still ends every prefix). ``node``: a Slurm pool's node of a single rank (``[rank 5 n2] ``)."""
    rs = sorted(set(ranks))
    if len(rs) == 1:
        name = f"rank {rs[0]}" + (f" {node}" if node else "")
        return f"[\x1b[{rank_ansi(rs[0])}m{name}\x1b[0m] " if colour else f"[{name}] "
    runs: List[List[int]] = []
    for r in rs:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return "[ranks " + ",".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs) + "] "


@dataclass
class _Held:
    line: str
    since: float
    ranks: Set[int] = field(default_factory=set)


class LineMerger:
    """Complete stderr lines held briefly so that the same line from several ranks is shown once.

    A line goes out, in arrival order, once every expected rank has sent it or it has
    waited ``window`` seconds; a rank's own lines keep their order. Pure: the caller
    gives the time.
    """

    def __init__(self, window: float = MERGE_WINDOW) -> None:
        self.window = window
        self.expected: Optional[Set[int]] = None  # the ranks that may send a line (None: unknown, wait the window)
        self._held: List[_Held] = []

    def add(self, rank: int, line: str, now: float) -> None:
        for held in self._held:  # the oldest identical line this rank has not sent yet
            if held.line == line and rank not in held.ranks:
                held.ranks.add(rank)
                return
        self._held.append(_Held(line, now, {rank}))

    def ready(self, now: float, final: bool = False) -> List[Tuple[Set[int], str]]:
        """The lines due now (all of them when ``final``), as (ranks, line), in order."""
        out = []
        while self._held:
            head = self._held[0]
            complete = self.expected is not None and head.ranks >= self.expected
            if not (final or complete or now - head.since >= self.window):
                break
            out.append((head.ranks, self._held.pop(0).line))
        return out

    def next_due(self) -> Optional[float]:
        return self._held[0].since + self.window if self._held else None


class RankPrinter:
    """Writes each rank's text to stdout/stderr with a ``[rank r] `` prefix per line."""

    def __init__(
        self, ranks: Optional[Iterable[int]] = None, streams: Optional[Dict[str, Callable[[], TextIO]]] = None, ordered: bool = False,
        colour: Optional[bool] = None,
    ) -> None:
        self.ranks = set(ranks) if ranks is not None else None
        self._streams = streams or {"stdout": lambda: sys.stdout, "stderr": lambda: sys.stderr}
        self._partial: Dict[Tuple[int, str], str] = {}
        self.colour = use_colour() if colour is None else colour
        self._wrote: Set[str] = set()  # the streams written since the last flush (only those need flushing)
        self.ordered = ordered
        self._held: Dict[Tuple[int, str], List[str]] = {}
        self.merger = LineMerger()
        self._lock = threading.RLock()  # the merge timer writes from its own thread
        self._timer: Optional[threading.Timer] = None
        self.nodes: Dict[int, str] = {}  # rank -> its Slurm node, named in its prefix (a pool on one host has none)

    @property
    def world(self) -> Optional[int]:
        return None if self.merger.expected is None else len(self.merger.expected)

    @world.setter
    def world(self, nproc: int) -> None:
        """The pool's size: a stderr line sent by every shown rank goes out at once."""
        self.merger.expected = {r for r in range(nproc) if self.shows(r)}

    def shows(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    def feed(self, rank: int, stream: str, text: str) -> None:
        if not self.shows(rank):
            return
        with self._lock:
            self._feed(rank, stream, text)
            self._drain(final=False)

    def _feed(self, rank: int, stream: str, text: str) -> None:
        key = (rank, stream)
        buf = self._partial.pop(key, "") + text
        out: List[str] = []
        for piece in _PIECES.findall(buf):
            if piece.endswith("\r") and not piece.endswith("\r\n"):
                continue  # a redraw in place (tqdm): the next piece replaces it; only a line's final state is written
            while len(piece) > MAX_PARTIAL + 2:
                out.append(piece[:MAX_PARTIAL] + "\n")
                piece = piece[MAX_PARTIAL:]
            if piece.endswith("\n"):
                out.append(piece)
            elif piece:
                self._partial[key] = piece
        if out:
            self._emit(rank, stream, out)

    def _emit(self, rank: int, stream: str, pieces: List[str]) -> None:
        if self.ordered:
            self._held.setdefault((rank, stream), []).extend(pieces)
            return
        if stream == "stderr":
            now = time.monotonic()
            for piece in pieces:
                self.merger.add(rank, piece, now)
            return
        self._write({rank}, stream, pieces)

    def _drain(self, final: bool) -> None:
        """Write the merged stderr lines that are due; arm the timer for the next one."""
        for ranks, line in self.merger.ready(time.monotonic(), final):
            self._write(ranks, "stderr", [line])
        due = self.merger.next_due()
        if due is not None and self._timer is None:
            ctx = contextvars.copy_context()  # the kernel routes the timer's output to this cell
            self._timer = threading.Timer(max(0.0, due - time.monotonic()) + 0.01, ctx.run, args=(self._on_timer,))
            self._timer.daemon = True
            self._timer.start()

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None
            self._drain(final=False)

    def _write(self, ranks: Set[int], stream: str, pieces: List[str]) -> None:
        prefix = ranks_label(ranks, self.colour, self.nodes.get(next(iter(ranks)), "") if len(ranks) == 1 else "")
        self._streams[stream]().write("".join(prefix + piece for piece in pieces))
        self._wrote.add(stream)

    def flush(self) -> None:
        """The cell ended: finish partial lines, and in ordered mode write everything rank by rank."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._flush()

    def _flush(self) -> None:
        for key in sorted(self._partial):
            piece = self._partial.pop(key)
            if piece.strip():  # a line left unfinished, or a bar's last redraw: its final state (a cleared bar leaves nothing)
                self._emit(key[0], key[1], [piece + "\n"])
        if self.ordered:
            held, self._held = self._held, {}
            self.ordered = False
            for (rank, stream) in sorted(held, key=lambda k: (k[1] != "stdout", k[0])):
                self._emit(rank, stream, held[(rank, stream)])
            self.ordered = True
        self._drain(final=True)
        wrote, self._wrote = self._wrote, set()
        for stream in sorted(wrote):  # a flush waits for the kernel's IO thread: only where something was written
            try:
                self._streams[stream]().flush()
            except (OSError, ValueError):
                pass
