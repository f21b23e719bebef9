"""Hang forensics and recovery texts, without processes: what the ranks answered in, the lines a user reads out."""
from __future__ import annotations

from ddp_magic.kernel.failures import forensics as F
from ddp_magic.kernel.failures.recovery import swap_notes
from ddp_magic.words import ranks_phrase


def c(op: str, seq: int = 12, shape=(4,), dtype: str = "float32", group: str = "default", ranks=None) -> dict:
    return {"op": op, "seq": seq, "shape": list(shape), "dtype": dtype, "group": group, "ranks": ranks, "waited": 3.0}


def test_ranks_phrase_names_runs_and_lists():
    assert ranks_phrase([3]) == "rank 3"
    assert ranks_phrase([2, 0]) == "ranks 0, 2"
    assert ranks_phrase([1, 0]) == "ranks 0-1"
    assert ranks_phrase([0, 1, 2]) == "ranks 0-2"
    assert ranks_phrase([0, 1, 3]) == "ranks 0-1, 3"
    assert ranks_phrase([0, 2, 3, 4, 5, 9]) == "ranks 0, 2-5, 9"


def test_a_rank_in_another_collective_is_a_mismatch():
    got = {0: c("all_reduce"), 1: c("all_reduce"), 2: c("all_reduce"), 3: c("broadcast")}
    assert F.verdicts(range(4), got, {}) == ["rank 3 is in broadcast #12 while ranks 0-2 are in all_reduce #12: mismatched collective"]


def test_a_rank_one_collective_ahead_is_a_mismatch_too():
    got = {0: c("all_reduce", 12), 1: c("all_reduce", 13)}
    assert F.verdicts(range(2), got, {}) == ["rank 1 is in all_reduce #13 while rank 0 is in all_reduce #12: mismatched collective"]


def test_ranks_that_never_arrived_are_named_with_where_they_are():
    got = {0: c("barrier", 3), 1: c("barrier", 3), 2: None, 3: None}
    where = {2: "raised", 3: "at cell line 2: time.sleep(60)"}
    assert F.verdicts(range(4), got, where) == ["ranks 2-3 never arrived at barrier #3 (rank 2 raised; rank 3 at cell line 2: time.sleep(60))"]


def test_a_sub_group_counts_only_its_own_ranks():
    got = {0: c("all_reduce", 2, group="group [0, 1]", ranks=[0, 1]), 1: None, 2: None, 3: None}
    assert F.verdicts(range(4), got, {}) == ["rank 1 never arrived at all_reduce #2 on group [0, 1]"]


def test_the_table_has_one_aligned_line_per_rank():
    lines = F.table([0, 1], {0: c("all_reduce", shape=(2, 3)), 1: None}, {0: "at cell line 4: dist.all_reduce(x)", 1: "raised"})
    assert lines[0].split() == ["rank", "collective", "tensor", "group", "where"]
    assert lines[1].split()[:5] == ["0", "all_reduce", "#12", "[2,", "3]"] and lines[1].endswith("at cell line 4: dist.all_reduce(x)")
    assert lines[2].split()[:4] == ["1", "-", "-", "-"] and lines[2].endswith("raised")
    assert lines[1].index("all_reduce") == lines[0].index("collective") == lines[2].index("-")  # aligned columns


def test_released_names_the_collective_and_the_line():
    got = {0: c("all_reduce"), 2: c("all_reduce"), 3: c("all_reduce")}
    where = {r: "at cell line 7: dist.all_reduce(x)" for r in (0, 2, 3)}
    assert F.released_text([0, 2, 3], got, where) == "ranks 0, 2-3 were in all_reduce #12 (at cell line 7: dist.all_reduce(x)) and were released"
    assert F.released_text([0], {0: None}, {}) == ""
    assert F.report([0, 1], {0: None, 1: None}, {}) == []


def test_objects_on_the_old_group_are_named_with_their_fix():
    replies = {0: {"swapped": ["model"], "stale": [["mesh2", "DeviceMesh"], ["net", "DDP"]]}, 1: {"swapped": ["model"], "stale": []}}
    assert swap_notes(replies) == [
        "DDP module model moved onto the new group (weights as they were)",
        "mesh2 (DeviceMesh) holds the old process group: make mesh2 again (init_device_mesh)",
        "net (DDP) holds the old process group: net = DDP(net.module)",
    ]


