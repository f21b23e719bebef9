"""The parent of what the kernel starts on Slurm (salloc, srun): it goes with the kernel, unless a kept pool lets it stay.

``python -m ddp_magic.procs.anchor PROGRAM ARGS...`` replaces ``setpriv --pdeathsig TERM PROGRAM ARGS...``.
A parent-death signal cannot be taken back from outside the process that asked for it, and a kept pool
(docs/keep.md) needs its salloc and srun to outlive the kernel. So they run as this process's child:

- the anchor asks Linux for SIGKILL when the kernel goes, its child for SIGTERM when the anchor goes: a
  kernel's death (SIGKILL included) reaches salloc and srun as setpriv's signal did;
- SIGUSR1 (``%ddp keep``) clears the anchor's parent-death signal: the child outlives the kernel; SIGUSR2
  (``%ddp keep --off``) asks for it again;
- the child's stdout and stderr pass through the anchor to its own (the kernel's pipes). Once the kernel no
  longer reads them, the anchor drops what comes: a kept srun never writes into a pipe without a reader
  (SIGPIPE would end srun, and Slurm the step with it). stdin is the child's own (the kernel's pipe).

It exits with its child's status (a signal's as that signal). It imports nothing of torch.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import List

from ..wire.kept import ANCHOR_KEEP as KEEP_SIGNAL, ANCHOR_UNKEEP as UNKEEP_SIGNAL
from .parent import PR_SET_PDEATHSIG, die_with_parent


def _prctl_pdeathsig(sig: int) -> None:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


def _child_dies_with_us(anchor: int) -> None:
    """In the child, before exec: SIGTERM when the anchor goes (setpriv's signal)."""
    _prctl_pdeathsig(signal.SIGTERM)
    if os.getppid() != anchor:
        os._exit(1)


def _relay(src: int, dst: int) -> None:
    """Copy ``src`` to ``dst`` until EOF; once ``dst`` has no reader (the kernel is gone), drop what comes."""
    out = True
    while True:
        try:
            data = os.read(src, 65536)
        except OSError:
            return
        if not data:
            return
        view = memoryview(data)
        while out and view:
            try:
                view = view[os.write(dst, view):]
            except OSError:  # EPIPE: no kernel reads us any more
                out = False


def main(argv: List[str]) -> int:
    if not argv:
        print("usage: python -m ddp_magic.procs.anchor PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    kernel = os.getppid()
    die_with_parent(kernel)  # SIGKILL: no code of ours runs, the child's own signal does the rest
    same = os.fstat(1).st_ino == os.fstat(2).st_ino and os.fstat(1).st_dev == os.fstat(2).st_dev
    me = os.getpid()
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT if same else subprocess.PIPE,
                             preexec_fn=lambda: _child_dies_with_us(me), close_fds=True)
    # set after the child's start: an ignored signal would be ignored in it too, past exec
    signal.signal(KEEP_SIGNAL, lambda *_: _prctl_pdeathsig(0))
    signal.signal(UNKEEP_SIGNAL, lambda *_: die_with_parent(kernel))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # the kernel signals the group: the child answers it
        signal.signal(sig, signal.SIG_IGN)
    streams = [(child.stdout, 1)] + ([] if same else [(child.stderr, 2)])
    relays = [threading.Thread(target=_relay, args=(s.fileno(), fd), daemon=True) for s, fd in streams if s is not None]
    for relay in relays:
        relay.start()
    code = child.wait()
    for relay in relays:
        relay.join(timeout=2.0)  # a grandchild may hold the pipe: its output is not the kernel's to wait for
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(me, -code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
