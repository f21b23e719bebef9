"""Cell values in the kernel: unpacking (inline and fetched after DECIDE), the gather decision, and how RankResults prints."""
from __future__ import annotations

import pickle
from typing import Any, Dict, List, Optional

import pytest

from ddp_magic.errors import RankFailure
from ddp_magic.kernel.results import gather as results
from ddp_magic.kernel.ranks import RankInfo
from ddp_magic.states import FailureKind, RankState
from ddp_magic.wire import protocol as P
from ddp_magic.wire import transfer

GARBAGE = {"pickle": b"not a pickle", "buffers": []}


def packed(value: Any) -> dict:
    return {"pickle": pickle.dumps(value), "buffers": []}


def test_inline_values_are_unpacked_in_rank_order():
    done = {1: {"status": "ok", "result": packed("b")}, 0: {"status": "ok", "result": packed("a")}}
    notes: List[str] = []
    assert results.cell_values(3, done, {}, notes) == ["a", "b", None] and notes == []


def test_an_unpicklable_result_becomes_unpicklable_inline_and_fetched():
    """Both ways a value arrives behave the same: the other ranks' values survive, with a note."""
    for done, fetched in (
        ({0: {"result": GARBAGE}, 1: {"result": packed(1)}}, {}),
        ({0: {"pending": {"shape": [1]}, "result": None}, 1: {"result": packed(1)}}, {0: {"result": GARBAGE}}),
    ):
        notes: List[str] = []
        values = results.cell_values(2, done, fetched, notes)
        assert isinstance(values[0], transfer.Unpicklable) and values[0].rank == 0 and values[1] == 1
        assert len(notes) == 1 and "rank 0 could not be unpickled in the kernel" in notes[0]


def test_the_same_plain_value_from_many_ranks_is_unpickled_once_and_a_mutable_one_for_each(monkeypatch):
    """1,024 ranks returning ``1`` cost one unpickle; a list each rank may change stays each rank's own object."""
    calls: List[dict] = []
    real = transfer.unpack
    monkeypatch.setattr(transfer, "unpack", lambda p: calls.append(p) or real(p))
    big = 10**30  # not one of Python's cached small ints: the sharing is ours
    done = {r: {"status": "ok", "result": packed(big if r < 3 else "s")} for r in range(5)}
    values = results.cell_values(5, done, {}, [])
    assert values == [big] * 3 + ["s"] * 2 and len(calls) == 2 and values[0] is values[2]
    calls.clear()
    lists = results.cell_values(3, {r: {"status": "ok", "result": packed([1])} for r in range(3)}, {}, [])
    assert lists == [[1]] * 3 and len(calls) == 3 and len({id(v) for v in lists}) == 3
    calls.clear()
    notes: List[str] = []
    bad = results.cell_values(2, {r: {"result": GARBAGE} for r in range(2)}, {}, notes)
    assert [v.rank for v in bad] == [0, 1] and len(notes) == 2 and len(calls) == 2  # each failure named, as before


def test_a_result_the_rank_could_not_pickle_is_named_inline_and_fetched():
    err = {"type": "mod.Thing", "reason": "TypeError: no"}
    for done, fetched in (({1: {"result": None, "result_error": err}}, {}), ({1: {"pending": {"x": 1}}}, {1: {"result": None, "result_error": err}})):
        notes: List[str] = []
        values = results.cell_values(2, done, fetched, notes)
        assert isinstance(values[1], transfer.Unpicklable) and values[1].type_name == "mod.Thing"
        assert notes == ["rank 1's result (mod.Thing) could not be pickled: TypeError: no; the other ranks' results are returned"]


def test_a_gathered_result_fills_every_rank_from_rank_0():
    done = {r: {"pending": {"shape": [2]}} for r in range(3)}
    fetched = {1: {"gathered": True, "result": None}, 0: {"gathered": True, "result": packed(["x", "y", "z"])}, 2: {"gathered": True, "result": None}}
    assert results.cell_values(3, done, fetched, []) == ["x", "y", "z"]