# ---------------------------------------------------------------- at scale: one row per place, not per rank
def test_the_table_groups_ranks_by_the_collective_they_are_in():
    n = 1024
    got = {r: c("all_reduce", 3 if r >= 512 else 4) for r in range(n)}
    got[517] = None
    where = {r: f"at cell line {2 if r < 512 else 3}: dist.all_reduce(x)" for r in range(n)}
    where[517] = "raised"
    lines = F.table(range(n), got, where)
    assert lines[0].split() == ["ranks", "collective", "tensor", "group", "where"]
    assert [ln.split("  ")[0] for ln in lines[1:]] == ["0-511", "512-516, 518-1023", "517"]
    assert "all_reduce #4" in lines[1] and "all_reduce #3" in lines[2] and lines[3].endswith("raised")
    assert lines[1].index("all_reduce") == lines[0].index("collective") == lines[3].index("-")  # aligned columns
    assert F.verdicts(range(n), got, where) == [
        "ranks 512-516, 518-1023 are in all_reduce #3 while ranks 0-511 are in all_reduce #4: mismatched collective",
        "rank 517 never arrived at all_reduce #4 (rank 517 raised)",  # #4 has the most ranks (512 to 511)
    ]
    assert F.released_text([r for r in range(n) if r != 517], got, where) == (
        "ranks 0-511 were in all_reduce #4, ranks 512-516, 518-1023 in all_reduce #3, and were released")


def test_a_table_of_many_places_is_capped_and_counts_the_rest():
    n = 1024
    got = {r: c("all_reduce", r) for r in range(n)}  # every rank in its own collective: the worst case
    lines = F.table(range(n), got, {})
    assert len(lines) == 1 + F.ROWS_SHOWN + 1
    assert lines[-1] == f"… and {n - F.ROWS_SHOWN} ranks in {n - F.ROWS_SHOWN} other places ({F.ROWS_SHOWN}-1023)"


def test_never_arrived_groups_the_ranks_by_where_they_are():
    got = {r: (c("barrier", 3) if r >= 8 else None) for r in range(1024)}
    where = {r: ("raised" if r == 5 else "at cell line 2: time.sleep(60)") for r in range(8)}
    assert F.verdicts(range(1024), got, where) == [
        "ranks 0-7 never arrived at barrier #3 (ranks 0-4, 6-7 at cell line 2: time.sleep(60); rank 5 raised)"]


def test_the_same_stack_is_said_once_with_its_ranks():
    stacks = {r: "(running the cell)\n  File \"<ddp-cell-2>\", line 3\n" for r in range(1024)}
    stacks[9] = "(running the cell)\n  File \"<ddp-cell-2>\", line 1\n"
    assert F.stacks_text(stacks) == [
        "--- ranks 0-8, 10-1023 ---\n(running the cell)\n  File \"<ddp-cell-2>\", line 3",
        "--- rank 9 ---\n(running the cell)\n  File \"<ddp-cell-2>\", line 1",
    ]


def test_scattered_ranks_in_a_row_are_cut_after_a_few_runs():
    got = {r: c("all_reduce", 3 if r % 2 else 4) for r in range(1024)}  # odd ranks in #3, even ranks in #4
    lines = F.table(range(1024), got, {})
    assert [ln.split("  ")[0] for ln in lines[1:]] == ["0, 2, 4, 6, 8, 10, 12, 14 and 504 more", "1, 3, 5, 7, 9, 11, 13, 15 and 504 more"]


def test_ranks_a_death_released_are_said_in_our_words_with_their_collective_and_line():
    """Not gloo's "Connection closed by peer … GLHF!", but where each survivor was when the rank died."""
    tb = 'Traceback (most recent call last):\n  File "<ddp-cell-4>", line 6, in <module>\n    dist.all_reduce(x)\nRuntimeError: [gloo] …'
    assert F.released_by_death_text({0: (c("all_reduce", 1), tb)}, [1]) == (
        "rank 0 was in all_reduce #1 (at cell line 6: dist.all_reduce(x)) when rank 1 died, and was released")
    assert F.released_by_death_text({0: (c("all_reduce", 1), ""), 2: (c("barrier", 2), ""), 3: (None, "")}, [1, 4]) == (
        "rank 0 was in all_reduce #1, rank 2 in barrier #2 when ranks 1, 4 died, and were released; "
        "rank 3 was in a collective when ranks 1, 4 died, and was released")
    assert F.released_text([0, 2], {0: c("all_reduce", 1), 2: c("barrier", 2)}, {}) == "rank 0 was in all_reduce #1, rank 2 in barrier #2, and were released"
