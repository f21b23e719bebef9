"""The control hub: every rank's sockets, one poll loop over them, and what their messages mean.

Everything happens on the caller's thread in ``pump``: it waits on the ranks' control and output sockets, the
admission wake-up and the launcher's exit events, forwards output as it arrives, and dispatches messages. A rank's
DONE counts only once its output streams have shown the sync markers it names, so nothing a rank printed arrives after
its cell has ended. While a cell runs the loop sleeps until an event or the caller's next deadline: a kernel running a
long cell wakes about twice a second, not twenty times.

Per rank everything is O(1): its sockets stay registered with one epoll between waits (a wake costs what is ready,
not how many ranks there are), every read goes into one buffer, and ``version``/``failed`` count the state changes
the hub makes (all of them / those to a failed, interrupted or dead state), so a caller can tell "nothing the failure
policy cares about changed" without a pass over the ranks.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

from ..errors import RankFailure
from ..logs import log
from ..states import FailureKind, RankState, Waiting
from ..wire import liveness
from ..wire import protocol as P
from ..wire import tls
from .admission import Admission
from .conns import Conn, OutConn, Poller, ReadBuffer, close_socket, peer_open, send_all_nonblocking, send_shutdown, unwatch, watch, watch_pulled
from .output.hub_output import STREAMS, OutputStreams
from .output.kept_output import KeptOutput
from .launchers import Launcher
from .failures import deaths
from .memory import Memory
from .jobs.peek import PeekDesk
from .ranks import Due, Listener, RankInfo, Tick
from .jobs.stdin import InputDesk
from .failures.unreachable import silent_siblings

POLL_S = 0.05  # the wait while starting, asking, or with a launcher that has no exit-event fd
IDLE_POLL_S = 0.5  # the longest sleep while a cell runs: a safety net, every event wakes the loop sooner
_DONE_STATES = {"ok": RankState.DONE, "interrupted": RankState.INTERRUPTED}  # any other status: FAILED


class Hub(OutputStreams):
    """The registry of the ranks' sockets and the one poll loop that reads them.

    ``on_death(rank, code)`` is told when a rank's process is gone while it held
    state (the pool marks itself broken); ``listener`` hears output and states.
    """

    def __init__(self, launcher: Launcher, on_death: Callable[[int, Optional[int]], None]) -> None:
        self.launcher = launcher
        self.on_death = on_death
        self.listener: Listener = Listener()
        self.ranks: Dict[int, RankInfo] = {}
        self.conns: Dict[int, Conn] = {}
        self.outs: Dict[Tuple[int, str], OutConn] = {}
        self.admission: Optional[Admission] = None  # set while ranks join
        self.ready: Set[int] = set()  # ranks whose process group is up (READY)
        self.init_failures: List[RankFailure] = []
        self.done: Dict[int, dict] = {}  # this cell's DONE messages, once their output is synced
        self.results: Dict[int, dict] = {}  # this cell's RESULT messages (after DECIDE)
        self.replies: Dict[str, Dict[int, dict]] = {}  # STACK / ENV replies
        self._by_fd: Dict[int, Union[Conn, OutConn]] = {}
        self._unsynced: Dict[int, dict] = {}  # DONE messages waiting for their output markers
        self._poller = Poller()  # every fd of _by_fd, plus the launcher's and the admission's (_extras)
        self._extras: Set[int] = set()
        self._rbuf = ReadBuffer()
        self.version = 0  # +1 for every rank state the hub changes (joined, finished, died)
        self.failed = 0  # +1 for every change to FAILED, INTERRUPTED or DEAD
        self.deaths = 0  # ranks seen dead since the last reset
        self.stdin = InputDesk()  # the ranks' questions and who sits in pdb (kernel/jobs/stdin.py)
        self.peeks = PeekDesk()  # %%ddp --peek answers, filed by whichever thread pumps (kernel/jobs/peek.py)
        self.shown: Optional[KeptOutput] = None  # a kept pool: its output to the notebook, and how far each rank's went
        self.keep_msg: Optional[dict] = None  # a kept pool: the KEEP a rank that joins anew gets
        self.hellos: Dict[int, dict] = {}  # the HELLOs of the ranks of a kept pool that joined an attaching kernel
        self._send_lock = threading.Lock()  # a peek sends from the main thread while a background cell's thread pumps

    # ------------------------------------------------------------ registry
    def reset(self, ranks: Dict[int, RankInfo], admission: Optional[Admission]) -> None:
        """A new start: these ranks, admitted through ``admission``."""
        self.ranks = ranks
        self.admission = admission
        self.ready = set()
        self.init_failures = []
        self.deaths = 0

    def begin_cell(self) -> None:
        self.done, self.results, self.replies = {}, {}, {}
        self.stdin.reset()

    def register(self, sock: socket.socket, hello: dict) -> None:
        """Take one authenticated socket: a rank's control socket, or one of its output streams."""
        rank = hello.get("rank")
        if hello["op"] == P.HELLO_OUT:
            stream = hello.get("stream")
            if rank not in self.ranks or stream not in STREAMS or (rank, stream) in self.outs:
                sock.close()
                return
            out = self.outs[(rank, stream)] = OutConn(rank, stream, sock)
            out.awaiting_spool = self.keep_msg is not None  # a rank joining a kept pool anew: KEEP goes to it (below)
            sock.setblocking(False)
            self._watch(sock, out)
            return
        if rank not in self.ranks or rank in self.conns:
            sock.close()
            return
        conn = self.conns[rank] = Conn(rank, sock)
        sock.setblocking(False)
        self._watch(sock, conn)
        info = self.ranks[rank]
        info.pid, info.host, info.device, info.state = hello["pid"], hello["host"], hello["device"], RankState.CONNECTING
        info.node, info.local_rank, info.node_name = hello.get("node", 0), hello.get("local_rank", rank), hello.get("node_name", "")
        self.launcher.adopt(info.pid, rank, info.host)
        if hello.get("attach"):  # a kept pool's rank joins the kernel that attached it (kernel/keep/attach.py)
            self.ready.add(rank)
            info.state = RankState.RUNNING if hello.get("busy") or hello.get("undelivered") else RankState.READY
            self.hellos[rank] = hello
        elif self.keep_msg is not None:  # a rank started again in a kept pool is kept too
            self.broadcast(P.message(P.KEEP, **self.keep_msg), [rank])
        self.version += 1
        self.listener.on_state(info)

    def _watch(self, sock: socket.socket, conn: Union[Conn, OutConn]) -> None:
        watch(self._poller, self._by_fd, sock, conn)

    def _unwatch(self, sock: socket.socket) -> None:
        unwatch(self._poller, self._by_fd, sock)

    def close_all(self) -> None:
        """Close every socket and forget what was pending."""
        for sock in [c.sock for c in self.conns.values()] + [o.sock for o in self.outs.values()]:
            close_socket(sock)
        self.conns.clear()
        self.outs.clear()
        self._by_fd.clear()
        self._poller.close()
        self._poller, self._extras = Poller(), set()
        self._unsynced.clear()

    def forget_rank(self, rank: int) -> None:
        """A dead rank's sockets and messages go, so a new process can join at its RANK (kernel/failures/recovery.py)."""
        conn = self.conns.get(rank)
        if conn is not None:
            self._drop_conn(conn)
        for stream in STREAMS:
            out = self.outs.pop((rank, stream), None)
            if out is not None:
                self._unwatch(out.sock)
                close_socket(out.sock)
        self.ready.discard(rank)
        self._unsynced.pop(rank, None)

    def dead_ranks(self) -> List[int]:
        return [r for r, info in self.ranks.items() if info.state == RankState.DEAD]

    def death_failure(self, rank: int) -> RankFailure:
        return deaths.death_failure(rank, self.ranks[rank], self.launcher.death_cause(rank))

    def any_peer_open(self) -> bool:
        """Whether some rank still holds its control connection open (ranks on other hosts exit late)."""
        return any(peer_open(c.sock) for c in self.conns.values())

    # ------------------------------------------------------------ sending
    def broadcast(self, msg: dict, ranks: Optional[Sequence[int]] = None) -> None:
        """Send to the given ranks (default: all connected); a rank that cannot take it is dropped."""
        frame, direct = P.encode(msg), tls.send_direct if tls.relaying() else None  # no TLS here: nothing to ask per rank
        for rank in list(ranks if ranks is not None else self.conns):
            conn = self.conns.get(rank)
            if conn is None:
                continue
            try:
                with self._send_lock:  # one frame at a time per socket, whichever thread sends
                    if direct is None or not direct(conn.sock, frame):  # over TLS: encrypted here when it can be, not by the relay
                        send_all_nonblocking(conn.sock, frame)
            except OSError:
                log.debug("rank %s's control socket failed on send", rank, exc_info=True)
                self._drop_conn(conn)

    def shutdown_all(self) -> None:
        """Ask every connected rank to exit cleanly (best effort, a short wait per rank)."""
        send_shutdown(list(self.conns.values()))

    # ------------------------------------------------------------ the poll loop
    def pump(self, until: Callable[[], bool], deadline: Optional[float], tick: Optional[Tick] = None, due: Optional[Due] = None) -> bool:
        """Dispatch messages and exits until until() holds (True) or the deadline passes (False).

        ``tick`` runs after each wake; ``due`` says when it next needs to run (a monotonic
        time, or None for "only on events"), so a quiet cell costs the kernel no busy polling.
        """
        launcher_fd = self.launcher.fileno()
        while True:
            if until():
                return True
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return False
            self._watch_extras(launcher_fd)
            wait = IDLE_POLL_S if (due is not None and launcher_fd is not None) else POLL_S
            for limit in (deadline, due() if due is not None else None):
                if limit is not None:
                    wait = min(wait, limit - now)
            if self._poller.fds:
                self._handle(self._poller.wait(wait))
            else:
                time.sleep(max(0.0, wait))
            for rank, pid, code in self.launcher.poll(0):
                self.on_exit(rank, pid, code)
            if tick is not None:
                tick()

    def reap(self) -> None:
        """Exits, and connections lost while the pool was idle (ranks on other hosts send no exit code). Nothing else is
        read here: the next cell's pump reads what the ranks sent, for that cell's listener."""
        for rank, pid, code in self.launcher.poll(0):
            self.on_exit(rank, pid, code)
        if self.launcher.reports_exits:
            return
        for conn in list(self.conns.values()):
            if conn.rank in self.conns and not peer_open(conn.sock):
                self._lost(conn, None)

    def _watch_extras(self, launcher_fd: Optional[int]) -> None:
        """The launcher's exit events, the admission's wake-up and the TLS relay's notes (a result it filled in place), added
        again each time: a closed pipe's number may be a new one's."""
        extras = {fd for fd in (launcher_fd, self.admission.fileno() if self.admission is not None else None, tls.note_fd()) if fd is not None}
        for fd in self._extras - extras:
            if fd not in self._by_fd:
                self._poller.remove(fd)
        for fd in extras:
            self._poller.add(fd)
        self._extras = extras

    def _handle(self, ready_fds: Iterable[int]) -> None:
        admission, note = self.admission.fileno() if self.admission is not None else None, tls.note_fd()  # once a wake, not once a rank
        for fd in ready_fds:
            if fd == admission and self.admission is not None:
                for sock, hello in self.admission.take():
                    self.register(sock, hello)
                continue
            if fd == note:
                self._relay_noted(fd)
                continue
            conn = self._by_fd.get(fd)
            if isinstance(conn, OutConn):
                self._read_out(conn)
            elif conn is not None:
                self._read_conn(conn)

    # ------------------------------------------------------------ reading
    def _relay_noted(self, fd: int) -> None:
        """The relay finished filling a buffer in place: read on the connections that were waiting for one."""
        try:
            os.read(fd, 4096)
        except BlockingIOError:
            pass
        for conn in [c for c in self.conns.values() if c.reader.relayed]:
            self._read_conn(conn)

    def _read_conn(self, conn: Conn) -> None:
        error: Optional[OSError] = None
        try:
            msgs = self._rbuf.frames(conn)
        except BlockingIOError:
            msgs = []
        except OSError as e:
            log.debug("rank %s's control socket failed on read", conn.rank, exc_info=True)
            msgs, error = None, e
        finally:  # the TLS socket is the relay's while it fills a buffer of ours
            watch_pulled(self._poller, self._by_fd, conn, not conn.reader.relayed and self.conns.get(conn.rank) is conn)
        if msgs is None:
            self._lost(conn, error)
            return
        for msg in msgs:
            self._dispatch(conn.rank, msg)

    def _lost(self, conn: Conn, error: Optional[OSError]) -> None:
        """A rank's control connection ended. Its node gone silent (wire/liveness.py): it and every rank on that node are
        unreachable (they share the link), the others are released by the failure policy as for any death. Else, with
        no exit code to wait for (remote ranks), the rank is gone."""
        silent = liveness.lost_to_silence(conn.sock, error)
        self._drop_conn(conn)
        if not (silent or not self.launcher.reports_exits):
            return
        lost = [conn.rank] + (silent_siblings(self.ranks, conn.rank) if silent else [])
        for rank in lost:
            info = self.ranks[rank]
            if info.state in (RankState.STOPPED, RankState.DEAD):
                continue
            info.silent = silent
            other = self.conns.get(rank)
            if other is not None:
                self._drop_conn(other)
            self.on_exit(rank, info.pid or 0, None)

    def _drop_conn(self, conn: Conn) -> None:
        self._unwatch(conn.sock)
        self.conns.pop(conn.rank, None)
        close_socket(conn.sock)

    def _read_leftovers(self, conn: Conn) -> None:
        """Whatever a rank sent before dying is still in its control socket."""
        try:
            while True:
                msgs = self._rbuf.frames(conn)
                if msgs is None:
                    return
                for msg in msgs:
                    self._dispatch(conn.rank, msg)
        except OSError:  # BlockingIOError included: nothing more is there
            return

    # ------------------------------------------------------------ meaning
    def _dispatch(self, rank: int, msg: dict) -> None:
        op = msg["op"]
        info = self.ranks.get(rank)
        if op == P.DONE:
            self._unsynced[rank] = msg
            self._release_done(rank)
        elif op == P.RESULT:
            self.results[rank] = msg
        elif op == P.READY:
            if info is not None:
                info.device = msg.get("device", info.device)
            self.ready.add(rank)
        elif op == P.INIT_FAILED:
            err, pid = msg["error"], info.pid if info else None
            failure = RankFailure(rank=rank, kind=FailureKind.INIT, type=err["type"], message=err["message"], traceback=err["traceback"], pid=pid)
            self.init_failures.append(failure)
        elif op == P.STACK and "id" in msg:  # %ddp stacks: filed by id, as a peek's answer is (kernel/stacks.py)
            self.peeks.put(rank, msg)
        elif op in (P.STACK, P.ENV, P.REFORM, P.VERSIONS, P.KEEP):
            self.replies.setdefault(op, {})[rank] = msg
        elif op == P.MEMORY:  # sampled while a cell runs, or asked for by %ddp status (kernel/memory.py)
            self.replies.setdefault(op, {})[rank] = msg
            if info is not None:
                info.mem = Memory.of(msg, info.mem)
                self.listener.on_state(info)
        elif op == P.INPUT:
            self.stdin.request(rank, msg)
            self.debug_changed(rank)
        elif op == P.DEBUG:
            self.stdin.debugger(rank, bool(msg.get("on")))
            self.debug_changed(rank)
        elif op in (P.PEEK, P.SAFE_POINT):  # filed by id: a peek's answer, a save's at a safe point (kernel/jobs/safe_save.py)
            self.peeks.put(rank, msg)
        elif op == P.METRICS:  # ddp_magic.log rows: the cell's store (kernel/results/metrics.py) and the views hear them
            self.listener.on_metrics(rank, msg.get("rows") or [])

    def debug_changed(self, rank: int) -> None:
        """A rank asked for input, entered or left pdb, or finished: show it, and tell every rank whether to hold."""
        info = self.ranks.get(rank)
        if info is not None and info.debugging != self.stdin.what(rank):
            info.debugging = self.stdin.what(rank)
            self.listener.on_state(info)
        hold = self.stdin.hold_change()
        if hold is not None:
            self.broadcast(hold)

    def _finish_rank(self, rank: int, msg: dict) -> None:
        self.done[rank] = msg
        if self.keep_msg is not None:  # a kept pool: the rank stops holding this DONE for a next kernel (procs/rank_channel.py)
            self.broadcast(P.message(P.DONE_SEEN, cell=msg["cell"]), [rank])
        info = self.ranks.get(rank)
        if not self.stdin.idle or (info is not None and info.debugging != Waiting.NO):  # the usual DONE: nothing to settle
            self.stdin.forget(rank)
            self.debug_changed(rank)
        if info is not None:
            info.state = _DONE_STATES.get(msg["status"], RankState.FAILED)
            info.finished, info.memory = time.monotonic(), msg.get("memory")
            info.mem = Memory.of(msg["mem"], info.mem) if msg.get("mem") else info.mem
            self.version += 1
            self.failed += info.state != RankState.DONE
            self.listener.on_state(info)

    def on_exit(self, rank: Optional[int], pid: int, code: Optional[int]) -> None:
        """A rank's process ended (code None: its connection was lost). A DONE already sent still counts."""
        if rank is None or rank not in self.ranks or self.ranks[rank].pid not in (None, pid):
            return
        info = self.ranks[rank]
        if info.state == RankState.STOPPED or (info.silent and info.state == RankState.DEAD):  # an unreachable rank's exit, seen late
            return
        conn = self.conns.get(rank)
        if conn is not None:
            self._read_leftovers(conn)
        self.drain_outs(rank)
        pending = self._unsynced.pop(rank, None)
        if pending is not None and info.state == RankState.RUNNING:
            self._finish_rank(rank, pending)
            return
        info.pid = info.pid or pid
        info.state = RankState.DEAD
        info.exit_code = code
        info.finished = time.monotonic()
        self.version += 1
        self.failed += 1
        self.deaths += 1
        self.on_death(rank, code)
        self.listener.on_state(info)
