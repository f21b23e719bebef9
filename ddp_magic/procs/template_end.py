"""Why a template ends its ranks when the kernel did not ask: said to the kernel first, so each rank's death names it.

Without it a rank that its template ended reads "killed by SIGKILL" in the kernel, the one thing it cannot tell
apart from the OOM killer or a stray ``kill``. The template sends an ``ending`` event (its node, these words)
before it kills anything; kernel/launchers/slurm_steps.py keeps the words by node, and
kernel/failures/recovery.py adds them to the death of that node's ranks. A template whose kernel asked it to
end (``exit``), or went through a preemption's save, says nothing: the kernel knows why.
"""
from __future__ import annotations

from enum import Enum
from typing import Dict

from .template_keep import emit


class TemplateEnd(Enum):
    """Each way a template ends its ranks on its own; the value is its words, formatted with what it names."""

    COMMANDS_CLOSED = "its command pipe from the kernel closed"
    SILENT = "it heard no beat from the kernel for {seconds:.0f}s"
    HANGUP = "its session hung up (SIGHUP)"
    PARENT_GONE = "{parent}"  # the template's own words for its parent's end: "its Ray actor ended", "its ssh session ended"
    SIGTERM = "it was sent SIGTERM"
    NO_LEASE = "no kernel is attached and its connection to the kept pool's lease closed"

    def words(self, **names: object) -> str:
        return self.value.format(**names)


def tell(node: str, children: Dict[int, int], end: TemplateEnd, **names: object) -> None:
    """The ``ending`` event, when the template has ranks to end (a spare's end is no one's concern)."""
    ranks = sorted(r for r in children.values() if r is not None and r >= 0)
    if ranks:
        emit({"event": "ending", "node": node, "ranks": ranks, "why": end.words(**names)})
