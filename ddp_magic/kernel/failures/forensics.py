"""Hang forensics: one line per group of ranks in the same place (collective, cell line), and who never arrived or called another.

Who never arrived, and who called another collective, is also who a hang is blamed on
(``culprits``): the policy makes them the root cause of a cell that timed out, so every
view names the rank the message names.

Pure functions over what the ranks answered to STACK: each reply's ``collective``
(procs/rank_collectives.py: op, the group's sequence number, shape, dtype, group,
the group's ranks) and stack text, plus a word for ranks that had already left the
cell ("raised", "died"). The policy (policy.py) puts the text into the cell's notes.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple

from ...words import plural, short_rank_list

Collective = Mapping[str, object]  # one rank's STACK reply field "collective"


def op_text(c: Collective) -> str:
    """"all_reduce #12"."""
    seq = c.get("seq")
    return f"{c.get('op')}" + (f" #{seq}" if seq is not None else "")


def _tensor(c: Collective) -> str:
    shape, dtype = c.get("shape"), c.get("dtype")
    if shape is None:
        return "-"
    return f"[{', '.join(map(str, shape))}] {dtype}"  # type: ignore[call-overload]


Row = Tuple[str, str, str, str]  # collective, tensor, group, where
ROWS_SHOWN = 24  # the table's rows at most: more places than that are counted, not listed (the policy keeps every reply)
RUNS = 8  # a row's ranks: this many runs, then how many more ('0, 2, 4, 6, 8, 10, 12, 14 and 504 more')


def _who(ranks: Sequence[int]) -> str:
    """words.ranks_phrase, cut after a few runs: 'ranks 0, 2, 4, 6, 8, 10, 12, 14 and 504 more'."""
    return f"rank {ranks[0]}" if len(set(ranks)) == 1 else f"ranks {short_rank_list(ranks, RUNS)}"


def _place(c: Optional[Collective], where: str) -> Row:
    if c is None:
        return ("-", "-", "-", where)
    return (op_text(c), _tensor(c), str(c.get("group", "default")), where)


def places(ranks: Sequence[int], collectives: Mapping[int, Optional[Collective]], where: Mapping[int, str]) -> List[Tuple[Row, List[int]]]:
    """The ranks grouped by where they are (collective, tensor, group, cell line), groups in order of their first rank."""
    groups: Dict[Row, List[int]] = {}
    for r in sorted(ranks):
        groups.setdefault(_place(collectives.get(r), where.get(r, "")), []).append(r)
    return sorted(groups.items(), key=lambda kv: kv[1][0])


def table(ranks: Sequence[int], collectives: Mapping[int, Optional[Collective]], where: Mapping[int, str]) -> List[str]:
    """One line per group of ranks in the same place (its ranks as 'rank_list' says them): collective, tensor, group,
    and where it is in the cell (or why it is not in it). At 4 ranks or 1,024 the same rule: as many lines as places."""
    groups = places(ranks, collectives, where)
    head = "rank" if all(len(rs) == 1 for _, rs in groups) else "ranks"
    rows: List[Tuple[str, ...]] = [(head, "collective", "tensor", "group", "where")]
    rows += [(short_rank_list(rs, RUNS), *row) for row, rs in groups[:ROWS_SHOWN]]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4] for row in rows]
    if len(groups) > ROWS_SHOWN:
        rest = [r for _, rs in groups[ROWS_SHOWN:] for r in rs]
        lines.append(f"… and {plural(len(rest), 'rank')} in {len(groups) - ROWS_SHOWN} other places ({short_rank_list(rest, RUNS)})")
    return lines


def stacks_text(stacks: Mapping[int, str]) -> List[str]:
    """Each distinct stack once, headed by the ranks that share it ('--- ranks 0-3 ---'): 1,024 ranks in one line
    of the cell are one stack, not 1,024."""
    groups: Dict[str, List[int]] = {}
    for r in sorted(stacks):
        groups.setdefault(stacks[r].rstrip(), []).append(r)
    ordered = sorted(groups.items(), key=lambda kv: kv[1][0])
    return [f"--- {_who(rs)} ---\n{text}" for text, rs in ordered]


def _key(c: Collective) -> Tuple[str, object]:
    return (str(c.get("op")), c.get("seq"))


@dataclass(frozen=True)
class Finding:
    """One group's hang: the collective most of its ranks are in, who is in another one, who never arrived."""

    group: str
    majority: Tuple[int, ...]  # the ranks in the collective most of the group is in
    shown: str  # that collective, as "all_reduce #12"
    odd: Tuple[Tuple[str, Tuple[int, ...]], ...]  # (another collective, the ranks in it): a mismatch
    missing: Tuple[int, ...]  # members in no collective of this group


