"""A failure costs a cell, not the workers' state: each scenario against one real 4-rank pool.

After every failure the same processes answer (same pids), a variable defined before
the failure is still there, and an all_reduce on the re-formed group is right. The
message names where each rank was (docs/recovery.md). A rank killed outright is the
last scenario: only it starts again.
"""
from __future__ import annotations

import os
import re
import stat
from typing import Dict, List, Tuple

import pytest

from conftest import wait_until
from ddp_magic.wire import shm
from format_patterns import SECONDS
from kernel_helper import Execution, Kernel

pytestmark = pytest.mark.kernel

SURVIVED = "%%ddp\nt = torch.ones(1)\ndist.all_reduce(t)\n(os.getpid(), kept, t.item())"


@pytest.fixture(scope="module")
def k4():
    k = Kernel()
    k.run("%load_ext ddp_magic").ok()
    k.run("%%ddp -n 4\nimport os, time, torch, torch.distributed as dist\nkept = dist.get_rank() + 100\nos.getpid()", timeout=180).ok()
    k.pids = k.value("list(_)")
    yield k
    mine = f"{shm.SHM_PREFIX}{shm.pid_namespace()}-{k.pid}-"
    files = lambda: [n for n in os.listdir(shm.SHM_DIR) if n.startswith(mine)]  # noqa: E731
    assert any(".r" in n for n in files()), files()  # the re-formed groups' stores, one per generation
    for name in files():
        assert stat.S_IMODE(os.stat(os.path.join(shm.SHM_DIR, name)).st_mode) == 0o600, name
    k.shutdown()
    assert wait_until(lambda: not files(), 15), f"left in /dev/shm: {files()}"


SESSION = "get_ipython().magics_manager.registry['DDPMagics'].session"
SNAPSHOT = (  # what the JupyterLab panel and status bar get (ui/labsnap.py), the parts that say who failed
    "(lambda d: {'states': [r['state'] for r in d['ranks']], 'causes': [(r.get('kind'), r.get('cause')) for r in d['ranks']],"
    " 'last': d['last_cell']})(__import__('ddp_magic.ui.labcomm', fromlist=['bridge']).bridge().pools.pool_dict())"
)
TABLE_ROW = re.compile(r"<tr data-rank='(\d+)' data-state='([a-z]+)'>")


def cell_view(ex: Execution) -> Tuple[Dict[int, str], str]:
    """The cell's status view as it settled (its last HTML): the state its rank table shows for each rank, and its
    one-line summary (the words, without markup)."""
    for msg in reversed(ex.messages):
        html = msg["content"].get("data", {}).get("text/html", "") if msg["msg_type"] in ("display_data", "update_display_data") else ""
        if "ddp-status" in html and TABLE_ROW.search(html):
            summary = re.sub(r"<[^>]+>", "", html.split("</summary>", 1)[0])
            return {int(r): state for r, state in TABLE_ROW.findall(html)}, summary
    raise AssertionError("the cell showed no status view")


def assert_ready_after(k: Kernel, root: List[int], kind: str) -> None:
    """A pool whole again after a failed cell is ready everywhere, and every view names the same root cause."""
    status = k.run("%ddp status").ok().stdout
    rows = [ln.split() for ln in status.splitlines() if ln.startswith("  rank ")]
    assert [row[4] for row in rows] == ["ready"] * 4, status
    last = status.splitlines()[-1]
    assert last.startswith("last cell In[") and last.endswith("; recovered: every rank is ready, the workers' variables intact"), status
    assert k.value(f"[str(r.state) for r in {SESSION}.status().ranks]") == ["ready"] * 4
    snap = k.value(SNAPSHOT)
    assert snap["states"] == ["ready"] * 4 and snap["causes"] == [(None, None)] * 4, snap  # nothing red, nothing amber
    assert snap["last"]["ok"] is False and snap["last"]["recovered"] is True and snap["last"]["root"] == root, snap["last"]
    assert {int(r): c["cause"] for r, c in snap["last"]["causes"].items()} == {r: "root" if r in root else "stopped" for r in range(4)}
    assert all(snap["last"]["causes"][str(r)]["kind"] == kind for r in root)
    k.run("%ddp_env").ok()  # what each rank sees, asked of the live ranks: the pool stays ready
    assert k.value(SNAPSHOT)["states"] == ["ready"] * 4


