"""A rank's control channel to the kernel: one frame at a time from any thread, and, in a kept pool, a queue while no kernel is attached."""
from __future__ import annotations

import socket
import threading
from typing import Any, List, Optional, Tuple

from ..logs import log
from ..wire import protocol as P
from ..wire import tls


class Channel:
    """The authenticated socket to the kernel; sends from any thread, one frame at a time. In a kept pool
    (procs/rank_keep.py) what is sent while no kernel is attached waits here for the next one.

    A kept pool's last DONE is also held until the kernel says it counted it (``DONE_SEEN``): a frame written to a
    kernel that has just been killed is accepted by the socket and lost with the kernel (its RST comes after), and
    that DONE carries the job's end and result. A kernel that goes before it counted the DONE leaves it to the next."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock: Optional[socket.socket] = sock
        self._lock = threading.Lock()
        self.kept = False
        self.pending: List[bytes] = []
        self.undelivered = False  # a DONE waits in ``pending``: the cell ended while no kernel was attached
        self.unseen: Optional[Tuple[int, bytes]] = None  # kept: (cell, frame) of the last DONE no kernel has counted

    def send(self, op: str, **fields: Any) -> None:
        parts = P.encode_parts(P.message(op, **fields))  # a result's tensors as their own memory, not copied into the frame
        with self._lock:
            if self.sock is None and self.kept:
                self._keep(op, parts, fields.get("cell"))
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
                self._keep(op, parts, fields.get("cell"))
                return
            if self.kept and op == P.DONE:
                self.unseen = (int(fields["cell"]), b"".join(parts))

    def _keep(self, op: str, parts: List[Any], cell: Optional[int]) -> None:
        """No kernel to send to: the frame waits for the next one (copied: a tensor's memory may change meanwhile)."""
        frame = b"".join(parts)
        self.pending.append(frame)
        if op == P.DONE:
            self.undelivered, self.unseen = True, (int(cell or 0), frame)

    def heard(self, op: str, msg: dict) -> None:
        """The kernel counted our DONE of ``cell`` (``DONE_SEEN``), or sent a new cell (it had the last one's end)."""
        with self._lock:
            if self.unseen is not None and (op == P.RUN or (op == P.DONE_SEEN and msg.get("cell") == self.unseen[0])):
                self.unseen = None

    def detach(self) -> None:
        """The kernel is gone: a DONE it never counted goes first to the next one."""
        with self._lock:
            self.sock = None
            if self.unseen is not None and self.kept and not any(f is self.unseen[1] for f in self.pending):
                self.pending.insert(0, self.unseen[1])
                self.undelivered = True

    def attach(self, sock: socket.socket) -> None:
        """A new kernel: what waited is sent first, in order (a DONE in it stays held until this kernel counts it)."""
        with self._lock:
            for frame in self.pending:
                tls.send(sock, frame)
            self.pending.clear()
            self.undelivered = False
            self.sock = sock
