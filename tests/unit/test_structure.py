"""The package's shape: which role may import which, no cycles, small modules and functions,
and no exception swallowed without a log line. docs/architecture.md explains the roles."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "ddp_magic"

# role -> the roles it may import. A role is a folder of ddp_magic/ or a top-level module.
ALLOWED: Dict[str, Set[str]] = {
    "logs": set(),
    "states": set(),
    "errors": {"states", "words"},
    "_version": set(),
    "words": set(),  # how counts, rank lists and durations are said: every role's text
    "wire": {"wire", "logs", "words"},  # both ends of each cross-process mechanism
    "procs": {"procs", "wire", "logs", "words"},  # the separate programs: rank, template, store
    "plan": {"plan", "errors", "states", "logs", "words"},
    "kernel": {"kernel", "wire", "plan", "errors", "states", "logs", "words"},
    "export": {"export", "kernel", "plan", "wire", "errors", "states", "logs", "words"},  # %ddp_export: history -> script (kernel side)
    "session": {"session", "export", "kernel", "plan", "wire", "errors", "states", "logs", "words"},
    "ui": {"ui", "session", "kernel", "plan", "wire", "errors", "states", "logs", "_version", "words"},
    "magic_options": {"plan", "words"},  # the magics' argument declarations and examples
    "magics": {"magic_options", "magics", "session", "export", "ui", "kernel", "plan", "wire", "errors", "states", "logs", "words"},
    "__main__": {"kernel", "wire", "logs", "words"},  # python -m ddp_magic kept|stop: a kept pool from a terminal (docs/keep.md)
    "__init__": {"magics", "ui", "kernel", "session", "procs", "_version", "logs"},  # procs: ddp_magic.breakpoint, called on a rank
}
NO_IPYTHON = {"wire", "procs", "plan", "kernel", "export", "session", "errors", "states", "logs", "words"}
# The one exception: a rank reloads edited modules with IPython's own autoreload (docs/autoreload.md), imported lazily, only
# once %ddp autoreload is on; no other rank code touches IPython.
IPYTHON_ON_RANKS = {"procs.rank_reload": ("IPython", "IPython.extensions", "IPython.extensions.deduperreload.deduperreload")}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> Iterator[Tuple[str, Path]]:
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if rel.parts[0] == "labextension":
            continue
        yield ".".join(rel.with_suffix("").parts), path


def _role(dotted: str) -> str:
    return dotted.split(".")[0]


def _imports(dotted: str, path: Path) -> List[Tuple[str, int]]:
    """Every module this one imports (lazily too), as dotted names: in-package ones without 'ddp_magic.'."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    here = dotted.split(".")[: (None if is_pkg else -1)]
    if is_pkg and here and here[-1] == "__init__":
        here = here[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)] if node.level > 1 else list(here)
                mod = ".".join(base + ([node.module] if node.module else []))
                names = [mod] if node.module else [".".join(base + [a.name]) for a in node.names]
                out += [("ddp_magic." + n if n else "ddp_magic", node.lineno) for n in names]
            elif node.module:
                out.append((node.module, node.lineno))
    return out


def _internal(name: str) -> str:
    return name[len("ddp_magic."):] if name.startswith("ddp_magic.") else ""


def test_roles_import_only_what_they_may() -> None:
    bad = []
    for dotted, path in _modules():
        role = _role(dotted)
        if role == "__init__" or dotted.endswith(".__init__") and role == "__init__":
            role = "__init__"
        allowed = ALLOWED.get(role)
        assert allowed is not None, f"{dotted}: a new role; add it to ALLOWED and to docs/architecture.md"
        for name, line in _imports(dotted, path):
            target = _internal(name)
            if name == "ddp_magic":
                target = "__init__"
            if target and _role(target) not in allowed and _role(target) != role:
                bad.append(f"{path.relative_to(ROOT)}:{line} ({role}) imports {name} ({_role(target)})")
            if role in NO_IPYTHON and name.split(".")[0] in ("IPython", "ipywidgets", "ipykernel") and name not in IPYTHON_ON_RANKS.get(dotted, ()):
                bad.append(f"{path.relative_to(ROOT)}:{line} ({role}) imports {name}: only the magics and ui/ may")
    assert not bad, "import rules broken:\n" + "\n".join(bad)


