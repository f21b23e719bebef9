"""The template of one node of a pool across hosts: imports torch once and forks that node's ranks; whatever started it (srun, ssh).

procs/forkserver.py's Template (fork, spares, reaping, killing every child when the kernel
goes) with what a node of several adds: commands may name another node (srun broadcasts its
stdin to every task), so a template acts only on the spawns and pings for its own; a rank's env
is this template's env with the kernel's per-rank changes applied (``env_set`` / ``env_unset``);
a later pool's secret arrives sealed with the first one's (wire/seal.py); and a kept
pool's lease is held by the first node's template, the others following it (procs/template_keep.py).
Started by procs/slurm_template.py (a task of an srun step) and procs/ssh_template.py (an ssh
session), which differ only in how the secret arrives and what they watch.
"""
from __future__ import annotations

from typing import Dict

from ..wire import seal
from .forkserver import Template
from .template_keep import emit as _emit


class NodeTemplate(Template):
    """forkserver's Template on one node: spawns for other nodes are ignored, a rank's env is built here."""

    def __init__(self, node: str, secret: bytes, env: Dict[str, str], terminated_why: str) -> None:
        super().__init__(kernel_pid=0)  # the kernel may be on another host: nothing of it to wait for here
        self.node, self.secret, self.env = node, secret, env
        self.terminated_why = terminated_why  # a kept pool's end by SIGTERM, as the next attach says it

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
        """The pool's secret in ``cmd``: sealed with the template's when it is another (wire/seal.py), else the template's."""
        if cmd.get("sealed"):
            cmd["secret"] = seal.unseal(self.secret, cmd.pop("sealed"), bytes.fromhex(cmd.pop("nonce"))).hex()
        return cmd

    def command(self, cmd: dict) -> None:
        """A kept pool's lease is held by the template of the node the keep names; the others follow it: they outlive
        the kernel too, and end when the lease does (a Slurm allocation with it: procs/slurm_hold.py releases it). A ping is
        the kernel asking whether this node hears it again (its ranks were unreachable): answered at once, over the
        same way a spawn would come and its ranks' events would go (srun's or ssh's stdin and output)."""
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
