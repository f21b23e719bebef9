"""The tests' own rules: no upper bound on wall time in a test.

On a loaded two-core machine a test that asserts ``took < 8`` fails when nothing is wrong. A test asserts the order of
events instead; where a time is the product's promise (a lost node named within 15 s), one generous bound (3x the
promise) stays, with the promise in a ``# promise:`` comment on its line. The figures themselves are bench/'s.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Callable, Iterator, List, Set, Tuple

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = (ROOT / "tests", ROOT / "labextension" / "ui-tests")
CLOCKS = {"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns"}  # time.<clock>()
# a name that holds a duration, by its name (a helper's return value: ``text, took = _during(...)``)
TIMING_NAME = re.compile(r"(^|_)(took|elapsed|duration|wall|spent)(_|$)", re.I)
PROMISE = "# promise:"


def _clock_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CLOCKS and \
        isinstance(node.func.value, ast.Name) and node.func.value.id == "time"


def _name(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _assigned(tree: ast.AST, what: Callable[[ast.AST], bool]) -> Set[str]:
    """Names assigned a value of which some part is ``what``, in this file."""
    out: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and any(what(n) for n in ast.walk(node.value)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out.update(_name(t) for t in targets if _name(t))
    return out


def _timed_names(tree: ast.AST) -> Set[str]:
    """Names that hold a duration: a clock reading minus another (``took = time.monotonic() - t0``, ``front.arrival(r) -
    t_sent`` where ``t_sent = time.monotonic()``)."""
    instants = _assigned(tree, _clock_call)

    def reading(n: ast.AST) -> bool:
        return _clock_call(n) or isinstance(n, ast.Name) and n.id in instants

    def difference(n: ast.AST) -> bool:
        return isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub) and any(reading(m) for m in ast.walk(n))

    return _assigned(tree, difference) | {"<instant>:" + i for i in instants}


def _is_timing(node: ast.AST, timed: Set[str]) -> bool:
    """Whether an expression is a measured duration: a clock difference, or a name that holds one."""
    if isinstance(node, ast.Call) and _name(node.func) == "abs":
        return False  # |a - b| < eps: two readings of one duration agree (a precision), not a bound on it
    for n in ast.walk(node):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub) and any(
                _clock_call(m) or isinstance(m, ast.Name) and "<instant>:" + m.id in timed for m in ast.walk(n)):
            return True
        name = _name(n) if isinstance(n, (ast.Name, ast.Attribute)) else ""
        if name and (name in timed or TIMING_NAME.search(name)) and not name.isupper():
            return True
    return False


def _figure(node: ast.AST, constants: Set[str]) -> bool:
    """Whether an expression is a fixed figure: numbers, CONSTANTS (``liveness.SILENCE_S``) and names given a number in
    this file, and arithmetic on them. A value the product or the test measured is not one: ``freed - seen <= ran``
    (the product's clock counts at least what the test saw pass) is an order of events, not a bound."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float))
    if isinstance(node, ast.Name):
        return node.id.isupper() or node.id in constants
    if isinstance(node, ast.Attribute):
        return node.attr.isupper()
    if isinstance(node, ast.UnaryOp):
        return _figure(node.operand, constants)
    if isinstance(node, ast.BinOp):
        return _figure(node.left, constants) and _figure(node.right, constants)
    return False


def _bounds(tree: ast.AST, timed: Set[str]) -> Iterator[ast.Assert]:
    """Asserts that bound a measured duration from above by a fixed figure."""
    constants = {_name(t) for n in ast.walk(tree) if isinstance(n, ast.Assign) and _figure(n.value, set()) for t in n.targets}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assert):
            continue
        for cmp in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
            sides = [cmp.left, *cmp.comparators]
            for i, op in enumerate(cmp.ops):
                low, high = sides[i], sides[i + 1]
                if isinstance(op, (ast.Gt, ast.GtE)):
                    low, high = high, low
                elif not isinstance(op, (ast.Lt, ast.LtE)):
                    continue
                if _is_timing(low, timed) and _figure(high, constants):
                    yield node
                    break


def unguarded(path: Path) -> List[Tuple[int, str]]:
    """(line, text) of each wall-time upper bound in ``path`` without a ``# promise:`` comment on one of its lines."""
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    timed = _timed_names(tree)
    out = []
    for node in _bounds(tree, timed):
        span = lines[node.lineno - 1: (node.end_lineno or node.lineno)]
        if not any(PROMISE in ln for ln in span):
            out.append((node.lineno, lines[node.lineno - 1].strip()))
    return sorted(set(out))


def _test_files() -> Iterator[Path]:
    for folder in FOLDERS:
        yield from sorted(folder.rglob("*.py"))


def test_no_wall_time_upper_bound_without_a_promise() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {code}" for path in _test_files() for line, code in unguarded(path)]
    assert not found, ("upper bounds on wall time (they fail on a loaded machine when nothing is wrong): assert the order of "
                       "events instead, or, where the time is the product's promise, bound it at 3x the promise with a "
                       "'# promise: ...' comment on the line; the figure goes to bench/:\n" + "\n".join(found))


def test_the_scan_finds_the_bounds_it_forbids(tmp_path: Path) -> None:
    """The scan itself: each way a bound was written in this suite is found, and the allowed ones are not."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import time\n"
        "t0 = time.monotonic()\n"
        "took = time.monotonic() - t0\n"
        "assert took < 8\n"
        "assert 2 <= took < 7\n"
        "assert time.monotonic() - t0 < 3.0, 'x'\n"
        "assert ex.error is not None and took < 15\n"
        "assert 30 > elapsed\n"
        "assert (\n    wall_s\n    < 4 * LIMIT\n)\n"
        "t_sent = time.monotonic()\n"
        "assert front.arrival(rid) - t_sent < 2.0\n"
        "assert took < 45  # promise: named within 15 s\n"
        "assert took >= 2\n"
        "assert warm_s < cold_s / 2\n"
        "assert took == 3\n"
        "assert abs(shown - elapsed) < 0.01\n"
        "seen = time.monotonic()\n"
        "assert freed - seen <= ran <= ended - seen\n"
    )
    assert [line for line, _ in unguarded(sample)] == [4, 5, 6, 7, 8, 9, 14]
