"""Rank-attributed output: ``[rank 2] loss 0.31`` lines in the cell's own streams.

Chunks arrive from several ranks at once, cut anywhere. Complete lines go out
at once with their rank's prefix; a partial line waits for its end (or for the
cell's end). A ``\\r`` keeps its meaning per rank: a line redrawn in place (a
tqdm bar) is not written while it changes, only its final state is, once it
ends with a newline or the cell ends; the live state is the status view's
(ui/progress.py), so four ranks' bars never flood the cell. That final state
is progress, not an error (tqdm writes to stderr only to keep out of a pipe): it
goes to stdout, among the rank's own lines in the order they came, never into a
red stderr block of its own; what a rank really writes to stderr stays there. The
two streams reach the kernel on two sockets, so "the order they came" is the
order the kernel reads them. The prefix is
coloured per rank with ANSI codes (``ui/colours.py``), which every front end
and a saved notebook show; ``NO_COLOR`` or ``DDP_MAGIC_COLOR=0`` turns that off.
Hidden ranks (``--ranks``) are dropped here and nowhere else: the pool and the
widget still see everything.

Identical lines from several ranks become one line, ``[ranks 0-1023] epoch 3 loss 0.41``
(kernel/output/fold.py's ``LineFolder``): stderr lines (the same warning from every rank) at
any size, waiting until every shown rank has sent one or ``MERGE_WINDOW`` seconds; stdout
lines once more than ``FOLD_ABOVE`` ranks are shown, waiting at most ``FOLD_WINDOW``. At
8 ranks or fewer stdout is never folded: each rank's lines show as they come, rank by rank.
What is written counts against the cell's budget (``OutputBudget``); past it lines are
held back, the cell says how many and how to read them (the session keeps every rank's
whole output, kernel/output/output_log.py).
"""
from __future__ import annotations

import contextvars
import itertools
import os
import re
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Mapping, Optional, Set, TextIO, Tuple

from ..errors import UsageError
from ..kernel.output.fold import FOLD_ABOVE, LineFolder, OutputBudget, fold_window, line_cost, without_log_time
from ..kernel.output.kept_output import stream as kept_stream
from ..words import ranks_phrase
from .colours import rank_ansi

if TYPE_CHECKING:
    from ..session import Session

_PIECES = re.compile(r"[^\r\n]*(?:\r\n|\n|\r)|[^\r\n]+$")
MAX_PARTIAL = 1 << 16  # an endless line is shown in pieces of this size, never held forever
MERGE_WINDOW = 0.5  # seconds a stderr line waits for the same line from the other ranks
BAR_WAIT = 0.25  # seconds a rank's stdout line waits while its bar's last state may still be on the stderr socket
READ_BACK = "%ddp output --rank {rank}"  # how a cell's reader gets a rank's whole output (a background job: job.output(rank))


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
    """``[rank 2] `` or ``[ranks 0-3] `` / ``[ranks 0, 2-3] ``: the prefix of a line from these ranks (words.py's
    rank list, the one way ranks are listed).

    ``colour``: the words inside the brackets in the rank's ANSI colour (``[`` and ``]`` stay plain,
    so ``"] "`` still ends every prefix). ``node``: a Slurm pool's node of a single rank (``[rank 5 n2] ``)."""
    rs = sorted(set(ranks))
    if len(rs) == 1:
        name = f"rank {rs[0]}" + (f" {node}" if node else "")
        return f"[\x1b[{rank_ansi(rs[0])}m{name}\x1b[0m] " if colour else f"[{name}] "
    return f"[{ranks_phrase(rs)}] "


