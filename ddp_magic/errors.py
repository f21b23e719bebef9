"""Failures as data (rank, pid, exit code or signal, traceback text) and their rendering.

Workers never send exception objects; they send these fields, and the kernel
raises one of the exceptions below. Each renders short: IPython calls
``_render_traceback_`` and shows our lines instead of the magic's internals.
"""
from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .states import FailureKind
from .words import short_rank_list


class DDPError(Exception):
    """Base of every error ddp_magic raises to the user; renders as its message alone."""

    def _render_traceback_(self) -> List[str]:
        return [f"{type(self).__name__}: {line}" if i == 0 else line for i, line in enumerate(str(self).splitlines())]


class UsageError(DDPError):
    """Bad flags or arguments; nothing was started."""


class StartError(DDPError):
    """The pool could not start; what was started has been stopped."""


class ShipError(DDPError):
    """A notebook variable could not be sent to the workers; nothing was sent."""


class Dequeued(DDPError):
    """A %%ddp cell left the queue before it ran (Ctrl-C, or its job's cancel): nothing ran on the ranks."""


class NodeUnreachable(DDPError):
    """A cell did not run: a node whose ranks were unreachable still does not answer; the other ranks keep their state."""


class NodeLost(DDPError):
    """A cell did not run: a lost node's ranks could not be placed again (no room for them yet); the other ranks keep their state."""


class PlanError(ValueError):
    """A request that cannot become a valid pool; the message says what to do."""


def signal_name(code: Optional[int]) -> Optional[str]:
    """The signal a negative exit code stands for ("SIGKILL"), or None for a plain exit code."""
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


_CRASH_SIGNALS = ("SIGSEGV", "SIGBUS", "SIGABRT", "SIGILL")


def describe_exit(code: Optional[int]) -> str:
    """How a rank's process ended, in words a user can act on."""
    if code is None:
        return "lost its connection to the kernel (the rank, or its whole node, went away)"
    name = signal_name(code)
    if name is None:
        return f"exited with code {code}"
    hint = " (a crash in native code)" if name in _CRASH_SIGNALS else ""
    return f"was killed by {name}{hint}"


@dataclass
class RankFailure:
    """One rank's failure in a cell (or at start-up), as plain fields the kernel can render."""

    rank: int
    kind: FailureKind
    type: str = ""
    message: str = ""
    traceback: str = ""
    pid: Optional[int] = None
    exit_code: Optional[int] = None
    last_lines: List[str] = field(default_factory=list)
    node: str = ""  # set when its node stopped answering (DIED, ``message`` says how): the node is named, not a pid
    why: str = ""  # how it died, with the evidence (kernel/failures/deaths.py): said instead of describe_exit's guess
    on: str = ""  # the node it ran on, where the pool names its nodes (Slurm, SSH, Ray): which machine to look at

    def _where(self) -> str:
        return f" on {self.on}" if self.on else ""

    def headline(self) -> str:
        if self.kind == FailureKind.DIED and self.node:
            return f"rank {self.rank} on {self.node} is unreachable: {self.message}"
        if self.kind == FailureKind.DIED:
            return f"rank {self.rank} (pid {self.pid}){self._where()} {self.why or describe_exit(self.exit_code)}"
        if self.kind == FailureKind.KILLED:
            stopped_by_us = self.exit_code in (-signal.SIGTERM, -signal.SIGKILL)
            how = signal_name(self.exit_code) if stopped_by_us else describe_exit(self.exit_code)
            return f"rank {self.rank} (pid {self.pid}) did not respond to the interrupt and was stopped ({how})"
        if self.kind == FailureKind.TIMEOUT:
            return self.message
        if self.kind == FailureKind.INTERRUPTED:
            return f"rank {self.rank} was interrupted"
        return f"rank {self.rank} raised {self.type}: {self.message}".rstrip(": ")


GROUPS_SHOWN = 8  # groups of failures a cell's message lists; the others are counted (CellError.failures has each one)


def _how(f: RankFailure) -> Tuple[object, ...]:
    """What ranks that failed the same way share: the kind, the exception and its message, how the process ended."""
    return (f.kind, f.type, f.message, f.exit_code if f.kind in (FailureKind.DIED, FailureKind.KILLED) else None, f.node, f.why, f.on)


def _who(ranks: Sequence[int]) -> str:
    """'rank 3', 'ranks 0-2, 5', or past 8 runs 'ranks 0, 2, 4, 6, 8, 10, 12, 14 and 504 more' (each one: .failures)."""
    return f"rank {ranks[0]}" if len(set(ranks)) == 1 else f"ranks {short_rank_list(ranks, 8)}"


def group_failures(failures: Sequence[RankFailure]) -> List[List[RankFailure]]:
    """The failures grouped by how they failed, each group in rank order, the groups in order of their first report."""
    groups: Dict[Tuple[object, ...], List[RankFailure]] = {}
    for f in failures:
        groups.setdefault(_how(f), []).append(f)
    return [sorted(g, key=lambda f: f.rank) for g in groups.values()]


