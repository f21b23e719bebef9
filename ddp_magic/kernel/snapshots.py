"""``%ddp save``, ``%ddp load`` and ``%ddp snapshots`` in the kernel: the cell each sends the ranks, and what the user reads back.

A save or load is a cell (the session runs it like any other, so it waits its turn, and a
rank that dies mid-save is a failed cell): one call into procs/rank_snapshot.py on every
rank, at a cell boundary. The ranks do the writing; the kernel only names the partial
folder and words their reports. ``snapshots`` reads meta.json files and needs no pool.
"""
from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..wire import snapshot as S
from ..words import fmt_bytes, plural

INTO_HINT = "where a rebuild is not exact: rebuild those objects in a setup cell, then %ddp load {path} --into NAME,NAME"


def save_args(parent: str, names: Sequence[str], step: Optional[int], background: bool = False, user_named: bool = False) -> Dict[str, Any]:
    """What every rank's writer takes (procs/rank_snapshot.py ``save``): one new partial folder of ``parent``, the names, the time;
    ``background``: the ranks go on once each has copied its share, a thread of each writes it; ``user_named``: the user
    named them (one no rank defines refuses the save; the names a session owns may have been deleted since)."""
    partial = os.path.join(os.path.abspath(parent), S.PARTIAL + secrets.token_hex(4))
    return {"partial": partial, "names": list(names), "time": time.time(), "step": step, "background": background, "typed": parent,
            "user_named": user_named}


def save_source(parent: str, names: Sequence[str], step: Optional[int], background: bool = False, user_named: bool = False) -> Tuple[str, str]:
    """The cell every rank runs for ``%ddp save``: its share written into one new partial folder of ``parent`` (returned too)."""
    args = save_args(parent, names, step, background, user_named)
    return _call("save", args), args["partial"]


WRITTEN_SOURCE = "__import__('ddp_magic.procs.rank_snapshot', fromlist=['written']).written()"  # waits for a background save


def finish_writes(pool: Any, run: Callable[[str], Any]) -> str:
    """Before a pool's ranks go: a background save of theirs still being written is waited for (a cell on every rank), and said."""
    parent = pool.recovery.writing if pool is not None and pool.alive else None
    if not parent:
        return ""
    pool.recovery.writing = None
    result = run(WRITTEN_SOURCE)
    return written_text(result.outcome.values if result.ok else [], parent) if result.ok else "the wait for the background save failed"


def written_text(outcomes: Sequence[Optional[Dict[str, Any]]], typed: str) -> str:
    """What the wait for a background save says: the snapshot whole, or the ranks it failed on."""
    failed: Dict[int, str] = {}
    for r in outcomes:
        failed.update({int(k): v for k, v in ((r or {}).get("failed") or {}).items()})
    if failed:
        first = min(failed)
        return f"the background save failed on rank {first}: {failed[first]}; it is left partial, the snapshots before it are whole"
    done = next((r for r in outcomes if r and r.get("path")), None)
    if done is None:
        return ""
    return f"{shown(typed, done['path'])} is whole: {fmt_bytes(done['bytes'])} written in the background"


def unfinished(partial: str) -> str:
    """What a failed save leaves, said after the ranks' failure."""
    return (f"%ddp save did not finish: {partial} is left as it was (%ddp snapshots lists it as partial; no load reads it); "
            f"the snapshots before it are whole")


def load_source(path: str, into: Sequence[str]) -> str:
    return _call("load", {"path": os.path.abspath(path), "into": list(into)})


def _call(op: str, args: Dict[str, Any]) -> str:
    return f"__import__('ddp_magic.procs.rank_snapshot', fromlist=['entry']).entry({op!r}, globals(), {args!r})"


def _kinds(names: Dict[str, Dict[str, Any]]) -> str:
    parts = []
    for name, entry in names.items():
        how = entry.get("kind", "?") + (f", {entry['sharing']}" if entry.get("sharing") else "")
        parts.append(f"{name} ({how})")
    return ", ".join(parts) or "nothing"


