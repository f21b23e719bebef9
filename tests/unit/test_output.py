"""Rank-attributed output (ddp_magic.ui.output): prefixes, partial lines, progress bars, --ranks."""
from __future__ import annotations

import io

import pytest

from ddp_magic.ui.output import RankPrinter, parse_ranks


def _printer(**kw):
    out, err = io.StringIO(), io.StringIO()
    return RankPrinter(streams={"stdout": lambda: out, "stderr": lambda: err}, **kw), out, err


def test_lines_are_prefixed_and_partials_wait_for_their_end():
    p, out, _ = _printer()
    p.feed(0, "stdout", "hel")
    p.feed(1, "stdout", "world\n")
    p.feed(0, "stdout", "lo\nnext")
    assert out.getvalue() == "[rank 1] world\n[rank 0] hello\n"
    p.flush()
    assert out.getvalue().endswith("[rank 0] next\n")


def test_carriage_return_progress_redraws_in_place():
    p, out, _ = _printer()
    for i in range(3):
        p.feed(0, "stdout", f"\r{i}/3")
    p.feed(0, "stdout", "\r3/3\n")
    text = out.getvalue()
    assert "[rank 0] 0/3\r" in text and "[rank 0] 3/3\n" in text
    assert "[rank 0] \r" not in text  # no empty prefixed redraws


def test_other_rank_does_not_overwrite_an_open_progress_line():
    p, out, _ = _printer()
    p.feed(0, "stdout", "\r50%\r")
    p.feed(1, "stdout", "log line\n")
    assert out.getvalue() == "[rank 0] 50%\r\n[rank 1] log line\n"


def test_rank_filter_and_ordered_mode():
    p, out, _ = _printer(ranks={1})
    p.feed(0, "stdout", "zero\n")
    p.feed(1, "stdout", "one\n")
    assert out.getvalue() == "[rank 1] one\n"
    p, out, _ = _printer(ordered=True)
    p.feed(1, "stdout", "b\n")
    p.feed(0, "stdout", "a\n")
    assert out.getvalue() == ""
    p.flush()
    assert out.getvalue() == "[rank 0] a\n[rank 1] b\n"


def test_endless_line_is_cut_not_held():
    p, out, _ = _printer()
    p.feed(0, "stdout", "x" * 200_000)
    assert len(out.getvalue()) > 100_000


@pytest.mark.parametrize("spec, want", [("0", {0}), ("0,2", {0, 2}), ("1-3", {1, 2, 3}), ("0, 2-3", {0, 2, 3})])
def test_parse_ranks(spec, want):
    assert parse_ranks(spec) == want


@pytest.mark.parametrize("spec", ["a", "3-1", "-1"])
def test_parse_ranks_rejects(spec):
    with pytest.raises(ValueError):
        parse_ranks(spec)
