"""The pool's prose for the user: why a start failed, which nodes are missing, what to run on the others.

Pure functions of plain values, so each text is unit-tested without processes
and the pool's lifecycle code stays about lifecycle.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import RankFailure
from ..words import plural, ranks_phrase
from ..states import FailureKind, RankState
from .ranks import CellOutcome, RankInfo


def node_instructions(nproc: int, nnodes: int, per_node: int, command: str, secret_file: Optional[str]) -> str:
    """What the user runs on every other node of a pool over nodes (printed once the pool launches)."""
    return (
        f"pool of {plural(nproc, 'rank')} on {nnodes} nodes: this node runs {per_node} of them under torchrun.\n"
        f"On {_other_nodes(nnodes)}, run (node ranks are given in the order nodes join):\n"
        f"  {command}\n"
        f"The secret file {secret_file} must be readable there with mode 0600: on a shared home it already is,\n"
        f"otherwise copy it (scp -p). Under Slurm: {srun_prefix(nnodes - 1)} {command}"
    )


def _other_nodes(nnodes: int, each: bool = True) -> str:
    """'the other node' or 'each of the other 3 nodes' ('the other 3 nodes' without ``each``)."""
    if nnodes == 2:
        return "the other node"
    return f"each of the other {nnodes - 1} nodes" if each else f"the other {nnodes - 1} nodes"


def srun_prefix(nodes: int) -> str:
    """How Slurm starts one torchrun agent per node: the pool's instructions and %ddp_export's sbatch file say it alike."""
    return f"srun --nodes={nodes} --ntasks-per-node=1"


def missing_nodes_text(
    ranks: Dict[int, RankInfo], missing: Sequence[int], nnodes: int, start_timeout: float, rendezvous: str, control: str
) -> str:
    """Why a pool over nodes did not start: which nodes joined, which did not, and what to check."""
    joined: Dict[int, Tuple[str, List[int]]] = {}
    for info in ranks.values():
        if info.state != RankState.STARTING:
            joined.setdefault(info.node, (info.host, []))[1].append(info.rank)
    if joined:
        seen = "; ".join(f"node {n} on {h} ({ranks_phrase(r)})" for n, (h, r) in sorted(joined.items()))
        never = nnodes - len(joined)
        head = (f"{never} of {nnodes} nodes never joined within {start_timeout:.0f}s (joined: {seen}); "
                f"{plural(len(missing), 'rank')} missing.")
    else:  # torchrun starts no rank anywhere until every node is in the rendezvous
        head = (
            f"{_other_nodes(nnodes, each=False)} never joined the rendezvous at {rendezvous} "
            f"within {start_timeout:.0f}s, so no rank started (this node's torchrun was waiting for them)."
        )
    return (
        f"{head} Run the command printed above on each other node, "
        f"check that they can reach {rendezvous} (rendezvous) and "
        f"{control} (control), then run the cell again."
    )


def start_failure_text(nproc: int, failures: Sequence[RankFailure], worker_log: str, master_port: Optional[int]) -> str:
    """Why the pool could not start: the root failure, its traceback and output, the launcher's log, a fix."""
    root = failures[0]
    lines = [f"the pool of {plural(nproc, 'rank')} could not start: {root.headline()}"]
    if root.traceback:
        lines += [root.traceback.rstrip()]
    if root.last_lines:
        lines += ["last lines it printed:"] + root.last_lines[-10:]
    worker_log = worker_log.strip()
    if worker_log:
        lines += ["worker log:", worker_log]
    text = "\n".join(lines)
    if "Address already in use" in text or "EADDRINUSE" in text:
        lines += [f"MASTER_PORT {master_port} was taken; run %ddp restart (a free port is chosen) or pass another --master-port"]
    return "\n".join(lines)


NAMES_GONE = "variables defined in earlier %%ddp cells are gone"


def restarted_notice(why: Optional[str]) -> str:
    """What the user reads when a cell had to restart a broken pool first."""
    return f"restarted the pool ({why}); {NAMES_GONE}"


def restarts_next_note(why: str) -> str:
    """The note on a cell that broke the pool: the next cell restarts it."""
    return f"the pool restarts on the next cell ({why}); variables defined in earlier %%ddp cells will be lost"


def cancelled_text(outcome: CellOutcome, step: Optional[int]) -> str:
    """What every view says of a background job that ``job.cancel()`` ended: ``cancelled by job.cancel(): ranks 0-1
    stopped at step 187; state kept`` (the cell, ``repr(job)``, ``%ddp status``, the panel). Not a rank's failure, not
    a Ctrl-C: the ranks were interrupted because the notebook asked. "" for any other end (a rank that raised on its
    own before the cancel is that rank's failure)."""
    if not outcome.cancelled or not all(f.kind in (FailureKind.INTERRUPTED, FailureKind.KILLED) for f in outcome.failures):
        return ""
    ranks = sorted({f.rank for f in outcome.failures})
    at = f" at step {step:,}" if step is not None else ""
    state = "state kept" if not outcome.state_lost else "state lost: the pool restarts on the next cell"
    return f"cancelled by job.cancel(): {ranks_phrase(ranks) if ranks else 'the ranks'} stopped{at}; {state}"
