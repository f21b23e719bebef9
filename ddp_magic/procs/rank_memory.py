"""A rank's memory: RSS now and its peak in the cell, CUDA's allocated / reserved / peak on a GPU, and its memory cgroup.

A sampler thread of the rank's own (``ddp-memory``) reads them every ``EVERY_S`` and sends
MEMORY only when something moved materially (``MOVED``): a quiet rank sends nothing, and the
main thread never waits for it. Three reads are the kernel's: a cell's DONE carries ``at_done``
(two ``pread``s of /proc/self, a few µs), ``%ddp status`` asks for ``sample`` between cells
(MEMORY request), and the cgroup part is what the kernel reads an OOM kill against after the
rank is gone (kernel/failures/deaths.py): its path, its limit, its ``oom_kill`` count. When a cell starts
(the reader thread's RUN) the peak is reset (``/proc/self/clear_refs``, torch's peak stats) and
the sampler looks at the cgroup again, so a rank moved into one just before a cell is known there.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable, Dict, Optional

from ..logs import log
from ..wire import protocol as P
from ..wire.memcg import cgroup, system_oom_kills

EVERY_S = 2.0  # the sampler's period: a low rate, on its own thread
MOVED = 16 << 20  # bytes an RSS or peak must move by (and 5 %) before the sampler sends it again
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class _State:
    def __init__(self) -> None:
        self.send: Optional[Callable[..., None]] = None
        self.rank = 0
        self.fds: Dict[str, int] = {}
        self.sent: Dict[str, Any] = {}  # the last sample sent
        self.wake = threading.Event()
        self.thread: Optional[threading.Thread] = None


STATE = _State()


def _read(name: str) -> str:
    """/proc/self/<name>, through a descriptor kept open (a pread is a few µs; open and close cost ten times that)."""
    fd = STATE.fds.get(name)
    if fd is None:
        fd = STATE.fds[name] = os.open(f"/proc/self/{name}", os.O_RDONLY)
    return os.pread(fd, 8192, 0).decode(errors="replace")


def _rss() -> Dict[str, int]:
    """RSS now (statm) and its high-water mark since the cell began (status' VmHWM), in bytes."""
    out = {"rss": int(_read("statm").split()[1]) * _PAGE}
    for line in _read("status").splitlines():
        if line.startswith("VmHWM:"):
            out["peak"] = int(line.split()[1]) * 1024
            break
    return out


def cuda() -> Optional[Dict[str, int]]:
    """CUDA's allocated, reserved and peak allocated bytes on this rank's device; None when CUDA is not in use (never imports torch)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            c = torch.cuda
            return {"allocated": int(c.memory_allocated()), "reserved": int(c.memory_reserved()), "peak": int(c.max_memory_allocated())}
    except Exception:  # a figure for the views is not worth failing anything
        log.debug("could not read CUDA's memory stats", exc_info=True)
    return None


def at_done() -> Dict[str, Any]:
    """What a cell's DONE carries: RSS and the cell's peak, CUDA's figures on a GPU (a few µs; nothing on failure)."""
    try:
        out: Dict[str, Any] = _rss()
    except (OSError, ValueError, IndexError):
        log.debug("could not read this rank's RSS", exc_info=True)
        out = {}
    gpu = cuda()
    if gpu is not None:
        out["cuda"] = gpu
    return out


def sample() -> Dict[str, Any]:
    """Everything: ``at_done``'s figures, the memory cgroup and the machine's OOM kills so far (the kernel reads an OOM
    kill against these after the rank is gone; /proc/vmstat costs ~0.2 ms, so only here, on the sampler's thread)."""
    out = at_done()
    out["cgroup"] = cgroup()
    out["system_oom_kills"] = system_oom_kills()
    out["at"] = time.time()  # a death's figure says how old it is ("at its last sample, 2 s before")
    return out


def on_error(e: BaseException) -> Dict[str, Any]:
    """A cell raised: on CUDA out of memory (torch.OutOfMemoryError), CUDA's figures as it failed, then torch's cache
    emptied so the rank goes on with its variables ({"cuda": …} for the error's data; {} for any other error)."""
    if type(e).__name__ != "OutOfMemoryError":
        return {}
    figures = cuda()
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    except Exception:  # the figures still say what happened
        log.debug("torch.cuda.empty_cache() failed after an out-of-memory error", exc_info=True)
    return {"cuda": figures}


def cell_started() -> None:
    """The reader thread got a RUN: the peaks start again, and the sampler looks (a rank moved into a cgroup is seen there)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS (Linux ≥ 4.0)
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()
    except Exception:  # a peak since the process began is still a peak
        log.debug("could not reset the memory peaks", exc_info=True)
    STATE.wake.set()


def _moved(new: Dict[str, Any], old: Dict[str, Any]) -> bool:
    if (new.get("cgroup") or {}).get("dir") != (old.get("cgroup") or {}).get("dir") or bool(new.get("cuda")) != bool(old.get("cuda")):
        return True
    if new.get("system_oom_kills") != old.get("system_oom_kills") or (new.get("cgroup") or {}).get("oom_kill") != (old.get("cgroup") or {}).get("oom_kill"):
        return True  # an OOM kill elsewhere: the kernel's baseline moves with it
    pairs = [(new.get(k), old.get(k)) for k in ("rss", "peak")]
    pairs += [((new.get("cuda") or {}).get(k), (old.get("cuda") or {}).get(k)) for k in ("allocated", "reserved")]
    return any(a is not None and (b is None or abs(a - b) > max(MOVED, b // 20)) for a, b in pairs)


def _loop() -> None:
    while True:  # a sample at once (the kernel knows the cgroup from the start), then every EVERY_S or as a cell starts
        try:
            now = sample()
            if _moved(now, STATE.sent) and STATE.send is not None:
                STATE.sent = now
                STATE.send(P.MEMORY, rank=STATE.rank, **now)
        except Exception:  # the kernel is going away, or /proc is odd: the next tick tries again
            log.debug("rank %d: the memory sample failed", STATE.rank, exc_info=True)
        STATE.wake.wait(EVERY_S)
        STATE.wake.clear()


def install(send: Callable[..., None], rank: int) -> None:
    """Start the sampler (once per process; a re-formed group keeps it)."""
    STATE.send, STATE.rank = send, rank
    if STATE.thread is None:
        STATE.thread = threading.Thread(target=_loop, name="ddp-memory", daemon=True)
        STATE.thread.start()


def answer(send: Callable[..., None], rank: int) -> None:
    """A MEMORY request (``%ddp status`` between cells): a fresh sample, at once, from the reader thread."""
    now = sample()
    STATE.sent = now
    send(P.MEMORY, rank=rank, asked=True, **now)