def test_a_gathered_result_that_cannot_be_unpickled_leaves_a_stand_in_per_rank():
    done = {r: {"pending": {"shape": [2]}} for r in range(2)}
    notes: List[str] = []
    values = results.cell_values(2, done, {0: {"gathered": True, "result": GARBAGE}, 1: {"gathered": True, "result": None}}, notes)
    assert [v.rank for v in values] == [0, 1] and all(isinstance(v, transfer.Unpicklable) for v in values)
    assert len(notes) == 1


def test_a_failed_gather_is_a_note_and_the_values_come_rank_by_rank():
    done = {r: {"pending": {"shape": [1]}} for r in range(2)}
    fetched = {r: {"gather_failed": "RuntimeError: x", "result": packed(r * 10)} for r in range(2)}
    notes: List[str] = []
    assert results.cell_values(2, done, fetched, notes) == [0, 10]
    assert notes[0].startswith("all_gather of the results failed on rank 0 (RuntimeError: x)")


def test_gather_only_when_every_rank_has_the_same_pending_shape_and_none_failed():
    same = {0: {"shape": [2]}, 1: {"shape": [2]}}
    assert results.gather_mode(same, [], 2) == "gather"
    assert results.gather_mode(same, [], 3) == "send"  # a rank returned no tensor
    assert results.gather_mode({0: {"shape": [2]}, 1: {"shape": [3]}}, [], 2) == "send"
    assert results.gather_mode(same, [RankFailure(rank=2, kind=FailureKind.ERROR)], 2) == "send"
    assert results.pending_results({0: {"pending": {"s": 1}}, 1: {"pending": None}, 2: {}}) == {0: {"s": 1}}


class FakeHub:
    """What fetch_pending reads of the hub: a rank answers DECIDE, another dies first."""

    def __init__(self) -> None:
        self.ranks = {r: RankInfo(rank=r, state=RankState.DONE) for r in range(3)}
        self.done: Dict[int, dict] = {0: {"pending": {"s": 1}}, 1: {"pending": {"s": 1}}, 2: {}}
        self.results: Dict[int, dict] = {}
        self.sent: List[tuple] = []

    def broadcast(self, msg: dict, ranks: Optional[List[int]] = None) -> None:
        self.sent.append((msg["op"], msg.get("mode"), ranks))

    def pump(self, until: Any, deadline: Optional[float], tick: Any = None, due: Any = None) -> bool:
        self.results[0] = {"result": packed("v")}
        self.ranks[1].state = RankState.DEAD
        return until()

    def death_failure(self, rank: int) -> RankFailure:
        return RankFailure(rank=rank, kind=FailureKind.DIED)


def test_fetch_pending_decides_once_and_counts_a_rank_that_died_first():
    hub = FakeHub()
    failures: List[RankFailure] = []
    fetched = results.fetch_pending(hub, failures, 5.0)  # type: ignore[arg-type]
    assert hub.sent == [(P.DECIDE, "send", [0, 1])]  # rank 2 returned no tensor: no gather
    assert fetched == {0: {"result": packed("v")}} and [(f.rank, f.kind) for f in failures] == [(1, FailureKind.DIED)]


# ------------------------------------------------------------------ RankResults: how the cell's value prints
def _pretty(value: Any, width: int = 79) -> str:
    from IPython.lib.pretty import pretty

    return pretty(value, max_width=width)


def _entries(text: str) -> Dict[int, str]:
    """rank -> its value's text, continuation lines un-indented: what a person reads for each rank."""
    out: Dict[int, List[str]] = {}
    rank = -1
    for line in text.splitlines()[1:]:
        if line.startswith("  ["):
            rank = int(line[3:line.index("]")])
            out[rank] = [line[line.index("]") + 2:]]
        else:
            pad = len(f"  [{rank}] ")
            assert line[:pad].strip() == "", f"a continuation line is not under its value: {line!r}"
            out[rank].append(line[pad:])
    return {r: "\n".join(lines) for r, lines in out.items()}