def survived(k: Kernel) -> None:
    """Same processes, the variable from before the failure, and a correct all_reduce on the new group."""
    k.run(SURVIVED, timeout=60).ok()
    values = k.value("[tuple(v) for v in _]")
    assert [v[0] for v in values] == k.pids, "the ranks were restarted"
    assert [v[1] for v in values] == [100, 101, 102, 103]
    assert [v[2] for v in values] == [4.0] * 4


def test_a_rank_raises_while_the_others_wait_in_all_reduce(k4):
    cell = "%%ddp\nx = torch.ones(3)\nif dist.get_rank() == 1:\n    raise ValueError('rank 1 cannot go on')\ndist.all_reduce(x)\nx"
    for _ in range(2):  # the second failure re-forms the re-formed group
        ex = k4.run(cell, timeout=60)
        msg = ex.error[1]
        assert msg.startswith("rank 1 raised ValueError: rank 1 cannot go on"), msg
        assert "rank 1 never arrived at all_reduce #" in msg and "(rank 1 raised)" in msg
        # lines as the editor numbers them: the %%ddp line is line 1, dist.all_reduce(x) line 5
        assert re.search(r"ranks 0, 2-3 were in all_reduce #\d+ \(at cell line 5: dist\.all_reduce\(x\)\) and were released", msg), msg
        assert re.search(r"  0, 2-3 +all_reduce #\d+ +\[3\] float32 +default +at cell line 5", msg), msg  # the table: a row per place
        assert re.search(r"Cell In\[\d+\], line 4\n +raise ValueError", msg), msg
        assert re.search(r"the process group was re-formed in " + SECONDS + r"; your variables are intact", msg), msg
        assert "restart" not in ex.stdout + ex.stderr
        states, summary = cell_view(ex)
        assert states == {0: "stopped", 1: "failed", 2: "stopped", 3: "stopped"}, states  # the cell keeps its outcome
        assert "rank 1 raised ValueError" in summary, summary
        assert_ready_after(k4, [1], "error")  # ... and the pool, whole again, is ready
        survived(k4)


def test_ctrl_c_while_every_rank_waits_in_a_collective(k4):
    cell = "%%ddp\nx = torch.ones(2)\nr, n = dist.get_rank(), dist.get_world_size()\ndist.recv(x, src=(r + 1) % n)  # nobody sends"
    ex = k4.run(cell, timeout=60, interrupt_after=2.0)
    msg = ex.error[1]
    assert "interrupted by the user" in msg, msg
    assert re.search(r"ranks 0-3 were in recv #\d+ \(at cell line 4: dist\.recv", msg), msg
    survived(k4)


def test_timeout_during_a_barrier_one_rank_never_reaches(k4):
    """The rank that never arrived is the root cause in the message, the cell's view and the panel alike,
    and the ranks that waited for it were only released."""
    for _ in range(2):
        ex = k4.run("%%ddp --timeout 2\nif dist.get_rank() == 3:\n    time.sleep(60)\ndist.barrier()", timeout=60)
        msg = ex.error[1]
        assert msg.startswith("the cell ran past --timeout 2s, waiting for rank 3\n"), msg
        assert re.search(r"rank 3 never arrived at barrier #\d+ \(rank 3 at cell line 3: time\.sleep\(60\)\)", msg), msg
        assert re.search(r"ranks 0-2 were in barrier #\d+", msg), msg
        states, summary = cell_view(ex)
        assert [states[r] for r in (0, 1, 2)] == ["stopped"] * 3 and states[3] != "stopped", states
        assert "waiting for rank 3" in summary and "rank 0" not in summary, summary
        assert_ready_after(k4, [3], "timeout")
        survived(k4)


def test_a_mismatched_collective_is_named(k4):
    cell = "%%ddp --timeout 3\nx = torch.ones(2, 3)\nif dist.get_rank() == 1:\n    dist.broadcast(x, 0)\nelse:\n    dist.all_reduce(x)"
    ex = k4.run(cell, timeout=60)
    msg = ex.error[1]
    found = re.search(r"rank 1 is in broadcast #(\d+) while ranks 0, 2-3 are in all_reduce #(\d+): mismatched collective", msg)
    assert found and found.group(1) == found.group(2), msg
    assert re.search(r"  1 +broadcast #\d+ +\[2, 3\] float32", msg), msg
    survived(k4)


