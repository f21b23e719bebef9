"""Running a cell's source the way IPython would: statements, then the last expression's value;
and what a failure looks like to the user (traceback text, errors as data).

Shared by the worker (which executes) and the kernel (which parses first, so a
syntax error never reaches a worker).
"""
from __future__ import annotations

import ast
import linecache
import os
import re
import traceback
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..words import ranks_phrase


def split_last_expression(source: str, filename: str) -> Tuple[ast.Module, Optional[ast.Expression]]:
    """Parse the cell; peel off a final bare expression (a trailing ';' only hides it, in the kernel)."""
    tree = ast.parse(source, filename=filename, mode="exec")
    last = None
    node = tree.body[-1] if tree.body else None
    if isinstance(node, ast.Expr):
        tree.body.pop()
        last = ast.Expression(body=node.value)
        ast.copy_location(last, node)
    return tree, last


def editor_lines(source: str, first_line: int) -> str:
    """The cell's source with its lines where the editor has them: body line k of a ``%%ddp`` cell is the editor's
    line k + 1, and tracebacks, the hang forensics' "cell line N" and syntax errors all read line numbers off it."""
    return "\n" * max(0, first_line - 1) + source


def remember_source(filename: str, source: str) -> None:
    """Make tracebacks show the cell's lines (linecache is what traceback reads)."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)


def run_source(source: str, filename: str, namespace: dict) -> Any:
    """Execute the cell in namespace; return the last expression's value (or None)."""
    tree, last = split_last_expression(source, filename)
    remember_source(filename, source)
    exec(compile(tree, filename, "exec"), namespace)
    if last is None:
        return None
    return eval(compile(last, filename, "eval"), namespace)


# ddp_magic's own frames (this runner, the worker's SIGINT handler, the patched
# init_process_group) are hidden from the user: every file under the package.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def format_user_traceback(exc: BaseException, cell_filename: str) -> str:
    """The traceback from the cell's first frame on, without ddp_magic's own frames.

    Our machinery (the runner above the cell, the SIGINT handler below it) is
    not the user's concern; library frames between cell frames stay.
    """
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != cell_filename:
        tb = tb.tb_next
    if tb is None:
        tb = exc.__traceback__
    te = traceback.TracebackException(type(exc), exc, tb)
    te.stack = traceback.StackSummary.from_list([f for f in te.stack if not os.path.abspath(f.filename).startswith(_PACKAGE_DIR)])
    return "".join(te.format())


def error_data(exc: BaseException, text: str) -> dict:
    """Errors cross processes as data (type name, message, traceback text), never as pickled exceptions:
    the kernel can always read them, whatever the rank had imported."""
    return {"type": type(exc).__name__, "message": str(exc), "traceback": text}


def syntax_error_text(err: SyntaxError) -> str:
    """A short description of a syntax error in a cell, with the offending line."""
    line = (err.text or "").rstrip("\n")
    caret = ""
    if line and err.offset:
        caret = "\n    " + " " * (err.offset - 1 - (len(line) - len(line.lstrip()))) + "^"
    where = f"line {err.lineno}" if err.lineno else "the cell"
    hint = ""
    stripped = line.lstrip()
    if stripped.startswith(("%", "!")):
        hint = "\nIPython magics and ! shell commands do not run on the workers; use plain Python in a %%ddp cell."
    return f"{err.msg} ({where})\n    {line.strip()}{caret}{hint}"


# ---------------------------------------------------------------- what the kernel shows of a traceback
_CELL_FRAME = re.compile(r'^(\s*)File "<ddp-cell-([^>]+)>", line (\d+),? in (.+)$', re.M)  # ", in": a traceback's; " in": faulthandler's


def name_cells(text: str, numbers: Mapping[str, Optional[int]]) -> str:
    """A traceback's frames in the cells named as IPython names its own: ``Cell In[10], line 5`` for ``<ddp-cell-L>``.

    ``numbers``: a cell label (the session's) -> the prompt number the front end shows for it (IPython's
    execution count); a label it lacks keeps its ``<ddp-cell-L>`` name."""

    def frame(m: "re.Match[str]") -> str:
        indent, label, line, func = m.groups()
        number = numbers.get(label)
        if number is None:
            return m.group(0)
        return f"{indent}Cell In[{number}], line {line}" + ("" if func == "<module>" else f", in {func}")

    return _CELL_FRAME.sub(frame, text)


def group_places(places: Mapping[int, str]) -> str:
    """Ranks at one place said once: {0: 'at cell line 5: f(x)', 2: 'at cell line 5: f(x)', 1: 'raised'} ->
    'ranks 0, 2 at cell line 5: f(x); rank 1 raised'."""
    by_place: Dict[str, List[int]] = {}
    for rank in sorted(places):
        by_place.setdefault(places[rank], []).append(rank)
    return "; ".join(f"{ranks_phrase(ranks)} {place}" for place, ranks in by_place.items())
