"""Which cells the exported script needs: the %%ddp cells, and the ordinary cells whose definitions they used.

Pure functions of the recorded history (export/record.py): no IPython, no
processes. A %%ddp cell needs the notebook names the session shipped to it;
each comes from the latest earlier ordinary cell that bound it, and that cell
in turn needs the notebook names it reads (a helper that calls another
helper), followed until nothing new is found. Names a %%ddp cell reads that
the workers owned come from the earlier %%ddp cell that assigned them. Cells
are taken whole, in execution order, so a seed set next to a tensor it makes
comes along. IPython syntax (``%magic``, ``!cmd``) cannot run in a script:
those lines are commented out and the cell is named in a warning.
"""
from __future__ import annotations

import ast
import builtins
import re
import symtable
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Set, Tuple

from ..wire.namespace import IPYTHON_NAMES, assigned_globals, used_globals
from .record import CellRecord, DdpRun, Shipped

# ddp_magic's own line magics: handled by the export itself, never a reason to warn.
OWN_MAGICS = ("%load_ext", "%reload_ext", "%ddp", "%ddp_env", "%ddp_export", "%%ddp")
_MAGIC_LINE = re.compile(r"^(\s*)(?:[\w.,\s\[\]()*]+=\s*)?([%!].*)$")
_READS_FILE = re.compile(
    r"\bopen\(|\bread_(csv|parquet|json|table|excel|pickle)\(|\btorch\.load\(|\bnp\.load|\bnumpy\.load|"
    r"\bloadtxt\(|\bload_dataset\(|\bfrom_pretrained\(|\bImage\.open\(|\bpickle\.load\("
)
_BUILTINS = frozenset(dir(builtins))


@dataclass(frozen=True)
class Cell:
    """One recorded cell as the export sees it: its Python text (magic lines commented out) and its names."""

    number: int
    kind: str  # "ddp", "ordinary" or "own" (only ddp_magic's magics: nothing to export)
    code: Optional[str]  # None: not Python a script can run (a cell magic, a syntax error)
    ok: bool = True
    magics: Tuple[str, ...] = ()  # the IPython commands it used, e.g. ("%timeit", "!ls")
    defines: FrozenSet[str] = frozenset()
    definitions: FrozenSet[str] = frozenset()  # the names bound by def, class or import
    magic_bound: FrozenSet[str] = frozenset()  # names bound from a magic (x = !ls): unexportable values
    uses: FrozenSet[str] = frozenset()
    late: FrozenSet[str] = frozenset()  # of uses, those read only inside functions: looked up when called, not when defined
    run: Optional[DdpRun] = None  # a %%ddp cell's last run on the pool


@dataclass
class Selection:
    """What goes into the script, and what the user must be told."""

    cells: List[Cell] = field(default_factory=list)  # execution order
    warnings: List[str] = field(default_factory=list)  # magics the script cannot reproduce, cells left out
    notes: List[str] = field(default_factory=list)  # where each shipped value comes from
    loads: List[Tuple[str, int]] = field(default_factory=list)  # (name, bytes): values to torch.save / torch.load

    @property
    def final(self) -> Optional[Cell]:
        ddp = [c for c in self.cells if c.kind == "ddp"]
        return ddp[-1] if ddp else None


def parse_cells(text: str) -> Set[int]:
    """``--cells`` as a set of cell numbers: ``3-9``, ``2,4-6``, ``5-`` (to the end), ``-4``."""
    out: Set[int] = set()
    for part in text.replace(" ", "").split(","):
        m = re.fullmatch(r"(\d*)-(\d*)|(\d+)", part)
        if not m or part == "-":
            raise ValueError(f"--cells {text!r}: give cell numbers as In [n] shows them, e.g. 3-9 or 2,4-6")
        if m.group(3):
            out.add(int(m.group(3)))
            continue
        lo, hi = int(m.group(1) or 1), int(m.group(2) or 1_000_000)
        if lo > hi:
            raise ValueError(f"--cells {text!r}: {lo}-{hi} is empty; give the lower number first")
        out.update(range(lo, hi + 1))
    return out


