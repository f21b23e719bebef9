"""What ddp_magic's formatters may write, as patterns a test matches and parsers that read the value back.

One home, so that no test expects less than a formatter writes: a test that matched only
``\\d+\\.\\d\\d s`` failed the day a pool started in under a second ('998 ms'). Every pattern
here accepts every output of its formatter (tests/unit/test_status_render.py sweeps them), and
the parsers give back the value within the precision shown.
"""
from __future__ import annotations

import re
from typing import Tuple

# ui/status_render.fmt_seconds (kernel/texts.py): '<1 ms', '35 ms', '2.31 s', '3 m 05 s', '1 h 02 m'
SECONDS = r"(?:<1 ms|\d+ ms|\d+\.\d\d s|\d+ m \d\d s|\d+ h \d\d m)"
# ui/status_render.fmt_clock, a live clock: '0.4 s', '12.3 s', '3 m 05 s', '1 h 02 m'
CLOCK = r"(?:\d+\.\d s|\d+ m \d\d s|\d+ h \d\d m)"

_PARTS = re.compile(
    r"^(?:(?P<lt><)1 ms|(?P<ms>\d+) ms|(?P<s>\d+\.\d+) s|(?P<m>\d+) m (?P<ms2>\d\d) s|(?P<h>\d+) h (?P<hm>\d\d) m)$"
)


def seconds_range(text: str) -> Tuple[float, float]:
    """The interval of true values a formatted duration stands for (what it shows, ± half its last digit; '1 h 02 m'
    reads like a clock, its seconds dropped)."""
    m = _PARTS.match(text.strip())
    if m is None:
        raise ValueError(f"not a duration ddp_magic writes: {text!r}")
    if m.group("lt"):
        return 0.0, 0.001
    if m.group("ms"):
        v = int(m.group("ms")) / 1000
        return v - 0.0005, v + 0.0005
    if m.group("s"):
        digits = m.group("s")
        half = 0.5 * 10 ** -len(digits.split(".")[1])
        v = float(digits)
        return v - half, v + half
    if m.group("m"):
        v = int(m.group("m")) * 60 + int(m.group("ms2"))
        return v - 0.5, v + 0.5
    v = int(m.group("h")) * 3600 + int(m.group("hm")) * 60
    return v - 0.5, v + 60.0  # hours and minutes: the seconds are dropped (a clock's reading), not rounded


def parse_seconds(text: str) -> float:
    """The value a formatted duration shows (the middle of ``seconds_range``)."""
    lo, hi = seconds_range(text)
    return (lo + hi) / 2


# ui/metrics_chart.fmt and labextension's fmtValue: '0', '5963', '0.0002628', '2.628e-05', '15.9k', '1M', '1.5T'
UNITS = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
NUMBER = re.compile(r"^-?(\d+)(?:\.(\d+))?(?:e([-+]\d+))?([kMGT]?)$")


def read_back(text: str) -> float:
    """The number a formatted metric value stands for ("15.9k" is 15900.0, "2.628e-05" is 0.00002628)."""
    m = NUMBER.match(text)
    assert m, f"{text!r} is not a number with an optional k, M, G or T"
    return float(text[: len(text) - len(m.group(4))]) * UNITS[m.group(4)]


def half_place(text: str) -> float:
    """Half the place value of the last digit shown: the most a correctly rounded text may be off by."""
    m = NUMBER.match(text)
    assert m
    return 0.5 * 10.0 ** (int(m.group(3) or 0) - len(m.group(2) or "")) * UNITS[m.group(4)]
