"""What a simulated rank does in a cell: the cell's source read as a short script of ``sim.*`` calls.

A ``%%ddp`` cell on simulated ranks is plain Python (the kernel parses it and
looks for notebook names, as for any cell), made only of calls such as::

    sim.print(3)                                  # 3 lines, the same on every rank ("line 0" ...)
    sim.print(2, own=True)                        # "rank 5 line 0" ...: each rank its own lines
    sim.sleep(0.2)                                # an interrupt ends it with KeyboardInterrupt
    sim.error("ValueError", "boom", ranks=[517])  # the cell raises on rank 517
    sim.collective("all_reduce", 3)               # wait in all_reduce #3 until the kernel aborts the group
    sim.die(1, ranks="3")                         # the rank's "process" exits with code 1
    sim.log(step=0, loss=0.5)                     # a ddp_magic.log row (METRICS)
    sim.buffer(1 << 20)                           # the value: an array of that many bytes (tensor-like)
    7                                             # a literal last expression: the value

Every call takes ``ranks=`` (an int, a list, or "0-3,8") and ``skip=`` (the same)
to say which ranks do it. Pure: parsing only, no I/O; the rank (rank.py) runs it.
"""
from __future__ import annotations

import ast
import functools
import operator
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, List, Optional, Tuple

STEPS = ("print", "sleep", "error", "collective", "die", "log", "buffer", "value")
VALUE_STEPS = ("buffer", "value")


class ScriptError(ValueError):
    """The cell is not a simulator script; the message says what the simulator accepts."""


def parse_ranks(spec: Any) -> FrozenSet[int]:
    """``3``, ``[1, 2]`` or ``"0-3,8"`` as a set of ranks."""
    if isinstance(spec, int):
        return frozenset([spec])
    if isinstance(spec, (list, tuple, set, frozenset)):
        return frozenset(int(r) for r in spec)
    out = set()
    for part in str(spec).split(","):
        lo, _, hi = part.strip().partition("-")
        if lo:
            out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out)


@dataclass(frozen=True)
class Step:
    """One ``sim.*`` call: what, with which arguments, for which ranks, on which line of the cell."""

    kind: str
    args: Tuple[Any, ...] = ()
    kwargs: Tuple[Tuple[str, Any], ...] = ()
    line: int = 1
    ranks: Optional[FrozenSet[int]] = None  # None: every rank
    skip: FrozenSet[int] = frozenset()

    def applies(self, rank: int) -> bool:
        return (self.ranks is None or rank in self.ranks) and rank not in self.skip

    def kw(self) -> Dict[str, Any]:
        return dict(self.kwargs)


@dataclass(frozen=True)
class Script:
    """A parsed cell: its steps in order and its source lines (a rank's stack text quotes them)."""

    steps: Tuple[Step, ...]
    lines: Tuple[str, ...] = field(default=())

    def for_rank(self, rank: int) -> List[Step]:
        return [s for s in self.steps if s.applies(rank)]


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.LShift: operator.lshift, ast.Pow: operator.pow}


def _literal(node: ast.AST, source: str) -> Any:
    """A literal, or arithmetic on literals (``1 << 20``, ``64 * 1024``)."""
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_literal(node.left, source), _literal(node.right, source))
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise ScriptError(f"the simulator takes literal arguments only, not {ast.get_source_segment(source, node)!r}") from None


def _step(node: ast.expr, source: str) -> Step:
    """One statement's call (or a literal: the value) as a Step."""
    line = getattr(node, "lineno", 1)
    if not isinstance(node, ast.Call):
        return Step("value", (_literal(node, source),), line=line)
    func = node.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "sim" and func.attr in STEPS):
        raise ScriptError(f"line {line}: simulated ranks run sim.{{{', '.join(STEPS)}}}(...) calls only")
    kwargs = {k.arg: _literal(k.value, source) for k in node.keywords if k.arg}
    ranks = kwargs.pop("ranks", None)
    skip = kwargs.pop("skip", ())
    args = tuple(_literal(a, source) for a in node.args)
    return Step(func.attr, args, tuple(sorted(kwargs.items())), line, None if ranks is None else parse_ranks(ranks), parse_ranks(skip))


@functools.lru_cache(maxsize=64)
def parse(source: str) -> Script:
    """The cell's source as a Script; ScriptError names the first statement the simulator cannot run.
    Cached: the hundreds of ranks of a host process run the same cell, and a Script is immutable."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ScriptError(f"not Python: {e}") from None
    steps = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Expr):
            raise ScriptError(f"line {stmt.lineno}: the simulator runs expressions only (sim.* calls and a literal value)")
        steps.append(_step(stmt.value, source))
    return Script(tuple(steps), tuple(source.splitlines()))


def stack_text(script: Script, filename: str, line: int, running: bool) -> str:
    """A STACK reply's text as procs/worker.py writes it: the state, then the cell's frame at ``line``."""
    if not running:
        return "(idle)\n"
    code = script.lines[line - 1].strip() if 0 < line <= len(script.lines) else ""
    return f'(running the cell)\n  File "{filename}", line {line}, in <module>\n    {code}\n'


C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def stack_frames(script: Script, filename: str, line: int, collective: Optional[dict]) -> List[List[Any]]:
    """An on-demand STACK's frames as procs/rank_stacks.py sends them: the cell's frame at ``line``, and torch's
    collective function under it while the rank waits in one."""
    code = script.lines[line - 1].strip() if 0 < line <= len(script.lines) else ""
    frames: List[List[Any]] = [[filename, line, "<module>", code]]
    if collective is not None:
        frames.append([C10D, 3252, str(collective.get("op", "all_reduce")), "work.wait()"])
    return frames


def traceback_text(script: Script, filename: str, line: int, type_name: str, message: str) -> str:
    """A user's traceback as wire/execution.py formats one: the cell's frame, then the exception."""
    frame = stack_text(script, filename, line, True).split("\n", 1)[1]
    return f"Traceback (most recent call last):\n{frame}{type_name}: {message}\n"
