"""How a rank's death reads in the cell, in the order a user meets it: a segfault shows
its clean form alone (the raw faulthandler report stays in ``%ddp output --rank N`` and the kernel's log), the ranks a
death released are said in our words (not gloo's), and a rank moved into a small cgroup in the cell and killed there
reads as the OOM killer's, with what its figure is.

One real kernel with 2 real ranks (gloo); each scenario runs twice, as a notebook user re-runs cells.
"""
from __future__ import annotations

import os
import re
from typing import Iterator, List

import pytest

import memcg_helper
from kernel_helper import ANSI, Kernel

pytestmark = pytest.mark.kernel

IMPORTS = "import os, time, ctypes, signal, torch, torch.distributed as dist\n"
RAW = ("forkserver.py", "template_keep.py", "runpy", "Extension modules", "<ddp-cell-", "gloo", "GLHF", "\U0001f3d6")


@pytest.fixture(scope="module")
def k2() -> Iterator[Kernel]:
    k = Kernel()
    k.run("%load_ext ddp_magic").ok()
    k.run("%%ddp -n 2\n" + IMPORTS + "os.getpid()", timeout=240).ok()
    yield k
    k.shutdown()


def pids(k: Kernel) -> List[int]:
    return k.value("[i.pid for _, i in sorted(get_ipython().magics_manager.registry['DDPMagics'].pool.ranks.items())]")


def cell_text(ex) -> str:
    """Everything the cell shows: its streams and its error, as a person reads them."""
    assert ex.error is not None, f"the cell did not fail: {ex.stdout}\n{ex.stderr}"
    return ANSI.sub("", ex.stdout + ex.stderr + "\n".join(ex.error[2]))


def again(k: Kernel) -> None:
    """The dead rank back (with its imports), the group whole."""
    k.run("%%ddp\n" + IMPORTS + "dist.barrier()", timeout=180).ok()


def test_a_segfault_shows_its_clean_form_alone_and_the_raw_report_stays_in_ddp_output(k2: Kernel) -> None:
    for _ in range(2):
        number = k2.value("get_ipython().execution_count")
        ex = k2.run("%%ddp\nx = 1\nif dist.get_rank() == 1:\n    time.sleep(0.3)\n    ctypes.string_at(0)\ndist.all_reduce(torch.ones(1))", timeout=180)
        text = cell_text(ex)
        assert re.search(r"rank 1 \(pid \d+\) was killed by SIGSEGV \(a crash in native code\)", text), text
        assert f"Cell In[{number}], line 5" in text and "in string_at" in text, text  # the cell's frames, the notebook's numbering
        assert [raw for raw in RAW if raw in text] == [], text  # not faulthandler's block, not the backend's words
        assert "Fatal Python error" not in ex.stdout + ex.stderr, text  # not streamed
        assert text.count("Fatal Python error: Segmentation fault") == 1, text  # once: the clean form's head
        assert re.search(r"rank 0 was in all_reduce #\d+ \(at cell line 6: dist\.all_reduce\(torch\.ones\(1\)\)\) when rank 1 died, and was released",
                         text), text
        assert "%ddp output --rank 1" in text, text
        raw = k2.run("%ddp output --rank 1", timeout=60).ok()
        assert "Fatal Python error: Segmentation fault" in raw.stderr and "Extension modules" in raw.stderr, raw.stderr
        assert f"  Cell In[{number}], line 5\n" in raw.stderr and "<ddp-cell-" not in raw.stderr, raw.stderr  # as the cell names it
        assert "rank 1's crash report" in k2.run("%ddp log", timeout=60).ok().stdout
        again(k2)


def test_a_rank_killed_in_a_collective_leaves_no_backend_text_in_the_cell(k2: Kernel) -> None:
    for _ in range(2):
        pid = pids(k2)[1]
        kill = "if dist.get_rank() == 1:\n    time.sleep(0.3)\n    os.kill(os.getpid(), signal.SIGKILL)\n"
        ex = k2.run("%%ddp\n" + kill + "dist.all_reduce(torch.ones(1))", timeout=180)
        text = cell_text(ex)
        assert f"rank 1 (pid {pid}) was killed by SIGKILL" in text, text
        assert re.search(r"rank 0 was in all_reduce #\d+ \(at cell line 5: dist\.all_reduce\(torch\.ones\(1\)\)\) when rank 1 died, and was released",
                         text), text
        assert [raw for raw in RAW if raw in text] == [] and "raised RuntimeError" not in text, text
        again(k2)


@pytest.mark.skipif(memcg_helper.memory_root() is None, reason=memcg_helper.WHY)
def test_a_rank_moved_into_a_small_cgroup_in_the_cell_and_killed_there_reads_as_the_oom_killer(k2: Kernel) -> None:
    """The move comes after the sample the cell's start takes (the sampler's next is 2 s away): the cgroup it was sampled
    in counts nothing, the machine's count moved."""
    for i in range(2):
        with memcg_helper.limited(f"ddp_words_{os.getpid()}_{i}", 300 << 20) as cg:
            pid = pids(k2)[1]
            ex = k2.run(f"%%ddp\nif dist.get_rank() == 1:\n    time.sleep(0.5)\n    open({str(cg / 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"
                        "    big = b'x' * (1 << 30)\ntime.sleep(1)\ndist.barrier()", timeout=240)
            text = cell_text(ex)
            assert re.search(rf"rank 1 \(pid {pid}\) was (probably )?killed by the kernel's OOM killer \(", text), text
            assert "not the OOM killer" not in text, text
            assert re.search(r"its cgroup peaked at [\d.]+ MiB|it held [\d.]+ [MG]iB (at its last sample, [\d.]+ m?s before|as its last cell ended)",
                             text), text  # what the figure is
        again(k2)