DDP_SETUP = (
    "%%ddp\nfrom torch.nn.parallel import DistributedDataParallel as DDP\ntorch.manual_seed(0)\n"
    "model = DDP(torch.nn.Linear(4, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "def step():\n    opt.zero_grad()\n    model(torch.ones(8, 4) * (dist.get_rank() + 1)).sum().backward()\n    opt.step()\n"
    "for _ in range(3):\n    step()\nbefore = [p.detach().clone() for p in model.parameters()]"
)
DDP_GOES_ON = (
    "%%ddp\nsame = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))\nstep()\n"
    "w = model.module.weight.detach().clone()\nws = [torch.zeros_like(w) for _ in range(dist.get_world_size())]\n"
    "dist.all_gather(ws, w)\n(same, all(torch.equal(ws[0], o) for o in ws), torch.equal(w, before[0]))"
)
FAIL = "%%ddp\nx = torch.ones(1)\nif dist.get_rank() == 2:\n    raise RuntimeError('planned')\ndist.all_reduce(x)"


def test_ddp_training_goes_on_after_a_failure_with_the_weights_from_before(k4):
    k4.run(DDP_SETUP, timeout=120).ok()
    msg = k4.run(FAIL, timeout=60).error[1]
    assert "DDP module model moved onto the new group" in msg, msg
    k4.run(DDP_GOES_ON, timeout=60).ok()  # no re-wrap: the group was swapped under it
    assert k4.value("[tuple(v) for v in _]") == [(True, True, False)] * 4  # same weights before; trained in step, alike everywhere
    k4.run("%%ddp\nbefore = [p.detach().clone() for p in model.parameters()]").ok()
    k4.run(FAIL, timeout=60)
    k4.run("%%ddp\nmodel = DDP(model.module)  # the documented re-wrap works as well", timeout=60).ok()
    k4.run(DDP_GOES_ON, timeout=60).ok()
    assert k4.value("[tuple(v) for v in _]") == [(True, True, False)] * 4
    survived(k4)


def test_a_mesh_an_fsdp2_module_and_a_sub_group_on_the_old_group_are_named_with_their_fix(k4):
    k4.run(
        "%%ddp\nfrom torch.distributed.device_mesh import init_device_mesh\nfrom torch.distributed.fsdp import fully_shard\n"
        "mesh2 = init_device_mesh('cpu', (4,))\nnet = fully_shard(torch.nn.Linear(8, 8), mesh=mesh2)\ng2 = dist.new_group([0, 1])", timeout=120,
    ).ok()
    msg = k4.run(FAIL, timeout=60).error[1]
    assert "mesh2 (DeviceMesh) holds the old process group: make mesh2 again (init_device_mesh)" in msg, msg
    assert re.search(r"net \(FSDP2\) holds the old process group", msg), msg
    assert "g2 (process group) holds the old process group: make g2 again (dist.new_group)" in msg, msg
    k4.run("%%ddp\nmesh2 = init_device_mesh('cpu', (4,))\nt = torch.ones(1)\ndist.all_reduce(t, group=mesh2.get_group())\nt.item()").ok()
    assert k4.value("list(_)") == [4.0] * 4
    survived(k4)


def test_a_rank_killed_mid_cell_costs_only_that_rank(k4):
    ex = k4.run("%%ddp\nimport signal\nif dist.get_rank() == 2:\n    os.kill(os.getpid(), signal.SIGKILL)\ndist.barrier()", timeout=60)
    msg = ex.error[1]
    assert msg.startswith("rank 2 (pid ") and "killed by SIGKILL" in msg, msg
    assert "rank 2 will be started again at the next cell" in msg, msg
    cell = "%%ddp --no-heal\nimport os, torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\n(os.getpid(), globals().get('kept'), t.item())"
    ex = k4.run(cell, timeout=120).ok()  # the new rank 2 starts empty (--no-heal; test_heal.py heals) and imports what it needs itself
    assert re.search(r"rank 2 \(pid \d+\) was killed by SIGKILL.*started it again", ex.stdout), ex.stdout  # a notice: stdout
    assert "rank 2's variables are gone" in ex.stdout and "ranks 0-1, 3 kept theirs" in ex.stdout, ex.stdout
    values = k4.value("[tuple(v) for v in _]")
    pids = [v[0] for v in values]
    assert [pids[r] for r in (0, 1, 3)] == [k4.pids[r] for r in (0, 1, 3)] and pids[2] != k4.pids[2]
    assert [v[1] for v in values] == [100, 101, None, 103]
    assert [v[2] for v in values] == [4.0] * 4
