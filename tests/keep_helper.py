"""What the kept-pool tests share (tests/kernel/test_keep.py, tests/slurm/test_slurm_keep.py,
tests/cluster/test_box_keep.py): the ticking kept job, and reading its ticks back from a kernel's messages."""
from __future__ import annotations

import re
from typing import Dict, List

from kernel_helper import ANSI, Execution, Kernel

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
