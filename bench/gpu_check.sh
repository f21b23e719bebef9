#!/usr/bin/env bash
# One-shot GPU check (issue 9): on a machine with NVIDIA GPUs and PyTorch already installed,
# run every GPU test and a short nccl bench from this working tree, without network access,
# and print one table. Finishes within ~8 minutes.
#   bash bench/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # the project from the working tree, nothing to download
PY=${PYTHON:-python3}
"$PY" - <<'PY' || exit 1
import importlib, sys
missing = [m for m in ("torch", "cloudpickle", "IPython", "ipykernel", "jupyter_client", "pytest") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu_check: missing here: {', '.join(missing)} (install them, e.g. from wheels carried in)")
import torch
print(f"gpu_check: torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s)")
PY
nvidia-smi -L 2>/dev/null || true
echo "== GPU tests =="
timeout 300 "$PY" -m pytest tests/test_gpu.py -q -rs -p no:cacheprovider -o addopts="" 2>&1 | tail -25
echo "== nccl bench =="
timeout 240 "$PY" bench/gpu_bench.py
