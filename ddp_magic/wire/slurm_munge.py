"""The pool's secret across Slurm's wire: sealed by MUNGE, which every Slurm cluster runs (AuthType=auth/munge).

srun hands a step's env to each node's slurmd in the clear, so a secret in it is readable by
anyone who captures the network. Sealed as a MUNGE credential instead (``munge -s``: encrypted
with the cluster's MUNGE key, decodable only by this user's uid, within MUNGE's time to live,
and once: a replayed credential is refused), only a process of this user on a node of the
cluster reads it back (``unmunge``). One credential a node, since each node's munged decodes a
credential once. The socket is Slurm's own (``AuthInfo=socket=`` in SLURM_CONF), else MUNGE's
default. Where MUNGE is missing, ``seal`` says None and the caller falls back to the plain secret.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import List, Mapping, Optional

from ..logs import log

DEFAULT_CONF = "/etc/slurm/slurm.conf"


def socket_args(env: Mapping[str, str]) -> List[str]:
    """``--socket=PATH`` when Slurm's conf names MUNGE's socket (``AuthInfo=socket=PATH``), else nothing."""
    try:
        with open(env.get("SLURM_CONF") or DEFAULT_CONF) as f:
            text = f.read()
    except OSError:
        return []
    found = re.search(r"^\s*AuthInfo\s*=\s*\S*?\bsocket=([^,\s]+)", text, re.M | re.I)
    return [f"--socket={found.group(1)}"] if found else []


def seal(payload: str, count: int, env: Mapping[str, str]) -> Optional[str]:
    """``count`` MUNGE credentials of ``payload`` for this uid, comma-separated; None without MUNGE (logged)."""
    munge = shutil.which("munge")
    if munge is None:
        log.warning("no munge command here: the pool's secret goes to the nodes in the step's env, unsealed")
        return None
    creds = []
    for _ in range(count):
        done = subprocess.run([munge, *socket_args(env), f"--restrict-uid={os.getuid()}", "--string", payload],
                              capture_output=True, text=True, timeout=30)
        if done.returncode:
            log.warning("munge could not seal the pool's secret (%s): it goes to the nodes unsealed", done.stderr.strip())
            return None
        creds.append(done.stdout.strip())
    return ",".join(creds)


def unseal(cred: str, env: Mapping[str, str]) -> str:
    """The payload of a credential ``seal`` made; RuntimeError (MUNGE's words) when it does not decode here."""
    try:
        done = subprocess.run(["unmunge", *socket_args(env), "--metadata=/dev/null"], input=cred, capture_output=True, text=True, timeout=30)
    except OSError as e:
        raise RuntimeError(f"the pool's secret came sealed by MUNGE, and unmunge cannot run on this node: {e}") from None
    if done.returncode:
        raise RuntimeError(f"unmunge could not read the pool's secret on this node: {done.stderr.strip() or done.returncode}")
    return done.stdout.strip()
