"""Each rank's live line and progress bar, read from its raw output: what the status view shows while tqdm redraws.

A ``\\r`` redraws a line in place. The cell's streams keep only each bar's final
state (ui/output.py); the live state is here: ``LiveLines`` keeps, per rank, the
line it shows now (the last complete line, or the redraw in progress) and, when
that line is a tqdm bar, its count, total and rate, for the view's multi-bar.
Pure: text in, state out; the view feeds it from ``on_output``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_COUNT = re.compile(
    r"(?P<n>\d+(?:\.\d+)?)(?P<nu>[kMGT]?)(?:/(?P<total>\d+(?:\.\d+)?)(?P<tu>[kMGT]?))?(?:\s*\w*)? \[[\d:]+(?:<[\d:?]+)?(?:, *(?P<rate>[^\]]*))?\]"
)
_SCALE = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_RATE = re.compile(r"([\d.]+[kMGT]?)\s*([A-Za-z]+/[A-Za-z]+)")


@dataclass(frozen=True)
class Bar:
    """A tqdm bar as one redraw shows it."""

    n: float
    total: Optional[float]
    rate: str = ""  # as tqdm wrote it: '30.12it/s', '1.2s/it'
    desc: str = ""

    @property
    def fraction(self) -> Optional[float]:
        return min(1.0, self.n / self.total) if self.total else None

    @property
    def percent(self) -> str:
        """'43%' as tqdm rounds it; '' for a bar of unknown length."""
        return f"{100 * self.fraction:.0f}%" if self.fraction is not None else ""

    @property
    def rate_text(self) -> str:
        """The rate as a person writes it: '30.12 it/s', '1.1k it/s', '1.2 s/it' (tqdm writes '30.12it/s')."""
        if self.rate.startswith("?"):
            return ""  # tqdm's first redraw: no rate yet
        m = _RATE.fullmatch(self.rate)
        return f"{m.group(1)} {m.group(2)}" if m else self.rate

    def short(self) -> str:
        """'43% 12.3 it/s' (or '5 it 980.2 it/s' without a total): what a rank's mini bar says beside it."""
        return " ".join(p for p in (self.percent or f"{self.n:g} it", self.rate_text) if p)

    def text(self) -> str:
        """'train 43% 43/100 12.3 it/s': the rank table's progress cell."""
        count = f"{self.n:g}/{self.total:g}" if self.total else f"{self.n:g}"
        return " ".join(p for p in (self.desc, self.percent, count, self.rate_text) if p)


def parse_bar(line: str) -> Optional[Bar]:
    """A tqdm-style line ('loss:  37%|███▋ | 37/100 [00:01<00:02, 30.12it/s]') as a Bar; None for any other line."""
    text = _ANSI.sub("", line).strip()
    m = _COUNT.search(text)
    if m is None or ("%|" not in text and "it [" not in text and "/s]" not in text):
        return None
    n = float(m.group("n")) * _SCALE[m.group("nu")]
    total = float(m.group("total")) * _SCALE[m.group("tu") or ""] if m.group("total") else None
    head = text[: m.start()]
    desc = head.split("%|", 1)[0].rsplit(":", 1)[0].strip() if ":" in head else ""
    return Bar(n, total, (m.group("rate") or "").strip(), desc)


class LiveLines:
    """Per rank: the line it shows now and the bar in it, from raw chunks cut anywhere."""

    def __init__(self) -> None:
        self._partial: Dict[Tuple[int, str], str] = {}
        self.lines: Dict[int, str] = {}
        self.bars: Dict[int, Bar] = {}

    def feed(self, rank: int, stream: str, text: str) -> None:
        key = (rank, stream)
        buf = self._partial.get(key, "") + text
        cut = max(buf.rfind("\n"), buf.rfind("\r"))
        done, rest = buf[: cut + 1], buf[cut + 1 :]
        self._partial[key] = rest[-4096:]
        shown = rest if rest.strip() else ""
        if not shown:  # the newest non-blank piece that ended
            for piece in reversed(re.split(r"\r\n|\n|\r", done)):
                if piece.strip():
                    shown = piece
                    break
        if shown:
            self._show(rank, shown)

    def _show(self, rank: int, line: str) -> None:
        self.lines[rank] = line
        bar = parse_bar(line)
        if bar is not None:
            self.bars[rank] = bar

    def line(self, rank: int) -> str:
        return self.lines.get(rank, "")
