#!/usr/bin/env bash
# Install everything (scripts/setup.sh) and run every test: unit tests, real-kernel
# tests with real worker processes, and the notebooks. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
set +e
.venv/bin/python -m pytest "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure here" >&2
  exit 1
fi
exit "$code"
