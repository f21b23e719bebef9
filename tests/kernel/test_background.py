"""%%ddp --bg, the job handle, the queue and --peek, against one real kernel with 2 real ranks (docs/background.md).

Nothing here races the clock: a background cell that must still run while the test does
something waits at a gate, a file the test removes when it is done (the ranks and this
test share the machine). Each scenario runs twice, as a notebook user re-runs cells.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterator, List

import pytest

from conftest import wait_until
from kernel_helper import ANSI, Execution, Kernel

pytestmark = pytest.mark.kernel

TRAIN = """%%ddp {flags}
import os, time, torch, torch.distributed as dist, ddp_magic
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.arange(8.0).reshape(2, 4) * (dist.get_rank() + 1) / 10
for step in range(200):
    for gate, at in (({a!r}, 50), ({b!r}, 150)):
        while step == at and os.path.exists(gate):
            time.sleep(0.01)
    opt.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    ddp_magic.log(step=step, loss=loss.item())
    if step % 50 == 0:
        print("step", step, "loss", round(loss.item(), 4))
[round(p.detach().sum().item(), 6) for p in model.parameters()]
"""
STATE_OK = "%%ddp\nt = torch.ones(1)\ndist.all_reduce(t)\n(os.getpid(), kept, t.item())"


@pytest.fixture(scope="module")
def k2() -> Iterator[Kernel]:
    k = Kernel()
    k.run("%load_ext ddp_magic").ok()
    k.run("%%ddp -n 2\nimport os, time, torch, torch.distributed as dist\nkept = dist.get_rank() + 100\nos.getpid()", timeout=180).ok()
    k.pids = k.value("list(_)")  # type: ignore[attr-defined]
    yield k
    k.shutdown()


class Gates:
    """Files a background cell waits at while they exist; the test removes them to let it go on."""

    def __init__(self, root: Path, *names: str) -> None:
        self.paths = {n: str(root / n) for n in names}

    def close(self) -> "Gates":
        for p in self.paths.values():
            Path(p).touch()
        return self

    def open(self, name: str) -> None:
        Path(self.paths[name]).unlink(missing_ok=True)

    def open_all(self) -> None:
        for name in self.paths:
            self.open(name)

    def __getitem__(self, name: str) -> str:
        return self.paths[name]


@pytest.fixture
def gates(tmp_path: Path) -> Iterator[Gates]:
    g = Gates(tmp_path, "a", "b")
    yield g
    g.open_all()  # a failed test never leaves a job waiting forever


def peek_ints(k: Kernel, expr: str = "step") -> List[int]:
    """Each rank's value of ``expr``, read by a peek (an int per rank, in rank order)."""
    ex = k.run(f"%%ddp --peek\n{expr}", timeout=60)
    if ex.error is not None and "NameError" in ex.error[1]:  # the cell has not got there yet
        return []
    ex.ok()
    return [int(v) for v in re.findall(r"\[\d\] (-?\d+)", ex.result or "")]


def peek_step(k: Kernel) -> List[int]:
    return peek_ints(k, "step")


def state_kept(k: Kernel) -> None:
    """Same processes, a variable from before, and a correct all_reduce: the pool went on with its state."""
    k.run(STATE_OK, timeout=120).ok()
    assert k.value("[tuple(v) for v in _]") == [(pid, 100 + r, 2.0) for r, pid in enumerate(k.pids)]  # type: ignore[attr-defined]


def late(k: Kernel, cell: Execution, kinds=("stream", "display_data", "update_display_data", "error")) -> List[dict]:
    """The messages of ``cell`` that came after it returned (a background cell's output)."""
    k.collect()
    return [m for m in k.elsewhere if m["parent_header"].get("msg_id") == cell.msg_id and m["msg_type"] in kinds]


