#!/usr/bin/env bash
# Set up .venv on a fresh machine: torch first (the one already importable, else the
# CPU wheel torch==2.13.0), then everything else constrained to that torch, so no
# resolver ever pulls a multi-GB CUDA build. Re-running skips what is already done.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${DDP_MAGIC_VENV:-.venv}
PY=${PYTHON:-python3}
# Debian's Chromium for the browser tests (labextension/ui-tests); never a downloaded browser.
if [ ! -x /usr/bin/chromium ] && [ "${DDP_MAGIC_NO_BROWSER:-0}" != 1 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing chromium (apt) for the browser tests"
    apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }
  else
    echo "setup: no /usr/bin/chromium and no root apt-get: the browser tests will be skipped (apt-get install -y chromium)" >&2
  fi
fi
# Slurm (slurmctld, slurmd, slurm-client, munge) for the --slurm tests: tests/slurm starts a two-node Slurm on this
# machine (scripts/local_slurm.py); without root they skip, saying why. Never started here, only installed.
if [ ! -x /usr/sbin/slurmctld ] && [ "${DDP_MAGIC_NO_SLURM:-0}" != 1 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Slurm and munge (apt) for the --slurm tests"
    slurm_pkgs="slurmctld slurmd slurm-client munge"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $slurm_pkgs >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $slurm_pkgs >/dev/null; }
  else
    echo "setup: no Slurm and no root apt-get: the --slurm tests will be skipped (apt-get install -y slurmctld slurmd slurm-client munge)" >&2
  fi
fi
# The cluster in a box's tools (tests/cluster, scripts/cluster_box.py: hosts as network namespaces, packet captures,
# firewall rules); without root those tests skip, saying why.
# openssh-server and openssh-client: an sshd per node for the --hosts tests (tests/cluster/test_box_ssh.py).
if { [ ! -x /usr/sbin/iptables ] || [ ! -x /usr/bin/tcpdump ] || [ ! -x /usr/bin/nsenter ] || [ ! -x /usr/sbin/ip ] \
     || [ ! -x /usr/sbin/sshd ] || [ ! -x /usr/bin/ssh ]; } && [ "${DDP_MAGIC_NO_SLURM:-0}" != 1 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing iproute2, util-linux, iptables, tcpdump and openssh (apt) for the cluster-in-a-box tests"
    box_pkgs="iproute2 util-linux iptables tcpdump openssh-server openssh-client"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $box_pkgs >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $box_pkgs >/dev/null; }
  else
    echo "setup: no root apt-get: the cluster-in-a-box tests will be skipped (apt-get install -y iproute2 util-linux iptables tcpdump openssh-server openssh-client)" >&2
  fi
fi
# The kernel tests' own tools: CI fails on a skip (tests/plugins/ci_skips.py), so what they need is installed here.
# useradd and runuser: another Unix user (tests/kernel/test_keep.py); unshare, ip, ss and iptables: a kernel in a network
# namespace of its own whose control port is cut (tests/kernel/test_lost_link.py); setpriv (test_background_words.py);
# openssl (the pool's TLS key); a python3 another user may run.
kernel_pkgs="passwd util-linux iproute2 iptables openssl python3"
if ! { command -v useradd && command -v runuser && command -v unshare && command -v setpriv && command -v ss \
       && command -v iptables && command -v openssl && [ -x /usr/bin/python3 ]; } >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing $kernel_pkgs (apt) for the kernel tests"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $kernel_pkgs >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $kernel_pkgs >/dev/null; }
  else
    echo "setup: no root apt-get: some kernel tests will be skipped (apt-get install -y $kernel_pkgs)" >&2
  fi
fi
# iptables in a new network namespace: the legacy backend needs the host's ip_tables module, nft does not
if [ "$(id -u)" = 0 ] && command -v iptables-nft >/dev/null 2>&1 && ! unshare -n iptables -L -n >/dev/null 2>&1; then
  update-alternatives --set iptables "$(command -v iptables-nft)" >/dev/null \
    && echo "setup: iptables now uses its nft backend (the legacy one failed in a network namespace)"
fi
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
reqs=$(cat requirements-dev.txt "$VENV/constraints.txt" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$VENV/.ddp_magic-reqs" 2>/dev/null)" != "$reqs" ]; then
  echo "setup: installing test and build tools (constrained to $(cat "$VENV/constraints.txt"))"
  "$VPY" -m pip install -q -c "$VENV/constraints.txt" -r requirements-dev.txt
  echo "$reqs" > "$VENV/.ddp_magic-reqs"
fi
# the JupyterLab extension, built before the package is installed (the install ships it)
ext=$(bash scripts/build_labextension.sh | tail -n 1)
want=$(cat pyproject.toml requirements-dev.txt "$VENV/constraints.txt" <(echo "$ext") | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing ddp_magic (editable, with its JupyterLab extension)"
  PATH="$(cd "$VENV" && pwd)/bin:$PATH" "$VPY" -m pip install -q -c "$VENV/constraints.txt" --no-build-isolation -e .
  echo "$want" > "$stamp"
fi
"$VPY" -c "import ddp_magic, torch; print(f'setup: ddp_magic {ddp_magic.__version__}, torch {torch.__version__} ready in $VENV')"
