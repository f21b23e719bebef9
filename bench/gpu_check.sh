#!/usr/bin/env bash
# One-shot GPU check: on a machine with NVIDIA GPUs and PyTorch already installed,
# run every GPU test and a short nccl bench from this working tree, without network access,
# and print the tables. Finishes within ~10 minutes.
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
timeout 300 "$PY" -m pytest tests/kernel/test_gpu.py -q -rs -p no:cacheprovider -o addopts="" 2>&1 | tail -25
echo "== nccl bench =="
timeout 240 "$PY" bench/gpu_bench.py
echo "== training turns, nccl: a %%ddp cell vs torchrun (bench_peers.py, ddp only) =="
if "$PY" -c "import matplotlib" 2>/dev/null; then
  ng=$("$PY" -c "import torch; print(torch.cuda.device_count())")
  ns=1; [ "$ng" -ge 2 ] && ns=1,2
  timeout 240 "$PY" bench/bench_peers.py --backend nccl --ns "$ns" --tools ddp --skip cold,memcpy --quick --train-repeats 1 \
    --out /tmp/gpu_check_peers > /tmp/gpu_check_peers.log 2>&1
  echo "bench_peers exit $? (log: /tmp/gpu_check_peers.log)"
  grep -A8 '^## 5' /tmp/gpu_check_peers.md 2>/dev/null | grep '^|' || tail -5 /tmp/gpu_check_peers.log
else
  echo "skipped: matplotlib is not installed here (bench_peers.py draws its plots with it)"
fi
