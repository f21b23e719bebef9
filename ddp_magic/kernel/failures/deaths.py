"""Why a rank died, with evidence: the OOM killer only when a counter says so, a crash's Python stack, CUDA out of memory.

- A SIGKILL is the OOM killer's only when an ``oom_kill`` count moved: the rank's memory
  cgroup's (its sampler said which and the count, procs/rank_memory.py; the kernel reads the
  count again after the death), or, with no cgroup readable, the machine's (/proc/vmstat)
  since the sampler last read it. "Not the OOM killer" only from a count that would have
  moved: the machine's (a rank may have left the cgroup it was sampled in); when the machine
  counted a kill and that cgroup did not, "probably"; with neither readable, "could not
  tell". The figure said with it is the cgroup's peak where the cgroup is not the kernel's
  own, else the last sample's, with its age. Nothing is read on the kernel's cell path; a
  rank on another host is left to describe_exit (its counters are not this kernel's to read).
- A segfault or abort: faulthandler wrote the rank's Python stack to its own stderr as it
  died (procs/worker.py enables it); the hub kept that block (RankInfo.crash) and it becomes
  the failure's traceback, the cell's lines named ``Cell In[n]`` as in any traceback. The raw
  block itself goes to ``%ddp output --rank N`` and the kernel's log, not to the cell
  (kernel/output/output_log.py).
- CUDA out of memory raises on some ranks: those ranks emptied torch's cache and said their
  figures (DONE's error ``cuda``); the others were released by the usual recovery.
"""
from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional

from ...errors import RankFailure, describe_exit
from ...states import FailureKind, RankState
from ...words import fmt_bytes, fmt_seconds, ranks_phrase
from ...wire import liveness, memcg
from ..memory import Memory, cuda_text
from .unreachable import node_key

if TYPE_CHECKING:
    from ..ranks import RankInfo

FAULT_HEAD = "Fatal Python error"
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (.+)$')
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class Oom(Enum):
    """What the OOM counters say of a SIGKILL."""

    YES = "yes"  # the rank's cgroup counted a kill
    PROBABLY = "probably"  # the machine counted one, and the rank's cgroup as last sampled could not (it may have moved, or is v1's root)
    NO = "no"  # a counter that would have counted it did not move
    UNKNOWN = "unknown"  # none that could have moved was readable


@dataclass(frozen=True)
class Evidence:
    """A SIGKILL's verdict, and the figures said with it."""

    oom: Oom
    limit: Optional[int] = None  # the memory limit of the cgroup the count moved in (or as last sampled)
    peak: Optional[int] = None  # that cgroup's peak usage, when the cgroup is not the kernel's own


def _cgroup_now(mem: Memory) -> Optional[Dict[str, Any]]:
    """The rank's last-sampled cgroup read again now (its count, limit, peak; the peak left out when the cgroup is the
    kernel's own: that figure is the notebook's, not the rank's); None: unknown or unreadable."""
    if mem.cgroup is None or mem.oom_kills is None:
        return None
    now = memcg.read_dir(mem.cgroup)
    if now is not None and mem.cgroup == (memcg.cgroup() or {}).get("dir"):
        now = dict(now, peak=None)
    return now


def oom_evidence(mem: Optional[Memory]) -> Evidence:
    """What the counters say: the rank's cgroup as last sampled (a kill counts in the victim's cgroup, so a count that
    moved is the OOM killer's) and the machine's (/proc/vmstat counts every OOM kill, wherever the victim was, so one that
    did not move rules it out). A cgroup's count that did not move rules it out only where the machine's is unreadable
    and the cgroup is not v1's root: the rank may have moved since the sample. The counts before are the rank's last
    sample's (its sampler's thread reads them; the kernel's cell path reads none)."""
    if mem is None:
        return Evidence(Oom.UNKNOWN)
    cg = _cgroup_now(mem)
    limit = cg["limit"] if cg is not None else mem.limit
    if cg is not None and mem.oom_kills is not None and cg["oom_kill"] > mem.oom_kills:
        return Evidence(Oom.YES, limit, cg.get("peak"))
    system = memcg.system_oom_kills()
    if system is not None and mem.system_oom_kills is not None:
        if system <= mem.system_oom_kills:
            return Evidence(Oom.NO)
        return Evidence(Oom.YES if cg is None else Oom.PROBABLY, None if cg is not None else limit)
    if cg is not None and mem.cgroup != memcg.ROOT_V1:
        return Evidence(Oom.NO)
    return Evidence(Oom.UNKNOWN)


