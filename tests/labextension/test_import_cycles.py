"""The extension's modules import one way: no circle of imports in labextension/src (type imports count too).

A circle (model.ts once re-exported format, ranks, state, commands, metrics and groups, which imported their types
from it: 7 files) makes the evaluation order of the bundle depend on which file is loaded first, and hides which
module a name belongs to. The toolchain has no eslint-plugin-import offline, so this reads the imports itself.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Set

SRC = Path(__file__).resolve().parents[2] / "labextension" / "src"
# import x from './a'; import type {...} from './a'; export * from './a'; export {x} from './a'; import './a'
_IMPORT = re.compile(r"""^\s*(?:import|export)\b[^;'"]*?(?:\bfrom\s+)?['"](\.{1,2}/[^'"]+)['"]""", re.M)


def imports_of(text: str) -> List[str]:
    """The local modules a TypeScript file imports or re-exports, by their file stem (./model -> model)."""
    return [Path(spec).name for spec in _IMPORT.findall(text)]


def graph(src: Path = SRC) -> Dict[str, List[str]]:
    """Module stem -> the stems it imports, for the extension's own modules (its tests import them, not the reverse)."""
    mods = {p.stem: p for p in src.glob("*.ts")}
    return {m: [d for d in imports_of(p.read_text()) if d in mods] for m, p in sorted(mods.items())}


def cycles(g: Dict[str, List[str]]) -> List[List[str]]:
    """Each circle of imports once (depth-first; a back edge closes one), as a path that returns to its start."""
    found: List[List[str]] = []
    done: Set[str] = set()

    def visit(node: str, path: List[str]) -> None:
        if node in path:
            found.append(path[path.index(node):] + [node])
            return
        if node in done:
            return
        for dep in g.get(node, []):
            visit(dep, path + [node])
        done.add(node)

    for node in g:
        visit(node, [])
    return found


def test_the_reader_sees_every_kind_of_import_and_every_circle() -> None:
    text = (
        "import type { A } from './model';\nimport { b, type C } from './format';\nexport * from './ranks';\n"
        "import './side';\nimport x from '@lumino/widgets';\n"
    )
    assert imports_of(text) == ["model", "format", "ranks", "side"]
    assert cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c", "a"]]
    assert cycles({"a": ["b", "c"], "b": ["c"], "c": []}) == []


def test_labextension_src_has_no_circle_of_imports() -> None:
    g = graph()
    assert {"model", "format", "ranks", "state", "commands", "metrics", "groups", "index"} <= set(g)
    found = cycles(g)
    assert not found, "circles of imports in labextension/src (import each name from the module that defines it):\n" + "\n".join(
        " -> ".join(f"{m}.ts" for m in c) for c in found
    )


def test_model_ts_holds_only_the_message_types() -> None:
    """model.ts imports nothing and defines no function: the types of what the kernel sends, and their constants."""
    text = (SRC / "model.ts").read_text()
    assert imports_of(text) == [] and "import " not in re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    assert not re.search(r"^export\s+(?:\*|\{|function|class|default)", text, re.M)
