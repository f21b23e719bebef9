"""Unit tests of the plain-Python pieces: no kernel, no worker processes."""
from __future__ import annotations

from ddp_magic.errors import CellError, RankFailure, describe_exit


# ---------------------------------------------------------------- errors
def test_describe_exit():
    assert describe_exit(3) == "exited with code 3"
    assert "SIGSEGV" in describe_exit(-11) and "SIGKILL" in describe_exit(-9)


def test_cell_error_renders_root_cause_first_and_groups_the_same():
    err = CellError(
        [
            RankFailure(rank=1, kind="error", type="ValueError", message="bad", traceback="Traceback...\nValueError: bad"),
            RankFailure(rank=2, kind="error", type="ValueError", message="bad"),
            RankFailure(rank=3, kind="error", type="ValueError", message="bad"),
        ]
    )
    text = str(err)
    assert text.startswith("rank 1 raised ValueError: bad") and "ranks 2, 3 failed the same way" in text
    assert err.ranks == [1, 2, 3]
    assert err._render_traceback_()[0].startswith("CellError: rank 1")