def _package_imports(dotted: str, path: Path) -> List[str]:
    """The packages a module imports by ``from . import x`` / ``from .. import x`` (that runs the package's __init__,
    dotted names without 'ddp_magic.'); a package's own __init__ counts its module-level imports only: one inside a
    function (kernel/__init__'s lazy ``Pool``) runs once both are loaded, which is how such a cycle is broken."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if path.name == "__init__.py" else list(ast.walk(tree))
    here = dotted.split(".")[:-1]
    out = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.level and not node.module:
            out.append(".".join(here[: len(here) - (node.level - 1)] + ["__init__"]))
    return out


def _import_graph() -> Dict[str, Set[str]]:
    """module -> the modules it imports; a package is its ``__init__`` (``from .launchers import X`` imports
    kernel.launchers.__init__, and so does ``from . import slurm_cli`` inside it). The top-level ``ddp_magic`` is left
    out: its entry points import lazily, by design, what imports it back (ddp_magic.breakpoint on a rank)."""
    graph: Dict[str, Set[str]] = {}
    known = {d for d, _ in _modules()}
    for dotted, path in _modules():
        deps = {p for p in _package_imports(dotted, path) if p in known and p != dotted and p != "__init__"}
        package = path.name == "__init__.py"
        top = {n.lineno for n in ast.parse(path.read_text()).body if isinstance(n, (ast.Import, ast.ImportFrom))}
        for name, line in _imports(dotted, path):
            if package and line not in top:  # a package's lazy import (in a function, or for type checkers only)
                continue
            target = _internal(name)
            if target and target + ".__init__" in known:
                target += ".__init__"
            while target and target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in known and target != dotted and target != "__init__":
                deps.add(target)
        graph[dotted] = deps
    return graph


def test_no_import_cycle() -> None:
    """No module imports itself back through others, packages' __init__ included (a re-exporting package whose
    members import it is a cycle)."""
    graph = _import_graph()
    state: Dict[str, int] = {}
    stack: List[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def _sources() -> Iterator[Path]:
    for _, path in _modules():
        yield path
    yield from sorted((ROOT / "bench").glob("*.py"))


@pytest.mark.parametrize("path", [p for _, p in _modules()], ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_small(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(ROOT)} has {lines} lines (at most {MAX_MODULE_LINES}): split it by role"


def test_functions_are_short() -> None:
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} is {n} lines")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def _broad(handler: ast.ExceptHandler) -> bool:
    t = handler.type
    names = [t] if t is None or not isinstance(t, ast.Tuple) else list(t.elts)
    return any(n is None or (isinstance(n, ast.Name) and n.id in ("Exception", "BaseException")) for n in names)


def _logs_or_raises(handler: ast.ExceptHandler) -> bool:
    for node in ast.walk(ast.Module(body=handler.body, type_ignores=[])):
        if isinstance(node, ast.Raise):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id in ("log", "logger") or node.func.attr == "handleError":
                return True
    return False


def test_broad_excepts_log_or_reraise() -> None:
    """A swallowed exception leaves a debug line in ddp_magic's log (%ddp log shows it)."""
    silent = []
    for _, path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ExceptHandler) and _broad(node) and not _logs_or_raises(node):
                silent.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not silent, "broad except without log.debug(..., exc_info=True) or raise:\n" + "\n".join(silent)


def test_no_issue_numbers_in_tests() -> None:
    """Tests are named by subject; the history of the project lives in git."""
    import re

    hits = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\b[Ii]ssue #?\d+\b|#\d+\b.*\b(issue|task)\b", line):
                hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()[:100]}")
    assert not hits, "issue numbers in tests:\n" + "\n".join(hits)


def test_architecture_page_lists_every_module() -> None:
    """docs/architecture.md copies each module's docstring; scripts/architecture_files.py rewrites it."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "architecture_files.py"), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
