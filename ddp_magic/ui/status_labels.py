"""What a rank is shown as (its label) and each label's tone: the status view's words and squares, compact or not.

A label is the pool's state, with DEAD told apart as killed (a signal) or died
(an exit code), and ranks ddp_magic stopped because another failed shown as
STOPPED. status_render.py (the summary line) and status_compact.py (the view
over 32 ranks) both read it; nothing here knows a snapshot.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Tuple, Union

from ..states import FailureKind, RankState

Label = Union[RankState, FailureKind]

# label -> tone (colours.py); the order is the order of the counts in the running summary
STATE_TONES: Dict[Label, str] = {
    RankState.QUEUED: "warn",  # waits for the scheduler (a Slurm job pending)
    RankState.STARTING: "info",  # on its way: the tone of running, as the JupyterLab panel and status bar show it
    RankState.CONNECTING: "info",
    RankState.READY: "info",
    RankState.RUNNING: "info",
    RankState.DONE: "ok",
    RankState.FAILED: "fail",
    FailureKind.DIED: "fail",
    FailureKind.KILLED: "warn",
    RankState.INTERRUPTED: "warn",
    FailureKind.TIMEOUT: "fail",  # the rank the others waited for when --timeout ran out (its own state: interrupted)
    RankState.STOPPED: "neutral",
}
ACTIVE = (RankState.QUEUED, RankState.STARTING, RankState.CONNECTING, RankState.RUNNING)
ROOT_CAUSES = (RankState.FAILED, FailureKind.DIED, FailureKind.KILLED)  # a rank that failed by itself
STOPPED_BY_US = (RankState.INTERRUPTED, FailureKind.KILLED)  # what the others show once a root cause exists
FAILURES = (RankState.FAILED, FailureKind.DIED, FailureKind.KILLED, FailureKind.TIMEOUT)  # always named, however many


def tone_of(label: Label) -> str:
    return STATE_TONES.get(label, "neutral")


class LabelChanges:
    """(rank, label) each time a rank's shown label changed, in order. Kept flat: at 1,024 ranks a cell makes 2,048
    changes, and a (rank, label) tuple each would stay tracked by the garbage collector (it holds an enum member)."""

    def __init__(self) -> None:
        self._flat: List[Any] = []

    def append(self, rank: int, label: Label) -> None:
        self._flat.append(rank)
        self._flat.append(label)

    def __iter__(self) -> Iterator[Tuple[int, Label]]:
        return zip(self._flat[::2], self._flat[1::2])

    def __len__(self) -> int:
        return len(self._flat) // 2

    def restarted(self, nproc: int) -> Tuple[int, ...]:
        """The ranks that became ready when not all did (one started again alone in the cell): () for a whole pool."""
        ready = {rank for rank, label in self if label == RankState.READY}
        return tuple(sorted(ready)) if 0 < len(ready) < nproc else ()