class RankPrinter:
    """Writes each rank's text to stdout/stderr with a ``[rank r] `` prefix per line."""

    def __init__(
        self, ranks: Optional[Iterable[int]] = None, streams: Optional[Dict[str, Callable[[], TextIO]]] = None, ordered: bool = False,
        colour: Optional[bool] = None, budget: Optional[OutputBudget] = None, read_back: str = READ_BACK,
    ) -> None:
        self.ranks = set(ranks) if ranks is not None else None
        # a kept pool's lines go through its staging while its hub reads them (kernel/output/kept_output.py), else to sys.stdout/err
        self._streams = streams or {"stdout": lambda: kept_stream("stdout"), "stderr": lambda: kept_stream("stderr")}
        self._partial: Dict[Tuple[int, str], str] = {}
        self._redrawn: Set[Tuple[int, str]] = set()  # (rank, stream) whose line in progress was redrawn in place (a bar)
        self._after_bar: Dict[int, Tuple[float, List[str]]] = {}  # rank -> (since, stdout lines that wait for its bar's end)
        self.colour = use_colour() if colour is None else colour
        self._wrote: Set[str] = set()  # the streams written since the last flush (only those need flushing)
        self.ordered = ordered
        self._held: Dict[Tuple[int, str], List[str]] = {}
        self.merger = LineFolder(max(MERGE_WINDOW, fold_window()))  # stderr: the same warning from every rank, once
        self._cpp_seen: Dict[str, Set[int]] = {}  # a torch C++ log line (without its time) -> the ranks that sent it
        self.folder: Optional[LineFolder] = None  # stdout, once more than FOLD_ABOVE ranks are shown
        self.budget = budget or OutputBudget()
        self.read_back = read_back  # "%ddp output --rank {rank}": named where lines were held back
        self._lock = threading.RLock()  # the merge timer writes from its own thread
        self._timer: Optional[threading.Timer] = None
        self.nodes: Dict[int, str] = {}  # rank -> its Slurm node, named in its prefix (a pool on one host has none)

    @property
    def world(self) -> Optional[int]:
        return None if self.merger.expected is None else len(self.merger.expected)

    @world.setter
    def world(self, nproc: int) -> None:
        """The pool's size: a line sent by every shown rank goes out at once; above FOLD_ABOVE shown ranks stdout folds too."""
        self.merger.expected = {r for r in range(nproc) if self.shows(r)}
        if len(self.merger.expected) > FOLD_ABOVE:
            self.folder = self.folder or LineFolder()  # FOLD_WINDOW, or DDP_MAGIC_FOLD_WINDOW
            self.folder.expected = self.merger.expected
        else:
            self.folder = None

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
        out: List[Tuple[str, str]] = []  # (stream, piece) in the order the rank wrote them
        for piece in _PIECES.findall(buf):
            if piece.endswith("\r") and not piece.endswith("\r\n"):
                self._redraw(key, piece)  # a redraw in place (tqdm): the next piece replaces it; only a line's final state is written
                continue
            while len(piece) > MAX_PARTIAL + 2:
                out.append((stream, piece[:MAX_PARTIAL] + "\n"))
                piece = piece[MAX_PARTIAL:]
            if piece.endswith("\n"):
                out.append((self._final_stream(key), piece))
            elif piece:
                self._partial[key] = piece
        for name, group in itertools.groupby(out, key=lambda sp: sp[0]):
            self._emit(rank, name, [piece for _, piece in group], bar=stream != name)

    def _redraw(self, key: Tuple[int, str], piece: str) -> None:
        """A line redrawn in place ('\\r' then the line, as tqdm draws): the next line that ends is its final state;
        a line cleared with blanks is gone."""
        if piece == "\r" or piece.strip():
            self._redrawn.add(key)
        else:
            self._redrawn.discard(key)

    def _final_stream(self, key: Tuple[int, str]) -> str:
        """Where a line that just ended goes: a redrawn line's final state (a tqdm bar, written to stderr only to
        stay out of a pipe's way) is progress, not an error: it joins the rank's stdout, in the order it came."""
        if key in self._redrawn:
            self._redrawn.discard(key)
            return "stdout"
        return key[1]

    def _emit(self, rank: int, stream: str, pieces: List[str], bar: bool = False) -> None:
        """Write (or hold) a rank's complete lines; ``bar``: a bar's final state, come from its stderr."""
        if self.ordered:
            self._held.setdefault((rank, stream), []).extend(pieces)
            return
        if stream == "stderr":
            now = time.monotonic()
            for piece in pieces:  # torch's C++ warnings carry each rank's own time: without it they fold
                line = without_log_time(piece)
                if line != piece and not self._cpp_first(rank, line):
                    continue
                self.merger.add(rank, line, now)
            return
        if not bar and self._bar_pending(rank):
            self._after_bar.setdefault(rank, (time.monotonic(), []))[1].extend(pieces)
            return
        if not bar:
            self._release(rank)
        self._show(rank, stream, pieces)
        if bar:
            self._release(rank)

    def _cpp_first(self, rank: int, line: str) -> bool:
        """Whether a torch C++ warning is shown: once a cell, however many ranks print it (c10d's reverse lookup,
        once per peer, nodes seconds apart): a copy joins the held line, or goes once that line is out."""
        ranks = self._cpp_seen.setdefault(line, set())
        first = not ranks or (rank not in ranks and self.merger.holds(line))
        ranks.add(rank)
        return first

    def _show(self, rank: int, stream: str, pieces: List[str]) -> None:
        """A rank's stdout lines: written, or folded with the same lines of the other ranks (above FOLD_ABOVE ranks)."""
        if self.folder is None:
            self._write({rank}, stream, pieces)
            return
        now = time.monotonic()
        for piece in pieces:
            self.folder.add(rank, piece, now)

    def _bar_pending(self, rank: int) -> bool:
        """A bar redrawn on the rank's stderr whose final line may not have come yet. Two sockets carry a rank's
        two streams, so the end of its bar and the line it printed next can reach the kernel swapped: that line
        waits (at most BAR_WAIT) for the bar's final state, so the rank's lines keep the order it wrote them in."""
        key = (rank, "stderr")
        return key in self._redrawn and key in self._partial

    def _release(self, rank: int) -> None:
        waiting = self._after_bar.pop(rank, None)
        if waiting is not None:
            self._show(rank, "stdout", waiting[1])

    def _drain(self, final: bool) -> None:
        """Write the folded lines and the stdout lines waiting for a bar that are due; arm the timer for the next one."""
        now = time.monotonic()
        for rank in [r for r, (since, _) in self._after_bar.items() if final or now - since >= BAR_WAIT]:
            self._release(rank)
        folders = [("stdout", self.folder), ("stderr", self.merger)]
        for stream, folder in folders:
            for ranks, line in folder.ready(now, final) if folder is not None else ():
                self._write(ranks, stream, [line])
        heads = [f.next_due() for _, f in folders if f is not None]
        dues = [d for d in heads if d is not None] + [since + BAR_WAIT for since, _ in self._after_bar.values()]
        due = min(dues) if dues else None
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
        """Lines into the cell, if its budget lets them through; else held back (the session keeps them: kernel/output/output_log.py)."""
        holding = self.budget.holding
        if not self.budget.allow(ranks, len(pieces), line_cost(pieces), time.monotonic()):
            if not holding:
                self._say(f"this cell's output is over its budget ({self.budget.lines:,} lines, then {self.budget.rate:g} a second): "
                          f"holding lines back; nothing is lost: {self.read_back.format(rank='N')} shows rank N's whole output")
            return
        self._say_gap()
        prefix = ranks_label(ranks, self.colour, self.nodes.get(next(iter(ranks)), "") if len(ranks) == 1 else "")
        self._streams[stream]().write("".join(prefix + piece for piece in pieces))
        self._wrote.add(stream)

    def _say_gap(self) -> None:
        """How many lines were held back since the last line shown, and how to read them."""
        gap = self.budget.gap()
        if gap is not None:
            lines, ranks = gap
            first = min(ranks)
            self._say(f"{lines:,} {'line' if lines == 1 else 'lines'} from {ranks_phrase(ranks)} held back; "
                      f"{self.read_back.format(rank=first)} shows rank {first}'s whole output")

    def _say(self, text: str) -> None:
        self._streams["stdout"]().write(f"ddp_magic: {text}\n")  # as the cell's notices are written (ui/cell_listener.py)
        self._wrote.add("stdout")

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
                name = self._final_stream(key)
                self._emit(key[0], name, [piece + "\n"], bar=name != key[1])
        self._redrawn.clear()
        for rank in sorted(self._after_bar):
            self._release(rank)
        if self.ordered:
            held, self._held = self._held, {}
            self.ordered = False
            for (rank, stream) in sorted(held, key=lambda k: (k[1] != "stdout", k[0])):
                self._emit(rank, stream, held[(rank, stream)])
            self.ordered = True
        self._drain(final=True)
        self._say_gap()
        wrote, self._wrote = self._wrote, set()
        for stream in sorted(wrote):  # a flush waits for the kernel's IO thread: only where something was written
            try:
                self._streams[stream]().flush()
            except (OSError, ValueError):
                pass


def show_output(session: "Session", rank: Optional[int], cell: Optional[str]) -> None:
    """%ddp output --rank N [--cell M]: the rank's whole output of that cell, each piece on its own stream, unprefixed."""
    if rank is None:
        raise UsageError("%ddp output: which rank? e.g. %ddp output --rank 3 (--cell 12: the output of In [12])")
    for stream, text in session.output(rank, cell):
        (sys.stdout if stream == "stdout" else sys.stderr).write(text)
    sys.stdout.flush()
    sys.stderr.flush()
