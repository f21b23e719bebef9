"""Why a rank died, with evidence: the OOM killer only when a counter says so, a crash's Python stack, CUDA out of memory.

- A SIGKILL is the OOM killer's only when an ``oom_kill`` count moved: the rank's memory
  cgroup's (its sampler said which and the count, procs/rank_memory.py; the kernel reads the
  count again after the death), else, with no cgroup readable, the machine's (/proc/vmstat)
  since the sampler last read it. Any other SIGKILL is said to be one: "killed by SIGKILL (not
  the OOM killer)". Nothing is read on the kernel's cell path; a rank on another host is left
  to describe_exit (its counters are not this kernel's to read).
- A segfault or abort: faulthandler wrote the rank's Python stack to its own stderr as it
  died (procs/worker.py enables it); the hub kept that block (RankInfo.crash) and it becomes
  the failure's traceback, the cell's lines named ``Cell In[n]`` as in any traceback.
- CUDA out of memory raises on some ranks: those ranks emptied torch's cache and said their
  figures (DONE's error ``cuda``); the others were released by the usual recovery.
"""
from __future__ import annotations

import os
import re
import signal
from typing import TYPE_CHECKING, Iterable, List, Mapping, Optional, Tuple

from ...errors import RankFailure
from ...states import FailureKind
from ...words import fmt_bytes, ranks_phrase
from ...wire import liveness, memcg
from ..memory import Memory, cuda_text
from .unreachable import node_key

if TYPE_CHECKING:
    from ..ranks import RankInfo

FAULT_HEAD = "Fatal Python error"
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (.+)$')
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


Evidence = Tuple[bool, Optional[int], Optional[int]]  # (the OOM killer's, the limit it hit, the cgroup's peak usage if the rank's own)


def _moved(d: Optional[str], before: Optional[int]) -> Optional[Evidence]:
    """Whether cgroup ``d``'s oom_kill went past ``before`` (its limit and peak usage); None: unreadable."""
    if d is None or before is None:
        return None
    now = memcg.read_dir(d)
    if now is None:
        return None
    return now["oom_kill"] > before, now["limit"], now.get("peak")


def oom_evidence(mem: Optional[Memory]) -> Optional[Evidence]:
    """(killed by the OOM killer, the memory limit it hit, its cgroup's peak): the rank's own cgroup's count if known (an
    OOM kill, the cgroup's or the machine's, counts in the victim's cgroup), else the machine's; None: none readable.
    The counts before are the rank's last sample's (its sampler's thread reads them; the kernel's cell path reads none)."""
    if mem is None:
        return None
    if mem.cgroup is not None:
        found = _moved(mem.cgroup, mem.oom_kills)
        if found is not None:
            shared = mem.cgroup == (memcg.cgroup() or {}).get("dir")  # the kernel's own: its peak is the notebook's, not the rank's
            return (found[0], found[1], None) if shared else found
    system = memcg.system_oom_kills()
    if system is not None and mem.system_oom_kills is not None:
        return system > mem.system_oom_kills, mem.limit, None
    return None


def why_killed(code: Optional[int], mem: Optional[Memory], local: bool = True) -> str:
    """How a rank that died by SIGKILL died, in words ('' for any other end, or a rank on another host, whose counters
    this kernel cannot read): the OOM killer only with evidence."""
    if code != -signal.SIGKILL or not local:
        return ""
    found = oom_evidence(mem)
    if found is None:
        return "was killed by SIGKILL (no OOM counter could be read to say whether the OOM killer sent it)"
    oom, limit, peak = found
    if not oom:
        return "was killed by SIGKILL (not the OOM killer)"
    held = max((x for x in (peak, mem.held if mem is not None else None) if x), default=None)
    facts = ([f"it held {fmt_bytes(held)}"] if held else []) + ([f"its memory limit is {fmt_bytes(limit)}"] if limit else [])
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


def death_failure(rank: int, info: "RankInfo") -> RankFailure:
    """How a dead rank died (exit code, last lines, the evidence), as a failure; a rank whose node went silent is unreachable."""
    if info.silent:
        return RankFailure(rank=rank, kind=FailureKind.DIED, pid=info.pid, message=liveness.silence_words(), node=node_key(info))
    return RankFailure(rank=rank, kind=FailureKind.DIED, pid=info.pid, exit_code=info.exit_code, last_lines=list(info.tail)[-10:],
                       why=info.death, traceback=crash_traceback(info.crash.splitlines()) if info.crash else "")
