"""What ``%ddp stacks`` shows: the ranks' stacks grouped, each group once with its ranks, the odd rank out first.

Pure functions over the STACK answers (procs/rank_stacks.py: per thread its name and frames as
[file, line, function, source line]). Two ranks are in one group when their stacks are the
same up to line numbers inside the same functions: 1,024 ranks in one training loop are one
group, whatever line each stands at; a line that differs within a group is shown as a range.
Groups come smallest first (the rank that is somewhere else is what the user looks for), each
headed ``--- ranks 0-6, 8-15 (15) ---``. Frames are named as our tracebacks name them:
``Cell In[12], line 4`` for a cell's own lines (wire/execution.py ``name_cells``), file:line
for the rest, a library's path from its package on.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..words import plural, short_rank_list
from .failures.forensics import op_text

GROUPS_SHOWN = 12  # groups listed in full at most; the others are counted, with their ranks
RUNS = 8  # a header's ranks: this many runs, then how many more
_CELL = re.compile(r"^<ddp-cell-([^>]+)>$")
_NATIVE_CELL = re.compile(r"\(<ddp-cell-([^>]+)>:(\d+)\)")  # py-spy's "f (<ddp-cell-2>:5)"
_LIB = re.compile(r"^.*?/(?:site|dist)-packages/|^.*?/lib/python\d+\.\d+/")
Key = Tuple[Any, ...]


def _key(reply: Mapping[str, Any]) -> Key:
    """What must be equal for two ranks to share a group: per thread its name and (file, function) frames."""
    threads = reply.get("threads")
    if threads is None:
        return ("text", str(reply.get("text", "")).strip())
    return tuple((t["name"], tuple((f[0], f[2]) for f in t["frames"])) for t in threads)


def group(replies: Mapping[int, Mapping[str, Any]]) -> List[List[int]]:
    """The ranks grouped by stack, smallest group first (ties: the lower first rank)."""
    groups: Dict[Key, List[int]] = {}
    for rank in sorted(replies):
        groups.setdefault(_key(replies[rank]), []).append(rank)
    return sorted(groups.values(), key=lambda rs: (len(rs), rs[0]))


def header(ranks: Sequence[int], what: str = "") -> str:
    """'--- rank 1 ---', '--- ranks 0-6, 8-15 (15) ---'."""
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {short_rank_list(ranks, RUNS)} ({len(ranks):,})"
    return f"--- {who}{what} ---"


def _lines(values: Sequence[int]) -> str:
    lo, hi = min(values), max(values)
    return f"line {lo}" if lo == hi else f"lines {lo}-{hi}"


def frame_text(frame: Sequence[Any], linenos: Sequence[int], numbers: Mapping[str, Optional[int]]) -> str:
    """'Cell In[12], line 4, in slow_part' or 'torch/distributed/distributed_c10d.py:2950 in all_reduce'."""
    filename, _, func = str(frame[0]), frame[1], str(frame[2])
    m = _CELL.match(filename)
    if m:
        number = numbers.get(m.group(1))
        cell = f"Cell In[{number}]" if number is not None else filename
        return f"{cell}, {_lines(linenos)}" + ("" if func == "<module>" else f", in {func}")
    lo, hi = min(linenos), max(linenos)
    return f"{_LIB.sub('', filename)}:{lo}" + (f"-{hi}" if hi != lo else "") + f" in {func}"


def native_text(text: str, numbers: Mapping[str, Optional[int]]) -> str:
    """py-spy's dump with a cell's frames named as ours are: ``f (Cell In[3], line 5)`` for ``f (<ddp-cell-2>:5)``."""
    def name(m: "re.Match[str]") -> str:
        number = numbers.get(m.group(1))
        return m.group(0) if number is None else f"(Cell In[{number}], line {m.group(2)})"
    return _NATIVE_CELL.sub(name, text)


def _thread_lines(members: Sequence[Mapping[str, Any]], index: int, numbers: Mapping[str, Optional[int]], named: bool) -> List[str]:
    """One thread of a group's stack: the first member's frames, each line number a range over the members."""
    first = members[0]["threads"][index]
    indent = "    " if named else "  "
    out = [f"  thread {first['name']}:"] if named else []
    if not first["frames"]:
        return out + [indent + ("(idle: between cells)" if first.get("main") else "(no Python frames)")]
    for i, frame in enumerate(first["frames"]):
        out.append(indent + frame_text(frame, [int(m["threads"][index]["frames"][i][1]) for m in members], numbers))
        if frame[3]:
            out.append(indent + "  " + str(frame[3]))
    return out


def _collective(members: Sequence[Mapping[str, Any]]) -> List[str]:
    """'  in all_reduce #12 (waited 3.1 s)': the collective the group's main threads wait in, if they agree on it."""
    cs = [m.get("collective") for m in members]
    if any(c is None for c in cs):
        return []
    ops = {op_text(c) for c in cs if c is not None}
    waited = max(float(c.get("waited") or 0.0) for c in cs if c is not None)
    return [f"  in {ops.pop() if len(ops) == 1 else 'collectives ' + ', '.join(sorted(ops))} (waited up to {waited:.1f} s)"]


