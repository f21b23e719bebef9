"""Cell values in the kernel: unpacking (inline and fetched after DECIDE) and the gather decision."""
from __future__ import annotations

import pickle
from typing import Any, Dict, List, Optional

from ddp_magic.errors import RankFailure
from ddp_magic.kernel import results
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
