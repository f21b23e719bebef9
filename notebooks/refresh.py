"""Re-execute the example notebooks in a real kernel and save their outputs in place.

    .venv/bin/python notebooks/refresh.py                 # all of them
    .venv/bin/python notebooks/refresh.py 03_train_ddp    # some of them (name or path)

Each notebook runs top to bottom through scripts/run_notebook.py --save (a fresh kernel, real
worker processes). Then two things that change on every run and mean nothing in a saved notebook
are dropped, so a refresh only changes the lines whose outputs changed: the state of the status
widgets, which are closed when their cell ends (each cell keeps its static HTML form), and
nbclient's per-cell execution timestamps; and the kernelspec is the one JupyterLab writes
(``KERNELSPEC``), so a notebook opened fresh does not show as modified.

Run it on a CPU-only machine (or with CUDA_VISIBLE_DEVICES=): the committed outputs are gloo's, and
`pytest notebooks` compares against them. Then run `pytest notebooks` (twice, to see it is stable).
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
RUNNER = HERE.parent / "scripts" / "run_notebook.py"


# The kernelspec JupyterLab and Notebook 7 write for ipykernel's python3: saved so, a notebook opened fresh is not "modified".
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def tidy(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nb.metadata.pop("widgets", None)
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nbformat.write(nb, path)


def resolve(name: str) -> Path:
    path = Path(name)
    if not path.suffix:
        path = HERE / f"{name}.ipynb"
    return path.resolve()


def main(argv: list) -> int:
    paths = [resolve(a) for a in argv] or sorted(HERE.glob("*.ipynb"))
    failed = []
    for path in paths:
        t0 = time.monotonic()
        run = subprocess.run([sys.executable, str(RUNNER), str(path), "--save"], capture_output=True, text=True)
        seconds = time.monotonic() - t0
        if run.returncode != 0:
            failed.append(path.name)
            print(f"FAILED {path.name} after {seconds:.1f}s:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}", file=sys.stderr)
            continue
        tidy(path)
        print(f"{path.name}: executed and saved in {seconds:.1f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
