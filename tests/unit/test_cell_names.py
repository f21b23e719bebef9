"""What a rank's traceback looks like in the notebook (wire/execution.py, ui/results.CellNumbers): cells named as
IPython names its own (``Cell In[10], line 5``), IPython's colours, and ranks at one place said once."""
from __future__ import annotations

from ddp_magic.errors import RankFailure, colour_traceback
from ddp_magic.states import FailureKind
from ddp_magic.ui.results import CellNumbers
from ddp_magic.wire.execution import format_user_traceback, group_places, name_cells, remember_source, run_source

TB = '''Traceback (most recent call last):
  File "<ddp-cell-3>", line 5, in <module>
    f()
  File "<ddp-cell-2>", line 2, in f
    1/0
ZeroDivisionError: division by zero'''


def test_cells_are_named_by_their_prompt_number():
    named = name_cells(TB, {"3": 10, "2": 9})
    assert '  Cell In[10], line 5\n    f()\n  Cell In[9], line 2, in f\n' in named
    assert name_cells(TB, {"3": 10}).count("<ddp-cell-2>") == 1, "a cell the kernel has no number for keeps its name"


def test_a_real_traceback_named_and_coloured():
    src = "def f():\n    return 1/0\nf()\n"
    try:
        run_source(src, "<ddp-cell-7>", {})
    except ZeroDivisionError as e:
        text = format_user_traceback(e, "<ddp-cell-7>")
    remember_source("<ddp-cell-7>", src)
    named = name_cells(text, {"7": 12})
    assert "Cell In[12], line 3" in named and "Cell In[12], line 2, in f" in named and "<ddp-cell" not in named
    coloured = colour_traceback(named)
    assert "\x1b[96mCell\x1b[39m \x1b[32mIn[12], line 3\x1b[39m" in coloured  # IPython 9's colours
    assert "\x1b[91mZeroDivisionError\x1b[39m: division by zero" in coloured


def test_the_magic_renames_failures_and_notes_with_the_execution_count():
    numbers = CellNumbers()
    numbers.name("2", 9, [], [])
    failure = RankFailure(rank=1, kind=FailureKind.ERROR, type="ZeroDivisionError", message="division by zero", traceback=TB)
    notes = numbers.name("3", 10, [failure], ['--- rank 0 ---\n  File "<ddp-cell-3>", line 5, in <module>'])
    assert "Cell In[10], line 5" in failure.traceback and "Cell In[9], line 2, in f" in failure.traceback
    assert notes == ["--- rank 0 ---\n  Cell In[10], line 5"]


def test_ranks_at_one_place_are_said_once():
    at5 = "at cell line 5: dist.all_reduce(x)"
    places = {0: at5, 2: at5, 3: at5, 1: "raised"}
    assert group_places(places) == "ranks 0, 2-3 at cell line 5: dist.all_reduce(x); rank 1 raised"
    assert group_places({4: "at an unknown place"}) == "rank 4 at an unknown place"
