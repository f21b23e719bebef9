"""Hang forensics: one line per rank (the collective it is in, its place in the cell) and who never arrived or called another.

Pure functions over what the ranks answered to STACK: each reply's ``collective``
(procs/rank_collectives.py: op, the group's sequence number, shape, dtype, group,
the group's ranks) and stack text, plus a word for ranks that had already left the
cell ("raised", "died"). The policy (policy.py) puts the text into the cell's notes.
"""
from __future__ import annotations

from collections import Counter
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

Collective = Mapping[str, object]  # one rank's STACK reply field "collective"


def ranks_text(ranks: Sequence[int]) -> str:
    """"rank 3", "ranks 0, 2", "ranks 0–3" (a run of three or more)."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) >= 3 and ranks[-1] - ranks[0] == len(ranks) - 1:
        return f"ranks {ranks[0]}–{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def op_text(c: Collective) -> str:
    """"all_reduce #12"."""
    seq = c.get("seq")
    return f"{c.get('op')}" + (f" #{seq}" if seq is not None else "")


def _tensor(c: Collective) -> str:
    shape, dtype = c.get("shape"), c.get("dtype")
    if shape is None:
        return "-"
    return f"[{', '.join(map(str, shape))}] {dtype}"  # type: ignore[call-overload]


def table(ranks: Sequence[int], collectives: Mapping[int, Optional[Collective]], where: Mapping[int, str]) -> List[str]:
    """One line per rank: collective, tensor, group, and where it is in the cell (or why it is not in it)."""
    rows: List[Tuple[str, str, str, str, str]] = [("rank", "collective", "tensor", "group", "where")]
    for r in sorted(ranks):
        c = collectives.get(r)
        if c is None:
            rows.append((str(r), "-", "-", "-", where.get(r, "")))
        else:
            rows.append((str(r), op_text(c), _tensor(c), str(c.get("group", "default")), where.get(r, "")))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4] for row in rows]


def _key(c: Collective) -> Tuple[str, object]:
    return (str(c.get("op")), c.get("seq"))


def verdicts(ranks: Sequence[int], collectives: Mapping[int, Optional[Collective]], where: Mapping[int, str]) -> List[str]:
    """Per group: who called a different collective ("mismatched collective") and who never arrived."""
    by_group: Dict[str, Dict[int, Collective]] = {}
    members: Dict[str, Sequence[int]] = {}
    for r, c in collectives.items():
        if c is None:
            continue
        group = str(c.get("group", "default"))
        by_group.setdefault(group, {})[r] = c
        listed = c.get("ranks")
        members[group] = list(listed) if isinstance(listed, (list, tuple)) else list(ranks)
    out: List[str] = []
    for group, calls in sorted(by_group.items()):
        common, _ = Counter(_key(c) for c in calls.values()).most_common(1)[0]
        majority = [r for r, c in calls.items() if _key(c) == common]
        shown = op_text(calls[majority[0]])
        suffix = "" if group == "default" else f" on {group}"
        for key in sorted({_key(c) for c in calls.values()} - {common}, key=str):
            odd = [r for r, c in calls.items() if _key(c) == key]
            verb = "is" if len(odd) == 1 else "are"
            out.append(
                f"{ranks_text(odd)} {verb} in {op_text(calls[odd[0]])} while {ranks_text(majority)} "
                f"{'is' if len(majority) == 1 else 'are'} in {shown}{suffix}: mismatched collective"
            )
        missing = [r for r in members[group] if r not in calls]
        if missing:
            why = "; ".join(f"rank {r} {where[r]}" for r in missing if where.get(r))
            out.append(f"{ranks_text(missing)} never arrived at {shown}{suffix}" + (f" ({why})" if why else ""))
    return out


def released_text(ranks: Sequence[int], collectives: Mapping[int, Optional[Collective]], where: Mapping[int, str]) -> str:
    """"ranks 0, 2, 3 were in all_reduce #5 (cell line 4: dist.all_reduce(x)) and were released"."""
    waiting = [r for r in ranks if collectives.get(r) is not None]
    if not waiting:
        return ""
    first = collectives[waiting[0]]
    assert first is not None
    ops = {op_text(c) for c in (collectives[r] for r in waiting) if c is not None}
    what = op_text(first) if len(ops) == 1 else "collectives"
    lines = {where.get(r, "") for r in waiting} - {""}
    at = f" ({lines.pop()})" if len(lines) == 1 else ""
    verb = "was" if len(waiting) == 1 else "were"
    return f"{ranks_text(waiting)} {verb} in {what}{at} and {verb} released"


def report(ranks: Sequence[int], collectives: Mapping[int, Optional[Collective]], where: Mapping[int, str]) -> List[str]:
    """The verdicts, then the table: what the cell's message shows when ranks were stuck (empty if none was in a collective)."""
    if not any(collectives.get(r) for r in ranks):
        return []
    return verdicts(ranks, collectives, where) + ["where each rank was:"] + ["  " + line for line in table(ranks, collectives, where)]
