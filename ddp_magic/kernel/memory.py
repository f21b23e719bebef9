"""Each rank's memory as the kernel knows it: the figures a rank sent (procs/rank_memory.py), and how every view says them.

A rank's DONE carries its RSS and the cell's peak (and CUDA's figures on a GPU); its sampler
sends MEMORY when they move while a cell runs; ``%ddp status`` asks between cells. The hub
keeps the newest on the rank's ``RankInfo.mem``; the status view, ``%ddp status``, the panel
and a job's repr read it from there, and the deaths (kernel/failures/deaths.py) read its cgroup.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

from ..words import fmt_bytes


@dataclass(unsafe_hash=True)
class Memory:
    """One rank's memory at one moment (None: not measured); never changed once made.

    Not ``frozen``: a frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` (9 µs here, 1 µs
    plain), and every DONE makes one: ~10 ms a cell at 1,024 ranks. Hashable all the same, as a frozen one is.
    """

    rss: Optional[int] = None
    peak: Optional[int] = None  # RSS's high-water mark since the cell began
    cuda_allocated: Optional[int] = None
    cuda_reserved: Optional[int] = None
    cuda_peak: Optional[int] = None
    cgroup: Optional[str] = None  # the memory cgroup's directory
    limit: Optional[int] = None  # its memory limit (None: none)
    oom_kills: Optional[int] = None  # its oom_kill count when sampled
    system_oom_kills: Optional[int] = None  # the machine's (/proc/vmstat) when sampled
    at: Optional[float] = None  # when the rank's sampler took these figures (its host's time.time()); None: a DONE's, as its cell ended

    @classmethod
    def of(cls, msg: Mapping[str, Any], before: Optional["Memory"] = None) -> "Memory":
        """From a DONE's ``mem`` or a MEMORY message; what it lacks (a DONE has no cgroup) is kept from ``before``."""
        if len(msg) == 2 and "rss" in msg and "peak" in msg:  # a CPU rank's DONE, every rank every cell: the same figures, the same value
            old = before or UNKNOWN
            if old.rss == msg["rss"] and old.peak == msg["peak"] and old.cuda_allocated is None and old.cuda_reserved is None and old.cuda_peak is None:
                return old
            return cls(msg["rss"], msg["peak"], None, None, None, old.cgroup, old.limit, old.oom_kills, old.system_oom_kills)
        cuda = msg.get("cuda") or {}
        cg = msg.get("cgroup")
        old = before or UNKNOWN
        return cls(
            rss=msg.get("rss", old.rss), peak=msg.get("peak", old.peak),
            cuda_allocated=cuda.get("allocated"), cuda_reserved=cuda.get("reserved"), cuda_peak=cuda.get("peak"),
            cgroup=cg.get("dir") if cg else (old.cgroup if "cgroup" not in msg else None),
            limit=cg.get("limit") if cg else (old.limit if "cgroup" not in msg else None),
            oom_kills=cg.get("oom_kill") if cg else (old.oom_kills if "cgroup" not in msg else None),
            system_oom_kills=msg.get("system_oom_kills", old.system_oom_kills), at=msg.get("at"),
        )

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def held(self) -> Optional[int]:
        """The most it is known to have held (a dead rank's figure): the peak, else the RSS."""
        if self.peak is None or self.rss is None:  # not max() over a generator: the views ask it of every rank at each render
            return self.rss if self.peak is None else self.peak
        return max(self.peak, self.rss)

    def text(self) -> str:
        """'RSS 1.2 GiB (peak 3.1 GiB); CUDA 2.0 GiB allocated, 2.5 GiB reserved, peak 2.9 GiB'."""
        parts = []
        if self.rss is not None:
            parts.append(f"RSS {fmt_bytes(self.rss)}" + (f" (peak {fmt_bytes(self.peak)})" if self.peak is not None else ""))
        if self.cuda_allocated is not None:
            parts.append(cuda_text(self))
        return "; ".join(parts)

    def short(self) -> str:
        """'1.2 GiB' (RSS) or '1.2 GiB · GPU 2.0 GiB': a table cell."""
        out = fmt_bytes(self.rss)
        if self.cuda_allocated is not None:
            out += f" · GPU {fmt_bytes(self.cuda_allocated)}"
        return out


UNKNOWN = Memory()  # nothing measured yet


def cuda_text(m: Memory) -> str:
    """'CUDA 2.0 GiB allocated, 2.5 GiB reserved, peak 2.9 GiB'."""
    return f"CUDA {fmt_bytes(m.cuda_allocated)} allocated, {fmt_bytes(m.cuda_reserved)} reserved, peak {fmt_bytes(m.cuda_peak)}"


def peak_of(mems: Iterable[Tuple[int, Optional[Memory]]]) -> Optional[Tuple[int, int, bool]]:
    """(rank, bytes, on the GPU) of the largest peak: CUDA's if any rank has one, else RSS's; None if nothing was measured."""
    best: Optional[Tuple[int, int, bool]] = None
    pairs = [(r, m) for r, m in mems if m is not None]
    gpu = any(m.cuda_peak is not None for _, m in pairs)
    for rank, m in pairs:
        value = m.cuda_peak if gpu else m.held
        if value is not None and (best is None or value > best[1]):
            best = (rank, value, gpu)
    return best


def peak_text(mems: Iterable[Tuple[int, Optional[Memory]]]) -> str:
    """'peak 3.1 GiB on rank 2' (or 'GPU peak …'): the settled view's words; '' if nothing was measured."""
    found = peak_of(mems)
    if found is None:
        return ""
    rank, value, gpu = found
    return f"{'GPU peak' if gpu else 'peak'} {fmt_bytes(value)} on rank {rank}"


def range_text(mems: Iterable[Optional[Memory]]) -> str:
    """'RSS 1.1-1.3 GiB' over a group of ranks (one figure when they agree to the digit); '' if none was measured."""
    rss = [m.rss for m in mems if m is not None and m.rss is not None]
    if not rss:
        return ""
    lo, hi = fmt_bytes(min(rss)), fmt_bytes(max(rss))
    return f"RSS {lo}" if lo == hi else f"RSS {lo} to {hi}"