def test_bg_training_lands_in_its_own_cell_while_other_cells_and_peeks_run(k2, gates):
    for _ in range(2):
        gates.close()
        k2.elsewhere.clear()
        bg = k2.run(TRAIN.format(flags="--bg --out job", a=gates["a"], b=gates["b"]), timeout=60).ok()
        assert bg.result is None and k2.value("job.done()") is False  # the cell returned while its job runs (held at gate a)
        assert wait_until(lambda: peek_step(k2) == [50, 50], 60, 0.2)  # the job waits at gate a
        others = [k2.run(f"y = {i} * 3\nprint('plain', y)\ny", timeout=60).ok() for i in range(3)]
        assert [o.result for o in others] == ["0", "3", "6"] and [o.stdout for o in others] == ["plain 0\n", "plain 3\n", "plain 6\n"]
        assert k2.value("job.done()") is False
        status = k2.run("%ddp status").ok().stdout
        assert re.search(r"background: cell \[\d+\] running \d+:\d\d:\d\d, step \d[\d,]*", status), status
        gates.open("a")
        assert wait_until(lambda: peek_step(k2) == [150, 150], 60, 0.2)  # the step count grew, seen from two peeks
        gates.open("b")
        k2.run("job.wait(120)", timeout=150).ok()
        bg_values = k2.value("list(job.result())")
        k2.run(TRAIN.format(flags="", a=gates["a"], b=gates["b"]), timeout=120).ok()  # the same cell in the foreground
        fg_values = k2.value("list(_)")
        assert bg_values == fg_values and len(bg_values) == 2 and bg_values[0] == bg_values[1]  # DDP keeps the replicas equal
        assert k2.value("len(job.metrics['step'])") == 400 and k2.value("max(job.metrics['step'])") == 199
        assert re.fullmatch(r"'<Job cell \[\d+\]: done after \d+:\d\d:\d\d, step 199>'", k2.run("repr(job)").ok().result or "")
        ours = bg.messages + late(k2, bg)  # the first lines may come before the cell has returned
        printed = ANSI.sub("", "".join(m["content"]["text"] for m in ours if m["msg_type"] == "stream"))
        assert [int(s) for s in re.findall(r"\[rank 0\] step (\d+)", printed)] == [0, 50, 100, 150], printed
        assert any(m["msg_type"] in ("display_data", "update_display_data") for m in ours)  # the view and the chart
        for other in others:  # none of the background cell's output went to the cells that ran meanwhile
            assert not [m for m in other.messages if m["msg_type"] == "stream" and "rank" in m["content"]["text"]]
            assert not [m for m in other.messages if m["msg_type"] in ("display_data", "update_display_data")]
        kinds = ("stream", "display_data", "update_display_data")
        strays = [m for m in k2.elsewhere if m["msg_type"] in kinds and m["parent_header"].get("msg_id") != bg.msg_id]
        assert not [m for m in strays if "rank" in str(m["content"])], strays


def test_cancel_mid_run_keeps_the_ranks_and_their_state(k2):
    for _ in range(2):
        k2.run("%%ddp --bg --out job\nn = 0\nwhile True:\n    n += 1\n    time.sleep(0.01)", timeout=60).ok()
        assert wait_until(lambda: [v > 0 for v in peek_ints(k2, "n")] == [True, True], 60, 0.2)
        for line, says in (("%ddp restart", "no restart"), ("%ddp stop", "the pool was not stopped"), ("%ddp_env", "%ddp_env reads the ranks")):
            refused = k2.run(line, timeout=30)  # the pool is the job's while it runs: each says so, and what to do
            assert refused.error is not None and refused.error[1].startswith(says) and "job.cancel()" in refused.error[1], refused.error
        before = peek_ints(k2, "n")
        sleeping = k2.run("import time as t\nt.sleep(60)", timeout=60, interrupt_after=1.0)  # Ctrl-C in another cell
        assert sleeping.error is not None and sleeping.error[0] == "KeyboardInterrupt"
        grew = lambda before=before: [a > b for a, b in zip(peek_ints(k2, "n"), before)] == [True, True]  # noqa: E731
        assert wait_until(grew, 30, 0.1) and k2.value("job.done()") is False
        assert k2.value("job.cancel()") is True
        ex = k2.run("job.result(60)", timeout=90)
        assert ex.error is not None and ex.error[0] == "JobCancelled", ex.error
        assert ex.error[1].startswith("cancelled by job.cancel(): ranks 0-1 stopped; state kept"), ex.error  # it logged no step
        assert k2.value("str(job.state)") == "cancelled" and k2.value("job.cancel()") is False
        state_kept(k2)
        k2.run("%%ddp\nn").ok()
        assert [v > 0 for v in k2.value("list(_)")] == [True, True]  # the loop's variable survived the cancel


