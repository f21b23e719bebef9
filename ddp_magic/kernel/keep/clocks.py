"""An attached pool's clocks are its ranks': when its last cell reached each rank and ended there, carried over the attach.

A kernel that attaches a kept pool did not see its cell start, nor, when the cell ended while no kernel was
attached, its end. Each rank says both in the HELLO it sends the attaching kernel (procs/rank_keep.py
``Keeper.clock``), as seconds before it sent it, measured on its own clock; this kernel subtracts them from when it
heard that HELLO. No timestamp crosses from one process's clock to another's (monotonic clocks differ between hosts,
wall clocks drift and jump), and the error is the HELLO's transit. So the job (``job.elapsed``, its repr), the cell's
view and ``%ddp status``/the panel's rank rows (kernel/pool_status.py) count the cell from its start on the ranks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ...states import RankState
from ..ranks import Listener, RankInfo

ENDED = (RankState.DONE, RankState.INTERRUPTED, RankState.FAILED)  # a rank's DONE came: its cell ended on it


@dataclass
class RankClocks:
    """Per rank, in this kernel's ``time.monotonic()``: when its last cell reached it, and when it ended there."""

    ran: Dict[int, float] = field(default_factory=dict)
    ended: Dict[int, float] = field(default_factory=dict)

    @classmethod
    def heard(cls, hellos: Dict[int, dict], heard_at: Dict[int, float]) -> "RankClocks":
        """From the ranks' HELLOs (their ``clock``: seconds before they sent it) and when this kernel heard each."""
        clocks = cls()
        for rank, hello in hellos.items():
            ago, at = hello.get("clock") or {}, heard_at.get(rank)
            if at is None or ago.get("ran") is None:  # a rank of an older ddp_magic, or one that never ran a cell
                continue
            clocks.ran[rank] = at - float(ago["ran"])
            if ago.get("ended") is not None and float(ago["ended"]) <= float(ago["ran"]):
                clocks.ended[rank] = at - float(ago["ended"])
        return clocks

    def start(self, ranks: Sequence[int]) -> Optional[float]:
        """When the cell reached the first of ``ranks`` (the job's run clock starts there, as a cell's does)."""
        times = [self.ran[r] for r in ranks if r in self.ran]
        return min(times) if times else None

    def end(self, ranks: Sequence[int]) -> Optional[float]:
        """When the cell had ended on every one of ``ranks``, if it had on all of them before this kernel attached."""
        return max(self.ended[r] for r in ranks) if ranks and all(r in self.ended for r in ranks) else None

    def apply(self, infos: Dict[int, RankInfo]) -> None:
        """The ranks' rows count their cell from when it reached them, to when it ended (a running one: no end yet)."""
        for rank, info in infos.items():
            if rank in self.ran:
                info.started = self.ran[rank]
                info.finished = self.ended.get(rank) if info.state != RankState.RUNNING else None

    def settle(self, info: RankInfo) -> None:
        """A rank's DONE that it queued while no kernel was attached came now: the cell ended when the rank says."""
        if info.state in ENDED and info.rank in self.ended:
            info.finished = self.ended[info.rank]


class Settled(Listener):
    """Passes a resumed cell's events on to ``inner``, each rank's end settled first (``RankClocks.settle``)."""

    def __init__(self, clocks: RankClocks, inner: Listener) -> None:
        self.clocks, self.inner = clocks, inner

    def on_output(self, rank: int, stream: str, text: str) -> None:
        self.inner.on_output(rank, stream, text)

    def on_state(self, info: RankInfo) -> None:
        self.clocks.settle(info)
        self.inner.on_state(info)

    def on_states(self, infos: Sequence[RankInfo]) -> None:
        for info in infos:
            self.clocks.settle(info)
        self.inner.on_states(infos)

    def on_notice(self, text: str) -> None:
        self.inner.on_notice(text)

    def on_metrics(self, rank: int, rows: List[Tuple[int, float, Dict[str, float]]]) -> None:
        self.inner.on_metrics(rank, rows)