def group_lines(ranks: Sequence[int], replies: Mapping[int, Mapping[str, Any]], numbers: Mapping[str, Optional[int]]) -> List[str]:
    """One group: its header, the collective it waits in, each thread's frames; a rank's own faulthandler text or
    native frames (the group's first rank's) where those are what it sent."""
    members = [replies[r] for r in ranks]
    first = members[0]
    lines = [header(ranks)] + _collective(members)
    if first.get("threads") is None:
        lines += ["  " + ln for ln in str(first.get("text", "")).rstrip().splitlines()]
    else:
        named = len(first["threads"]) > 1
        for i in range(len(first["threads"])):
            lines += _thread_lines(members, i, numbers, named)
    if first.get("native"):
        lines += [f"  native frames (rank {ranks[0]}, py-spy):"] + ["    " + ln for ln in native_text(str(first["native"]), numbers).rstrip().splitlines()]
    return lines


def render(replies: Mapping[int, Mapping[str, Any]], numbers: Mapping[str, Optional[int]], unanswered: Sequence[int] = (),
           absent: Sequence[int] = (), timeout: float = 0.0) -> List[str]:
    """Every group (smallest first, at most ``GROUPS_SHOWN`` in full), then who did not answer and who is not connected."""
    groups = group(replies)
    lines: List[str] = []
    for ranks in groups[:GROUPS_SHOWN]:
        lines += group_lines(ranks, replies, numbers)
    if len(groups) > GROUPS_SHOWN:
        rest = sorted(r for rs in groups[GROUPS_SHOWN:] for r in rs)
        more = f"{plural(len(rest), 'rank')} in {len(groups) - GROUPS_SHOWN} other stacks ({short_rank_list(rest, RUNS)})"
        lines.append(f"--- and {more}: --ranks R shows them ---")
    if unanswered:
        lines.append(header(sorted(unanswered), f": no answer within {timeout:g} s") +
                     "\n  its reader thread could not run: C code that holds the GIL, or a stopped process"
                     " (with py-spy installed, --native reads native frames; %ddp stacks --timeout S waits longer)")
    if absent:
        lines.append(header(sorted(absent), ": not connected (%ddp status says why)"))
    notes = sorted({str(m["native_error"]) for m in replies.values() if m.get("native_error")})
    return lines + notes


def summary(replies: Mapping[int, Any], elapsed: float) -> str:
    """'4 ranks in 2 stacks (31 ms)': the first line."""
    n = len(group(replies))
    return f"{plural(len(replies), 'rank')} in {plural(n, 'stack')} ({elapsed * 1000:.0f} ms)"
