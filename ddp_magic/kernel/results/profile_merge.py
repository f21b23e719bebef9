"""%%ddp --profile in the kernel: arm the ranks, merge their Chrome traces into one file, name the straggler.

``ProfileRun.arm`` sends PROFILE to every rank just before the cell (procs/rank_profile.py
runs it under torch.profiler); ``collect`` reads each rank's trace (a 0600 file under the
pool's /dev/shm prefix, removed once read, or the bytes in DONE from another host) and writes
one Chrome/Perfetto JSON:

- one process group per rank: the rank's own process is "rank r", its GPU lanes
  "rank r · GPU d"; pids are remapped (``rank * 100 + i``) so ranks never share a lane, and
  flow ids are made unique per rank;
- one clock: each rank's events are shifted by the offset it measured at the cell's start
  (wall clock − profiler clock, see rank_profile.py), then by the earliest rank's start, so
  the trace begins at 0 on every rank's common wall clock;
- ``ddp_magic.log`` steps become instant events ("step N") on their rank.

The straggler table comes from the same events: per rank its wall time (the cell under the
profiler), its time in collectives (the union of gloo/nccl/c10d and collective-named events
over all its threads and GPU streams), the rest as compute, and its slowest step (from
``ddp_magic.log`` steps). The rank everyone waited for is the one that spent the least time in
collectives: the others sat in theirs until it arrived. It is named only when the others waited
for it at least a tenth of the cell (kernel/results/metrics.py ``stands_out``, the chart's rule too), and
the cell's metrics take this verdict (``CellMetrics.profiled``), so the chart's "slowest rank"
and this table never name two different ranks.
"""
from __future__ import annotations

import json
import os
import re
import zlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from ...errors import UsageError
from ...logs import log
from ...wire import protocol as P
from ...wire import shm
from .metrics import CellMetrics, Straggler, StragglerMeasure, stands_out
from ..ranks import Listener

DEFAULT_PATH = "ddp_trace.json"
CLOCK_EVENT = "ddp_magic.clock"  # procs/rank_profile.py's marker
COLLECTIVE = re.compile(r"^(gloo|nccl|c10d)\b|^nccl|all_?reduce|all_?gather|reduce_?scatter|broadcast|barrier|all_?to_?all", re.IGNORECASE)
OPEN_HINT = "open it at https://ui.perfetto.dev (Open trace file) or in Chrome at chrome://tracing (Load): one lane group per rank"
_META = ("process_name", "process_labels", "process_sort_index")


@dataclass
class RankProfile:
    """One rank's line of the straggler table (seconds)."""

    rank: int
    wall: float = 0.0
    collectives: float = 0.0
    slowest_step: Optional[Tuple[int, float]] = None  # (step, seconds)
    error: str = ""

    @property
    def compute(self) -> float:
        return max(0.0, self.wall - self.collectives)


@dataclass
class ProfileReport:
    """What ``--profile`` leaves: the merged trace's path and the straggler table."""

    path: str  # as the user gave it (the file is written relative to the kernel's working directory)
    ranks: List[RankProfile]
    events: int = 0
    size: int = 0
    waited_for: Optional[int] = None
    why: str = ""
    errors: List[str] = field(default_factory=list)

    def text(self) -> str:
        head = f"ddp_magic profile: {len(self.ranks)} ranks, {self.events} events, trace written to {self.path} ({self.size / 1e6:.1f} MB)"
        rows = [head, "  " + OPEN_HINT, f"{'rank':>4}  {'wall s':>8}  {'collectives s':>13}  {'compute s':>9}  slowest step"]
        for r in self.ranks:
            if r.error:
                rows.append(f"{r.rank:>4}  {r.error}")
                continue
            step = f"step {r.slowest_step[0]}: {r.slowest_step[1]:.3f} s" if r.slowest_step else "-"
            rows.append(f"{r.rank:>4}  {r.wall:>8.3f}  {r.collectives:>13.3f}  {r.compute:>9.3f}  {step}")
        rows.append(self.why)
        return "\n".join(rows + self.errors)


class Verdict(NamedTuple):
    """Who the others waited for (None: nobody), how much longer they sat in collectives than it did (s), and why."""

    rank: Optional[int]
    gap: float
    why: str


