"""The JupyterLab panel's word for a preemption (docs/snapshots.md "Preemption"): the comm's snapshot carries ``ended``.

test_lab_comm.py's stand-in front end on a kernel of its own. A pool armed with --save-on-preempt is preempted
between cells (SIGTERM to its template): the snapshot sent after its end has no pool and ``ended`` says the line the
cell said, with the step saved and the folder; the next pool's snapshots no longer carry it.
(labextension/src/__tests__/model.test.ts "a preempted pool": what the panel and the status bar make of it.)"""
from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Iterator

import pytest
from conftest import wait_until
from kernel_helper import Kernel
from test_lab_comm import Front

pytestmark = pytest.mark.kernel

POOL = "get_ipython().magics_manager.registry['DDPMagics'].pool"


@pytest.fixture
def front() -> Iterator[Front]:
    k = Kernel()
    f = Front(k)
    try:
        yield f
    finally:
        k.shutdown()


def test_the_snapshot_after_a_preemption_says_it_until_the_next_pool(front: Front, tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    front.run("%load_ext ddp_magic")
    front.open()
    front.run(f"%%ddp -n 2 --no-widget --save-on-preempt {folder}\nimport torch\nstep = 7\nw = torch.ones(2) * step")  # armed at its end
    seen = front.run(f"print({POOL}.launcher.proc.pid)")
    pid = int("".join(m["content"]["text"] for m in seen if m["msg_type"] == "stream"))
    front.clear()
    assert wait_until(lambda: any(f"-{front.k.pid}-" in n and n.endswith("preempt-armed") for n in os.listdir("/dev/shm")), 30)
    os.kill(pid, signal.SIGTERM)  # between cells: the kernel's watcher saves at once, then ends the pool
    front.pump(lambda: any(s.get("ended") for s in front.snapshots()), 120)
    snap = [s for s in front.snapshots() if s.get("ended")][-1]
    ended = snap["ended"]
    assert snap["pool"] is None, snap["pool"]
    assert ended["why"] == "preempted" and ended["step"] == 7 and ended["saved"] is True, ended
    assert ended["folder"] == str(folder) and ended["text"].startswith(f"preempted: saved step 7 to {folder}/step-"), ended
    assert ended["text"].endswith(f"%ddp load {folder} on the next allocation"), ended
    front.clear()
    front.run(f"%ddp load {folder} -n 2")
    front.pump(lambda: any(s.get("pool") for s in front.snapshots()), 60)
    assert all(s.get("ended") is None for s in front.snapshots() if s.get("pool")), front.snapshots()[-1]
