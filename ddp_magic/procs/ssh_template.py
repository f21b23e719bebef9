"""A host's template over SSH: the remote command of the pool's ssh session to that host; says who it is, then imports torch once and forks the host's ranks.

Started by the kernel's launcher (kernel/launchers/ssh.py) as ``ssh HOST -- sh -c 'cd DIR;
exec PYTHON -m ddp_magic.procs.ssh_template --node HOST'``: one session a host, in parallel.
Its first line is a ``hello`` (wire/node_hello.py: versions and content hashes, GPUs,
addresses), before it reads anything; the kernel refuses a host whose code differs by
closing the session, and nothing ran. Otherwise the kernel's first line carries the pool's
secret and the env the host's ranks share (the secret only ever on this stdin: never argv,
never the remote command's env); then it is procs/node_template.py's template, as on Slurm.

What it watches, so that nothing outlives its kernel (unless kept, below):
- its session: stdin closing (ssh ended, the kernel's side of it gone), and its parent
  (sshd's session process; its end is a SIGTERM here, a SIGHUP too);
- the kernel itself: the kernel sends a ``beat`` every few seconds over the session; none
  for ``silence`` seconds (a link down, the kernel's host gone, where sshd would go on
  waiting) ends every rank and the template. sshd is not relied on to end a remote
  command when its connection drops: it does not always.

A kept pool (``%ddp keep``, docs/keep.md "Over SSH"): the template *detaches from its session* instead of having its
ssh client kept alive on the kernel's host. From the keep on it clears its parent-death signal, takes neither stdin's
EOF nor SIGHUP nor the beat's silence for the kernel's end, and follows the lease: the first host's template holds
it (TCP and TLS), the others hold a connection to it (procs/template_keep.py ``follow``) and end their ranks when it
closes, or goes silent (TLS keepalive). Why not keep the ssh clients alive under a keeper on the kernel's host: an
ssh client is one more process there per host that must itself be ended with the lease, it would tie the pool to the
kernel's host's network for nothing (an attached kernel reaches the templates through the lease, not ssh), and a
host lost meanwhile would leave its client hanging until ssh's own keepalive; a detached template needs nothing of
its session. ``keep --off`` ties it to its session and the beat again.

``--save-on-preempt`` (docs/snapshots.md "Preemption"): SIGTERM is two things here. As our parent-death signal (sshd's
session gone: the kernel's side of it, or the kernel) it ends everything at once, as before; Linux re-parents us before
it sends that signal, so the handler tells it by our parent no longer being the session. From outside while the
session lives (a ``kill``, a preemptible machine's agent) it is a Slurm node's: armed ranks get SIGUSR1 and save while
the kernel lives, and the template goes once they have gone (the kernel ends them after saving), at the session's end,
or after PREEMPT_GRACE_S. SIGUSR1 to the template is passed on to armed ranks, as on Slurm.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from typing import Dict, Optional

from ..logs import log
from ..wire import node_hello, seal
from .forkserver import _read_line, _warm_imports, readable
from .node_template import NodeTemplate
from .lease import release_from_parent
from .parent import die_with_parent
from .template_end import TemplateEnd, tell
from .template_keep import emit


class SshTemplate(NodeTemplate):
    """NodeTemplate that also ends when the kernel has not been heard for ``silence`` seconds (unless kept)."""

    sealed_secret = False  # the secret comes as it is: ssh encrypts the session (a Ray template's comes sealed to its key)

    def __init__(self, node: str, secret: bytes, env: Dict[str, str], silence: float) -> None:
        super().__init__(node, secret, env, "its ssh session ended")
        self.silence = silence
        self.heard = time.monotonic()
        self.session = os.getppid()  # sshd's session process: we die with it, unless kept

    def read_commands(self) -> None:
        self.heard = time.monotonic()
        super().read_commands()

    def reap(self) -> None:
        """Every turn of the loop (a second at most): exited ranks, then whether the kernel went silent."""
        super().reap()
        if self.follows_lease and self.upstream is None and self.kernel_fd < 0:
            log.warning("no kernel and no connection to the kept pool's lease: ending this host's ranks")
            tell(self.node, self.children, TemplateEnd.NO_LEASE)
            self.kernel_gone(dead=False)
        if self.kept_or_following():
            return
        if self.kernel_fd == 0 and time.monotonic() - self.heard > self.silence:
            if readable([0], 0):  # beats waiting unread: this loop was held up (a starved machine), not the kernel; read next
                return
            log.debug("no beat from the kernel for %.0fs: ending the ranks", self.silence)
            tell(self.node, self.children, TemplateEnd.SILENT, seconds=self.silence)
            self.kernel_gone()

    def terminated(self, *_: object) -> None:
        """SIGTERM: our parent-death signal ends everything at once; one from outside while the session lives and a kernel
        hears us saves armed ranks first (the module's docstring; procs/template_preempt.py)."""
        parent_gone = os.getppid() != self.session  # re-parented: the session is gone
        self.preempt_or_end(not parent_gone and self.kernel_fd >= 0, (TemplateEnd.PARENT_GONE, {"parent": self.terminated_why})
                            if parent_gone else (TemplateEnd.SIGTERM, {}))

    def kept_or_following(self) -> bool:
        return self.lease is not None or self.follows_lease

    def command(self, cmd: dict) -> None:
        """As a node template's; a keep (held here or followed) detaches us from the session, an unkeep ties us again."""
        was = self.kept_or_following()
        super().command(cmd)
        now = self.kept_or_following()
        if now and not was:
            release_from_parent()
            signal.signal(signal.SIGTERM, self.kept_terminated)  # from outside now: armed ranks save while a kernel is attached
        elif was and not now:
            self.heard = time.monotonic()  # the kernel beats on: its silence counts from here
            die_with_parent(self.session, signal.SIGTERM)
            signal.signal(signal.SIGTERM, self.terminated)  # a kept holder's SIGTERM ended its lease (procs/template_keep.py)

    def kernel_left(self) -> None:
        """As a template's; a kept one whose session just closed sends its stdout and stderr to /dev/null from now on: a
        rank forked again later must not inherit a pipe no one reads (its events go over the lease)."""
        session = self.kernel_fd == 0
        super().kernel_left()
        if session and self.kept_or_following():
            devnull = os.open(os.devnull, os.O_WRONLY)
            for fd in (1, 2):
                os.dup2(devnull, fd)
            os.close(devnull)

    def hangup(self, *_: object) -> None:
        """SIGHUP (the session's end): as its stdin closing, unless the pool is kept."""
        if not self.kept_or_following():
            tell(self.node, self.children, TemplateEnd.HANGUP)
            self.kernel_gone()


def _init() -> Optional[dict]:
    """The kernel's first line (secret, env, silence); None when the kernel closed the session instead (refused)."""
    line = _read_line()
    if not line.strip():
        return None
    return json.loads(line)


def init_secret(init: dict, node: str, key: Optional[seal.Ephemeral]) -> bytes:
    """The pool's secret from the kernel's first line: as it is (an ssh session), or sealed to this template's ``key``
    (wire/seal.py: a Ray node's, whose first line crosses Ray's RPC), which then is the only form taken."""
    if key is None:
        return bytes.fromhex(init["secret"])
    entry = (init.get("sealed_to") or {}).get(node)
    if not isinstance(entry, dict):
        raise ValueError(f"the kernel's first line holds no secret sealed to {node}'s key")
    return seal.opened(key, entry)


def main(argv: Optional[list] = None, kind: "type[SshTemplate]" = SshTemplate) -> None:
    """``kind``: SshTemplate, or procs/ray_template.py's (a Ray actor's child)."""
    parser = argparse.ArgumentParser(prog=f"python -m {kind.__module__}")
    parser.add_argument("--node", required=True, help="the host's name as the kernel calls it (its ssh alias)")
    parser.add_argument("--port", type=int, default=0, help="MASTER_PORT, to say whether it is free here")
    parser.add_argument("--probe", action="store_true", help="say hello and exit (%%ddp_env's checks)")
    parser.add_argument("--dial", default="", help="HOST:PORT of the kernel, to say whether it is reached from here")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    key = seal.Ephemeral() if kind.sealed_secret and not args.probe else None
    emit(dict(node_hello.hello(args.node, args.port, args.dial), **({"key": key.public} if key else {})))
    if args.probe:
        return
    init = _init()
    if init is None:
        os._exit(0)
    os.environ.update(init.get("env") or {})
    try:
        secret = init_secret(init, args.node, key)
    except (KeyError, ValueError) as e:  # not the kernel's line, or not for us: nothing runs here
        emit({"event": "error", "node": args.node, "message": f"no pool secret: {e}"})
        os._exit(1)
    template = kind(args.node, secret, dict(os.environ), float(init.get("silence") or node_hello.SILENCE_S))
    signal.signal(signal.SIGTERM, template.terminated)  # sshd's session ended (our parent-death signal), or a kill
    signal.signal(signal.SIGUSR1, template.warned)  # --save-on-preempt: passed on to armed ranks
    signal.signal(signal.SIGHUP, template.hangup)
    die_with_parent(os.getppid(), signal.SIGTERM)
    try:
        info = _warm_imports()
    except BaseException as e:
        log.debug("the host's template could not import torch", exc_info=True)
        emit({"event": "error", "node": args.node, "message": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        os._exit(1)
    template.heard = time.monotonic()
    template.watch_children()
    emit({"event": "ready", "node": args.node, "pid": os.getpid(), "info": info})
    template.serve()


if __name__ == "__main__":
    main(sys.argv[1:])