def test_a_rank_raising_in_the_bg_cell_raises_from_result_and_shows_in_the_cell(k2, gates):
    # the raise waits at a gate until the cell has returned: the failure policy releases rank 0 at once (kernel/failures/probe.py),
    # so without it the job could fail before its own cell is idle
    cell = ("%%ddp --bg --out job\nx = torch.ones(2)\nwhile os.path.exists({a!r}):\n    time.sleep(0.01)\n"
            "if dist.get_rank() == 1:\n    raise ValueError('rank 1 gives up')\ndist.all_reduce(x)\nx")
    for _ in range(2):
        gates.close()
        k2.elsewhere.clear()
        bg = k2.run(cell.format(a=gates["a"]), timeout=60).ok()
        gates.open("a")
        k2.run("job.wait(120)", timeout=150).ok()
        ex = k2.run("job.result()", timeout=30)
        assert ex.error is not None and ex.error[0] == "CellError" and ex.error[1].startswith("rank 1 raised ValueError: rank 1 gives up"), ex.error
        assert "the process group was re-formed" in ex.error[1]
        assert k2.value("str(job.state)") == "failed"
        shown = late(k2, bg, ("error",))
        assert len(shown) == 1 and "rank 1 raised ValueError: rank 1 gives up" in shown[0]["content"]["evalue"]
        state_kept(k2)


def test_a_second_cell_waits_its_turn_and_ctrl_c_takes_it_out_of_the_queue(k2, gates):
    loop = "%%ddp --bg --out job\nfor i in range(3):\n    while os.path.exists({a!r}):\n        time.sleep(0.01)\nprint('bg done')\ni"
    for _ in range(2):
        gates.close()
        k2.elsewhere.clear()
        bg = k2.run(loop.format(a=gates["a"]), timeout=60).ok()

        def on_stream(name: str, text: str) -> None:
            if "queued behind cell [" in text:
                gates.open("a")  # let the job end only once this cell says it waits

        queued = k2.run("%%ddp\nprint('second', dist.get_rank())\ndist.get_rank()", timeout=120, on_stream=on_stream).ok()
        prompt = [m for m in bg.messages if m["msg_type"] == "execute_input"][0]["content"]["execution_count"]
        assert f"queued behind cell [{prompt}], which runs on the pool now" in queued.stdout, queued.stdout  # named by its prompt
        assert sorted(re.findall(r"\[rank \d\] second \d", queued.stdout)) == ["[rank 0] second 0", "[rank 1] second 1"]
        assert "bg done" not in queued.stdout
        assert k2.value("job.done()") is True and k2.value("list(job.result())") == [2, 2]
        assert "bg done" in "".join(m["content"]["text"] for m in late(k2, bg, ("stream",)))
        gates.close()  # a second background cell queues on its own thread: its cell returns at once
        k2.run(loop.format(a=gates["a"]), timeout=60).ok()
        second = k2.run("%%ddp --bg --out job2\ndist.get_rank() + 40", timeout=60).ok()
        assert k2.value("str(job2.state)") == "queued" and k2.value("'queued' in repr(job2)")  # returned before its turn came
        assert re.search(r"queued: cell \[\d+\]", k2.run("%ddp status").ok().stdout)
        gates.open("a")
        assert k2.value("list(job2.result(60))") == [40, 41]
        assert k2.value("job.wait(30)") is True and k2.value("str(job.state)") == "done"  # its turn goes before its cell's last output
        said = second.stdout + ANSI.sub("", "".join(m["content"]["text"] for m in late(k2, second, ("stream",))))
        assert "queued behind cell [" in said, said  # in its own cell, before or after the cell returned
        gates.close()
        k2.run(loop.format(a=gates["a"]), timeout=60).ok()
        refused = k2.run("%%ddp --no-queue\n1", timeout=30)
        assert refused.error is not None and "--no-queue" in refused.error[1] and "job.cancel()" in refused.error[1]

        def interrupt_when_queued(name: str, text: str) -> None:
            if "queued behind" in text:
                k2.km.interrupt_kernel()

        out = k2.run("%%ddp\nprint('never ran')", timeout=60, on_stream=interrupt_when_queued)
        assert out.error is not None and out.error[0] == "Dequeued" and "taken out of the queue" in out.error[1], out.error
        assert "never ran" not in out.stdout and k2.value("job.done()") is False  # Ctrl-C did not touch the job
        gates.open("a")
        assert k2.value("job.wait(60)") is True and k2.value("str(job.state)") == "done"


