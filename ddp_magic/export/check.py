"""%ddp_export --check: run the exported script under torchrun on this machine and compare it with the cells.

The script runs under ``torchrun --standalone`` with the pool's world size
(gloo on CPU where the pool had no GPU), each rank's stdout in its own file
(torchrun's ``--redirects``), and writes each rank's final value to a folder
(``DDP_EXPORT_RESULTS``). The comparison is per rank: the last lines the
%%ddp cells printed against the script's last lines, then the final cell's
value (its repr) against the script's. The first difference is reported.
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from ..plan.plan import threads_per_rank
from .script import RESULTS_ENV
from ..words import plural

LAST_LINES = 10  # lines per rank compared


@dataclass(frozen=True)
class Expected:
    """What the cells produced: each rank's printed lines (the exported %%ddp cells, in order) and final values."""

    lines: Tuple[Tuple[str, ...], ...]
    values: Optional[Tuple[str, ...]]  # repr per rank; None: the final cell returned nothing
    final_cell: int


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    text: str  # what the magic prints
    difference: Optional[str] = None


def _short(line: str, width: int = 120) -> str:
    return repr(line if len(line) <= width else line[: width - 3] + "...")


def first_difference(expected: Expected, lines: Sequence[Sequence[str]], values: Sequence[Optional[str]]) -> Optional[str]:
    """The first place the script differs from the cells, in words; None when it does not."""
    for rank, want in enumerate(expected.lines):
        want_tail = [ln.rstrip() for ln in want][-LAST_LINES:]
        got = [ln.rstrip() for ln in (lines[rank] if rank < len(lines) else [])]
        got_tail = got[-len(want_tail):] if want_tail else []
        if len(got_tail) < len(want_tail):
            return f"rank {rank}: the cells printed {plural(len(want_tail), 'line')} at the end, the script only {len(got_tail)}"
        for i, (a, b) in enumerate(zip(want_tail, got_tail)):
            if a != b:
                return f"rank {rank}, line {i + 1} of the last {len(want_tail)} printed: the cells printed {_short(a)}, the script printed {_short(b)}"
    if expected.values is not None:
        for rank, want_value in enumerate(expected.values):
            got_value = values[rank] if rank < len(values) else None
            if got_value != want_value:
                shown = "nothing" if got_value is None else _short(got_value)
                return f"rank {rank}, the final cell's value (In [{expected.final_cell}]): the cells returned {_short(want_value)}, the script {shown}"
    return None


def _rank_files(log_dir: str, name: str, nproc: int) -> List[str]:
    """Each local rank's file of torchrun's log folder (``<run>/attempt_0/<rank>/stdout.log``)."""
    out = []
    for rank in range(nproc):
        found = sorted(glob.glob(os.path.join(log_dir, "**", "attempt_*", str(rank), name), recursive=True))
        out.append(found[-1] if found else "")
    return out


def _read(path: str) -> str:
    if not path:
        return ""
    with open(path, errors="replace") as f:
        return f.read()


def command(script: str, nproc: int, log_dir: str) -> List[str]:
    """torchrun on this machine, one node, each rank's output in its own file."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "--log-dir", log_dir, "--redirects", "3", script]


def run_check(script: str, nproc: int, expected: Expected, timeout: float = 1800, cwd: Optional[str] = None) -> CheckResult:
    """Run ``script`` on ``nproc`` local ranks and compare; a failed run is reported with its rank's last lines."""
    shown = f"torchrun --standalone --nproc-per-node {nproc} {os.path.basename(script)}"
    with tempfile.TemporaryDirectory(prefix="ddp_export_check_") as tmp:
        results, logs = os.path.join(tmp, "results"), os.path.join(tmp, "logs")
        os.makedirs(results)
        env = dict(os.environ, **{RESULTS_ENV: results})
        env.setdefault("OMP_NUM_THREADS", str(threads_per_rank(nproc)))  # as the pool's ranks had it
        try:
            proc = subprocess.run(command(os.path.abspath(script), nproc, logs), cwd=cwd, env=env, capture_output=True, text=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return CheckResult(False, f"--check: {shown} did not finish within {timeout:.0f}s", "the script did not finish")
        outs = [_read(p).splitlines() for p in _rank_files(logs, "stdout.log", nproc)]
        if proc.returncode != 0:
            errs = [_read(p) for p in _rank_files(logs, "stderr.log", nproc)]
            failed = next((r for r, e in enumerate(errs) if "Traceback" in e or "Error" in e), 0)
            tail = "\n".join((errs[failed] or proc.stderr).strip().splitlines()[-15:])
            why = f"the script exited with code {proc.returncode}"
            return CheckResult(False, f"--check: {shown}: {why}; rank {failed}'s last lines:\n{tail}", why)
        values = [_read(os.path.join(results, f"rank{r}.txt")) or None for r in range(nproc)]
    diff = first_difference(expected, outs, values)
    if diff is not None:
        return CheckResult(False, f"--check: {shown} ran (exit code 0) but differs from the cells. First difference: {diff}", diff)
    what = f"the last printed lines (up to {LAST_LINES}) of each of its {nproc} ranks"
    if expected.values is not None:
        what += f" and the final cell's values (In [{expected.final_cell}])"
    return CheckResult(True, f"--check: {shown} ran (exit code 0); {what} match the cells'.")
