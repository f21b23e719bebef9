"""How ddp_magic says a count, a list of ranks and a duration: one formatter each, for every role that words text.

Pure functions of plain values, imported by wire/, plan/, kernel/ and ui/ alike (it imports
nothing of ours), so the checks, the pool's notices, errors, forensics, the status view,
%ddp_env and the output prefixes say "2 ranks", "ranks 0, 2-3" and "998 ms" the same way.
labextension/src/format.ts mirrors ``fmt_seconds`` (tests/labextension/test_model_mirror.py).
"""
from __future__ import annotations

from typing import Iterable, List, Optional


def plural(n: int, word: str, many: Optional[str] = None) -> str:
    """'1 rank', '2 ranks', '0 ranks' (``many``: an irregular plural, e.g. plural(n, 'process', 'processes'))."""
    return f"{n} {word}" if n == 1 else f"{n} {many or word + 's'}"


def rank_list(ranks: Iterable[int]) -> str:
    """'3', '0-1', '0-3', '0, 2-3', '0, 2': sorted, each run of consecutive ranks as 'first-last', the runs joined by ', '."""
    runs: List[List[int]] = []
    for r in sorted(set(ranks)):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


def short_rank_list(ranks: Iterable[int], runs: int = 4) -> str:
    """'0-511', '3, 9, 17, 20 and 40 more': ``rank_list`` cut after a few runs (a sentence about 1,024 ranks stays short;
    it stops reading the runs where it cuts)."""
    rs = sorted(set(ranks))
    found: List[List[int]] = []  # [first, last] of each run, up to the one past the cut
    for r in rs:
        if found and r == found[-1][1] + 1:
            found[-1][1] = r
        elif len(found) > runs:
            break
        else:
            found.append([r, r])
    shown = found[:runs]
    text = ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in shown)
    left = len(rs) - sum(b - a + 1 for a, b in shown)
    return f"{text} and {left} more" if left else text


def ranks_phrase(ranks: Iterable[int]) -> str:
    """'rank 1' or 'ranks 0, 2-3': the ranks a sentence speaks of, singular or plural."""
    rs = sorted(set(ranks))
    return f"rank {rs[0]}" if len(rs) == 1 else f"ranks {rank_list(rs)}"


def fmt_seconds(s: Optional[float]) -> str:
    """'<1 ms', '35 ms', '2.31 s', '3 m 05 s', '1 h 02 m': a duration that ended; never '0.00 s' for a quick one."""
    if s is None:
        return ""
    if s < 0.001:
        return "<1 ms"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.2f} s"
    m, sec = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m} m {sec:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} m"


def fmt_bytes(n: Optional[int]) -> str:
    """'3.1 GiB', '212.0 MiB', '512 B'; '' for None (a figure nobody measured)."""
    if n is None:
        return ""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
