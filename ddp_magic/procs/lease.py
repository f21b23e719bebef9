"""The lease of a kept pool, held by its template: the lock, the discovery file, the lease socket, the two timers.

``%ddp keep`` sends the template a ``keep`` command (procs/forkserver.py); from then on the template
no longer dies with its kernel (its parent-death signal is cleared, it has a session of its own) and
this ``Lease`` is the pool's anchor (DESIGN.md §4d, docs/keep.md):

- it holds the liveness lock (wire/kept.py) for the template's life, and a lock on a marker in /dev/shm
  so that a new kernel's sweep of dead kernels' files (wire/shm.py) leaves the pool's files alone;
- it listens on the lease socket (0600, in a 0700 directory; procs/lease_door.py): every rank connects once kept and waits
  there for a kernel while none is attached; a kernel attaches there (``attach``) after proving the
  pool's secret, and the template's commands and events then travel on that connection;
- *idle*: no kernel attached and no rank running a cell, for ``idle`` seconds; *max*: ``max`` seconds
  since keep. Either ends the lease: every rank is killed, the pool's files go, and the discovery file
  says why (the next attach tells the user).

A Slurm pool whose nodes are other hosts than its kernel's (``bind``: this node's address): the lease listens on
TCP there, TLS with a key of its own (wire/kept.py ``LeaseAt``), and keeps its files in this node's ``held_dir``.
The kernel's host follows it over a *watch* connection (procs/lease_watch.py), which gets every change of the
discovery record, then why the lease ended (or ``off``).

The hot path is not here: once a kernel has attached, its cells go straight to the ranks.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import time
from typing import Any, Callable, Dict, List, Optional

from ..logs import log
from ..wire import kept, shm
from ..words import fmt_seconds
from .lease_door import Door, Peer


def release_from_parent() -> None:
    """No parent-death signal any more (a kept template outlives its kernel), and out of the kernel's session."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG, 0
    except (OSError, AttributeError):
        log.debug("could not clear the template's parent-death signal", exc_info=True)


