"""See inside every rank: %ddp stacks and job.stacks() while a job runs, each rank's memory in %ddp status,
and why a rank died (the OOM killer only with a counter's evidence, another SIGKILL, a segfault's stack, CUDA out of memory).

One real kernel with 4 real ranks (gloo); each scenario runs twice, as a notebook user re-runs cells. Nothing races the
clock: a job that must still run while the test looks waits at a gate, a file the test removes when it is done.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

import memcg_helper
from conftest import wait_until
from kernel_helper import Kernel

pytestmark = pytest.mark.kernel

STATE = "%%ddp --no-heal\nimport os, time, ctypes, torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\n" \
    "(dist.get_rank(), 'kept' in globals(), t.item())"


@pytest.fixture(scope="module")
def k4() -> Iterator[Kernel]:
    k = Kernel()
    k.run("%load_ext ddp_magic").ok()
    k.run("%%ddp -n 4\nimport os, time, ctypes, torch, torch.distributed as dist\nos.getpid()", timeout=240).ok()
    yield k
    k.shutdown()


def pids(k: Kernel) -> List[int]:
    return k.value("[i.pid for _, i in sorted(get_ipython().magics_manager.registry['DDPMagics'].pool.ranks.items())]")


def error_text(ex) -> str:
    assert ex.error is not None, f"the cell did not fail: {ex.stdout}\n{ex.stderr}"
    return "\n".join(ex.error[2])


def state_after_loss(k: Kernel, lost: int) -> str:
    """The next cell is right: the dead rank is back (its variables gone: ``--no-heal``; test_heal.py heals one), the
    others kept theirs, the all_reduce is whole."""
    ex = k.run(STATE, timeout=180).ok()
    assert k.value("[tuple(v) for v in _]") == [(r, r != lost, 4.0) for r in range(4)]
    return ex.stdout + ex.stderr


def variables_said(k: Kernel) -> str:
    """What a re-formed group must say of the variables, from the ranks themselves: a rank started again earlier (this
    module's SIGKILL and segfault tests; never rank 0) that lacks a name rank 0 has of those the workers own (``%ddp
    status``) lost its variables of before; alone, no rank lacks any."""
    from ddp_magic.kernel.ranks import variables_kept

    rows = [r for r in k.run("%ddp status").ok().stdout.splitlines() if r.strip().startswith("names on the workers: ")]
    names = sorted(rows[0].split(": ", 1)[1].split(", ")) if rows else []
    k.run(f"%%ddp\nsorted(set({names!r}) & set(globals()))", timeout=120).ok()
    have = [set(v) for v in k.value("list(_)")]
    return variables_kept(range(4), [r for r in range(4) if have[0] - have[r]])


def keep_state(k: Kernel) -> None:
    k.run("%%ddp\nkept = True", timeout=120).ok()


def test_stacks_of_a_running_bg_job_group_the_odd_rank_first_and_the_job_goes_on(k4: Kernel, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    for _ in range(2):
        gate.touch()
        number = k4.value("get_ipython().execution_count")  # the next cell's In [n] (IPython counts this one already)
        k4.run(f"""%%ddp --bg --out job
def slow_part():
    while os.path.exists({str(gate)!r}):
        time.sleep(0.05)
t = torch.ones(1)
if dist.get_rank() == 1:
    slow_part()