def test_a_peek_may_not_enter_a_collective_and_its_error_costs_only_the_peek(k2, gates):
    for _ in range(2):
        gates.close()
        k2.run(TRAIN.format(flags="--bg --out job", a=gates["a"], b=gates["b"]), timeout=60).ok()
        assert wait_until(lambda: peek_step(k2) == [50, 50], 60, 0.2)
        refused = k2.run("%%ddp --peek\ndist.all_reduce(torch.ones(1))", timeout=60)
        assert refused.error is not None and "a peek may not call torch.distributed.all_reduce" in refused.error[1], refused.error
        for below, op in (("dist.group.WORLD.allreduce(torch.ones(1)).wait()", "torch.ops.c10d.allreduce_"), ("model(x)", "DistributedDataParallel.forward")):
            refused = k2.run(f"%%ddp --peek\n{below}", timeout=60)  # the routes below torch.distributed's functions
            assert refused.error is not None and f"a peek may not call {op}" in refused.error[1], refused.error
        raised = k2.run("%%ddp --peek --ranks 1\nprint('about to fail')\n1 / 0", timeout=60)
        assert raised.error is not None and raised.error[1].startswith("rank 1 raised ZeroDivisionError"), raised.error
        assert "[rank 1] about to fail" in raised.stdout and "rank 0" not in raised.error[1].split("\n")[0]
        only0 = k2.run("%%ddp --peek --ranks 0\nprint('norm', round(float(model.module.weight.norm()), 3) > 0)\nstep", timeout=60).ok()
        assert only0.stdout == "[rank 0] norm True\n" and re.fullmatch(r"RankResults\(2 ranks\):\n  \[0\] 50\n  \[1\] None", only0.result or "")
        assert k2.value("job.done()") is False
        gates.open_all()
        assert k2.value("job.wait(120)") is True and k2.value("str(job.state)") == "done"  # the training went on


def test_ddp_wait_await_and_a_timeout_in_the_background(k2):
    for _ in range(2):
        k2.run("%%ddp --bg --out job\ntime.sleep(0.5)\ndist.get_rank() * 10", timeout=60).ok()
        waited = k2.run("%ddp wait", timeout=60).ok()
        assert re.fullmatch(r"<Job cell \[\d+\]: done after \d+:\d\d:\d\d>\n", waited.stdout), waited.stdout
        k2.run("%%ddp --bg --out job\ntime.sleep(0.3)\ndist.get_rank() + 1", timeout=60).ok()
        assert k2.run("list(await job)", timeout=60).ok().result == "[1, 2]"
        k2.run("%%ddp --bg --out job --timeout 1\ntime.sleep(60)", timeout=60).ok()
        ex = k2.run("job.result(60)", timeout=90)
        assert ex.error is not None and ex.error[1].startswith("the cell ran past --timeout 1s"), ex.error
        state_kept(k2)


