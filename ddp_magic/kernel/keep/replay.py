"""A replay's lines in the order they were printed: the ranks' missed output merged by when each line came.

An attaching kernel gets what each rank printed while no kernel showed it as one block per rank (procs/rank_keep.py
replays its spool at once), so shown as it comes it is all of rank 1's lines, then all of rank 0's. Each rank says in
its HELLO when the lines of its replay were printed (``Spool.replay_stamps``: per read of its pipe, how many lines
and how many seconds before the HELLO, on its own clock); this merges the blocks line by line in that order, the
order the live path shows them in. Lines past the stamped ones (printed since) keep the time they were heard; lines
older than the stamps a rank keeps go first; a line not ended yet goes last (its rest comes live).
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterator, List, Optional, Tuple

Call = Tuple[str, Tuple[Any, ...]]  # a listener's method and its arguments
Heard = Tuple[str, Tuple[Any, ...], float]  # ... and when this kernel heard it (time.monotonic())
Key = Tuple[int, str]  # (rank, stream)


def expected(hellos: Dict[int, dict]) -> Dict[Key, int]:
    """Per rank and stream, the lines its replay holds (the attach waits for them before it shows any)."""
    return {(rank, stream): sum(int(n) for n, _ in stamps) for rank, hello in hellos.items()
            for stream, stamps in (hello.get("replay") or {}).items() if stamps}


def _times(stamps: List[List[Any]], heard_at: Optional[float]) -> Iterator[float]:
    """One time a stamped line, in this kernel's clock (-inf: before the oldest stamp, or no time to count from)."""
    for n, ago in stamps:
        at = -math.inf if ago is None or heard_at is None else heard_at - float(ago)
        for _ in range(int(n)):
            yield at


def _lines(pieces: List[Tuple[str, float]], stamps: List[List[Any]], heard_at: Optional[float]) -> List[Tuple[float, str]]:
    """One rank's stream, cut into lines, each with its time (never earlier than the line before it)."""
    times = _times(stamps, heard_at)
    out: List[Tuple[float, str]] = []
    held, last = "", -math.inf
    for text, when in pieces:
        held += text
        *whole, held = held.split("\n")
        for line in whole:
            last = max(last, next(times, when))
            out.append((last, line + "\n"))
    if held:
        out.append((math.inf, held))
    return out


def merged(calls: List[Heard], hellos: Dict[int, dict], heard_at: Dict[int, float]) -> List[Call]:
    """``calls`` as the listener should hear them: every other call first, in its order; then the ranks' output, line by
    line in time order (rank, then stream, for lines of the same moment), a rank's run of lines in one call."""
    others: List[Call] = [(name, args) for name, args, _ in calls if name != "on_output"]
    pieces: Dict[Key, List[Tuple[str, float]]] = {}
    for name, args, when in calls:
        if name == "on_output":
            pieces.setdefault((int(args[0]), str(args[1])), []).append((str(args[2]), when))
    lines = [(at, key, i, text) for key, parts in pieces.items()
             for i, (at, text) in enumerate(_lines(parts, (hellos.get(key[0]) or {}).get("replay", {}).get(key[1]) or [], heard_at.get(key[0])))]
    lines.sort(key=lambda line: (line[0], line[1], line[2]))
    out: List[Call] = []
    for _, key, _, text in lines:
        if out and out[-1][1][:2] == key:
            out[-1] = ("on_output", (key[0], key[1], out[-1][1][2] + text))
        else:
            out.append(("on_output", (key[0], key[1], text)))
    return others + out
