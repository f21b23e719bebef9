"""Failures as data (rank, pid, exit code or signal, traceback text) and their rendering.

Workers never send exception objects; they send these fields, and the kernel
raises one of the exceptions below. Each renders short: IPython calls
``_render_traceback_`` and shows our lines instead of the magic's internals.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import List, Optional, Sequence


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


def describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "lost its connection to the kernel (the rank, or its whole node, went away)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (out of memory? the kernel's OOM killer sends SIGKILL)" if name == "SIGKILL" else ""
        hint = " (a crash in native code)" if name in ("SIGSEGV", "SIGBUS", "SIGABRT", "SIGILL") else hint
        return f"was killed by {name}{hint}"
    return f"exited with code {code}"


@dataclass
class RankFailure:
    rank: int
    kind: str  # "error", "interrupted", "died", "killed", "init", "timeout"
    type: str = ""
    message: str = ""
    traceback: str = ""
    pid: Optional[int] = None
    exit_code: Optional[int] = None
    last_lines: List[str] = field(default_factory=list)

    def headline(self) -> str:
        if self.kind == "died":
            return f"rank {self.rank} (pid {self.pid}) {describe_exit(self.exit_code)}"
        if self.kind == "killed":
            how = {-15: "SIGTERM", -9: "SIGKILL"}.get(self.exit_code or 0, describe_exit(self.exit_code))
            return f"rank {self.rank} (pid {self.pid}) did not respond to the interrupt and was stopped ({how})"
        if self.kind == "timeout":
            return self.message
        if self.kind == "interrupted":
            return f"rank {self.rank} was interrupted"
        return f"rank {self.rank} raised {self.type}: {self.message}".rstrip(": ")


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
        if not self.failures:
            return "\n".join(self.notes) or "the cell failed"
        root = self.failures[0]
        lines = [root.headline()]
        if root.traceback:
            lines += ["", f"--- traceback on rank {root.rank} ---", root.traceback.rstrip()]
        if root.last_lines:
            lines += ["", f"--- last lines rank {root.rank} printed ---", *root.last_lines]
        others = self.failures[1:]
        same = [f for f in others if f.kind == root.kind and f.type == root.type and f.message == root.message]
        if same:
            lines += ["", f"{'ranks' if len(same) > 1 else 'rank'} {', '.join(str(f.rank) for f in same)} failed the same way"]
        for f in others:
            if f in same or f.kind == "killed":  # stopped ranks are summed up in the notes
                continue
            lines += ["", f.headline()]
            if f.kind == "died" and f.last_lines:
                lines += [f"  last lines: {ln}" for ln in f.last_lines[-3:]]
        if self.notes:
            lines += [""] + self.notes
        return "\n".join(lines)

    def _render_traceback_(self) -> List[str]:
        text = self.render().splitlines()
        return [f"CellError: {text[0]}"] + text[1:]


class CellTimeout(CellError):
    """The cell ran past --timeout; carries every rank's stack at expiry."""