def findings(ranks: Sequence[int], collectives: Mapping[int, Optional[Collective]]) -> List[Finding]:
    """Per group (sorted by name): who called a different collective, and who never arrived. The one reading of
    the STACK replies that both the words (``verdicts``) and the blame (``culprits``) come from."""
    by_group: Dict[str, Dict[int, Collective]] = {}
    members: Dict[str, Sequence[int]] = {}
    for r, c in collectives.items():
        if c is None:
            continue
        group = str(c.get("group", "default"))
        by_group.setdefault(group, {})[r] = c
        listed = c.get("ranks")
        members[group] = list(listed) if isinstance(listed, (list, tuple)) else list(ranks)
    out: List[Finding] = []
    for group, calls in sorted(by_group.items()):
        common, _ = Counter(_key(c) for c in calls.values()).most_common(1)[0]
        majority = tuple(r for r, c in calls.items() if _key(c) == common)
        odd = []
        for key in sorted({_key(c) for c in calls.values()} - {common}, key=str):
            these = tuple(r for r, c in calls.items() if _key(c) == key)
            odd.append((op_text(calls[these[0]]), these))
        missing = tuple(r for r in members[group] if r not in calls)
        out.append(Finding(group, majority, op_text(calls[majority[0]]), tuple(odd), missing))
    return out


def culprits(ranks: Sequence[int], collectives: Mapping[int, Optional[Collective]]) -> List[int]:
    """The ranks a hang is blamed on: those in a mismatched collective and those that never arrived (sorted;
    empty when the waiting ranks agree and nobody is missing)."""
    out: Set[int] = set()
    for f in findings(ranks, collectives):
        out.update(f.missing)
        out.update(r for _, these in f.odd for r in these)
    return sorted(out)


def _left_mid_call(f: Finding, op: str, where: Mapping[int, str]) -> bool:
    """Whether ranks one call behind the others are only that: some members died (or their node went silent) while
    the call ran, so some survivors finished it and others did not. Not a mismatch to blame anyone for."""
    gone = any(where.get(r) in GONE_WORDS for r in f.missing)
    name, _, seq = op.partition(" #")
    major_name, _, major_seq = f.shown.partition(" #")
    return gone and name == major_name and seq.isdigit() and major_seq.isdigit() and abs(int(seq) - int(major_seq)) == 1


GONE_WORDS = ("died", "unreachable")  # what the policy's ``where`` says of a rank that left the cell without a word


def verdicts(ranks: Sequence[int], collectives: Mapping[int, Optional[Collective]], where: Mapping[int, str]) -> List[str]:
    """Per group: who called a different collective ("mismatched collective") and who never arrived."""
    out: List[str] = []
    for f in findings(ranks, collectives):
        suffix = "" if f.group == "default" else f" on {f.group}"
        for op, odd in f.odd:
            if _left_mid_call(f, op, where):
                continue
            verb = "is" if len(odd) == 1 else "are"
            out.append(
                f"{_who(odd)} {verb} in {op} while {_who(f.majority)} "
                f"{'is' if len(f.majority) == 1 else 'are'} in {f.shown}{suffix}: mismatched collective"
            )
        if f.missing:
            why = "; ".join(f"{_who(rs)} {w}" for (*_, w), rs in places([r for r in f.missing if where.get(r)], {}, where))
            out.append(f"{_who(f.missing)} never arrived at {f.shown}{suffix}" + (f" ({why})" if why else ""))
    return out


