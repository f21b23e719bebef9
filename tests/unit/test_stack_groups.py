"""%ddp stacks' grouping and words (kernel/stack_groups.py): pure, over STACK answers as the ranks send them."""
from __future__ import annotations

from typing import Any, Dict, List

from ddp_magic.kernel.stack_groups import GROUPS_SHOWN, frame_text, group, native_text, render, summary

C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def _reply(frames: List[List[Any]], collective: Any = None, in_cell: bool = True) -> Dict[str, Any]:
    return {"threads": [{"name": "main", "main": True, "frames": frames}], "collective": collective, "in_cell": in_cell}


def _loop(rank: int, line: int = 7) -> Dict[str, Any]:
    return _reply([["<ddp-cell-3>", line, "<module>", "dist.all_reduce(t)"], [C10D, 3252, "all_reduce", "work.wait()"]],
                  {"op": "all_reduce", "seq": 12, "waited": 1.5})


def _slow(rank: int) -> Dict[str, Any]:
    return _reply([["<ddp-cell-3>", 6, "<module>", "slow_part()"], ["<ddp-cell-3>", 3, "slow_part", "time.sleep(8)"]])


def test_1024_ranks_in_one_loop_are_one_group_whatever_line_each_is_at() -> None:
    replies = {r: _loop(r, line=7 + r % 3) for r in range(1024)}
    assert group(replies) == [list(range(1024))]
    text = "\n".join(render(replies, {"3": 12}))
    assert text.splitlines()[0] == "--- ranks 0-1023 (1,024) ---"
    assert "Cell In[12], lines 7-9" in text and "torch/distributed/distributed_c10d.py:3252 in all_reduce" in text
    assert "in all_reduce #12" in text and summary(replies, 0.02).startswith("1024 ranks in 1 stack")


def test_the_odd_rank_out_comes_first_with_its_own_stack() -> None:
    replies = {r: (_slow(r) if r == 7 else _loop(r)) for r in range(16)}
    lines = render(replies, {"3": 12})
    assert lines[0] == "--- rank 7 ---"
    assert "  Cell In[12], line 3, in slow_part" in lines
    assert "--- ranks 0-6, 8-15 (15) ---" in lines
    assert lines.index("--- ranks 0-6, 8-15 (15) ---") > lines.index("--- rank 7 ---")


def test_1024_simulated_ranks_in_a_few_places_are_a_few_groups() -> None:
    replies = {r: (_slow(r) if r % 256 == 5 else _reply([], in_cell=False) if r >= 1000 else _loop(r)) for r in range(1024)}
    groups = group(replies)
    assert [len(g) for g in groups] == [4, 24, 996]
    text = "\n".join(render(replies, {}))
    assert "--- ranks 5, 261, 517, 773 (4) ---" in text and "(idle: between cells)" in text
    assert "<ddp-cell-3>, line 6" in text  # a cell whose prompt number is not known keeps its own name


def test_many_different_stacks_are_cut_with_their_ranks_counted() -> None:
    replies = {r: _reply([[f"/src/f{r}.py", 1, f"fn{r}", ""]]) for r in range(40)}
    lines = render(replies, {})
    assert sum(ln.startswith("--- rank ") for ln in lines) == GROUPS_SHOWN
    assert lines[-1].startswith(f"--- and 28 ranks in {40 - GROUPS_SHOWN} other stacks")


def test_unanswered_and_absent_ranks_are_said_and_faulthandler_text_is_shown() -> None:
    replies = {0: {"text": 'Thread 0x1 (most recent call first):\n  File "x.py", line 3 in f', "collective": None}}
    text = "\n".join(render(replies, {}, unanswered=[1, 2], absent=[3], timeout=2.0))
    assert "--- ranks 1-2 (2): no answer within 2 s ---" in text and "--- rank 3: not connected" in text
    assert 'File "x.py", line 3 in f' in text


def test_all_threads_are_headed_by_name() -> None:
    two = {"threads": [{"name": "main", "main": True, "frames": []}, {"name": "loader", "main": False, "frames": [["/q.py", 9, "get", "x"]]}]}
    text = "\n".join(render({0: two, 1: two}, {}))
    assert "  thread main:\n    (idle: between cells)\n  thread loader:\n    /q.py:9 in get\n      x" in text


def test_frame_names() -> None:
    assert frame_text(["<ddp-cell-4>", 2, "<module>", ""], [2], {"4": 9}) == "Cell In[9], line 2"
    assert frame_text(["/usr/lib/python3.11/threading.py", 320, "wait", ""], [320, 324], {}) == "threading.py:320-324 in wait"


def test_native_frames_name_cells_as_our_frames_do() -> None:
    dump = ("Thread 4242 (active): \"MainThread\"\n    __libc_recv (libc.so.6)\n    slow_part (<ddp-cell-2>:5)\n"
            "    <module> (<ddp-cell-2>:9)\n    run (<ddp-cell-7>:1)\n")
    text = native_text(dump, {"2": 3})
    assert "slow_part (Cell In[3], line 5)" in text and "<module> (Cell In[3], line 9)" in text
    assert "run (<ddp-cell-7>:1)" in text and "__libc_recv (libc.so.6)" in text  # a cell the notebook did not number keeps its name
