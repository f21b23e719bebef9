"""Rank-attributed output: ``[rank 2] loss 0.31`` lines in the cell's own streams.

Chunks arrive from several ranks at once, cut anywhere. Complete lines go out
at once with their rank's prefix; a partial line waits for its end (or for the
cell's end). A ``\\r`` keeps its meaning, so a tqdm bar on one rank redraws in
place. Hidden ranks (``--ranks``) are dropped here and nowhere else: the pool
and the widget still see everything.
"""
from __future__ import annotations

import re
import sys
from typing import Callable, Dict, Iterable, List, Optional, Set, TextIO, Tuple

_PIECES = re.compile(r"[^\r\n]*(?:\r\n|\n|\r)|[^\r\n]+$")
MAX_PARTIAL = 1 << 16  # an endless line is shown in pieces of this size, never held forever


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


class RankPrinter:
    """Writes each rank's text to stdout/stderr with a ``[rank r] `` prefix per line."""

    def __init__(self, ranks: Optional[Iterable[int]] = None, streams: Optional[Dict[str, Callable[[], TextIO]]] = None, ordered: bool = False) -> None:
        self.ranks = set(ranks) if ranks is not None else None
        self._streams = streams or {"stdout": lambda: sys.stdout, "stderr": lambda: sys.stderr}
        self._partial: Dict[Tuple[int, str], str] = {}
        self._open: Dict[str, Optional[int]] = {"stdout": None, "stderr": None}  # rank whose \r-line is on screen
        self.ordered = ordered
        self._held: Dict[Tuple[int, str], List[str]] = {}

    def shows(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    def feed(self, rank: int, stream: str, text: str) -> None:
        if not self.shows(rank):
            return
        key = (rank, stream)
        buf = self._partial.pop(key, "") + text
        out: List[str] = []
        for piece in _PIECES.findall(buf):
            if piece == "\r":
                continue  # a bare carriage return: the next piece redraws the line anyway
            while len(piece) > MAX_PARTIAL + 2:
                out.append(piece[:MAX_PARTIAL] + "\n")
                piece = piece[MAX_PARTIAL:]
            if piece.endswith(("\n", "\r")):
                out.append(piece)
            elif piece:
                self._partial[key] = piece
        if out:
            self._emit(rank, stream, out)

    def _emit(self, rank: int, stream: str, pieces: List[str]) -> None:
        if self.ordered:
            self._held.setdefault((rank, stream), []).extend(pieces)
            return
        prefix = f"[rank {rank}] "
        parts: List[str] = []
        for piece in pieces:
            if self._open[stream] is not None and self._open[stream] != rank:
                parts.append("\n")  # another rank's progress line stays visible above ours
            parts.append(prefix + piece)
            self._open[stream] = rank if piece.endswith("\r") and not piece.endswith("\r\n") else None
        f = self._streams[stream]()
        f.write("".join(parts))

    def flush(self) -> None:
        """The cell ended: finish partial lines, and in ordered mode write everything rank by rank."""
        for key in sorted(self._partial):
            piece = self._partial.pop(key)
            self._emit(key[0], key[1], [piece + "\n"])
        if self.ordered:
            held, self._held = self._held, {}
            self.ordered = False
            for (rank, stream) in sorted(held, key=lambda k: (k[1] != "stdout", k[0])):
                self._emit(rank, stream, held[(rank, stream)])
            self.ordered = True
        for stream in ("stdout", "stderr"):
            if self._open[stream] is not None:
                self._streams[stream]().write("\n")
                self._open[stream] = None
            try:
                self._streams[stream]().flush()
            except (OSError, ValueError):
                pass
