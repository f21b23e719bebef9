"""Every rank's whole output kept per cell (ddp_magic.kernel.output.output_log): what %ddp output --rank N reads back."""
from __future__ import annotations

import os
import stat

import pytest

from ddp_magic.kernel import Listener
from ddp_magic.kernel.output.output_log import OutputLog


class Seen(Listener):
    def __init__(self) -> None:
        self.got: list = []

    def on_output(self, rank: int, stream: str, text: str) -> None:
        self.got.append((rank, stream, text))


def test_each_rank_s_output_comes_back_whole_in_order_with_its_streams():
    log = OutputLog()
    for _run in (1, 2):  # the same cell run again: its old output is replaced
        seen = Seen()
        tap = log.tap(seen, "12")
        for i in range(300):
            for r in range(3):
                tap.on_output(r, "stdout", f"rank {r} step {i}\n")
            tap.on_output(1, "stderr", f"warn {i}\n")
        tap.on_output(2, "stdout", "ünïcode, no newline")
        assert len(seen.got) == 300 * 4 + 1, "the front end hears everything as before"
        assert log.pieces(0) == [("stdout", f"rank 0 step {i}\n") for i in range(300)]
        assert "".join(t for s, t in log.pieces(1, "12") if s == "stderr") == "".join(f"warn {i}\n" for i in range(300))
        assert log.pieces(2)[-1] == ("stdout", "ünïcode, no newline")
        assert log.ranks("12")[0] == sum(len(f"rank 0 step {i}\n") for i in range(300))
    fd = log._cells["12"].file.fileno()
    assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o600 and os.fstat(fd).st_nlink == 0, "this user's only, and in no folder"


def test_only_the_last_cells_are_kept_and_an_unknown_cell_names_the_kept_ones():
    log = OutputLog(keep=3)
    with pytest.raises(KeyError, match="no %%ddp cell has run yet"):
        log.pieces(0)
    for n in range(1, 6):
        log.tap(Listener(), str(n)).on_output(0, "stdout", f"cell {n}\n")
    assert log.pieces(0) == [("stdout", "cell 5\n")] and log.pieces(0, "3") == [("stdout", "cell 3\n")]
    with pytest.raises(KeyError, match=r"no output kept for cell 1: the cells kept are 3, 4, 5 \(the last 3\)"):
        log.pieces(0, "1")
    assert list(log._cells) == ["3", "4", "5"], "older cells' files are closed (freed)"
    assert log.pieces(7) == [], "a rank that printed nothing"