class ProfileRun:
    """One profiled cell, from the kernel's side."""

    def __init__(self, path: str) -> None:
        self.given = path or DEFAULT_PATH
        self.path = os.path.abspath(os.path.expanduser(self.given))

    @classmethod
    def arm(cls, pool: Any, listener: Listener, path: str) -> "ProfileRun":
        """Start the pool if it is not up, then tell every rank to profile the next cell (before its RUN)."""
        run = cls(path)
        folder = os.path.dirname(run.path)
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise UsageError(f"--profile {path}: cannot write into {folder}; give a path in a folder that exists, e.g. --profile trace.json")
        notice = pool.ensure_started(listener)
        if notice:
            listener.on_notice(notice)
        pool.hub.broadcast(P.message(P.PROFILE))
        return run

    def collect(self, pool: Any, metrics: Optional[CellMetrics] = None) -> ProfileReport:
        """Read every rank's trace from its DONE, merge, write ``self.path``, and say who was waited for
        (to ``metrics`` too: the cell's chart names the same straggler)."""
        traces: Dict[int, dict] = {}
        infos: Dict[int, dict] = {}
        report = ProfileReport(path=self.given, ranks=[])
        for rank in range(pool.nproc):
            done = pool.done_message(rank) or {}
            info = done.get("profile")
            try:
                if info is None:
                    raise ValueError("no trace (the rank did not finish the cell)")
                if info.get("error"):
                    raise ValueError(info["error"])
                traces[rank], infos[rank] = _load(info), dict(info, node=_node_name(pool, rank))
            except (OSError, ValueError) as e:
                report.ranks.append(RankProfile(rank, error=str(e)))
        merged = merge(traces, infos)
        with open(self.path, "w") as f:
            json.dump(merged, f)
        report.events, report.size = len(merged["traceEvents"]), os.path.getsize(self.path)
        report.ranks = sorted(report.ranks + [rank_profile(r, merged, infos[r]) for r in traces], key=lambda p: p.rank)
        verdict = waited_for(report.ranks)
        report.waited_for, report.why = verdict.rank, verdict.why
        if metrics is not None and sum(1 for r in report.ranks if not r.error) > 1:
            metrics.profiled = Straggler(verdict.rank, verdict.gap, StragglerMeasure.PROFILE)
        return report


def _node_name(pool: Any, rank: int) -> str:
    """The Slurm node a rank ran on ("" for a rank of this host): its lanes say it, as its output's prefix does."""
    return str(getattr(getattr(pool, "ranks", {}).get(rank), "node_name", "") or "")


def _load(info: dict) -> dict:
    """A rank's trace: from its private file (removed once read) or from the bytes it sent."""
    if "data" in info:
        return json.loads(zlib.decompress(info["data"]))
    path = info["path"]
    try:
        with open(path) as f:
            return json.load(f)
    finally:
        shm.remove(path)


# ---------------------------------------------------------------- merging (pure)
def clock_offset(events: List[dict], info: dict) -> float:
    """µs to add to this rank's ts to get wall-clock µs: its start reading minus the clock event's ts."""
    for e in events:
        if e.get("name") == CLOCK_EVENT and "ts" in e:
            return info["start_ns"] / 1000.0 - float(e["ts"])
    log.debug("profile: no %s event in a trace; its rank is not aligned", CLOCK_EVENT)
    return 0.0


def merge(traces: Dict[int, dict], infos: Dict[int, dict]) -> dict:
    """One Chrome trace from the ranks' traces: a lane group per rank, one clock (see the module's docstring)."""
    t0 = min((infos[r]["start_ns"] / 1000.0 for r in traces), default=0.0)
    world = max(traces, default=0) + 1
    out: List[dict] = []
    for rank in sorted(traces):
        events = traces[rank].get("traceEvents", [])
        shift = clock_offset(events, infos[rank]) - t0
        pids = _pid_map(rank, events)
        for e in events:
            if (e.get("ph") == "M" and e.get("name") in _META) or isinstance(e.get("pid"), str):
                continue  # their lane names are ours; "Spans" and "Traces" are Kineto's bookkeeping
            e = dict(e, pid=pids[_key(e.get("pid"))])
            if "ts" in e:
                e["ts"] = float(e["ts"]) + shift
            if "id" in e and e.get("ph") in ("s", "t", "f"):
                e["id"] = e["id"] * world + rank if isinstance(e["id"], int) else f"{rank}:{e['id']}"
            out.append(e)
        out += _lane_names(rank, pids, events, str(infos[rank].get("node") or ""))
        main = pids[_key(_main_pid(events))]
        for step, t in infos[rank].get("steps", []):
            out.append({"ph": "i", "s": "p", "name": f"step {step}", "pid": main, "tid": 0, "ts": t * 1e6 - t0, "cat": "ddp_magic"})
    other = {"ddp_magic": {"ranks": sorted(traces), "t0_unix_us": t0, "clock": "per-rank offset wall - profiler clock, measured at the cell's start"}}
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": other}


