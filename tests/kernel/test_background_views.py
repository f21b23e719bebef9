"""What every view says of a background job is what the kernel knows: its run time, its start clock, its cancel, its queue.

One real kernel with real ranks. The run time of a job is its seconds on the ranks (docs/background.md): the cell's
status view, ``job.elapsed``, ``repr(job)``, ``%ddp status`` and the panel's snapshot count the same seconds, and a
pool's start is the start clock's, one clock from the pool's own start (``Pool.start_began``). A ``job.cancel()`` is
neither a rank's failure nor a Ctrl-C. A queued cell's notice goes once its turn came. Each scenario runs twice.
"""
from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Iterator, List

import pytest

from conftest import wait_until
from format_patterns import SECONDS
from kernel_helper import ANSI, Execution, Kernel
from ddp_magic.kernel.jobs.turns import clock_text
from ddp_magic.words import fmt_seconds

pytestmark = pytest.mark.kernel

SESSION = "get_ipython().magics_manager.registry['DDPMagics'].session"
SINCE = f"(lambda p: None if p is None or p.start_began is None else __import__('time').monotonic() - p.start_began)({SESSION}.pool)"
SNAP = f"__import__('ddp_magic.ui.labsnap', fromlist=['PoolSnapshots']).PoolSnapshots({SESSION}).pool_dict()"


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    k = Kernel()
    k.run("%load_ext ddp_magic").ok()
    yield k
    k.shutdown()


def late(k: Kernel, cell: Execution, kinds=("stream", "display_data", "update_display_data", "error")) -> List[dict]:
    """The messages of ``cell`` that came after it returned (a background cell's output)."""
    k.collect()
    return [m for m in k.elsewhere if m["parent_header"].get("msg_id") == cell.msg_id and m["msg_type"] in kinds]


def final_view(msgs: List[dict]) -> str:
    """The words of the last status view a cell's messages carry (its summary line, as a reader sees it)."""
    htmls = [m["content"]["data"]["text/html"] for m in msgs if m["msg_type"] in ("display_data", "update_display_data")
             and "ddp-status" in m["content"].get("data", {}).get("text/html", "")]
    assert htmls, "no status view"
    head = htmls[-1].split("</summary>", 1)[0]
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", head)).split())


def test_a_job_that_starts_its_pool_counts_its_seconds_on_the_ranks_and_the_start_has_one_clock(kernel, tmp_path: Path):
    gate = tmp_path / "gate"
    cell = f"%%ddp -n 2 --bg --out job\nimport os, time\nwhile os.path.exists({str(gate)!r}):\n    time.sleep(0.01)\ntime.sleep(1.5)"
    for _ in range(2):
        kernel.run("%ddp stop").ok()  # every run starts its own pool, in the job
        gate.touch()
        kernel.elsewhere.clear()
        bg = kernel.run(cell, timeout=60).ok()
        clocks: List[float] = []  # the panel's start clock while the pool starts, as the snapshots say it

        def running(clocks: List[float] = clocks) -> bool:
            pool, since = kernel.value(f"[{SNAP}, {SINCE}]")  # the snapshot, then the pool's own start clock (the truth)
            job = (pool or {}).get("job") or {}
            if pool and not pool["started"]:
                assert job.get("phase") in ("starting", None) and job.get("elapsed") is None, job  # no run time yet
                shown = max([r["elapsed"] for r in pool["ranks"]], default=0.0)
                assert since is None or since - 0.5 <= shown <= since + 0.001, (shown, since)  # the bar's, the panel's clock
                clocks.append(shown)
            return job.get("phase") == "running"

        assert wait_until(running, 120, 0.05)
        assert clocks == sorted(clocks), f"the start clock went back: {clocks}"
        began_to_ready = kernel.value(f"{SESSION}.pool.start_seconds")
        assert clocks and clocks[-1] <= began_to_ready + 0.05, (clocks, began_to_ready)  # the pool's own clock, up to its start
        pool = kernel.value(SNAP)
        pids = [r["pid"] for r in pool["ranks"]]
        on_ranks = max(r["elapsed"] for r in pool["ranks"])
        assert abs(pool["job"]["elapsed"] - on_ranks) < 0.5, pool  # the job's clock is its ranks' clock
        gate.unlink()
        assert kernel.value("job.wait(60)") is True
        elapsed = kernel.value("job.elapsed")
        view = final_view(bg.messages + late(kernel, bg))
        shown = re.search(rf"2 ranks ✓ ({SECONDS})", view)
        assert shown and shown.group(1) == fmt_seconds(elapsed), (view, elapsed)  # the cell and job.elapsed: one figure
        assert f"pool started in {fmt_seconds(began_to_ready)}" in view, view  # the pool's start apart, named
        assert kernel.run("repr(job)").ok().result == repr(f"<Job {bg_name(bg)}: done after {clock_text(elapsed)}>")
        assert elapsed >= 1.5
        # the pool the job started outlives the job's thread (its template asked for a parent-death signal)
        kernel.run("%%ddp\nimport os\nos.getpid()", timeout=120).ok()
        assert kernel.value("list(_)") == pids


