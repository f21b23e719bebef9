"""A Slurm node's template: the one task of the pool's step on its node; imports torch once and forks the node's ranks.

The template itself is procs/node_template.py's (shared with SSH's); this is how srun starts it.

Started by the kernel's launcher (kernel/launchers/slurm.py) as ``srun --ntasks-per-node=1
... python -m ddp_magic.procs.slurm_template``: one import of torch a node instead of one a
rank, and a rank lost on a node is forked again there in milliseconds, with no new step. It
is procs/forkserver.py's Template (fork, spares, reaping, killing every child when the
kernel goes) with two differences: its commands reach every node at once (srun broadcasts
its stdin, ``--input=all``), so each template acts only on the spawns (and pings) for its own node;
and a rank's env is this task's env (Slurm's node-local variables, the GPUs Slurm gave
it) with the kernel's per-rank changes applied (``env_set`` / ``env_unset``), torchrun's
set and the rank's own Slurm task variables among them.

The pool's secret comes in the step's env and leaves ``os.environ`` at once; a later
pool's secret comes sealed with it (wire/slurm_env.py ``seal``), never in the clear.
stdin closing (srun gone: the kernel is) or SIGTERM (the step cancelled) ends every rank
and the template; a rank dies with its template (its parent-death signal). A kept pool
(docs/keep.md): the first node's template holds the lease, as a fork-server template does, and
the others follow it; stdin closing then only means that no kernel is attached. A following template holds a
connection to the lease (procs/template_keep.py ``follow``, once the kernel says where the holder listens): a
kernel that attaches the pool later sends its spawns to the holder, which hands one for another node to that
node's template.
"""
from __future__ import annotations

import os
import signal
import traceback

from ..logs import log
from ..wire import slurm_env
from .forkserver import _emit, _warm_imports
from .node_template import NodeTemplate
from .parent import die_with_parent

NODE_ENV = "SLURMD_NODENAME"  # the node's name, the same in every step (a spawn names the node it is for)


def main() -> None:
    env = dict(os.environ)
    try:
        secret = slurm_env.step_secret(env)  # MUNGE-sealed (or plain), out of the env either way
    finally:
        for carrier in (slurm_env.SECRET_ENV, slurm_env.MUNGED_ENV):
            os.environ.pop(carrier, None)
    if not secret:
        raise SystemExit(f"{slurm_env.SECRET_ENV} is not in the env: this task was not started by ddp_magic's Slurm launcher")
    node = env.get(NODE_ENV, "")
    template = NodeTemplate(node, secret, env, f"its Slurm job {env.get('SLURM_JOB_ID', '')} ended (its time limit came, or it was cancelled)")
    signal.signal(signal.SIGTERM, template.terminated)  # the step cancelled or preempted: the ranks go with us (armed: after saving)
    signal.signal(signal.SIGUSR1, template.warned)  # --save-on-preempt's --signal=USR1@120: armed ranks save
    die_with_parent(os.getppid(), signal.SIGTERM)  # slurmstepd gone
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        info = _warm_imports()
    except BaseException as e:
        log.debug("the node template could not import torch", exc_info=True)
        _emit({"event": "error", "node": node, "message": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        os._exit(1)
    template.watch_children()
    _emit({"event": "ready", "node": node, "pid": os.getpid(), "info": info})
    template.serve()


if __name__ == "__main__":
    main()