def _key(pid: Any) -> str:
    return str(pid)


def _main_pid(events: List[dict]) -> Any:
    """The rank's own process: where its CPU ops are."""
    for e in events:
        if e.get("cat") in ("cpu_op", "user_annotation") and isinstance(e.get("pid"), int):
            return e["pid"]
    return events[0].get("pid") if events else 0


def _pid_map(rank: int, events: List[dict]) -> Dict[str, int]:
    """Every pid of one rank's trace to a pid of its own in the merged one (its process first)."""
    main = _key(_main_pid(events))
    keys = [main] + sorted({_key(e.get("pid")) for e in events if not isinstance(e.get("pid"), str)} - {main})
    return {k: rank * 100 + i for i, k in enumerate(keys)}


def _lane_names(rank: int, pids: Dict[str, int], events: List[dict], node: str = "") -> List[dict]:
    """process_name and process_sort_index for each of a rank's lanes: "rank r", "rank r · GPU d", … (a Slurm rank's with
    its node, as its output's prefix: "rank 2 n2", "rank 2 n2 · GPU 0")."""
    main = _key(_main_pid(events))
    me = f"rank {rank} {node}" if node else f"rank {rank}"
    out = []
    for key, pid in pids.items():
        name = me if key == main else (f"{me} · GPU {key}" if key.isdigit() else f"{me} · {key or 'profiler'}")
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
    return out


# ---------------------------------------------------------------- the straggler table (pure)
def rank_profile(rank: int, merged: dict, info: dict) -> RankProfile:
    """One rank's wall, collective and compute time, and its slowest step, from the merged trace."""
    t0 = merged["otherData"]["ddp_magic"]["t0_unix_us"]
    start, end = info["start_ns"] / 1000.0 - t0, info["end_ns"] / 1000.0 - t0
    lo, hi = rank * 100, rank * 100 + 99
    spans = [
        (max(start, e["ts"]), min(end, e["ts"] + e["dur"]))
        for e in merged["traceEvents"]
        if e.get("ph") == "X" and lo <= e.get("pid", -1) <= hi and "dur" in e and COLLECTIVE.search(str(e.get("name", "")))
    ]
    return RankProfile(rank, wall=(end - start) / 1e6, collectives=_union(spans) / 1e6, slowest_step=_slowest_step(info))


def _union(spans: List[Tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if b <= reach:
            continue
        total += b - max(a, reach)
        reach = b
    return total


def _slowest_step(info: dict) -> Optional[Tuple[int, float]]:
    """The longest gap between two ``ddp_magic.log`` calls (the first from the cell's start)."""
    marks = info.get("steps") or []
    prev, best = info["start_ns"] / 1e9, None
    for step, t in marks:
        if best is None or t - prev > best[1]:
            best = (step, t - prev)
        prev = t
    return best


def waited_for(ranks: List[RankProfile]) -> Verdict:
    """The rank the others waited for: the least time in collectives, if they waited for it a tenth of the cell."""
    ok = [r for r in ranks if not r.error]
    if len(ok) < 2:
        return Verdict(None, 0.0, "one rank profiled: nobody to wait for")
    most = max(r.collectives for r in ok)
    if most <= 0:
        return Verdict(None, 0.0, "no collectives recorded: no rank waited for another")
    least = min(ok, key=lambda r: r.collectives)
    others = [r.collectives for r in ok if r is not least]
    gap = min(others) - least.collectives
    if not stands_out(gap, max(r.wall for r in ok)):
        return Verdict(None, gap, f"no straggler: no rank kept the others waiting a tenth of the cell (collectives {least.collectives:.3f}-{most:.3f} s)")
    spread = f"{min(others):.3f} s" if len(others) == 1 or min(others) == max(others) else f"{min(others):.3f}-{max(others):.3f} s"
    why = f"everyone waited for rank {least.rank}: it spent the least time in collectives ({least.collectives:.3f} s; the others {spread})"
    return Verdict(least.rank, gap, why)
