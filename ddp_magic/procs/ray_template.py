"""A Ray node's template: an SSH host's template (procs/ssh_template.py) whose parent is its Ray actor, and stays so when kept.

Started by procs/ray_actor.py as ``python -m ddp_magic.procs.ray_template --node NAME``, the actor's child. Until
``%ddp keep`` it is the SSH template exactly: it ends with its parent (the actor; a parent-death signal, even when
the actor is SIGKILLed), its stdin's end, or the kernel's beat's silence. A kept SSH template drops its
parent-death signal (its parent, sshd's session, ends with the kernel's ssh client); a kept Ray template must not:
its actor does not end with the kernel (the pool's driver outlives the kernel under the lease,
procs/ray_keep.py), and a template must never outlive its actor. So after every keep, follow or unkeep it asks
for the signal again. Its stdin closing while kept (the driver's word that no kernel is there) is the kernel's
leaving, as a kept SSH template's session closing is.

Its lines cross Ray's RPC (the actor's ``write``), which is not encrypted unless the cluster turned on Ray's TLS. So
its hello carries the public half of a key it just made, and the kernel's first line holds the pool's secret sealed to
that key (wire/seal.py); a later pool's secret or a kept pool's comes sealed with that secret, as on Slurm.

``--save-on-preempt`` is the SSH template's (docs/snapshots.md "Preemption"): a SIGTERM while its actor lives (a node's
shutdown, a ``kill``) saves armed ranks first; its parent-death signal (the actor gone) ends everything at once.
"""
from __future__ import annotations

import signal
import sys
from typing import Dict, Optional

from .parent import die_with_parent
from .ssh_template import SshTemplate, main as ssh_main


class RayTemplate(SshTemplate):
    """SshTemplate that dies with its actor, kept or not, and takes the pool's secret sealed to its own key."""

    sealed_secret = True  # its first line crosses Ray's RPC, clear unless the cluster turned on Ray's TLS (wire/seal.py)

    def __init__(self, node: str, secret: bytes, env: Dict[str, str], silence: float) -> None:
        super().__init__(node, secret, env, silence)
        self.terminated_why = "its Ray actor ended"

    def command(self, cmd: dict) -> None:
        """As an SSH template's, then the parent-death signal again (a keep lifts it: procs/lease.py release_from_parent)."""
        super().command(cmd)
        if cmd.get("op") in ("keep", "follow", "unkeep"):
            die_with_parent(self.session, signal.SIGTERM)


def main(argv: Optional[list] = None) -> None:
    ssh_main(argv, RayTemplate)


if __name__ == "__main__":
    main(sys.argv[1:])
