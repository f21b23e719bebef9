"""The template's part in a kept pool: its commands (``keep``, ``unkeep``), an attached kernel's connection, the lease's turn in its loop.

A mixin of procs/forkserver.py's ``Template``, kept apart so that file stays the fork server and this one the
keeping: the lease itself (lock, discovery file, timers, the lease socket) is procs/lease.py's.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time
from typing import Callable, Dict, List, Optional

from ..logs import log
from ..wire import kept
from .lease import Lease, release_from_parent
from .parent import die_with_parent

FOLLOW_WAIT_S = 30.0  # a following template reaches the holder's lease socket within this (it opens as the same keep arrives)

EVENTS = {"fd": 1}  # where events go: stdout, an attached kernel's lease connection (procs/lease.py), or nowhere (-1)


def emit(event: dict) -> None:
    """One event to the kernel; a kernel that is gone reads none (and must not stop our cleanup)."""
    data = (json.dumps(event) + "\n").encode()
    if EVENTS["fd"] < 0:
        return
    try:
        while data:
            n = os.write(EVENTS["fd"], data)
            data = data[n:]
    except OSError:  # EPIPE: the kernel died; kernel_gone still kills the ranks and removes the files
        log.debug("the kernel no longer reads our events", exc_info=True)


class KeptTemplate:
    """What a ``Template`` does for a kept pool."""

    kernel_fd: int
    cmd_buf: bytes
    lease: Optional[Lease]
    spares: Dict[int, int]
    children: Dict[int, int]
    want: int
    kernel_pid: int
    spawn: Callable[[dict], None]  # the Template's (procs/forkserver.py)
    kernel_gone: Callable[..., None]  # the Template's: end the pool when its kernel goes (dead=False: it asked)
    kept_terminated: Callable[..., None]  # procs/template_preempt.py: a SIGTERM to a kept pool's template

    def command(self, cmd: dict) -> None:
        op = cmd["op"]
        if op == "spawn":
            self.spawn(cmd)
        elif op == "exit":
            self.kernel_gone(dead=False)
        elif op == "keep":
            self.keep(cmd)
        elif op == "unkeep":
            if self.lease is not None:
                self.lease.off()
                self.lease = None
            if self.kernel_sock is None and self.kernel_pid:  # our own kernel again: we die with it, as before keep
                die_with_parent(self.kernel_pid, signal.SIGTERM)
            emit({"event": "unkept"})

    def keep(self, cmd: dict) -> None:
        """%ddp keep: the pool outlives its kernel from now on (procs/lease.py); again: new timers."""
        if self.lease is not None:
            self.lease.idle, self.lease.max = float(cmd["idle"]), float(cmd["max"])
            self.lease.info.update(cmd.get("info", {}))
            self.lease.write()
        else:
            release_from_parent()
            signal.signal(signal.SIGTERM, self.kept_terminated)  # no parent-death signal now: a SIGTERM is from outside
            self.lease = Lease(cmd, bytes.fromhex(cmd["secret"]), lambda: dict(self.children))
            self.lease.fence_old = self.fence
            self.lease.relay = emit  # a following node template's events (procs/slurm_template.py): on to the attached kernel
        emit({"event": "kept", "id": self.lease.id, "dir": self.lease.dir, "lease": self.lease.at})

    def fence(self, event: dict) -> None:
        """Another kernel attached with --force: the one attached now is told, and no longer heard."""
        emit(event)
        self.kernel_left()

    kernel_sock: Optional[socket.socket] = None  # an attached kernel's lease connection (None: our stdin, or no kernel)
    follows_lease = False  # a Slurm node's template whose pool another node's template keeps (procs/slurm_template.py)
    upstream: Optional[socket.socket] = None  # a following template's connection to the holder's lease socket
    up_buf = b""
    spool_dir = ""  # a following template's: where its node's ranks spool (removed when the pool ends)

    def kernel_left(self) -> None:
        """No kernel hears us now (fd 0, our stdin, stays open for no one); a following template's events go to the holder,
        which passes them on to the kernel that attaches next."""
        if self.kernel_sock is not None:
            try:
                self.kernel_sock.close()
            except OSError:
                log.debug("closing the kernel's connection failed", exc_info=True)
        self.kernel_sock = None
        self.kernel_fd, self.cmd_buf = -1, b""
        EVENTS["fd"] = self.upstream.fileno() if self.upstream is not None else -1
        if self.lease is not None:
            self.lease.kernel_left()

    # ------------------------------------------------------------ a template that follows another's lease (Slurm)
    def follow(self, at: kept.LeaseAt, secret: bytes, node: str, spool_dir: str) -> None:
        """A connection to the holder's lease (its socket, or TCP and TLS from another host), the pool's secret proved:
        the spawns of a kernel that attaches the kept pool come that way (srun's stdin is the first kernel's), and our
        events go back once that kernel is gone."""
        if self.upstream is not None:  # keep again (new timers): the same lease
            return
        self.spool_dir = spool_dir
        deadline = time.monotonic() + FOLLOW_WAIT_S
        while True:
            try:
                sock = kept.dial_lease(at, secret)
                sock.sendall((json.dumps({"op": "template", "node": node, "pid": os.getpid()}) + "\n").encode())
                break
            except (OSError, EOFError):  # a full backlog, or a slow handshake: again
                if time.monotonic() > deadline:
                    log.warning("node %s's template could not reach the kept pool's lease; a kernel that attaches it cannot fork "
                                "a rank here", node, exc_info=True)
                    return
                time.sleep(0.05)
        sock.settimeout(None)
        self.upstream, self.up_buf = sock, b""

    def unfollow(self) -> None:
        sock, self.upstream, self.up_buf = self.upstream, None, b""
        if sock is None:
            return
        if EVENTS["fd"] == sock.fileno():
            EVENTS["fd"] = -1
        sock.close()

    def read_upstream(self) -> None:
        """The holder's commands for us (an attached kernel's spawns); its connection closing with no kernel of our own
        is the pool's end (the lease ended, or %ddp stop): our ranks go, as the holder's did."""
        assert self.upstream is not None
        try:
            data = self.upstream.recv(65536)
        except OSError:
            log.debug("the lease holder's connection failed", exc_info=True)
            data = b""
        if not data:
            self.unfollow()
            if self.kernel_fd < 0:
                if self.spool_dir:  # this node's ranks' output logs (on the holder's host, the lease removes its own)
                    shutil.rmtree(self.spool_dir, ignore_errors=True)
                self.kernel_gone(dead=False)
            return
        self.up_buf += data
        EVENTS["fd"] = self.upstream.fileno()  # the attached kernel's events go back this way (its first kernel may live on, fenced)
        while b"\n" in self.up_buf and self.upstream is not None:
            line, self.up_buf = self.up_buf.split(b"\n", 1)
            try:
                cmd = json.loads(line)
            except ValueError:  # a line cut short (the holder gave up on a send): the spawn it held fails in the kernel's wait
                log.warning("the lease holder sent an unreadable line: %r", line[:200])
                continue
            self.command(cmd)

    def kept_fds(self) -> List[int]:
        return (self.lease.fds() if self.lease is not None else []) + ([self.upstream.fileno()] if self.upstream is not None else [])

    def serve_kept(self, ready: List[int]) -> None:
        """The lease's turn in the template's loop (its holder), or the holder's commands (a following template)."""
        if self.lease is not None:
            self.serve_lease([fd for fd in ready if fd in self.lease.fds()])
        if self.upstream is not None and self.upstream.fileno() in ready:
            self.read_upstream()

    def serve_lease(self, ready: List[int]) -> None:
        lease = self.lease
        assert lease is not None
        for fd in ready:
            peer = lease.handle(fd)
            if peer is not None:  # a kernel attached: its commands, and our events, on its connection from now on
                self.kernel_sock = peer.sock
                self.kernel_fd = EVENTS["fd"] = peer.sock.fileno()
                peer.sock.setblocking(True)
                self.cmd_buf = peer.buf
                peer.buf = b""
        if lease.kernel is None and self.kernel_fd >= 0:
            self.kernel_left()
        why = lease.due() if lease.ended is None else lease.ended
        if why is not None:
            lease.end(why)
            self.lease = None
            self.kernel_gone(dead=False)
