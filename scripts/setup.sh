#!/usr/bin/env bash
# Set up .venv on a fresh machine: torch first (the one already importable, else the
# CPU wheel torch==2.13.0), then everything else constrained to that torch, so no
# resolver ever pulls a multi-GB CUDA build. Re-running skips what is already done.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${DDP_MAGIC_VENV:-.venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  if "$PY" -c "import torch" 2>/dev/null; then
    echo "setup: using the torch already importable by $PY"
    "$PY" -m venv --system-site-packages "$VENV"
  else
    "$PY" -m venv "$VENV"
  fi
fi
VPY="$VENV/bin/python"
if ! "$VPY" -c "import torch" 2>/dev/null; then
  echo "setup: installing torch==2.13.0 (CPU)"
  "$VPY" -m pip install -q torch==2.13.0
fi
"$VPY" -c "import torch; print('torch==' + torch.__version__)" > "$VENV/constraints.txt"
stamp="$VENV/.ddp_magic-setup"
want=$(cat pyproject.toml requirements-dev.txt "$VENV/constraints.txt" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing test tools and ddp_magic (constrained to $(cat "$VENV/constraints.txt"))"
  "$VPY" -m pip install -q -c "$VENV/constraints.txt" -r requirements-dev.txt
  "$VPY" -m pip install -q -c "$VENV/constraints.txt" --no-build-isolation -e .
  echo "$want" > "$stamp"
fi
"$VPY" -c "import ddp_magic, torch; print(f'setup: ddp_magic {ddp_magic.__version__}, torch {torch.__version__} ready in $VENV')"