def _magic_name(command: str) -> str:
    """``%timeit`` for a magic; ``!ls`` for a shell command (env assignments skipped, a path cut to its name)."""
    if command.startswith("%"):
        return command.split()[0]
    words = [w for w in command.lstrip("!").split() if not re.fullmatch(r"\w+=\S*", w)] or ["sh"]
    return "!" + (words[0] if words[0].startswith("{") else words[0].split("/")[-1])


def _strip_magics(source: str) -> Tuple[str, List[str], Set[str]]:
    """The cell with IPython lines commented out (indentation kept); the magics used; names bound from a magic."""
    lines, magics, bound = [], [], set()
    for line in source.splitlines():
        m = _MAGIC_LINE.match(line)
        if not m or line.lstrip().startswith("#"):
            lines.append(line)
            continue
        magics.append(_magic_name(m.group(2)))
        lhs = line.split("=", 1)[0] if "=" in line.split(m.group(2), 1)[0] else ""
        bound.update(re.findall(r"[A-Za-z_]\w*", lhs))
        lines.append(f"{m.group(1)}pass  # IPython, not exported: {line.strip()}")
    return "\n".join(lines), magics, bound


def _definitions(code: str) -> Set[str]:
    names: Set[str] = set()
    for node in ast.parse(code).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def analyse(record: CellRecord) -> Cell:
    """What one recorded cell is, defines and uses."""
    text = record.source.strip("\n")
    first = text.lstrip().split("\n", 1)[0].strip()
    if record.runs:
        run = record.runs[-1]
        uses = _names(run.body, used_globals) | {s.name for s in run.shipped}
        try:
            body_defs = frozenset(_definitions(run.body))
        except SyntaxError:
            body_defs = frozenset()
        return Cell(record.number, "ddp", run.body, record.ok and run.ok, defines=_names(run.body, assigned_globals), definitions=body_defs,
                    uses=uses, run=run)
    if first.startswith("%%"):
        word = first.split()[0]
        kind = "own" if word == "%%ddp" else "ordinary"  # a %%ddp cell that never ran (a usage error)
        return Cell(record.number, kind, None, record.ok, magics=() if kind == "own" else (word,))
    code, magics, bound = _strip_magics(text)
    own = [m for m in magics if m.split()[0] in OWN_MAGICS]
    others = tuple(m for m in magics if m not in own)
    if not code.strip() or (own and not others and not _has_code(code)):
        return Cell(record.number, "own", None, record.ok)
    try:
        defs = _definitions(code)
    except SyntaxError:
        return Cell(record.number, "ordinary", None, record.ok, magics=others)
    uses = _names(code, used_globals)
    return Cell(record.number, "ordinary", code, record.ok, others, _names(code, assigned_globals), frozenset(defs), frozenset(bound),
                uses, uses & _late_names(code))


def _has_code(code: str) -> bool:
    return any(ln.strip() and not ln.strip().startswith(("#", "pass  # IPython")) for ln in code.splitlines())


def _names(code: str, which: object) -> FrozenSet[str]:
    try:
        found = which(code, "<cell>")  # type: ignore[operator]
    except SyntaxError:
        return frozenset()
    return frozenset(n for n in found if n not in IPYTHON_NAMES and n not in _BUILTINS and not n.startswith("__"))


def _late_names(code: str) -> Set[str]:
    """Globals read only inside function bodies (a class body runs at once; its methods do not)."""
    now: Set[str] = set()
    late: Set[str] = set()

    def walk(table: symtable.SymbolTable, deferred: bool) -> None:
        for sym in table.get_symbols():
            if sym.is_referenced() and (sym.is_global() or table.get_type() == "module"):
                (late if deferred else now).add(sym.get_name())
        for child in table.get_children():
            walk(child, deferred or child.get_type() == "function")

    walk(symtable.symtable(code, "<cell>", "exec"), False)
    return late - now


def _definer(cells: List[Cell], before: int, name: str, ddp: bool) -> Optional[int]:
    """The index of the latest cell before ``before`` that bound ``name`` (an ordinary cell, or a %%ddp one)."""
    for j in range(before - 1, -1, -1):
        c = cells[j]
        if not c.ok or (c.kind == "ddp") != ddp:
            continue
        if name in c.defines or name in c.magic_bound:
            return j
    return None


