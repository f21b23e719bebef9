#!/usr/bin/env bash
# Install everything (scripts/setup.sh), then execute notebooks/01_quickstart.ipynb in a
# real Jupyter kernel, headless, and print each cell with what a user would see.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python scripts/run_notebook.py notebooks/01_quickstart.ipynb "$@"
