"""The committed example notebooks carry the outputs of a real, complete run (no kernel needed here).

nbval (notebooks/conftest.py) re-executes each notebook and compares its outputs with the committed
ones; these checks catch what it cannot: a notebook saved without outputs, or cleared, or from a run
that stopped half-way or failed where it should not. Refresh them with `python notebooks/refresh.py`.
"""
from __future__ import annotations

import configparser
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
EXPECTED = [
    "01_quickstart", "02_env_and_validation", "03_train_ddp", "04_all_gather", "05_when_things_go_wrong", "06_debugging",
    "07_fsdp2", "08_tensor_parallel", "09_export", "10_metrics_and_profile", "11_background",
    "12_autoreload", "13_snapshots",
]
EXPECTED_TO_FAIL = {"raises-exception", "nbval-raises-exception"}
REFRESH = "re-execute and save it: python notebooks/refresh.py"


def notebook_paths():
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def tags(cell) -> set:
    return set(cell.get("metadata", {}).get("tags", []))


def test_the_example_notebooks_are_all_there():
    assert [p.stem for p in notebook_paths()] == EXPECTED


@pytest.fixture(params=EXPECTED)
def nb(request):
    path = NOTEBOOKS / f"{request.param}.ipynb"
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    notebook.path = path
    return notebook


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def test_executed_top_to_bottom_in_one_kernel(nb):
    counts = [c.execution_count for c in code_cells(nb)]
    assert None not in counts, f"{nb.path.name} has cells that were never run (saved without executing, or cleared); {REFRESH}"
    assert counts == list(range(1, len(counts) + 1)), f"{nb.path.name} was not run top to bottom in a fresh kernel (In [{counts}]); {REFRESH}"


def test_outputs_are_committed(nb):
    cells = code_cells(nb)
    assert any(c.outputs for c in cells), f"{nb.path.name} has no outputs committed; {REFRESH}"
    for i, c in enumerate(cells):
        first = c.source.lstrip().splitlines()[0] if c.source.strip() else ""
        shows_something = first.startswith(("%%ddp", "%ddp_env", "%ddp ")) and not any(f in first for f in ("--no-widget", "--json", "--bg"))
        if shows_something:  # a %%ddp cell always shows at least its status view or its error (a --bg cell's come after it returned)
            assert c.outputs, f"{nb.path.name}: code cell {i} ({first!r}) has no outputs; {REFRESH}"


def test_only_the_cells_marked_so_failed(nb):
    for i, c in enumerate(code_cells(nb)):
        errors = [o for o in c.outputs if o.output_type == "error"]
        if tags(c) & EXPECTED_TO_FAIL:
            assert errors, f"{nb.path.name}: code cell {i} is tagged raises-exception but did not fail:\n{c.source}"
        else:
            assert not errors, (
                f"{nb.path.name}: code cell {i} failed ({errors[0].ename}: {errors[0].evalue[:200]}) without the "
                f"raises-exception tag:\n{c.source}"
            )


def test_every_cell_is_run_by_nbval(nb):
    for i, c in enumerate(code_cells(nb)):
        skipped = {"nbval-skip"} & tags(c) or "# NBVAL_SKIP" in c.source
        assert not skipped, f"{nb.path.name}: code cell {i} is skipped by nbval; every cell must run"


def test_the_python3_kernel():
    for path in notebook_paths():
        assert nbformat.read(path, as_version=4).metadata.kernelspec.name == "python3", path.name


def test_sanitize_rules_compile():
    text = (NOTEBOOKS / "nbval_sanitize.cfg").read_text()
    rules = re.findall(r"^regex: (.*)$\n^replace: (.*)$", text, flags=re.MULTILINE)  # nbval's own reading
    assert len(rules) >= 10
    for regex, replace in rules:
        re.sub(regex, replace, "pid 1 port 2")


def test_sanitize_rules_keep_what_matters():
    """The rules replace what varies between runs, and nothing a reader compares."""
    text = (NOTEBOOKS / "nbval_sanitize.cfg").read_text()
    rules = re.findall(r"^regex: (.*)$\n^replace: (.*)$", text, flags=re.MULTILINE)

    def sanitize(s):
        for regex, replace in rules:
            s = re.sub(regex, replace, s)
        return s

    a = "pool of 2 rank(s), backend gloo, MASTER_PORT 40381\n  rank 0: pid 2530  interrupted cpu\n"
    b = "pool of 2 rank(s), backend gloo, MASTER_PORT 51234\n  rank 0: pid 99  interrupted cpu\n"
    assert sanitize(a) == sanitize(b)
    row = "127.0.0.1    48173        2           0     0           2                 0          1"
    assert sanitize(row) == sanitize(row.replace("48173", "33001").replace("0          1", "0          8"))
    assert sanitize(row) != sanitize(row.replace("2           0     0", "2           1     1"))  # ranks still compared
    assert sanitize("[rank 0] loss 0.412") == "[rank 0] loss 0.412"


def test_the_test_run_includes_the_notebooks():
    """./scripts/test.sh runs plain `pytest`: setup.cfg's testpaths must hold notebooks/."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert "notebooks" in cfg["tool:pytest"]["testpaths"].split()


def test_saved_with_the_kernelspec_jupyterlab_writes(nb):
    """JupyterLab and Notebook 7 rewrite any other display name on open: the notebook would open as modified."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("refresh", NOTEBOOKS / "refresh.py")
    refresh = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("refresh", refresh)
    spec.loader.exec_module(refresh)
    assert dict(nb.metadata["kernelspec"]) == refresh.KERNELSPEC == {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


EXTRA_IMPORTS = {"matplotlib": "matplotlib", "tqdm": "tqdm"}  # import name -> the `examples` extra's requirement


def test_what_an_example_needs_beyond_ddp_magic_is_in_the_examples_extra(nb):
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        tomllib = pytest.importorskip("tomli")
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["examples"]
    code = "\n".join(c.source for c in code_cells(nb))
    needed = [m for m in EXTRA_IMPORTS if re.search(rf"^\s*(import|from) {m}\b", code, re.M)]
    for module in needed:
        assert any(req.startswith(EXTRA_IMPORTS[module]) for req in extra), f"{module} missing from the examples extra"
    if needed:
        first = next(c for c in nb.cells if c.cell_type == "markdown").source
        assert 'pip install "ddp-magic[examples]"' in first, "say at the top of the notebook what it needs"
