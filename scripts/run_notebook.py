"""Execute a notebook in a real kernel, headless, and print each cell with what a user would see.

    python scripts/run_notebook.py notebooks/01_quickstart.ipynb [--save]

--save writes the executed notebook (with its outputs) back in place.
"""
from __future__ import annotations

import argparse
import sys
import time

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def show(nb: nbformat.NotebookNode) -> None:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            print("\n" + "\n".join("  " + line for line in cell.source.splitlines()))
            continue
        if cell.cell_type != "code":
            continue
        n = cell.get("execution_count") or " "
        print(f"\nIn [{n}]:")
        print("\n".join("    " + line for line in cell.source.splitlines()))
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                sys.stdout.write(out.text if out.name == "stdout" else "".join(f"(stderr) {ln}\n" for ln in out.text.splitlines()))
            elif out.output_type in ("execute_result", "display_data"):
                text = out.data.get("text/plain") or _html_summary(out.data.get("text/html", ""))
                prefix = f"Out[{n}]: " if out.output_type == "execute_result" else ""
                print(prefix + text)
            elif out.output_type == "error":
                print(f"{out.ename}: {out.evalue}")


def _html_summary(html: str) -> str:
    """The first line of an HTML-only display (the %%ddp status view) as plain text."""
    import html as htmllib
    import re

    head = re.sub(r"(?s)<style.*?</style>", "", html.split("<details", 1)[0])
    text = htmllib.unescape(re.sub(r"<[^>]+>", " ", head))
    return "[status] " + " ".join(text.split()) if text.strip() else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("notebook")
    ap.add_argument("--save", action="store_true", help="write the executed notebook back in place")
    ap.add_argument("--timeout", type=int, default=600)
    args = ap.parse_args()
    nb = nbformat.read(args.notebook, as_version=4)
    t0 = time.monotonic()
    # Closed widgets' state is dead weight in a saved notebook (the status view leaves HTML behind).
    client = NotebookClient(nb, timeout=args.timeout, kernel_name="python3", allow_errors=False, store_widget_state=False)
    failed = None
    try:
        client.execute()
    except CellExecutionError as e:
        failed = e
    show(nb)
    print(f"\n[{args.notebook} executed in {time.monotonic() - t0:.1f}s]")
    if args.save:
        nbformat.write(nb, args.notebook)
    if failed is not None:
        print(f"a cell failed unexpectedly:\n{failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
