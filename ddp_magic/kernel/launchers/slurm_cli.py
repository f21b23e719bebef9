"""Slurm's command-line tools as the launcher uses them: squeue, scontrol, scancel, sbatch --test-only, and what salloc prints.

Every call has a timeout and returns plain values; every parser is a pure function of
one line (unit-tested). Formats chosen for Slurm 22.05 and later: ``squeue --json``
ignores ``-j`` there, so squeue is read through ``-o`` fields.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from typing import List, NamedTuple, Optional, Sequence, Tuple

from ...logs import log
from ...states import SchedulerState

CALL_TIMEOUT_S = 20.0
_GRANTED = re.compile(r"Granted job allocation (\d+)")
_PENDING = re.compile(r"Pending job allocation (\d+)|job (\d+) queued and waiting")
_REVOKED = re.compile(r"Job allocation (\d+) has been revoked")
_NODE_ADDR = re.compile(r"(?:^|\s)NodeAddr=(\S+)")
_PREFIX = re.compile(r"^(?:salloc|srun|sbatch|scontrol|squeue|scancel): (?:error: |fatal: )?")


class JobInfo(NamedTuple):
    """One job as squeue lists it (state GONE: squeue no longer knows it)."""

    state: SchedulerState
    reason: str = ""
    nodelist: str = ""


def installed() -> Optional[str]:
    """Why this machine cannot drive Slurm (None: it can)."""
    missing = [c for c in ("salloc", "srun", "squeue", "scontrol", "scancel") if shutil.which(c) is None]
    if missing:
        return f"--slurm needs Slurm's commands on this machine ({', '.join(missing)} not found): run the kernel on a login node or inside salloc"
    return None


def run(argv: Sequence[str], timeout: float = CALL_TIMEOUT_S) -> Tuple[int, str]:
    """(exit code, stdout + stderr) of one Slurm command; a command that cannot run is code 127 with the reason."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.debug("%s failed to run", argv[0], exc_info=True)
        return 127, f"{argv[0]}: {e}"
    return done.returncode, (done.stdout + done.stderr).strip()


def short_error(text: str, limit: int = 3) -> str:
    """Slurm's own words, short: its lines without the tool's prefix, repeats and help hints dropped."""
    out: List[str] = []
    for line in text.splitlines():
        line = _PREFIX.sub("", line.strip())
        if line and not line.startswith("Try \"") and line not in out:
            out.append(line)
    return "; ".join(out[:limit]) or "(Slurm printed nothing)"


def parse_salloc(line: str) -> Tuple[str, Optional[str]]:
    """One line salloc printed: ("granted" | "pending" | "revoked", job id), or ("other", None)."""
    for kind, pattern in (("granted", _GRANTED), ("pending", _PENDING), ("revoked", _REVOKED)):
        m = pattern.search(line)
        if m:
            return kind, next(g for g in m.groups() if g)
    return "other", None


def parse_squeue(line: str) -> JobInfo:
    """``squeue -h -o '%T|%r|%N'``'s line (empty: the job is gone)."""
    parts = line.strip().split("|")
    if not parts or not parts[0]:
        return JobInfo(SchedulerState.GONE)
    reason = parts[1] if len(parts) > 1 and parts[1] not in ("None", "(null)") else ""
    return JobInfo(SchedulerState.from_slurm(parts[0]), reason, parts[2] if len(parts) > 2 else "")


def parse_node_addr(line: str) -> Optional[str]:
    """NodeAddr= of ``scontrol show node NAME -o``."""
    m = _NODE_ADDR.search(line)
    return m.group(1) if m else None


def job(job_id: str) -> JobInfo:
    code, out = run(["squeue", "-h", "-j", job_id, "-o", "%T|%r|%N"])
    if code:  # squeue -j of a job Slurm has purged fails ("Invalid job id specified")
        return JobInfo(SchedulerState.GONE, short_error(out))
    return parse_squeue(out.splitlines()[0] if out else "")


def hostnames(nodelist: str) -> List[str]:
    """n[1-2] -> [n1, n2] (scontrol's expansion, the one Slurm itself uses)."""
    code, out = run(["scontrol", "show", "hostnames", nodelist])
    return out.split() if code == 0 and out else ([nodelist] if nodelist else [])


def node_addr(node: str) -> str:
    """The address a node is reached at (NodeAddr): a fake or cluster-private node name may not resolve, its address does."""
    code, out = run(["scontrol", "show", "node", node, "-o"])
    return (parse_node_addr(out) if code == 0 else None) or node


def down_nodes(nodes: Sequence[str]) -> List[str]:
    """Which of ``nodes`` Slurm holds down or failed now (not answering it): why it revoked a job on them."""
    if not nodes:
        return []
    code, out = run(["sinfo", "-h", "-N", "-t", "down,fail,no_respond", "-n", ",".join(nodes), "-o", "%N"])
    return sorted(set(out.split())) if code == 0 else []


def test_request(argv: Sequence[str]) -> Optional[str]:
    """sbatch --test-only's verdict on a request: None when Slurm would take it, else its own message, short."""
    code, out = run(argv)
    return short_error(out) if code else None


def cancel(job_id: str) -> None:
    """scancel one job or step of ours (never one we found: the caller decides)."""
    code, out = run(["scancel", job_id], timeout=10)
    if code:
        log.debug("scancel %s: %s", job_id, out)