def select(records: List[CellRecord], wanted: Optional[Set[int]] = None) -> Selection:
    """The cells of the script (the %%ddp cells in ``wanted``, or all, and what they need), with warnings and notes."""
    cells = [analyse(r) for r in records]
    chosen: Set[int] = set()
    todo: List[Tuple[str, int, int]] = []  # (name, look before this cell, the %%ddp cell whose run calls it)
    shipped: Dict[str, Tuple[Shipped, int]] = {}
    sel = Selection()
    for i, c in enumerate(cells):
        if c.kind != "ddp" or (wanted is not None and c.number not in wanted):
            continue
        if not c.ok:
            sel.warnings.append(f"cell {c.number} (%%ddp) failed in the notebook: left out")
            continue
        chosen.add(i)
        todo += _needs(c, i, i, shipped)
    seen: Set[Tuple[str, int, int]] = set()
    while todo:
        item = todo.pop()
        if item in seen:
            continue
        seen.add(item)
        name, before, origin = item
        j = _definer(cells, before, name.lstrip("\0"), ddp=name.startswith("\0"))
        if j is None or j in chosen or cells[j].code is None:
            continue
        chosen.add(j)
        if cells[j].run is None:  # an ordinary cell: what it reads now, and what its functions read when called
            todo += [(n, j, origin) for n in cells[j].uses - cells[j].late] + [(n, origin, origin) for n in cells[j].late]
        else:
            todo += _needs(cells[j], j, j, shipped)
    sel.cells = [cells[i] for i in sorted(chosen)]
    _explain_values(cells, shipped, sel)
    _warn_magics(cells, chosen, wanted, sel)
    return sel


def _needs(c: Cell, i: int, origin: int, shipped: Dict[str, Tuple[Shipped, int]]) -> List[Tuple[str, int, int]]:
    """What a %%ddp cell needs: the names shipped to it (from ordinary cells), the names the workers owned ("\\0": %%ddp cells)."""
    assert c.run is not None
    sent = {s.name for s in c.run.shipped}
    for s in c.run.shipped:
        shipped.setdefault(s.name, (s, i))
    return [(n, i, origin) for n in sorted(sent)] + [("\0" + n, i, origin) for n in sorted(c.uses - c.definitions - sent)]


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.0f} {unit}"
    return f"{n} bytes"


def _explain_values(cells: List[Cell], shipped: Dict[str, Tuple[Shipped, int]], sel: Selection) -> None:
    """Say where each shipped value (not a definition) comes from in the script, or how to bring it."""
    for name, (s, i) in sorted(shipped.items()):
        j = _definer(cells, i, name, ddp=False)
        src = cells[j] if j is not None else None
        if src is not None and src.code is None:
            sel.warnings.append(f"`{name}` comes from cell {src.number}, which is not Python a script can run: define it in the script yourself")
            continue
        if src is not None and name not in src.magic_bound:
            if name in src.definitions or s.kind in ("function", "class", "module"):
                continue
            if _READS_FILE.search(src.code or ""):
                sel.notes.append(f"`{name}` comes from cell {src.number}, which reads a file: exported as is")
            else:
                sel.notes.append(f"`{name}` is regenerated by cell {src.number}")
            continue
        sel.notes.append(
            f"`{name}` is a {_size(s.size)} value built interactively: save it with `torch.save` and load it in the script (line added, commented)"
        )
        sel.loads.append((name, s.size))


def _warn_magics(cells: List[Cell], chosen: Set[int], wanted: Optional[Set[int]], sel: Selection) -> None:
    """Name every cell (of those asked for) whose IPython commands the script cannot reproduce."""
    for i, c in enumerate(cells):
        if c.kind != "ordinary" or not (wanted is None or c.number in wanted or i in chosen):
            continue
        used = ", ".join(dict.fromkeys(c.magics))
        if c.magics and i in chosen:
            sel.warnings.append(f"cell {c.number} uses {used}: the script needs this cell; those lines are commented out in it")
        elif c.magics:
            sel.warnings.append(f"cell {c.number} uses {used}, which a script cannot run: left out")
        if i in chosen and wanted is not None and c.number not in wanted:
            sel.notes.append(f"cell {c.number} is outside --cells but defines what the chosen cells use: included")
