"""A Slurm node's template: the one task of the pool's step on its node; imports torch once and forks the node's ranks.

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
from typing import Dict

from ..logs import log
from ..wire import slurm_env
from .forkserver import Template, _emit, _warm_imports
from .parent import die_with_parent

NODE_ENV = "SLURMD_NODENAME"  # the node's name, the same in every step (a spawn names the node it is for)


class NodeTemplate(Template):
    """forkserver's Template on one Slurm node: spawns for other nodes are ignored, a rank's env is built here."""

    def __init__(self, node: str, secret: bytes, env: Dict[str, str]) -> None:
        super().__init__(kernel_pid=0)  # the kernel may be on another host: nothing of it to wait for here
        self.node, self.secret, self.env = node, secret, env
        self.terminated_why = f"its Slurm job {env.get('SLURM_JOB_ID', '')} ended (its time limit came, or it was cancelled)"

    def spawn(self, cmd: dict) -> None:
        if cmd.get("node") != self.node:
            if self.lease is not None and self.kernel_sock is not None:  # a kernel that attached the kept pool asks us alone
                why = self.lease.forward(cmd)  # that node's template holds a connection to our lease (``follow``)
                if why:
                    _emit({"event": "unserved", "rank": cmd.get("rank"), "node": cmd.get("node"), "why": why})
            return
        config = cmd["config"]
        env = dict(self.env, **config.pop("env_set", {}))
        for name in config.pop("env_unset", []):
            env.pop(name, None)
        config["env"] = env
        super().spawn(self._unsealed(cmd))

    def _unsealed(self, cmd: dict) -> dict:
        """The pool's secret in ``cmd``: sealed with the step's when it is another (wire/slurm_env.py), else the step's."""
        if cmd.get("sealed"):
            cmd["secret"] = slurm_env.unseal(self.secret, cmd.pop("sealed"), bytes.fromhex(cmd.pop("nonce"))).hex()
        return cmd

    def command(self, cmd: dict) -> None:
        """A kept pool's lease is held by the template of the node the keep names; the others follow it: they outlive
        the kernel too, and end with the allocation when the lease does (procs/slurm_hold.py releases it). A ping is
        the kernel asking whether this node hears it again (its ranks were unreachable): answered at once, over the
        same way a spawn would come and its ranks' events would go (srun's stdin and output)."""
        op, node = cmd.get("op"), cmd.get("node")
        if op == "ping":
            if node == self.node:
                _emit({"event": "pong", "node": self.node, "id": cmd.get("id")})
            return
        if op in ("keep", "unkeep", "follow") and node and node != self.node:
            if op == "follow":  # the holder's lease is up: where it listens (a socket, or TCP and TLS on its host)
                self.follow(cmd["lease"], bytes.fromhex(self._unsealed(cmd).get("secret") or self.secret.hex()), self.node, str(cmd.get("dir") or ""))
            elif op == "keep":
                self.follows_lease = True
            else:
                self.follows_lease = False
                self.unfollow()
            return
        if op == "follow":
            return
        if op == "unkeep":
            self.follows_lease = False
        if op == "keep":
            cmd = self._unsealed(cmd)
            cmd.setdefault("secret", self.secret.hex())
        super().command(cmd)


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
    template = NodeTemplate(node, secret, env)
    signal.signal(signal.SIGTERM, template.kernel_gone)  # the step cancelled: the ranks go with us
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