@dataclass
class Saved:
    """What ``%ddp save`` did: rank 0's report (the folder, each name's kind, what could not be saved)."""

    report: Dict[str, Any]
    typed: str = ""  # the folder as the user wrote it: the text names the snapshot so
    where: str = ""  # " at a safe point (the job goes on)": taken while a cell ran (kernel/jobs/safe_save.py)

    def text(self) -> str:
        r = self.report
        step = f"step {r['step']}" if r.get("step") is not None else "a snapshot"
        if r.get("background"):  # the ranks went on after copying their shares: rank 0 says when it is whole
            head = (f"saving {step} to {shown(self.typed, r['path'])}{self.where}: {plural(len(r['names']), 'name')}; "
                    f"the ranks went on after {r['paused']:.2f} s, their threads write it (rank 0 says when it is whole)")
        else:
            head = f"saved {step} to {shown(self.typed, r['path'])}{self.where}: {plural(len(r['names']), 'name')}, {fmt_bytes(r['bytes'])}"
        lines = [head, "  " + _kinds(r["names"])]
        if r.get("earlier"):  # the background save before this one, waited for first
            lines.append(f"  the background save before it {r['earlier']}")
        for name, why in sorted(r["unsaved"].items()):
            lines.append(f"  not saved: {name}: {why}")
        return "\n".join(lines)


@dataclass
class Loaded:
    """What ``%ddp load`` did on every rank: the names set, and what could not be mapped (each note once, with its ranks)."""

    reports: List[Dict[str, Any]]
    world: int
    saved_world: int
    typed: str = ""  # the folder as the user wrote it
    notes: Dict[str, List[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for r in self.reports:
            for note in r["notes"]:
                self.notes.setdefault(note, []).append(r["rank"])

    @property
    def names(self) -> List[str]:
        return list(self.reports[0]["names"]) if self.reports else []

    def text(self) -> str:
        first = self.reports[0]
        step = f"step {first['step']}, " if first.get("step") is not None else ""
        path = shown(self.typed, first["path"])
        lines = [f"loaded {path} ({step}saved by {plural(self.saved_world, 'rank')}) into {plural(self.world, 'rank')}: "
                 + (", ".join(self.names) or "nothing")]
        parent = os.path.dirname(path)
        for note, ranks in self.notes.items():
            where = "" if len(ranks) == self.world else f" (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))})"
            lines.append(f"  {note.replace('%ddp load DIR', f'%ddp load {parent}')}{where}")
        if any("not exact" in n or "cannot be mapped" in n for n in self.notes) and not any("--into" in n for n in self.notes):
            lines.append("  " + INTO_HINT.format(path=parent))
        return "\n".join(lines)


def shown(typed: str, actual: str) -> str:
    """A snapshot's folder as the user would write it: under the folder they typed, not as an absolute path."""
    if not typed or os.path.abspath(typed) == actual:
        return typed or actual
    return os.path.join(typed, os.path.basename(actual))


def listing(parent: str) -> str:
    """``%ddp snapshots DIR``: one line each snapshot, oldest first; partial ones say why they are never loaded."""
    found = S.entries(parent)
    if not found:
        return f"no snapshots in {parent}" + ("" if os.path.isdir(parent) else " (no such folder)") + f": %ddp save {parent} writes one"
    lines = [f"{plural(sum(e.meta is not None for e in found), 'snapshot')} in {parent} (oldest first; %ddp load {parent} takes the newest):"]
    for e in found:
        name = os.path.basename(e.path)
        if e.meta is None:
            lines.append(f"  {name}  {e.problem}")
            continue
        m = e.meta
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(m.time))
        step = f"step {m.step}" if m.step is not None else "no step"
        unsaved = f" (not saved: {', '.join(sorted(m.unsaved))})" if m.unsaved else ""
        lines.append(f"  {name}  {step}  {when}  {plural(m.world_size, 'rank')}  {fmt_bytes(m.bytes)}  {', '.join(m.names)}{unsaved}")
    return "\n".join(lines)


def world_of(path: str) -> int:
    """The world size the snapshot ``path`` names (or the newest in it) was saved at: a new pool's default size."""
    return S.Meta.read(S.resolve(path)).world_size
