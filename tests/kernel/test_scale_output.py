"""What a user reads of 256 ranks' output in a real kernel: folded lines, a flood held back, %ddp output --rank N.

The ranks are bench/simranks' (the real wire protocol, no torch); the kernel, its
session, pool, hub and printer are real. The kernel's fold window is widened
(DDP_MAGIC_FOLD_WINDOW) so that a loaded machine reading 512 sockets never splits
"the same line from every rank" in two: what is checked is the folding, not the
clock (the 0.3 s deadline itself is tests/unit/test_fold.py's, on a fake clock).
Its budget is lowered (DDP_MAGIC_OUTPUT_LINES) so that a flood is a few thousand
lines. Then the same at n = 4 with real ranks: each rank's lines as today, and
``%ddp output`` / ``job.output`` reading back what ``--ranks`` hid. Every cell runs twice.
"""
from __future__ import annotations

import ast
import re
from typing import Iterator, List

import pytest

from kernel_helper import Kernel, simulated_kernel

pytestmark = pytest.mark.kernel
N = 256
BUDGET = 1000
HELD = re.compile(r"ddp_magic: ([\d,]+) lines? from ranks? [\d, -]+ held back; %ddp output --rank (\d+) --cell (\d+) shows rank \2's whole output")


@pytest.fixture(scope="module")
def sim_kernel() -> Iterator[Kernel]:
    k = simulated_kernel(N // 2, {"DDP_MAGIC_FOLD_WINDOW": "5", "DDP_MAGIC_OUTPUT_LINES": str(BUDGET), "NO_COLOR": "1"})
    try:
        k.run(f"%%ddp -n {N}\n1", timeout=120).ok()
        yield k
    finally:
        k.shutdown()


def _lines(text: str) -> List[str]:
    return [ln for ln in text.splitlines() if ln]


def test_the_same_line_from_every_rank_or_from_half_is_shown_once(sim_kernel) -> None:
    for _ in range(2):
        ex = sim_kernel.run(f"%%ddp -n {N}\nsim.print(2)\nsim.print(1, stream='stderr')\n3", timeout=120).ok()
        assert _lines(ex.stdout) == [f"[ranks 0-{N - 1}] line 0", f"[ranks 0-{N - 1}] line 1"]
        assert _lines(ex.stderr) == [f"[ranks 0-{N - 1}] line 0"], "stderr folds apart from stdout"
        ex = sim_kernel.run("%%ddp\nsim.print(1, ranks='0-127')\nsim.print(1, ranks='128-255', own=True)", timeout=120).ok()
        own = [f"[rank {r}] rank {r} line 0" for r in range(128, N)]  # lines that differ keep their rank
        assert sorted(_lines(ex.stdout)) == sorted(["[ranks 0-127] line 0"] + own), "in arrival order"


def test_lines_that_differ_keep_their_rank_and_each_rank_s_order(sim_kernel) -> None:
    for _ in range(2):
        ex = sim_kernel.run("%%ddp\nsim.print(1)\nsim.print(1, own=True)\nsim.print(1)", timeout=120).ok()
        shown = _lines(ex.stdout)
        assert shown[0] == shown[-1] == f"[ranks 0-{N - 1}] line 0"
        assert sorted(shown[1:-1]) == sorted(f"[rank {r}] rank {r} line 0" for r in range(N))


def test_a_flood_is_held_back_and_ddp_output_gives_a_rank_s_whole_output(sim_kernel) -> None:
    per_rank = 20
    for _ in range(2):
        ex = sim_kernel.run(f"%%ddp\nsim.print({per_rank}, own=True)", timeout=300).ok()
        shown = _lines(ex.stdout)
        first = next(i for i, ln in enumerate(shown) if ln.startswith("ddp_magic: "))
        assert first >= BUDGET and shown[first].startswith(f"ddp_magic: this cell's output is over its budget ({BUDGET:,} lines, then 50 a second)")
        rank_lines = [ln for ln in shown if ln.startswith("[rank ")]
        held = [HELD.match(ln) for ln in shown if ln.startswith("ddp_magic: ") and "held back;" in ln]
        assert held and all(held), shown[-3:]
        assert len(rank_lines) + sum(int(m.group(1).replace(",", "")) for m in held if m) == N * per_rank, "every line shown or counted"
        cell = held[-1].group(3) if held[-1] else ""
        for ask in ("%ddp output --rank 200", f"%ddp output --rank 200 --cell {cell}"):
            back = sim_kernel.run(ask, timeout=60).ok()
            assert back.stdout == "".join(f"rank 200 line {i}\n" for i in range(per_rank)) and back.stderr == ""
    wrong = sim_kernel.run(f"%ddp output --rank {N}", timeout=60)
    assert wrong.error is not None and wrong.error[0] == "UsageError" and f"the pool has ranks 0..{N - 1}" in wrong.error[1]


@pytest.fixture(scope="module")
def real_kernel() -> Iterator[Kernel]:
    k = Kernel(extra_env={"NO_COLOR": "1"})
    try:
        k.run("%load_ext ddp_magic").ok()
        yield k
    finally:
        k.shutdown()


CELL = "import os, sys\nr = int(os.environ['RANK'])\nprint('out', r)\nprint('err', r, file=sys.stderr)\nprint('same on every rank')\n"


def test_ddp_output_reads_back_what_ranks_hid_on_four_real_ranks(real_kernel) -> None:
    for _ in range(2):
        ex = real_kernel.run("%%ddp -n 4 --ranks 0\n" + CELL, timeout=300).ok()
        assert sorted(_lines(ex.stdout)) == ["[rank 0] out 0", "[rank 0] same on every rank"], "4 ranks: each rank's own lines, as before"
        back = real_kernel.run("%ddp output --rank 2", timeout=60).ok()
        assert back.stdout == "out 2\nsame on every rank\n" and back.stderr == "err 2\n"
    ex = real_kernel.run("%%ddp -n 4\n" + CELL, timeout=300).ok()
    assert sorted(ln for ln in _lines(ex.stdout) if "same" in ln) == [f"[rank {r}] same on every rank" for r in range(4)], "not folded at n = 4"
    for _ in range(2):
        real_kernel.run("%%ddp --bg --out job --ranks 1\n" + CELL, timeout=60).ok()
        got = real_kernel.run("job.wait(120); print(repr(job.output(3)))", timeout=180).ok()
        text = ast.literal_eval(_lines(got.stdout)[-1])
        assert sorted(text.splitlines()) == ["err 3", "out 3", "same on every rank"] and text.index("out 3") < text.index("same")
