"""A rank's control channel to the kernel: one frame at a time from any thread, and, in a kept pool, a queue while no kernel is attached."""
from __future__ import annotations

import socket
import threading
from typing import Any, List, Optional

from ..logs import log
from ..wire import protocol as P
from ..wire import tls


class Channel:
    """The authenticated socket to the kernel; sends from any thread, one frame at a time. In a kept pool
    (procs/rank_keep.py) what is sent while no kernel is attached waits here for the next one."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock: Optional[socket.socket] = sock
        self._lock = threading.Lock()
        self.kept = False
        self.pending: List[bytes] = []
        self.undelivered = False  # a DONE waits in ``pending``: the cell ended while no kernel was attached

    def send(self, op: str, **fields: Any) -> None:
        parts = P.encode_parts(P.message(op, **fields))  # a result's tensors as their own memory, not copied into the frame
        with self._lock:
            if self.sock is None and self.kept:
                self._keep(op, parts)
                return
            assert self.sock is not None
            try:
                for part in parts:
                    tls.send(self.sock, part)  # over TLS a big one goes from that memory (the relay's), else sendall
            except OSError:
                if not self.kept:
                    raise
                log.debug("the kernel went while we sent; kept for the next one", exc_info=True)
                self.sock = None
                self._keep(op, parts)

    def _keep(self, op: str, parts: List[Any]) -> None:
        """No kernel to send to: the frame waits for the next one (copied: a tensor's memory may change meanwhile)."""
        self.pending.append(b"".join(parts))
        self.undelivered = self.undelivered or op == P.DONE

    def detach(self) -> None:
        with self._lock:
            self.sock = None

    def attach(self, sock: socket.socket) -> None:
        """A new kernel: what waited is sent first, in order."""
        with self._lock:
            for frame in self.pending:
                tls.send(sock, frame)
            self.pending.clear()
            self.undelivered = False
            self.sock = sock