class Lease:
    """The kept pool's anchor in its template (see the module's docstring)."""

    def __init__(self, cmd: Dict[str, Any], secret: bytes, children: Callable[[], Dict[int, int]]) -> None:
        self.id, self.where = str(cmd["id"]), str(cmd.get("where") or "") or kept.held_dir()
        self.secret = secret
        self.children = children  # pid -> rank, the template's live ranks
        self.info: Dict[str, Any] = dict(cmd["info"])
        self.since = time.time()
        self.idle, self.max = float(cmd["idle"]), float(cmd["max"])
        self.dir = kept.make_pool_dir(self.id, self.where)
        self._lock = kept.hold_lock(kept.lock_path(self.id, self.where))
        self.prefix = str(self.info.get("shm_prefix", ""))
        self._shm_lock = self._hold_shm_marker()
        _raise_fd_limit(2 * int(self.info.get("nproc") or 0) + 64)  # a lease connection per rank: past the usual 1,024
        self.door = Door(kept.socket_path(self.id, self.where), secret, str(cmd.get("bind") or ""))
        self.at, self.remote = self.door.at, self.door.key is not None  # remote: its kernel's host reaches it over the network
        self.peers: Dict[int, Peer] = {}  # fd -> peer
        self.templates: Dict[str, Peer] = {}  # node -> its template's connection (a Slurm pool's other nodes)
        self.kernel: Optional[Dict[str, Any]] = {"kernel": cmd.get("kernel", ""), "pid": cmd.get("pid"), "since": time.time()}
        self.kernel_peer: Optional[Peer] = None  # after an attach: the kernel's connection (before: the template's stdin)
        self.left_at: Optional[float] = None  # when the last kernel left
        self.idle_since: Optional[float] = None
        self.meanwhile: List[Dict[str, Any]] = []  # what happened while no kernel was attached
        self.ended: Optional[str] = None  # why the lease must end now (python -m ddp_magic stop); the template ends it
        self.write()

    # ------------------------------------------------------------ files
    def _hold_shm_marker(self) -> Optional[int]:
        if not self.prefix or not os.path.isdir(shm.SHM_DIR):
            return None
        try:
            return kept.hold_lock(os.path.join(shm.SHM_DIR, self.prefix + shm.KEPT_MARKER))
        except OSError:
            log.debug("could not mark the kept pool's files in /dev/shm", exc_info=True)
            return None

    def record(self) -> Dict[str, Any]:
        """What the discovery file says."""
        busy = sorted(p.rank for p in self.peers.values() if p.rank is not None and p.busy)
        return dict(self.info, id=self.id, state="kept", secret=self.secret.hex(), template_pid=os.getpid(), since=self.since,
                    idle=self.idle, max=self.max, attached=self.kernel, left_at=self.left_at, busy=busy, meanwhile=self.meanwhile,
                    ranks=self.ranks(), templates=sorted(self.templates), lease=self.at, dir=self.dir)

    def ranks(self) -> Dict[str, int]:
        """rank -> pid of every live rank: our children, and on Slurm the ranks other nodes' templates forked (known by
        their lease connection, which they hold while they live)."""
        out = {str(p.rank): p.pid for p in self.peers.values() if p.rank is not None and p.pid}
        out.update({str(r): pid for pid, r in self.children().items()})
        return out

    def write(self) -> None:
        self.tell_watchers({"event": "record", "record": self.record()})
        try:
            kept.write_private(kept.discovery_path(self.id, self.where), self.record())
        except OSError:
            log.debug("could not write the kept pool's discovery file", exc_info=True)

    # ------------------------------------------------------------ the loop's part
    def fds(self) -> List[int]:
        return [*self.door.fds(), *self.peers]

    def handle(self, fd: int) -> Optional[Peer]:
        """A readable fd of ours; returns a kernel's peer that just attached (the template reads its commands then)."""
        if fd in self.door.fds():
            for new in self.door.admit(fd):
                self.peers[new.sock.fileno()] = new
            return None
        peer = self.peers.get(fd)
        if peer is None:
            return None
        lines = peer.lines()
        if lines is None:
            self._drop(fd, peer)
            return None
        for msg in lines:
            attached = self._message(peer, msg)
            if attached:
                return peer
        return None

    def _drop(self, fd: int, peer: Peer) -> None:
        self.peers.pop(fd, None)
        try:
            peer.sock.close()
        except OSError:
            log.debug("closing a lease peer failed", exc_info=True)
        if peer.node is not None and self.templates.get(peer.node) is peer:
            del self.templates[peer.node]
            self._node_note(f"{peer.node}'s template left the lease (its node lost, or it ended)", peer.node)
        if peer is self.kernel_peer:
            self.kernel_left()
        elif peer.rank is not None and peer.pid not in self.children() and self.kernel is None:
            # another node's rank (Slurm): not ours to reap; its lease connection closing is its exit
            self.note(f"rank {peer.rank} (pid {peer.pid}) died (its lease connection closed)", rank=peer.rank, pid=peer.pid, code=None, kind="died")

    def _message(self, peer: Peer, msg: Dict[str, Any]) -> bool:
        op = msg.get("op")
        if peer.node is not None:  # a following template's event (a rank it forked, or its exit): for the attached kernel
            if self.relay is not None:
                self.relay(msg)
        elif op == "template":
            peer.node, peer.pid = str(msg["node"]), int(msg.get("pid") or 0)
            self.templates[peer.node] = peer
            self._node_note(f"{peer.node}'s template joined the lease again (its node placed again)", peer.node)
        elif op == "rank":
            peer.rank, peer.busy, peer.pid = int(msg["rank"]), bool(msg.get("busy")), int(msg.get("pid") or 0)
        elif op == "busy":
            was, peer.busy = peer.busy, bool(msg.get("busy"))
            if was and not peer.busy and self.kernel is None:
                self.note(f"rank {peer.rank}'s cell ended", rank=peer.rank, kind="cell_ended")
            elif self.kernel is None:
                self.write()
        elif op == "attach":
            return self._attach(peer, msg)
        elif op == "stop":
            peer.send({"event": "stopping"})
            self.ended = "it was stopped from a terminal (python -m ddp_magic stop)"
        elif op == "info":
            peer.send(self.record())
        elif op == "watch":
            peer.watch = True
            peer.send({"event": "record", "record": self.record()})
        return False

    def _attach(self, peer: Peer, msg: Dict[str, Any]) -> bool:
        if self.kernel is not None and not msg.get("force"):
            peer.send({"event": "refused", "attached": self.kernel})
            return False
        left_at = self.left_at if self.kernel is None else None  # a kernel taken over (--force) had not left
        if self.kernel is not None:
            self.fence(msg)
        self.peers.pop(peer.sock.fileno(), None)  # the template reads its commands from now on
        self.kernel_peer = peer
        self.kernel = {"kernel": msg.get("kernel", ""), "pid": msg.get("pid"), "since": time.time()}
        report = {"event": "attached", "meanwhile": self.meanwhile, "ranks": self.ranks(),
                  "busy": sorted(p.rank for p in self.peers.values() if p.rank is not None and p.busy), "left_at": left_at,
                  "since": self.since, "idle": self.idle, "max": self.max}
        peer.send(report)
        self.meanwhile, self.left_at, self.idle_since = [], None, None
        for rank_peer in [p for p in self.peers.values() if p.rank is not None]:
            offsets = msg.get("offsets", {}).get(str(rank_peer.rank), [0, 0])
            rank_peer.send({"op": "dial", "addr": msg["addr"], "port": msg["port"], "offsets": offsets, "tls": msg.get("tls")})
        self.write()
        return True

    fence_old: Optional[Callable[[Dict[str, Any]], None]] = None  # the template's: tell the attached kernel it lost the pool
    relay: Optional[Callable[[Dict[str, Any]], None]] = None  # the template's: an event to the attached kernel, if any

    def forward(self, cmd: Dict[str, Any]) -> str:
        """A command of the attached kernel for another node's template (a spawn); why it could not go ("" when it went)."""
        peer = self.templates.get(str(cmd.get("node")))
        if peer is None:
            return "that template holds no connection to the kept pool's lease (it ended, or never reached the lease socket)"
        return "" if peer.send(cmd) else "that template's connection to the kept pool's lease closed"

    def fence(self, msg: Dict[str, Any]) -> None:
        if self.fence_old is not None:
            self.fence_old({"event": "fenced", "by": msg.get("kernel", ""), "pid": msg.get("pid"), "at": time.time()})

    def kernel_left(self) -> None:
        """The attached kernel is gone (its connection or the template's stdin closed): the idle timer may start."""
        if self.kernel is None:
            return
        self.kernel, self.kernel_peer, self.left_at = None, None, time.time()
        self.write()

    def _node_note(self, text: str, node: str) -> None:
        """A following template came or went: the discovery file says so at once (``templates``), and the next attach
        tells it when it happened with no kernel here (a Ray node placed again by the pool's driver: procs/ray_unattended.py)."""
        if self.kernel is None:
            self.note(text, node=node, kind="node")
        else:
            self.write()

    def note(self, text: str, **fields: Any) -> None:
        """Something happened while no kernel was attached: the next attach reports it."""
        self.meanwhile.append(dict(fields, text=text, at=time.time()))
        self.write()

    def on_exit(self, rank: Optional[int], pid: int, code: int) -> None:
        if self.kernel is None and rank is not None:
            how = f"exit code {code}" if code >= 0 else f"signal {signal.Signals(-code).name}" if -code in signal.valid_signals() else str(code)
            self.note(f"rank {rank} (pid {pid}) died ({how})", rank=rank, pid=pid, code=code, kind="died")
            for peer in list(self.peers.values()):
                if peer.rank == rank:
                    peer.busy = False

    # ------------------------------------------------------------ the timers
    def due(self, now: Optional[float] = None) -> Optional[str]:
        """Why the lease ends now, or None."""
        now = time.time() if now is None else now
        if now - self.since >= self.max:
            return f"its lease's --max ({_span(self.max)}) ran out"
        busy = any(p.busy for p in self.peers.values() if p.rank is not None)
        if self.kernel is not None or busy:
            self.idle_since = None
            return None
        self.idle_since = self.idle_since or now
        if now - self.idle_since >= self.idle:
            return f"no kernel attached and no job running for its lease's --idle ({_span(self.idle)})"
        return None

    def tell_watchers(self, event: Dict[str, Any]) -> None:
        for peer in [p for p in self.peers.values() if p.watch]:
            peer.send(event)

    def end(self, why: str) -> None:
        """The lease is over: every rank goes (the template kills them), the files go, the discovery file says why."""
        self.tell_watchers({"event": "ended", "record": self.ended_record(why)})
        ranks = self.children()
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            if self.remote:  # the kernel's host keeps the word (procs/lease_watch.py); nothing of it stays here
                self._unlink_files()
            else:
                kept.write_private(kept.discovery_path(self.id, self.where), self.ended_record(why))
        except OSError:
            log.debug("could not write the ended pool's file", exc_info=True)
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.prefix:
            shm.remove_pool_files(self.prefix)

    def ended_record(self, why: str) -> Dict[str, Any]:
        return dict(id=self.id, state="ended", why=why, at=time.time(), notebook=self.info.get("notebook", ""),
                    nproc=self.info.get("nproc"), job=self.info.get("job"), meanwhile=self.meanwhile)

    def off(self) -> None:
        """``%ddp keep --off``: the pool is its kernel's again; the lease's files go (the lock with the process)."""
        self.tell_watchers({"event": "off"})
        for peer in list(self.peers.values()):
            peer.sock.close()
        self.peers.clear()
        self.templates.clear()
        self.door.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        self._unlink_files()
        for fd in (self._lock, self._shm_lock):
            if fd is not None:
                os.close(fd)
        if self.prefix:
            shm.remove(os.path.join(shm.SHM_DIR, self.prefix + shm.KEPT_MARKER))


    def _unlink_files(self) -> None:
        for path in (kept.discovery_path(self.id, self.where), kept.lock_path(self.id, self.where)):
            try:
                os.unlink(path)
            except OSError:
                log.debug("could not remove %s", path, exc_info=True)


def _raise_fd_limit(needed: int) -> None:
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = needed + len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else needed + 256
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))
    except (ImportError, ValueError, OSError):
        log.debug("the open-file limit could not be raised", exc_info=True)


def _span(seconds: float) -> str:
    return fmt_seconds(seconds)
