"""What the kept-pool tests share (tests/kernel/test_keep.py, tests/slurm/test_slurm_keep.py,
tests/cluster/test_box_keep.py): the ticking kept job, and reading its ticks back from a kernel's messages."""
from __future__ import annotations

import json
import os
import re
import signal
import time
from typing import Dict, List, Optional

from kernel_helper import ANSI, Execution, Kernel, alive

TICKS = """%%ddp --bg --out job --keep
import os, time
for i in range({n}):
    print('tick', i, flush=True)
    while i == {at} and os.path.exists({gate!r}):
        time.sleep(0.02)
    time.sleep(0.02)
('done', kept)
"""  # a kept background job that ticks, waits at tick ``at`` while the gate file exists, and returns its rank's ``kept``
TICK = re.compile(r"\[rank (\d+)(?: \S+)?\] tick (\d+)\n")  # "[rank 0]", or "[rank 0 n1]" on Slurm: its node too


def cell_texts(k: Kernel, ex: Execution) -> str:
    """Every stream text of one cell, its later (background) messages included, colour codes stripped."""
    msgs = ex.messages + [m for m in k.collect(1.0) if m["parent_header"].get("msg_id") == ex.msg_id]
    return ANSI.sub("", "".join(m["content"].get("text", "") for m in msgs if m["msg_type"] == "stream"))


def ticks(text: str) -> Dict[int, List[int]]:
    """rank -> the ticks it printed, in the order shown."""
    out: Dict[int, List[int]] = {}
    for rank, i in TICK.findall(text):
        out.setdefault(int(rank), []).append(int(i))
    return out


def ticked(k: Kernel, ex: Execution, ranks: int, tick: int = 5, timeout: float = 60) -> bool:
    """Whether every one of ``ranks`` ranks has shown ``tick`` of the running TICKS job within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not all(tick in ticks(cell_texts(k, ex)).get(r, []) for r in range(ranks)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def sigkill_kept(k: Kernel, ex: Optional[Execution] = None) -> str:
    """SIGKILL the kernel of a kept pool; what it had shown of ``ex``. A second after its death, what would end a pool
    that is not kept (its srun or ssh sessions' end) has had its moment."""
    os.kill(k.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(k.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)
    first = cell_texts(k, ex) if ex is not None else ""
    k.kc.stop_channels()
    k.km.shutdown_kernel(now=True)
    return first


def kept_record(runtime: str) -> dict:
    """The one discovery file in ``runtime`` (on another host's lease: the mirror its watch keeps here)."""
    names = [n for n in os.listdir(runtime) if n.startswith("ddp-kept-") and n.endswith(".json")]
    assert len(names) == 1, os.listdir(runtime)
    with open(os.path.join(runtime, names[0])) as f:
        return json.load(f)


def runtime_processes(runtime: str, *programs: bytes) -> List[int]:
    """The processes of ``programs`` (module names as in their command line) whose env names this test's runtime
    directory: a kept pool's own on this host (its templates, lease keeper or Ray driver), none of another test's."""
    out = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                mine = f"JUPYTER_RUNTIME_DIR={runtime}".encode() in f.read().split(b"\0")
        except OSError:
            continue
        if mine and any(program in cmd for program in programs):
            out.append(pid)
    return out
