"""A kept pool's template as the attached kernel's launcher: the fork server, reached on its lease socket.

The template outlived the kernel that started it, so it is no child of ours and has no pipe to us: its
commands (``spawn`` a dead rank again, ``exit``) and events (``spawned``, ``exited``) travel on the
authenticated lease connection the attach opened (procs/lease.py), one JSON object a line, as on the
pipes of a template we started. Its liveness is its lock (wire/kept.py), not its pid.
"""
from __future__ import annotations

import json
import socket
import time
from typing import Dict, Optional

from ...logs import log
from ...wire import kept
from ..launchers import ForkServerLauncher, LaunchError

EXIT_WAIT_S = 3.0  # %ddp stop: how long the template gets to end its ranks and release its lock


class KeptLauncher(ForkServerLauncher):
    """ForkServerLauncher over a kept template's lease connection."""

    def __init__(self, secret: bytes, sock: socket.socket, pids: Dict[int, int], lock: str) -> None:
        super().__init__(secret)
        self.sock: Optional[socket.socket] = sock
        self._pids = dict(pids)
        self.lock = lock
        self.ready_info = "the kept pool's template (attached)"

    refuses = ""  # why no rank may be forked here (an attached Slurm pool: its node templates read srun's stdin, not us)

    def spawn(self, rank: int, config: dict) -> None:
        if self.refuses:
            raise LaunchError(self.refuses)
        super().spawn(rank, config)

    def begin(self, nice: int = 0) -> None:
        """Nothing to start: the template runs."""

    def stale(self) -> list:
        return []

    def start(self, timeout: float = 120.0) -> str:
        return self.ready_info

    def _write(self, obj: dict) -> None:
        if self.sock is None:
            raise OSError("the kept template's connection is closed")
        self.sock.sendall((json.dumps(obj) + "\n").encode())

    def fileno(self) -> Optional[int]:
        return self.sock.fileno() if self.sock is not None else None

    def alive(self) -> bool:
        """Its connection is open and, while it holds a lease, its lock is held (after keep --off: the connection alone)."""
        return self.sock is not None and (not self.lock or kept.is_held(self.lock))

    def detach(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()
        self._pids = {}

    def close(self) -> None:
        """%ddp stop (or a pool that replaces this one): the template ends its ranks and its lease, then exits."""
        if self.sock is None:
            return
        try:
            self._write({"op": "exit"})
        except OSError:
            log.debug("the kept template was gone already", exc_info=True)
        deadline = time.monotonic() + EXIT_WAIT_S
        while self.lock and kept.is_held(self.lock) and time.monotonic() < deadline:
            time.sleep(0.02)
        self.detach()
        self.ready_info = ""
