"""Running a cell's source as IPython would, and the traceback a user sees: the cell's own
frames and library frames, never ddp_magic's machinery."""
from __future__ import annotations

import os

import pytest

import ddp_magic
from ddp_magic.wire.execution import editor_lines, format_user_traceback, run_source, syntax_error_text


def test_last_expression_value_and_traceback_points_at_cell():
    ns: dict = {}
    assert run_source("a = 2\na * 21", "<ddp-cell-t>", ns) == 42
    with pytest.raises(ZeroDivisionError) as info:
        run_source("x = 1\n1 / 0", "<ddp-cell-u>", ns)
    text = format_user_traceback(info.value, "<ddp-cell-u>")
    assert 'File "<ddp-cell-u>", line 2' in text and "1 / 0" in text and "execution.py" not in text


def test_frames_from_anywhere_in_the_package_are_hidden():
    """The rank's SIGINT handler lives in procs/, not beside the runner: it must stay hidden too."""
    handler = os.path.join(os.path.dirname(ddp_magic.__file__), "procs", "worker.py")
    ns: dict = {}
    exec(compile("def _on_sigint():\n    raise KeyboardInterrupt\n", handler, "exec"), ns)
    with pytest.raises(KeyboardInterrupt) as info:
        run_source("import time\n_on_sigint()", "<ddp-cell-i>", ns)
    text = format_user_traceback(info.value, "<ddp-cell-i>")
    assert 'File "<ddp-cell-i>", line 2' in text and "procs" not in text and "KeyboardInterrupt" in text


def test_a_trailing_statement_returns_nothing():
    assert run_source("a = 1\nif a:\n    b = 2\n", "<ddp-cell-s>", {}) is None


def test_syntax_error_text_is_short_with_a_caret():
    try:
        compile("x = (\n", "<c>", "exec")
    except SyntaxError as e:
        text = syntax_error_text(e)
    assert "line 1" in text and "^" in text


def test_syntax_error_text_explains_magics():
    try:
        compile("%time x = 1\n", "<c>", "exec")
    except SyntaxError as e:
        text = syntax_error_text(e)
    assert "magics" in text


def test_editor_lines_number_the_body_as_the_editor_does():
    """Body line k of a %%ddp cell is the editor's line k + 1: the traceback names line 3 for the body's 1 / 0 on line 2."""
    body = "x = 1\n1 / 0"
    with pytest.raises(ZeroDivisionError) as info:
        run_source(editor_lines(body, 2), "<ddp-cell-e>", {})
    text = format_user_traceback(info.value, "<ddp-cell-e>")
    assert 'File "<ddp-cell-e>", line 3' in text and "1 / 0" in text, text
    assert run_source(editor_lines("a = 2\na * 21", 2), "<ddp-cell-v>", {}) == 42  # the last expression still comes back
    assert editor_lines(body, 1) == body  # no %%ddp line above it: its own numbering
    for first_line in (2, 3):  # below a %%ddp line, or below %%time and %%ddp
        try:
            compile(editor_lines("for i in range(3)\n    pass", first_line), "<c>", "exec")
        except SyntaxError as e:
            assert f"(line {first_line})" in syntax_error_text(e)
