"""The simulated ranks' cell scripts (bench/simranks/script.py): which rank does what, and the stack a rank reports."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ddp_magic.kernel.failures.forensics import last_cell_line

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from simranks import script as S  # noqa: E402


def test_rank_selectors_and_the_steps_each_rank_runs() -> None:
    assert S.parse_ranks("0-3,8") == frozenset({0, 1, 2, 3, 8}) and S.parse_ranks(5) == frozenset({5}) and S.parse_ranks([1, 2]) == frozenset({1, 2})
    src = 'sim.error("ValueError", "boom", ranks=[517])\nsim.collective("all_reduce", 3, skip="517")\nsim.buffer(1 << 20)'
    script = S.parse(src)
    assert [s.kind for s in script.for_rank(517)] == ["error", "buffer"]
    assert [s.kind for s in script.for_rank(3)] == ["collective", "buffer"]
    assert script.for_rank(3)[1].args == (1 << 20,) and S.parse("7").steps[0] == S.Step("value", (7,), line=1)


def test_the_stack_a_rank_reports_reads_as_a_worker_s() -> None:
    script = S.parse('sim.print(2)\nsim.collective("all_reduce", 3)')
    text = S.stack_text(script, "<ddp-cell-4>", 2, True)
    assert last_cell_line(text) == 'cell line 2: sim.collective("all_reduce", 3)'  # what the policy reads from a real rank's stack
    assert S.stack_text(script, "<ddp-cell-4>", 2, False) == "(idle)\n"


@pytest.mark.parametrize("src", ["x = 1", "import torch", "print(1)", "sim.sleep(t)"])
def test_what_the_simulator_cannot_run_is_named(src: str) -> None:
    with pytest.raises(S.ScriptError, match="simulat|literal"):
        S.parse(src)