dist.all_reduce(t)
t.item()""", timeout=60).ok()

        def two_groups() -> bool:
            out = k4.run("%ddp stacks", timeout=60).ok().stdout
            return "--- rank 1 ---" in out and "--- ranks 0, 2-3 (3) ---" in out

        assert wait_until(two_groups, 60, 0.2)
        text = k4.run("%ddp stacks", timeout=60).ok().stdout
        assert text.index("--- rank 1 ---") < text.index("--- ranks 0, 2-3 (3) ---")  # the odd rank out first
        one, others = text.split("--- ranks 0, 2-3 (3) ---")
        assert f"Cell In[{number}], line 4, in slow_part" in one and "time.sleep(0.05)" in one and "all_reduce" not in one
        assert f"Cell In[{number}], line 8" in others and "dist.all_reduce(t)" in others and " in all_reduce" in others
        assert re.match(r"4 ranks in 2 stacks \(\d+ ms\)", text)
        by_job = k4.run("job.stacks()", timeout=60).ok().result or ""
        assert "--- rank 1 ---" in by_job and "--- ranks 0, 2-3 (3) ---" in by_job and "slow_part" in by_job
        assert "--- rank 2 ---" in k4.run("%ddp stacks --ranks 2", timeout=60).ok().stdout
        assert k4.value("job.done()") is False
        gate.unlink()
        k4.run("job.wait(120)", timeout=150).ok()
        assert k4.value("list(job.result())") == [4.0] * 4  # the job went on, whole
        idle = k4.run("%ddp stacks --all-threads", timeout=60).ok().stdout
        assert "--- ranks 0-3 (4) ---" in idle and "(idle: between cells)" in idle


def py_spy() -> Optional[str]:
    """py-spy where a rank finds it: on PATH, or beside the interpreter (a venv that is not activated)."""
    return shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))


def test_stacks_usage_errors_say_what_to_do(k4: Kernel) -> None:
    for _ in range(2):
        ex = k4.run("%ddp status --all-threads")
        assert ex.error is not None and "go with stacks" in ex.error[1]
        out = k4.run("%ddp stacks --native", timeout=60).ok().stdout
        assert "--- ranks 0-3 (4) ---" in out
        if py_spy() is None:  # an option, not a dependency: without it the Python frames still come
            assert "py-spy is not installed on this rank's host (pip install py-spy)" in out
        else:  # requirements-dev.txt installs it: each rank's native frames, read from outside the rank
            assert "native frames (rank 0, py-spy):" in out and "(libc.so" in out, out


def rss(k: Kernel) -> Dict[int, float]:
    """Each rank's RSS in MiB as %ddp status prints it."""
    out = k.run("%ddp status", timeout=60).ok().stdout
    found = {int(r): float(v) * (1024 if unit == "GiB" else 1) for r, v, unit in re.findall(r"rank (\d+): .*RSS ([\d.]+) (MiB|GiB)", out)}
    assert sorted(found) == [0, 1, 2, 3], out
    return found


def test_status_shows_each_ranks_rss_and_it_moves_when_a_rank_allocates(k4: Kernel) -> None:
    for _ in range(2):
        k4.run("%%ddp\nbig = None", timeout=120).ok()
        before = rss(k4)
        k4.run("%%ddp\nbig = torch.ones(50_000_000) if dist.get_rank() == 2 else None", timeout=120).ok()  # 200 MB on rank 2
        after = rss(k4)
        assert after[2] - before[2] > 150, (before, after)
        assert all(abs(after[r] - before[r]) < 60 for r in (0, 1, 3)), (before, after)
        k4.run("%%ddp\nbig = None", timeout=120).ok()
        assert before[2] - 60 < rss(k4)[2] < after[2] - 150  # and back


def test_a_kill_9_is_not_called_oom_and_the_rank_restarts_alone(k4: Kernel) -> None:
    for _ in range(2):
        keep_state(k4)
        pid = pids(k4)[3]
        ex = k4.run("%%ddp\nif dist.get_rank() == 3:\n    os.kill(os.getpid(), 9)\ntime.sleep(1)\ndist.barrier()", timeout=180)
        text = error_text(ex)
        assert f"rank 3 (pid {pid}) was killed by SIGKILL (not the OOM killer)" in text, text
        assert "OOM killer's" not in text and "kernel's OOM killer" not in text
        notice = state_after_loss(k4, 3)
        assert f"rank 3 (pid {pid}) was killed by SIGKILL (not the OOM killer): started it again" in notice and "rank 3's variables are gone" in notice, notice


def test_a_segfault_names_the_signal_with_the_ranks_stack_and_the_cells_line(k4: Kernel) -> None:
    for _ in range(2):
        keep_state(k4)
        pid = pids(k4)[1]
        number = k4.value("get_ipython().execution_count")
        ex = k4.run("%%ddp\nx = 1\nif dist.get_rank() == 1:\n    ctypes.string_at(0)\ntime.sleep(1)\ndist.barrier()", timeout=180)
        text = error_text(ex)
        assert f"rank 1 (pid {pid}) was killed by SIGSEGV (a crash in native code)" in text, text
        assert "Fatal Python error: Segmentation fault" in text and f"Cell In[{number}], line 4" in text, text
        assert "runpy" not in text  # from the cell on
        assert "in string_at" in text, text  # ctypes' frame, most recent last
        assert "ddp_magic/" not in text.split("--- traceback on rank 1 ---")[1].split("\n\n")[0]  # our own frames left out
        state_after_loss(k4, 1)