VALUES = [
    (10, 2.0),
    {"loss": 0.25, "names": ["a" * 30, "b" * 30, "c" * 30]},
    "a string that is long enough " * 4,
    [1.0, 3.0, 5.0],
]


@pytest.mark.parametrize("value", VALUES, ids=["tuple", "dict", "long str", "list"])
def test_every_rank_s_value_prints_the_same_way(value: Any) -> None:
    """Was: '[0] (10,' / '2.0)' but '[1] (10, 2.0)'. Each rank's value is the value printed alone."""
    from ddp_magic.ui.results import RankResults

    results = RankResults([value, value, value])
    for text, alone in ((_pretty(results), _pretty(value, 79 - len("  [0] "))), (repr(results), repr(value))):
        entries = _entries(text)
        assert sorted(entries) == [0, 1, 2] and text.splitlines()[0] == "RankResults(3 ranks):"
        assert entries[0] == entries[1] == entries[2] == alone, text


def test_tensors_print_alike_with_their_rows_under_the_first():
    import torch

    from ddp_magic.ui.results import RankResults

    t = torch.arange(12.0).reshape(3, 4)
    for text in (_pretty(RankResults([t, t])), repr(RankResults([t, t]))):
        entries = _entries(text)
        assert entries[0] == entries[1] == repr(t), text
        assert len(text.splitlines()) == 1 + 2 * 3  # three rows per rank
    assert repr(RankResults([None])) == "RankResults(1 rank):\n  [0] None"


def test_scalars_formatted_once_for_all_ranks_still_print_as_each_alone():
    """Equal scalars share one formatting (a thousand ranks' ``1``); values that compare equal but print apart do not."""
    from ddp_magic.ui.results import RankResults

    values = [1, True, 1.0, -0.0, 0.0, float("nan"), "1", b"1", None, 1, 2 ** 70, -0.0]
    results = RankResults(values)
    for text, show in ((_pretty(results), lambda v: _pretty(v, 79 - len("  [10] "))), (repr(results), repr)):
        entries = _entries(text)
        assert [entries[r] for r in range(len(values))] == [show(v) for v in values], text
    assert _entries(repr(results))[3] == "-0.0" and _entries(repr(results))[4] == "0.0" and _entries(repr(results))[1] == "True"


def test_a_multi_line_value_s_continuations_stay_under_it_for_ranks_past_9():
    from ddp_magic.ui.results import RankResults

    class Two:
        def __repr__(self) -> str:
            return "first\nsecond"

    text = repr(RankResults([Two()] * 11))
    assert "\n  [10] first\n       second" in text and "\n  [9] first\n      second" in text


def test_running_cell_reads_the_prompt_and_the_body_s_first_editor_line():
    """IPython 9 has counted the next cell up while this one runs: the running cell's own result has its number."""
    from types import SimpleNamespace as NS

    from ddp_magic.ui.results import running_cell

    def shell(count: int, raw: Optional[str], shown: int) -> Any:
        result = None if raw is None else NS(execution_count=shown, info=NS(raw_cell=raw))
        return NS(execution_count=count, displayhook=NS(exec_result=result))

    assert running_cell(shell(5, "%%ddp -n 2\nx = 1", 4)) == (4, 2)
    assert running_cell(shell(5, "%%time\n%%ddp\nx = 1", 4)) == (4, 3)  # under another cell magic
    assert running_cell(shell(5, "get_ipython().run_cell_magic('ddp', '', 'x')", 4)) == (4, 1)  # no %%ddp line: the body's own lines
    assert running_cell(shell(7, None, 0)) == (7, 1)  # outside a cell: the shell's count
    assert running_cell(NS()) == (None, 1)