def group_headline(group: Sequence[RankFailure]) -> str:
    """A group's one line: a lone rank's own headline (its pid too), else the ranks, compact, and how they failed
    ('ranks 0-9, 11-1023 were interrupted', 'ranks 5-9 exited with code 3')."""
    first = group[0]
    if len(group) == 1:
        return first.headline()
    who = _who([f.rank for f in group])
    if first.kind == FailureKind.DIED and first.node:
        return f"{who} on {first.node} are unreachable: {first.message}"
    if first.kind == FailureKind.DIED:
        how = first.why or describe_exit(first.exit_code)
        return f"{who}{first._where()} {how.replace('was killed', 'were killed').replace('lost its connection', 'lost their connections')}"
    if first.kind == FailureKind.KILLED:
        return f"{who} did not respond to the interrupt and were stopped"
    if first.kind == FailureKind.TIMEOUT:
        return first.message
    if first.kind == FailureKind.INTERRUPTED:
        return f"{who} were interrupted"
    return f"{who} raised {first.type}: {first.message}".rstrip(": ")


class CellError(DDPError):
    """A %%ddp cell failed on one or more ranks. ``failures`` lists them, root cause first."""

    def __init__(self, failures: Sequence[RankFailure], notes: Sequence[str] = (), partial: object = None) -> None:
        self.failures = list(failures)
        self.notes = list(notes)
        self.partial = partial  # results of the ranks that succeeded, indexed by rank
        super().__init__(self.render())

    @property
    def ranks(self) -> List[int]:
        return [f.rank for f in self.failures]

    def render(self) -> str:
        """The root cause in full (headline, traceback, last lines), then one line per *group* of the other failures
        (ranks that failed the same way), then the notes: as many lines at 1,024 ranks as at 4."""
        if not self.failures:
            return "\n".join(self.notes) or "the cell failed"
        root = self.failures[0]
        lines = [root.headline()]
        if root.traceback:
            lines += ["", f"--- traceback on rank {root.rank} ---", root.traceback.rstrip()]
        if root.last_lines:
            lines += ["", f"--- last lines rank {root.rank} printed ---", *root.last_lines]
        others = self.failures[1:]
        same = [f for f in others if _how(f) == _how(root)]
        if same and root.node:  # a node gone silent: the node and all its ranks in the first line
            lines[0] = group_headline([root, *same])
        elif same and root.kind != FailureKind.TIMEOUT:  # a timeout's headline names every rank it waited for
            lines += ["", f"{_who([f.rank for f in same])} failed the same way"]
        said = {id(f) for f in same}  # by identity: comparing dataclasses is O(n) each, O(n²) over 1,024 ranks
        rest = [f for f in others if id(f) not in said and f.kind != FailureKind.KILLED and not f.message.startswith("released")]
        groups = group_failures(rest)  # the killed and the released are summed up in the notes
        for group in groups[:GROUPS_SHOWN]:
            lines += ["", group_headline(group)]
            if len(group) == 1 and group[0].kind == FailureKind.DIED and group[0].last_lines:
                lines += [f"  last lines: {ln}" for ln in group[0].last_lines[-3:]]
        if len(groups) > GROUPS_SHOWN:
            left = [f.rank for g in groups[GROUPS_SHOWN:] for f in g]
            lines += ["", f"{_who(left)} failed in {len(groups) - GROUPS_SHOWN} other ways (each one: the error's .failures)"]
        if self.notes:
            lines += [""] + self.notes
        return "\n".join(lines)

    def _render_traceback_(self) -> List[str]:
        text = self.render().splitlines()
        return colour_traceback("\n".join([f"{type(self).__name__}: {text[0]}"] + text[1:])).splitlines()


class JobCancelled(CellError):
    """A background job's cell ended by ``job.cancel()``: the ranks were interrupted because the notebook asked, so
    the error says that (``cancelled by job.cancel(): ranks 0-1 stopped at step 187; state kept``), not a rank's
    interrupt nor a Ctrl-C; ``failures`` still lists each interrupted rank."""

    def __init__(self, text: str, failures: Sequence[RankFailure], notes: Sequence[str] = (), partial: object = None) -> None:
        self.text = text
        super().__init__(failures, notes, partial)

    def render(self) -> str:
        return "\n".join([self.text] + ([""] + self.notes if self.notes else []))


_COLOURED = (
    (re.compile(r"^(\s*)Cell In\[(\d+)\], line (\d+)", re.M), "\\1\x1b[96mCell\x1b[39m \x1b[32mIn[\\2], line \\3\x1b[39m"),
    (re.compile(r'^(\s*)File "([^"]+)", line (\d+)', re.M), '\\1\x1b[96mFile\x1b[39m \x1b[32m"\\2", line \\3\x1b[39m'),
    (re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning))(:|$)", re.M), "\x1b[91m\\1\x1b[39m\\2"),
)


def colour_traceback(text: str) -> str:
    """IPython's colours for a traceback's frame lines and exception name (ANSI: every Jupyter front end shows them).

    Only for what a front end renders as a traceback (``_render_traceback_``), never for an exception's message."""
    for pattern, replacement in _COLOURED:
        text = pattern.sub(replacement, text)
    return text