def test_a_bg_cell_exports_like_a_foreground_one(k2, tmp_path):
    script = tmp_path / "train.py"
    for _ in range(2):
        k2.run("%%ddp --bg --out job\nexported_total = dist.get_rank() + 7\nexported_total", timeout=60).ok()
        k2.run("job.wait(60)", timeout=90).ok()
        k2.run(f"%ddp_export {script}", timeout=60).ok()
        assert "exported_total = dist.get_rank() + 7" in script.read_text()


def _shm_files(pid: int) -> List[str]:
    from ddp_magic.wire import shm

    mine = f"{shm.SHM_PREFIX}{shm.pid_namespace()}-{pid}-"
    return [n for n in os.listdir(shm.SHM_DIR) if n.startswith(mine)]


def _shutdown_while_running() -> None:
    from conftest import pid_alive, worker_pids_of

    k = Kernel()
    try:
        k.run("%load_ext ddp_magic").ok()
        for cell, says in (("%%ddp --bg\n1", "no pool is running yet: give the number of ranks"), ("%%ddp -n 2 --bg\n1 +", "SyntaxError in the cell")):
            refused = k.run(cell, timeout=60)  # told at once, in the cell itself, not later by a job
            assert refused.error is not None and says in refused.error[1], refused.error
        k.run("%%ddp -n 2 --bg --out job\nimport time\nwhile True:\n    time.sleep(0.01)", timeout=180).ok()
        running = lambda: len(re.findall(r"rank \d: pid \d+ +running", k.run("%ddp status").ok().stdout)) == 2  # noqa: E731
        assert wait_until(running, 120, 0.2)  # the job started the pool and the cell runs on both ranks
        procs, files, pid = worker_pids_of(k.pid), _shm_files(k.pid), k.pid
        assert len(procs) >= 3 and files, (procs, files)  # the template and two ranks; the group's store
    finally:
        k.shutdown()
    assert wait_until(lambda: not any(pid_alive(p) for p in procs), 20), [p for p in procs if pid_alive(p)]
    assert wait_until(lambda: not _shm_files(pid), 20), _shm_files(pid)


def test_kernel_shutdown_while_a_bg_job_runs_leaves_no_process_and_no_file():
    for _ in range(2):
        _shutdown_while_running()


def test_the_panel_hears_the_background_job_and_its_restart_waits_for_no_one():
    from test_lab_comm import Front

    k = Kernel()
    front = Front(k)
    gate = Gates(Path(k.run("import tempfile; tempfile.mkdtemp()").ok().result.strip("'")), "a")
    try:
        front.run("%load_ext ddp_magic")
        front.open()
        front.run("%%ddp -n 2 --no-widget\nimport os, time, ddp_magic")
        cell = ("%%ddp --bg --out job --no-widget\nfor step in range(5):\n    ddp_magic.log(step=step, x=1.0)\n"
                f"while os.path.exists({gate['a']!r}):\n    time.sleep(0.01)")
        for _ in range(2):
            gate.close()
            front.run(cell)
            front.pump(lambda: bool((front.last_pool() or {}).get("job")) and front.last_pool()["job"]["step"] == 4, 60)
            job = front.last_pool()["job"]
            assert job["background"] and re.fullmatch(r"background: cell \[\d+\] running \d+:\d\d:\d\d, step 4", job["text"]), job
            reply = front.reply(front.request("restart"))  # the panel's Restart while the job holds the pool
            assert not reply["ok"] and reply["error"].startswith("no restart: cell [") and "job.cancel()" in reply["error"], reply
            gate.open("a")
            front.run("job.wait(60)")
            front.pump(lambda: front.last_pool()["job"] is None, 30)
    finally:
        gate.open_all()
        k.shutdown()