def released_text(ranks: Sequence[int], collectives: Mapping[int, Optional[Collective]], where: Mapping[int, str], when: str = "") -> str:
    """"ranks 0, 2-3 were in all_reduce #5 (cell line 4: dist.all_reduce(x)) and were released"; ranks in different
    collectives are said per collective ("ranks 0-2 were in all_reduce #4, ranks 3-6 in all_reduce #3, and were released").
    ``when``: what released them, as "rank 1 died" ("rank 0 was in all_reduce #1 when rank 1 died, and was released")."""
    waiting = [r for r in ranks if collectives.get(r) is not None]
    if not waiting:
        return ""
    by_op: Dict[str, List[int]] = {}
    for r in waiting:
        by_op.setdefault(op_text(collectives[r] or {}), []).append(r)
    lines = {where.get(r, "") for r in waiting} - {""}
    at = f" ({lines.pop()})" if len(lines) == 1 else ""
    verb = "was" if len(waiting) == 1 else "were"
    end = f" when {when}, and {verb} released" if when else f" and {verb} released"
    groups = sorted(by_op.items(), key=lambda kv: kv[1][0])
    if len(groups) == 1:
        return f"{_who(waiting)} {verb} in {groups[0][0]}{at}{end}"
    if len(groups) > 4:
        return f"{_who(waiting)} were in {len(groups)} collectives{at}{end}"
    each = [f"{_who(rs)} {'was' if len(rs) == 1 else 'were'} in {op}" if i == 0 else f"{_who(rs)} in {op}"
            for i, (op, rs) in enumerate(groups)]
    return f"{', '.join(each)}{at}{end if when else ',' + end}"


def released_by_death_text(released: Mapping[int, Tuple[Optional[Collective], str]], died: Sequence[int]) -> str:
    """The ranks whose collective broke because ranks of the cell died (rank -> the collective it raised in, its
    traceback), in our words instead of the backend's: "rank 0 was in all_reduce #1 (at cell line 5: …) when rank 1
    died, and was released"; a rank whose collective is not known: "rank 0 was in a collective when rank 1 died, …"."""
    when = f"{_who(died)} died"
    known = {r: c for r, (c, _) in released.items() if c}
    where = {r: f"at {last_cell_line(tb)}" for r, (_, tb) in released.items() if 'File "<ddp-cell' in tb}
    lines = [released_text(sorted(known), known, where, when)] if known else []
    unknown = sorted(r for r in released if r not in known)
    if unknown:
        verb = "was" if len(unknown) == 1 else "were"
        lines.append(f"{_who(unknown)} {verb} in a collective when {when}, and {verb} released")
    return "; ".join(lines)


def report(ranks: Sequence[int], collectives: Mapping[int, Optional[Collective]], where: Mapping[int, str]) -> List[str]:
    """The verdicts, then the table: what the cell's message shows when ranks were stuck (empty if none was in a collective)."""
    if not any(collectives.get(r) for r in ranks):
        return []
    return verdicts(ranks, collectives, where) + ["where each rank was:"] + ["  " + line for line in table(ranks, collectives, where)]


def last_cell_line(stack: str) -> str:
    """Where in the cell a stack stands: "cell line 5: dist.all_reduce(x)"."""
    lines = [ln.strip() for ln in stack.splitlines() if ln.strip().startswith('File "<ddp-cell')]
    if not lines:
        return "an unknown place"
    last = lines[-1]
    try:
        lineno = last.split("line ", 1)[1].split(",", 1)[0]
    except IndexError:
        return last
    code_lines = stack.splitlines()
    idx = [i for i, ln in enumerate(code_lines) if ln.strip() == last][-1]
    code = code_lines[idx + 1].strip() if idx + 1 < len(code_lines) else ""
    return f"cell line {lineno}: {code}" if code else f"cell line {lineno}"
