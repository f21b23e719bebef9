"""The kernel's host following a kept pool's lease held on another host: the liveness lock here, the discovery file mirrored.

Runs in the process that holds a kept Slurm pool's allocation on the kernel's host (procs/slurm_hold.py: salloc's
command, which outlives the kernel). A lease on another node (procs/lease.py, over TCP and TLS) cannot hold a lock
or write a file here, where the next kernel, ``%ddp attach --list`` and ``python -m ddp_magic kept`` look; so this
thread does it for it: it proves the pool's secret to the lease, asks to *watch*, writes every discovery record the
lease sends to this host's discovery file (0600), and holds this host's liveness lock as long as the connection
lives. When the lease ends it writes why (the next attach says so); on ``keep --off`` or a stop the files go; a
connection lost without a word says that the holder went away. Then the lock is free, and the allocation follows it.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from typing import Any, Callable, Dict, Optional

from ..logs import log
from ..wire import kept

CONNECT_S = 30.0  # the lease listens before the kernel sends us its address: this covers a slow TLS key on a busy node


class LeaseWatch:
    """One kept pool's lease, watched from this host (see the module's docstring)."""

    def __init__(self, spec: Dict[str, Any]) -> None:
        self.at: kept.LeaseAt = spec["lease"]
        self.secret = bytes.fromhex(spec["secret"])
        self.id, self.where = str(spec["id"]), str(spec["where"])
        self.node = str(spec.get("node") or "its first node")
        self.lock = kept.lock_path(self.id, self.where)
        self.sock: Optional[socket.socket] = None
        self.failed = False  # never reached the lease: the kernel's keep fails, the allocation follows the kernel again
        self.over = threading.Event()  # the lease ended (its lock here is free)
        self.stopping = False
        self.on_end: Optional[Callable[[], None]] = None  # what the lease's end (a stop's too) ends here before the lock goes (a Ray pool's driver)
        self.unwatched = False  # stop() was called: keep --off, the pool goes on

    def start(self) -> None:
        threading.Thread(target=self._run, name="ddp-lease-watch", daemon=True).start()

    def stop(self) -> None:
        """``keep --off``: the pool is its kernel's again; nothing of it here any more."""
        self.stopping = self.unwatched = True
        sock = self.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                log.debug("the lease watch's connection was closed already", exc_info=True)

    def _run(self) -> None:
        fd: Optional[int] = None
        try:
            self.sock = self._dial()
            if self.sock is None:
                self.failed = True
                return
            buf, first = b"", True
            while True:
                data = self.sock.recv(65536)
                if not data:
                    break
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if self._event(json.loads(line)):
                        return
                    if first:  # the record is here: now the pool is alive for whoever looks on this host
                        fd, first = kept.hold_lock(self.lock), False
            if not self.stopping:
                self._ended(f"its lease holder on {self.node} went away (its node, its template or the network)")
        except (OSError, ValueError):
            log.warning("watching the kept pool %s's lease failed", self.id, exc_info=True)
            if fd is not None and not self.stopping:
                self._ended(f"this host lost its connection to the lease on {self.node}")
        finally:
            self._remove(files=self.stopping)
            if fd is not None and not self.unwatched and self.on_end is not None:  # its lock free means all of it is gone
                self.on_end()
            if fd is not None:
                os.close(fd)
            self.over.set()

    def _dial(self) -> Optional[socket.socket]:
        deadline = time.monotonic() + CONNECT_S
        while not self.stopping:
            try:
                sock = kept.dial_lease(self.at, self.secret)
                sock.sendall(b'{"op": "watch"}\n')
                sock.settimeout(None)
                return sock
            except OSError:
                if time.monotonic() > deadline:
                    log.warning("the kept pool %s's lease on %s did not answer", self.id, self.node, exc_info=True)
                    return None
                time.sleep(0.2)
        return None

    def _event(self, event: Dict[str, Any]) -> bool:
        """One word of the lease; whether the watch is over."""
        kind = event.get("event")
        if kind == "record":
            kept.write_private(kept.discovery_path(self.id, self.where), dict(event["record"], holder=self.node))
        elif kind == "ended":
            kept.write_private(kept.discovery_path(self.id, self.where), event["record"])
            return True
        elif kind == "off":
            self.stopping = True
            return True
        return False

    def _ended(self, why: str) -> None:
        try:
            old = kept.read(kept.discovery_path(self.id, self.where))
        except (OSError, ValueError):
            old = {}
        kept.write_private(kept.discovery_path(self.id, self.where), dict(
            id=self.id, state="ended", why=why, at=time.time(), notebook=old.get("notebook", ""), nproc=old.get("nproc"),
            job=old.get("job"), meanwhile=old.get("meanwhile") or []))

    def _remove(self, files: bool) -> None:
        """This host's pool directory (the kernel's count of what it showed); with ``files``, the discovery file and lock."""
        shutil.rmtree(kept.pool_dir(self.id, self.where), ignore_errors=True)
        for path in (kept.discovery_path(self.id, self.where), self.lock) if files else ():
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
