"""Rewrite the file list of docs/architecture.md from the modules' docstrings (their first paragraph).

    .venv/bin/python scripts/architecture_files.py          # rewrite it
    .venv/bin/python scripts/architecture_files.py --check  # exit 1 if it is out of date (tests/unit/test_structure.py)

The docstrings are the one home of what each module is for; the page copies them.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "ddp_magic"
ARCH = ROOT / "docs" / "architecture.md"
ORDER = [
    "", "plan", "kernel", "kernel/failures", "kernel/output", "kernel/jobs", "kernel/results", "kernel/keep", "kernel/launchers",
    "wire", "procs", "ui", "export",
]
TITLES = {
    "": "top level: the kernel's entry points and what every role shares",
    "plan": "plan/ (kernel): what the user asked for, and the env each rank gets",
    "kernel": "kernel/ (kernel): the pool's life, its ranks and the failure policy",
    "kernel/failures": "kernel/failures/ (kernel): who failed first, the root cause, why a rank died, hang forensics, recovery in place",
    "kernel/output": "kernel/output/ (kernel): the ranks' raw streams read, the same line from many ranks folded, the log on disk",
    "kernel/jobs": "kernel/jobs/ (kernel): who drives the pool and when: one cell at a time, peeks and stdin beside it (keep/: the lease)",
    "kernel/results": "kernel/results/ (kernel): what the ranks return: values gathered, DTensor pieces, metrics rows, merged profiles",
    "kernel/keep": "kernel/keep/ (kernel): a pool kept past its kernel, and the next kernel's attach",
    "kernel/launchers": "kernel/launchers/ (kernel): how rank processes come to exist",
    "wire": "wire/ (kernel and ranks): both ends of each cross-process mechanism",
    "procs": "procs/ (ranks, template, store): the separate programs",
    "ui": "ui/ (kernel): what the notebook and JupyterLab show",
    "export": "export/ (kernel): %ddp_export, the notebook's %%ddp cells as a torchrun or Slurm script",
}
SPECIAL = {
    "_version.py": "the version, the one source (package.json and the wheel read it)",
    "__init__.py": "the IPython extension's entry points (lazy imports) and `ddp_magic.Pool`",
}
LABEXTENSION = (
    "**labextension/ (browser)**: `src/model.ts` (the messages' types only), `format`, `ranks`, `groups`, `state`, "
    "`commands`, `metrics` (messages → what the UI shows; no JupyterLab imports, no circle of imports), `connection.ts` (the comm), "
    "`statusbar.ts`, `panel.ts` (with `panel_ranks.ts`, `panel_metrics.ts`, `panel_facts.ts`, `dom.ts`), `index.ts` (commands, menus), "
    "`highlight.ts` (the `%%ddp` line); the build writes `ddp_magic/labextension/`. "
    "See [labextension/README.md](../labextension/README.md).\n"
)


def _first_paragraph(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def _groups() -> Dict[str, List[Tuple[str, str]]]:
    groups: Dict[str, List[Tuple[str, str]]] = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        folder = "" if str(rel.parent) == "." else str(rel.parent)
        if rel.parts[0] == "labextension" or (path.name == "__init__.py" and folder):
            continue
        first = SPECIAL.get(path.name, "") if not folder else ""
        groups.setdefault(folder, []).append((str(rel), first or _first_paragraph(path)))
    return groups


def file_list() -> str:
    groups = _groups()
    lines: List[str] = []
    for folder in sorted(groups, key=lambda f: ORDER.index(f) if f in ORDER else len(ORDER)):
        lines.append(f"**{TITLES.get(folder, folder + '/')}**\n")
        lines += [f"- `{rel}`: {first}" for rel, first in groups[folder]]
        lines.append("")
    return "\n".join(lines + [LABEXTENSION])


def rewritten(text: str) -> str:
    return re.sub(r"(<!-- files:start -->\n).*?(<!-- files:end -->)", lambda m: m.group(1) + file_list() + m.group(2), text, flags=re.S)


def main() -> int:
    text = ARCH.read_text()
    new = rewritten(text)
    if "--check" in sys.argv[1:]:
        if new != text:
            print("docs/architecture.md's file list is out of date: run .venv/bin/python scripts/architecture_files.py", file=sys.stderr)
            return 1
        return 0
    ARCH.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