def _held(mem: Optional[Memory], now: float) -> str:
    """'it held 160.9 MiB at its last sample, 2 s before' (or 'as its last cell ended'): the figure and its age."""
    held = mem.held if mem is not None else None
    if not held or mem is None:
        return ""
    when = f"at its last sample, {fmt_seconds(max(0.0, now - mem.at))} before" if mem.at is not None else "as its last cell ended"
    return f"it held {fmt_bytes(held)} {when}"


def why_killed(code: Optional[int], mem: Optional[Memory], local: bool = True, now: Optional[float] = None) -> str:
    """How a rank that died by SIGKILL died, in words ('' for any other end, or a rank on another host, whose counters
    this kernel cannot read): the OOM killer only with evidence, "probably" when the counters disagree."""
    if code != -signal.SIGKILL or not local:
        return ""
    found = oom_evidence(mem)
    if found.oom == Oom.UNKNOWN:
        return "was killed by SIGKILL (could not tell whether the OOM killer sent it: no OOM counter that would have counted it could be read)"
    if found.oom == Oom.NO:
        return "was killed by SIGKILL (not the OOM killer)"
    held = _held(mem, time.time() if now is None else now)
    facts = [f"its cgroup peaked at {fmt_bytes(found.peak)}"] if found.peak else [held] if held else []
    facts += [f"its memory limit is {fmt_bytes(found.limit)}"] if found.limit else []
    if found.oom == Oom.PROBABLY:
        facts.insert(0, "the machine counted an OOM kill, the cgroup it was last sampled in did not: it may have moved")
        return "was probably killed by the kernel's OOM killer (" + "; ".join(facts) + ")"
    return "was killed by the kernel's OOM killer" + (f" ({'; '.join(facts)})" if facts else "")


def crash_traceback(lines: Iterable[str]) -> str:
    """faulthandler's block (most recent call first) as a traceback (most recent call last), ddp_magic's frames left out;
    the cell's frames as ``File "<ddp-cell-L>", line N, in f``, which CellNumbers then names ``Cell In[n], line N``."""
    lines = list(lines)
    head = next((ln.strip() for ln in lines if ln.startswith(FAULT_HEAD)), "")
    frames = [m.groups() for m in (_FRAME.match(ln) for ln in lines) if m]
    frames = [f for f in frames if not os.path.abspath(f[0]).startswith(_PACKAGE_DIR)]
    cell = [i for i, f in enumerate(frames) if f[0].startswith("<ddp-cell")]
    frames = frames[: cell[-1] + 1] if cell else frames  # most recent first: from the cell's outermost frame on
    if not frames:
        return head
    body = [f'  File "{f}", line {n}, in {fn}' for f, n, fn in reversed(frames)]
    return "\n".join([head, "Python stack when it died (most recent call last):"] + body)


def cuda_oom_notes(done: Mapping[int, dict]) -> List[str]:
    """'ranks 1, 3 ran out of CUDA memory (rank 1: CUDA 10.2 GiB allocated, …); torch.cuda.empty_cache() ran there'."""
    hit = dict(sorted((r, m["error"]) for r, m in done.items() if m.get("error") and m["error"].get("type") == "OutOfMemoryError"))  # sorted: the few
    if not hit:
        return []
    each = [f"rank {r}: " + (cuda_text(Memory.of({"cuda": e["cuda"]})) if e.get("cuda") else "CUDA not in use, no figures") for r, e in hit.items()]
    return [f"{ranks_phrase(hit)} ran out of CUDA memory ({'; '.join(each)}); torch.cuda.empty_cache() ran on "
            f"{'it' if len(hit) == 1 else 'them'}, and every rank keeps its variables"]


def death_failure(rank: int, info: "RankInfo", cause: str = "") -> RankFailure:
    """How a dead rank died (exit code, last lines, the evidence), as a failure; a rank whose node went silent is unreachable.
    ``cause``: its template's word on why it ended the rank (the launcher's ``death_cause``), added when it came after
    the rank's end was seen (a joined rank's lost connection is often faster than its template's event)."""
    if cause and info.state == RankState.DEAD and cause not in (info.death or ""):
        info.death = f"{info.death or describe_exit(info.exit_code)}: {cause}"
    if info.silent:
        return RankFailure(rank=rank, kind=FailureKind.DIED, pid=info.pid, message=liveness.silence_words(), node=node_key(info))
    crash = crash_traceback(info.crash.splitlines()) + f"\n(faulthandler's whole report: %ddp output --rank {rank})" if info.crash else ""
    return RankFailure(rank=rank, kind=FailureKind.DIED, pid=info.pid, exit_code=info.exit_code, last_lines=list(info.tail)[-10:],
                       why=info.death, traceback=crash, on=info.node_name)
