"""A process's memory cgroup, read the same way at both ends: the rank says which it is in, the kernel counts its OOM kills.

A rank's sampler (procs/rank_memory.py) sends its memory cgroup's directory, limit and
``oom_kill`` count; when the rank dies by SIGKILL the kernel reads that count again from the
same directory (the cgroup outlives the process) and the machine's in /proc/vmstat, and names
the OOM killer only when one of them moved (kernel/failures/deaths.py). v1 (``memory.oom_control``,
``memory.limit_in_bytes``, ``memory.max_usage_in_bytes``) and v2 (``memory.events``, ``memory.max``, ``memory.peak``).

A cgroup's count is evidence only for a rank still in it: a rank moved since its sample was
killed in another one (v1 counts a kill in the victim's own cgroup alone), and v1's root
memory cgroup (``ROOT_V1``) is where a rank moved out of it came from. /proc/vmstat counts
every OOM kill on the machine, wherever the victim was.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

from ..logs import log

ROOT_V1 = "/sys/fs/cgroup/memory"  # v1's root memory cgroup (v2's root has no memory.events: never a rank's here)
UNLIMITED = 1 << 60  # a v1 cgroup's "no limit" is a huge number; v2 says "max"
VMSTAT = "/proc/vmstat"


def cgroup(pid: str = "self") -> Optional[Dict[str, Any]]:
    """The memory cgroup of a process: its directory, limit (None: none) and oom_kill count (v1 or v2); None if none is readable."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = [ln.strip().split(":", 2) for ln in f if ln.count(":") >= 2]
    except OSError:
        return None
    for _, c, p in lines:
        if "memory" in c.split(","):  # v1
            d = f"{ROOT_V1}{p.rstrip('/')}"
            return _cg(d, "memory.limit_in_bytes", "memory.oom_control")
    for h, c, p in lines:
        if h == "0" and c == "":  # v2
            for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                d = f"{root}{p.rstrip('/')}"
                if os.path.exists(f"{d}/memory.events"):
                    return _cg(d, "memory.max", "memory.events")
    return None


def _number(path: str) -> Optional[int]:
    """A cgroup file's one number (None: unreadable, or "max" / v1's huge no-limit)."""
    try:
        with open(path) as f:
            text = f.read().strip()
        return None if text == "max" or int(text) >= UNLIMITED else int(text)
    except (OSError, ValueError):
        return None


def _cg(d: str, limit_file: str, events_file: str) -> Optional[Dict[str, Any]]:
    kills = oom_kill_count(f"{d}/{events_file}")
    if kills is None:
        return None
    return {"dir": d, "limit": _number(f"{d}/{limit_file}"), "oom_kill": kills}


def oom_kill_count(path: str) -> Optional[int]:
    """The ``oom_kill N`` line of a cgroup's memory.oom_control / memory.events, or of /proc/vmstat."""
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        log.debug("could not read %s", path, exc_info=True)
    return None


def read_dir(d: str) -> Optional[Dict[str, Any]]:
    """A cgroup directory's limit, oom_kill count and peak usage now (the kernel's second read, after the rank is gone)."""
    for events, limit, peak in (("memory.oom_control", "memory.limit_in_bytes", "memory.max_usage_in_bytes"), ("memory.events", "memory.max", "memory.peak")):
        if os.path.exists(f"{d}/{events}"):
            found = _cg(d, limit, events)
            return dict(found, peak=_number(f"{d}/{peak}")) if found is not None else None
    return None


def system_oom_kills() -> Optional[int]:
    """The machine's OOM kills so far (/proc/vmstat's oom_kill)."""
    return oom_kill_count(VMSTAT)