def test_cuda_out_of_memory_on_one_rank_releases_the_others_and_keeps_the_state(k4: Kernel) -> None:
    mock = """
if dist.get_rank() == 1:  # the GPU part is mocked (no GPU here): the figures torch.cuda would give, and empty_cache's call
    emptied = globals().get('emptied', 0)
    real = {n: getattr(torch.cuda, n) for n in ('is_initialized', 'memory_allocated', 'memory_reserved', 'max_memory_allocated', 'empty_cache')}
    torch.cuda.is_initialized = lambda: True
    torch.cuda.memory_allocated = lambda *a: 10 << 30
    torch.cuda.memory_reserved = lambda *a: 11 << 30
    torch.cuda.max_memory_allocated = lambda *a: 23 << 29
    def _empty():
        global emptied
        emptied += 1
    torch.cuda.empty_cache = _empty
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")  # the mocks stay until the rank has read them
dist.all_reduce(torch.ones(1))
"""
    restore = "%%ddp\nif dist.get_rank() == 1:\n    for n, f in real.items():\n        setattr(torch.cuda, n, f)\n    print('emptied', emptied)"
    for i in range(2):
        keep_state(k4)
        said = variables_said(k4)
        text = error_text(k4.run("%%ddp" + mock, timeout=180))
        assert "rank 1 raised OutOfMemoryError: CUDA out of memory" in text, text
        assert ("rank 1 ran out of CUDA memory (rank 1: CUDA 10.0 GiB allocated, 11.0 GiB reserved, peak 11.5 GiB); "
                "torch.cuda.empty_cache() ran on it, and every rank keeps its variables") in text, text
        assert "released" in text and f"; {said}" in text, (said, text)
        k4.run(STATE, timeout=120).ok()
        assert k4.value("[tuple(v) for v in _]") == [(r, True, 4.0) for r in range(4)]
        assert k4.run(restore, timeout=60).ok().stdout.strip().endswith(f"emptied {i + 1}")


@pytest.mark.skipif(memcg_helper.memory_root() is None, reason=memcg_helper.WHY)
def test_a_rank_over_its_cgroups_limit_is_named_killed_by_the_oom_killer_with_the_limit(k4: Kernel) -> None:
    """cgroup v1 or v2, whichever the host has; the figure is the cgroup's peak (the cgroup is the rank's own), said as such."""
    for i in range(2):
        keep_state(k4)
        with memcg_helper.limited(f"ddp_inside35_{os.getpid()}_{i}", 300 << 20) as cg:
            pid = pids(k4)[2]
            (cg / "cgroup.procs").write_text(str(pid))
            ex = k4.run("%%ddp\nif dist.get_rank() == 2:\n    big = torch.ones(256 << 20)\ntime.sleep(1)\ndist.barrier()", timeout=240)
            text = error_text(ex)
            assert re.search(rf"rank 2 \(pid {pid}\) was killed by the kernel's OOM killer \(its cgroup peaked at [\d.]+ MiB; its memory limit is 300.0 MiB\)",
                             text), text
            notice = state_after_loss(k4, 2)
            assert f"rank 2 (pid {pid}) was killed by the kernel's OOM killer" in notice and "rank 2's variables are gone" in notice, notice


def test_16_ranks_in_one_loop_are_one_group(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    k = Kernel()
    try:
        k.run("%load_ext ddp_magic").ok()
        k.run("%%ddp -n 16\nimport os, time, torch, torch.distributed as dist\nos.getpid()", timeout=300).ok()
        shown: List[str] = []
        for _ in range(2):
            gate.touch()
            # the ranks agree when to stop (a rank that saw the gate gone alone would wait in barrier while the
            # others wait in all_reduce: a deadlock of the cell's own, which %ddp stacks showed as two groups)
            k.run(f"""%%ddp --bg --out job
t = torch.ones(1)
while True:
    t[0] = float(not os.path.exists({str(gate)!r}))
    dist.all_reduce(t)
    if t.item() > 0:
        break
    time.sleep(0.02)
dist.barrier()""", timeout=60).ok()

            def one_group() -> bool:  # a rank caught between two calls (in os.path.exists) is another stack for that moment
                shown[:] = [k.run("%ddp stacks", timeout=60).ok().stdout]
                return "16 ranks in 1 stack" in shown[0]

            assert wait_until(one_group, 90, 0.2), shown
            assert "--- ranks 0-15 (16) ---" in shown[0] and ("time.sleep(0.02)" in shown[0] or " in all_reduce" in shown[0]), shown
            assert shown[0].count("--- ranks") == 1
            gate.unlink()
            k.run("job.wait(120)", timeout=150).ok()
            assert k.value("job.done()") is True
    finally:
        gate.unlink(missing_ok=True)
        k.shutdown()
