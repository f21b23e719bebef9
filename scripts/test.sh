#!/usr/bin/env bash
# Install everything (scripts/setup.sh), lint (scripts/lint.sh: ruff, mypy, eslint) and run
# every test: unit tests, real-kernel tests with real worker processes, the notebooks and the
# JupyterLab extension in headless Chromium, on three workers (tests/plugins/worker_groups.py says
# which tests never overlap, and why three on two cores). Extra arguments go to pytest (-n 0: one process). A worker
# that crashes ends the run at once (--max-worker-restart=0): its group's other tests would never be scheduled again,
# and the run would hang.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/lint.sh
set +e
.venv/bin/python -m pytest -n 3 --max-worker-restart=0 --no-loadscope-reorder --durations=20 --durations-min=15 "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure here" >&2
  exit 1
fi
exit "$code"
