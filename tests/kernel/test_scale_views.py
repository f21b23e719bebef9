"""What the user reads of 256 ranks: the grouped failure message, the grouped forensics, the summary view, %ddp status, %ddp_env.

The kernel side runs for real (pool, hub, policy, forensics, the view, the magics); the
ranks are bench/simranks'. Each cell runs twice, as a notebook user re-runs cells. What
is checked is the words and their count of lines (one line per group of ranks, never
one per rank), never a figure of the run.
"""
from __future__ import annotations

import html
import re
import sys
from pathlib import Path
from typing import Iterator, List

import pytest

from ddp_magic.errors import CellError
from ddp_magic.states import FailureKind

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import simranks  # noqa: E402

pytestmark = pytest.mark.kernel
N = 256
OTHERS = "0-99, 101-255"  # every rank but rank 100


@pytest.fixture(scope="module")
def pool() -> Iterator[object]:
    p = simranks.sim_pool(N, per_host=N // 2)  # two host processes
    try:
        p.start()
        yield p
    finally:
        p.stop()


def message(out: object) -> List[str]:
    """The cell's error as the user reads it (CellError's render), its lines."""
    return CellError(out.failures, out.notes).render().splitlines()  # type: ignore[attr-defined]


def test_one_rank_raises_while_255_wait_one_line_per_group(pool) -> None:
    for _ in range(2):
        lines = message(pool.run('sim.error("ValueError", "boom", ranks=[100])\nsim.collective("all_reduce", 3)'))
        assert lines[0] == "rank 100 raised ValueError: boom"
        assert "rank 100 never arrived at all_reduce #3 (rank 100 raised)" in lines
        rows = [ln.split("  ")[1] for ln in lines[lines.index("where each rank was:") + 2:] if ln.startswith("  ")]
        assert rows == [OTHERS, "100"], lines  # the mismatch table: a row per place, not per rank
        assert f'ranks {OTHERS} were in all_reduce #3 (at cell line 2: sim.collective("all_reduce", 3)) and were released' in lines
        assert len(lines) < 20, "\n".join(lines)
        assert pool.run("5").values == [5] * N


def test_one_rank_raises_while_255_sleep_the_interrupted_are_one_line(pool) -> None:
    for _ in range(2):
        out = pool.run('sim.error("ValueError", "boom", ranks=[100])\nsim.sleep(30)')
        assert sum(f.kind == FailureKind.INTERRUPTED for f in out.failures) == N - 1
        lines = message(out)
        assert lines[0] == "rank 100 raised ValueError: boom" and f"ranks {OTHERS} were interrupted" in lines
        assert len(lines) < 20, "\n".join(lines)


def test_forensics_group_the_ranks_by_the_collective_they_hang_in(pool) -> None:
    src = 'sim.collective("all_reduce", 4, ranks="0-99")\nsim.collective("all_reduce", 3, skip="0-99")'
    for _ in range(2):
        out = pool.run(src, timeout=1.0)
        assert out.failures[0].kind == FailureKind.TIMEOUT and sorted(f.rank for f in out.failures if f.kind == FailureKind.TIMEOUT) == list(range(100))
        lines = message(out)
        assert lines[0] == "the cell ran past --timeout 1s, waiting for ranks 0-99"
        assert "ranks 0-99 are in all_reduce #4 while ranks 100-255 are in all_reduce #3: mismatched collective" in lines
        head = lines.index("where each rank was when the timeout expired:")
        assert lines[head + 1].split() == ["ranks", "collective", "tensor", "group", "where"]
        assert [ln.split()[:3] for ln in lines[head + 2:head + 4]] == [["0-99", "all_reduce", "#4"], ["100-255", "all_reduce", "#3"]]
        assert [ln for ln in lines if ln.startswith("--- ")] == ["--- ranks 0-99 ---", "--- ranks 100-255 ---"]  # each stack once
        assert "ranks 0-99 were in all_reduce #4, ranks 100-255 in all_reduce #3, and were released" in lines
        assert len(lines) < 30, "\n".join(lines)
        assert pool.run("1").values == [1] * N


@pytest.fixture(scope="module")
def sim_kernel() -> Iterator[object]:
    """A real Jupyter kernel whose %%ddp pools are simulated ranks."""
    from kernel_helper import simulated_kernel

    k = simulated_kernel(per_host=N // 2)
    try:
        yield k
    finally:
        k.shutdown()


def final_view(ex: object) -> str:
    """The status view's HTML as the cell left it: the last display (or update of it) that carries the view."""
    bundles = [m["content"]["data"] for m in ex.messages  # type: ignore[attr-defined]
               if m["msg_type"] in ("display_data", "update_display_data") and "ddp-status" in m["content"]["data"].get("text/html", "")]
    assert bundles, "no status view"
    return str(bundles[-1]["text/html"])


def words(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).replace(" ,", ",").split())


def test_the_view_and_the_error_of_256_ranks_in_a_kernel(sim_kernel) -> None:
    for _ in range(2):
        ex = sim_kernel.run(f'%%ddp -n {N}\nsim.error("ValueError", "boom", ranks=[100])\nsim.collective("all_reduce", 3)', timeout=120)
        assert ex.error is not None and ex.error[1].startswith("rank 100 raised ValueError: boom")
        assert f"ranks {OTHERS} were in all_reduce #3" in ex.error[1] and len(ex.error[2]) < 25
        view = final_view(ex)
        header = view.split("</summary>", 1)[0]
        assert re.match(rf"%%ddp {N} ranks ✗ rank 100 raised ValueError: boom · [^·]+ · gloo", words(header)), words(header)
        assert "title='rank " not in header  # no square per rank over 32
        assert re.findall(r"class='ddp-status-segment' data-state='([a-z]+)' data-count='(\d+)'", header) == [("failed", "1"), ("stopped", str(N - 1))]
        body = view.split("</summary>", 1)[1]
        assert re.findall(r"<tr data-state='([a-z]+)' data-count='(\d+)'>", body) == [("failed", "1"), ("stopped", str(N - 1))]
        assert words(body.split("ddp-status-grid", 1)[1].split("ddp-status-ranks", 1)[0]).count("■") == N
        assert re.findall(r"data-rank='(\d+)' data-state='([a-z]+)'", body.split("ddp-status-ranks", 1)[1]) == [("100", "failed")]
        assert len(view) < 30_000
        assert sim_kernel.run(f"%%ddp -n {N}\n4", timeout=120).ok().result.startswith(f"RankResults({N} ranks)")


def test_ddp_status_and_ddp_env_of_256_ranks_in_a_kernel(sim_kernel) -> None:
    sim_kernel.run(f"%%ddp -n {N}\n1", timeout=120).ok()
    for _ in range(2):
        lines = sim_kernel.run("%ddp status").ok().stdout.splitlines()
        assert lines[0].startswith(f"pool of {N} ranks, backend gloo")
        assert re.fullmatch(r"  ranks 0-255: done  cpu  \(pids \d+(, |-)\d+\)  RSS 64.0 MiB", lines[1]), lines[:4]  # two host processes, one line
        assert len(lines) < 6, lines
    sim_kernel.run(f'%%ddp -n {N}\nsim.error("ValueError", "boom", ranks=[100])\nsim.collective("all_reduce", 3)', timeout=120)
    for _ in range(2):
        lines = sim_kernel.run("%ddp status").ok().stdout.splitlines()
        assert lines[-1].startswith("last cell In[") and "rank 100 raised ValueError: boom" in lines[-1] and len(lines) < 6, lines
    for _ in range(2):
        env = sim_kernel.run("plan = %ddp_env -n 1024\nprint(repr(plan))").ok().stdout.splitlines()  # a plan: nothing starts
        table = [ln.split() for ln in env[2:] if ln and not ln.startswith(("(", "✓", "✗", "!"))]
        assert env[0].startswith("planned env for 1024 ranks") and table == [["RANK", "LOCAL_RANK"], ["0-1023", "0-1023"]], env
        live = sim_kernel.run("live = %ddp_env\nprint(repr(live))").ok().stdout.splitlines()
        assert live[0].startswith(f"live env of {N} ranks") and ["0-255", "0-255"] in [ln.split() for ln in live], live[:8]
        assert len(live) < 15
