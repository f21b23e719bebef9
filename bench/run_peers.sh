#!/usr/bin/env bash
# ddp_magic side by side with accelerate, ipyparallel, nbdistributed, torchrun, mp.spawn and bare processes.
#
#   bash bench/run_peers.sh [--quick] [--publish] [any bench/bench_peers.py option]
#   bash bench/run_peers.sh --install-only   # only make the venv (bench/bench_slurm.py runs its submitit and
#                                            # ipyparallel rows with it)
#
# Makes bench/.venv-peers (its own environment, never the project's .venv): torch first (the CPU
# wheel torch==2.13.0 here; TORCH_SPEC=... to choose), then the peers pinned in
# bench/requirements-peers.txt, constrained to that torch so no resolver pulls another build.
# ddp_magic is the working tree, through a .pth file (an editable install would run the
# JupyterLab extension build, which the bench does not need). Then runs bench/bench_peers.py with
# that venv's python: bench/results/peers.md, peers.json, peers_*.png (--publish also copies them
# to docs/bench/; README.md is never edited).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=bench/.venv-peers
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
if [ ! -x "$VENV/bin/python" ]; then
  echo "run_peers: creating $VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
if ! "$VPY" -c "import torch" 2>/dev/null; then
  echo "run_peers: installing $TORCH_SPEC first"
  "$VPY" -m pip install -q "$TORCH_SPEC"
fi
"$VPY" -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > "$VENV/constraints.txt"
stamp="$VENV/.peers-installed"
want=$(cat bench/requirements-peers.txt "$VENV/constraints.txt" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "run_peers: installing the peers (constrained to $(cat "$VENV/constraints.txt"))"
  "$VPY" -m pip install -q -c "$VENV/constraints.txt" -r bench/requirements-peers.txt
  echo "$want" > "$stamp"
fi
site=$("$VPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$(pwd)" > "$site/ddp_magic_worktree.pth"
"$VPY" -m ipykernel install --prefix "$VENV" --name ddp-bench-peers --display-name "ddp bench peers" > /dev/null
"$VPY" -c "import ddp_magic, torch, accelerate, ipyparallel, nbdistributed, submitit; print(f'run_peers: ddp_magic from {ddp_magic.__file__}, torch {torch.__version__}')"
if [ "${1:-}" = "--install-only" ]; then
  exit 0
fi
status=0
"$VPY" bench/bench_peers.py "$@" || status=$?
left=$(pgrep -af "ddp_magic|ipengine|ipcontroller|ipyparallel|nbdistributed/worker.py" | grep -v pgrep || true)
if [ -n "$left" ]; then
  echo "run_peers: processes matching the tools are running now (ours were stopped by pid; these may be someone else's):"
  echo "$left"
fi
exit $status
