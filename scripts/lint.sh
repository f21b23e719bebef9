#!/usr/bin/env bash
# Lint, run by scripts/test.sh before the tests: ruff and mypy on the Python package,
# eslint on the JupyterLab extension's TypeScript. Any error fails the test command.
# Assumes scripts/setup.sh has run (it installs ruff, mypy and labextension/node_modules).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${DDP_MAGIC_VENV:-.venv}
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac
status=0
echo "lint: ruff"
"$VENV/bin/ruff" check ddp_magic bench tests scripts notebooks labextension/ui-tests || status=1
echo "lint: mypy"
"$VENV/bin/mypy" || status=1
echo "lint: eslint (labextension/src)"
(cd labextension && PATH="$VENV/bin:$PATH" jlpm run lint:check) || status=1
if [ "$status" -ne 0 ]; then
  echo "lint: failed (fix the errors above; ruff check --fix fixes some)" >&2
fi
exit "$status"