def bg_name(cell: Execution) -> str:
    prompt = [m for m in cell.messages if m["msg_type"] == "execute_input"][0]["content"]["execution_count"]
    return f"cell [{prompt}]"


def test_a_cancel_says_cancelled_by_job_cancel_in_the_cell_the_repr_the_status_and_the_panel(kernel):
    kernel.run("%%ddp -n 2\nimport time, ddp_magic\n0", timeout=180).ok()
    loop = "%%ddp --bg --out job\nn = 0\nwhile True:\n    n += 1\n    if n % 10 == 0:\n        ddp_magic.log(step=n, x=1.0)\n    time.sleep(0.01)"
    for _ in range(2):
        kernel.elsewhere.clear()
        bg = kernel.run(loop, timeout=60).ok()
        assert wait_until(lambda: (kernel.value("job.ticket.progress() or 0")) >= 30, 60, 0.1)
        assert kernel.value("job.cancel()") is True
        assert kernel.value("job.wait(60)") is True and kernel.value("str(job.state)") == "cancelled"
        step = kernel.value("max(job.metrics['step'])")  # the last step the ranks logged: what the kernel knows
        text = f"cancelled by job.cancel(): ranks 0-1 stopped at step {step:,}; state kept"
        ex = kernel.run("job.result()", timeout=30)
        assert ex.error is not None and ex.error[0] == "JobCancelled" and ex.error[1].splitlines()[0] == text, ex.error
        assert "interrupted by the user" not in ex.error[1] and "was interrupted" not in ex.error[1]
        shown = late(kernel, bg, ("error",))  # the cell's own error output
        assert len(shown) == 1 and shown[0]["content"]["evalue"].splitlines()[0] == text, shown
        view = final_view(bg.messages + late(kernel, bg))
        assert text in view and "interrupted" not in view, view
        said = kernel.run("repr(job)").ok().result
        assert said == repr(f"<Job {bg_name(bg)}: {text} ({clock_text(kernel.value('job.elapsed'))} on the ranks)>"), said
        pool = kernel.value(SNAP)
        assert pool["last_cell"]["headline"] == text and pool["last_cell"]["cancelled"] is True, pool["last_cell"]
        assert pool["last_cell"]["text"].endswith(f": {text}"), pool["last_cell"]  # the panel's line, no "recovered" after it
        assert f"last cell In[{bg_name(bg)[6:-1]}]: {text}" in kernel.run("%ddp status").ok().stdout
        kernel.run("%%ddp\nn > 0").ok()  # the state was kept, as it says
        assert kernel.value("list(_)") == [True, True]


def test_a_queued_cell_s_notice_goes_once_its_turn_came(kernel, tmp_path: Path):
    gate = tmp_path / "gate"
    kernel.run("%%ddp -n 2\nimport os, time\n0", timeout=180).ok()
    job = f"%%ddp --bg --out job\nwhile os.path.exists({str(gate)!r}):\n    time.sleep(0.01)"
    notices = "list(__import__('ddp_magic.ui.labcomm', fromlist=['bridge']).bridge().notices)"
    for _ in range(2):
        gate.touch()
        kernel.run(job, timeout=60).ok()

        def on_stream(name: str, text: str) -> None:
            if "queued behind cell [" in ANSI.sub("", text):
                gate.unlink()  # the job ends only once this cell says it waits

        queued = kernel.run("%%ddp\n1", timeout=120, on_stream=on_stream).ok()
        assert "queued behind cell [" in queued.stdout  # the cell's own record of its wait stays
        assert [n for n in kernel.value(notices) if "queued behind" in n] == [], "the panel's notice went with the wait"
        assert kernel.value(SNAP)["queued"] == [] and kernel.value("job.done()") is True
    gate.touch()
    kernel.run(job, timeout=60).ok()

    def dequeue(name: str, text: str) -> None:
        if "queued behind" in ANSI.sub("", text):
            kernel.km.interrupt_kernel()

    out = kernel.run("%%ddp\nprint('never ran')", timeout=60, on_stream=dequeue)
    assert out.error is not None and out.error[0] == "Dequeued"
    assert [n for n in kernel.value(notices) if "queued behind" in n] == [], "taken out of the queue: it waits no more"
    gate.unlink()
    assert kernel.value("job.wait(60)") is True
