"""The lease's two timers (``--idle``, ``--max``), read from what a user types, and said back as one line."""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Dict, Optional

IDLE_S = 30 * 60.0  # default --idle: no kernel attached and no job running for this long ends the pool
MAX_S = 24 * 3600.0  # default --max: the kept pool's whole life
_UNITS = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d)?\s*$")


class TermsError(ValueError):
    """A duration that cannot be read; the message shows the forms that can."""


def duration(text: str, what: str) -> float:
    """``30m``, ``24h``, ``5s``, ``90`` (seconds), ``1.5h`` -> seconds."""
    m = _DURATION.match(str(text).lower())
    if not m or float(m.group(1)) <= 0:
        raise TermsError(f"{what} {text!r}: give a duration such as 5s, 30m, 24h or 2d")
    return float(m.group(1)) * _UNITS[m.group(2) or ""]


def span(seconds: float) -> str:
    """``30 min``, ``5 s``, ``24 h``, ``1 h 30 min``: a lease's length, as a person says it."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min" + (f" {s % 60} s" if s % 60 else "")
    h, m = divmod(s // 60, 60)
    return f"{h} h" + (f" {m} min" if m else "")


@dataclass(frozen=True)
class Terms:
    """How long a kept pool lives without its kernel (``idle``) and at most (``max``), from ``since`` (time.time())."""

    idle: float = IDLE_S
    max: float = MAX_S
    since: float = 0.0

    @classmethod
    def parse(cls, idle: Optional[str], most: Optional[str], since: Optional[float] = None) -> "Terms":
        return cls(duration(idle, "--idle") if idle else IDLE_S, duration(most, "--max") if most else MAX_S, since or time.time())

    @property
    def ends_at(self) -> float:
        return self.since + self.max

    def text(self, attached: bool = True, left_at: Optional[float] = None) -> str:
        """``kept: ends 30 min after its kernel leaves, at most at 06:14``: a row of its own (%ddp status, attach)."""
        return "kept: " + self.lease(attached, left_at)

    def lease(self, attached: bool = True, left_at: Optional[float] = None) -> str:
        """``ends 30 min after its kernel leaves, at most at 06:14`` (detached: ``no kernel attached since 02:14; ends at
        02:44 unless a kernel attaches or a job runs, at most at 06:14``): each fact once, for a line that already says kept."""
        most = _clock(self.ends_at)
        if attached or left_at is None:
            return f"ends {span(self.idle)} after its kernel leaves, at most at {most}"
        idle_end = min(left_at + self.idle, self.ends_at)
        return f"no kernel attached since {_clock(left_at)}; ends at {_clock(idle_end)} unless a kernel attaches or a job runs, at most at {most}"

    def to_dict(self) -> Dict[str, Any]:
        return {"idle": self.idle, "max": self.max, "since": self.since}


def _clock(at: float) -> str:
    """``06:14``, or ``Tue 06:14`` when it is not today."""
    fmt = "%H:%M" if time.localtime(at)[:3] == time.localtime()[:3] else "%a %H:%M"
    return time.strftime(fmt, time.localtime(at))
