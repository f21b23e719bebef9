"""The kernel side of a pool: start, run cells on, watch and stop N worker processes.

Plain Python with no IPython and no torch import: the magics, the widget, the
benchmarks and the tests all drive it through ``Pool.run``. Everything happens
on the calling thread in one poll loop over the workers' sockets and the
launcher's exit events, so output is forwarded as it arrives and a dead rank
is noticed as soon as its exit event or closed socket arrives. While a cell
runs, the loop sleeps until an event or the watch's next deadline: a kernel
running a long cell wakes about twice a second, not twenty times.
"""
from __future__ import annotations

import atexit
import codecs
import os
import queue
import select
import signal
import socket
import sys
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence

from ..wire import protocol as P
from ..wire import transfer
from ..wire.capture import MarkerScanner
from ..plan.plan import Plan, PlanError, make_plan
from ..errors import RankFailure, StartError
from .launchers import LaunchError, TorchrunLauncher, make_launcher, signal_pid, worker_env
from .policy import CellWatch

POLL_S = 0.05  # the wait while starting, asking, or with a launcher that has no exit-event fd
IDLE_POLL_S = 0.5  # the longest sleep while a cell runs: a safety net, every event wakes the loop sooner


class _Guarded:
    """Wraps a front end's listener: a bug in a view must not leave a cell half-run."""

    def __init__(self, inner: "Listener") -> None:
        self.inner = inner
        self.errors: List[str] = []

    def _call(self, name: str, *args: Any) -> None:
        try:
            getattr(self.inner, name)(*args)
        except Exception as e:  # report once, keep the pool's bookkeeping going
            if not self.errors:
                self.errors.append(f"the listener's {name} failed ({type(e).__name__}: {e}); its view may be incomplete")

    def on_output(self, rank: int, stream: str, text: str) -> None:
        self._call("on_output", rank, stream, text)

    def on_state(self, info: "RankInfo") -> None:
        self._call("on_state", info)

    def on_notice(self, text: str) -> None:
        self._call("on_notice", text)


class Listener:
    """What a front end hears from a pool. Override what you need; all are called on the caller's thread."""

    def on_output(self, rank: int, stream: str, text: str) -> None:
        pass

    def on_state(self, info: "RankInfo") -> None:
        pass

    def on_notice(self, text: str) -> None:
        pass


@dataclass
class RankInfo:
    """What the kernel knows of one rank right now."""

    rank: int
    state: str = "starting"  # starting, connecting, ready, running, done, failed, interrupted, dead, stopped
    pid: Optional[int] = None
    device: str = ""
    host: str = ""
    node: int = 0
    local_rank: Optional[int] = None
    exit_code: Optional[int] = None
    started: float = field(default_factory=time.monotonic)
    finished: Optional[float] = None
    memory: Optional[int] = None
    last_line: str = ""
    tail: Deque[str] = field(default_factory=lambda: deque(maxlen=20))

    @property
    def elapsed(self) -> float:
        return (self.finished or time.monotonic()) - self.started


@dataclass
class CellOutcome:
    """What a cell produced: per-rank values, failures (root cause first) and notes for the user."""

    values: List[Any]
    failures: List[RankFailure]
    notes: List[str]
    elapsed: float
    stacks: Dict[int, str] = field(default_factory=dict)
    state_lost: bool = False

    @property
    def ok(self) -> bool:
        return not self.failures


class _Conn:
    """A rank's control socket: framed messages."""

    def __init__(self, rank: int, sock: socket.socket) -> None:
        self.rank = rank
        self.sock = sock
        self.reader = P.FrameReader()


class _OutConn:
    """A rank's raw stdout or stderr socket (its fd 1 or 2), with sync markers in the bytes."""

    def __init__(self, rank: int, stream: str, sock: socket.socket) -> None:
        self.rank = rank
        self.stream = stream
        self.sock = sock
        self.scanner = MarkerScanner()
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.synced = -1  # the last cell whose marker has been read
        self.eof = False


class Pool:
    """N ranks of a persistent worker pool, one per process, with torch.distributed's env.

    >>> pool = Pool(2)                     # validates; starts nothing yet
    >>> out = pool.run("import torch.distributed as d\\nd.get_rank()")
    >>> out.values
    [0, 1]
    >>> pool.stop()
    """

    def __init__(
        self,
        nproc: int,
        *,
        backend: str = "auto",
        master_addr: str = "127.0.0.1",
        master_port: Optional[int] = None,
        init: bool = True,
        start_method: str = "auto",
        listen_addr: Optional[str] = None,
        extra_env: Optional[Dict[str, str]] = None,
        start_timeout: float = 180.0,
        grace: float = 1.0,
        nnodes: int = 1,
        pg_timeout: float = 300.0,
    ) -> None:
        if not isinstance(nnodes, int) or nnodes < 1:
            raise PlanError(f"--nnodes must be 1 or more (got {nnodes!r})")
        if isinstance(nproc, int) and nproc % nnodes:
            raise PlanError(f"-n {nproc} ranks do not split evenly over {nnodes} nodes; give a multiple of {nnodes}")
        self.nnodes = nnodes
        self.pg_timeout = pg_timeout
        per_node = nproc // nnodes if isinstance(nproc, int) else nproc
        self.request = dict(nproc=per_node, backend=backend, master_addr=master_addr, master_port=master_port, init=init, extra_env=extra_env)
        self.plan: Plan = self._make_plan()  # raises PlanError before anything starts
        if nnodes > 1:
            start_method = "torchrun"
        self.start_method = start_method
        # Loopback unless ranks on other nodes must reach us; never every interface.
        self.listen_addr = listen_addr or ("127.0.0.1" if nnodes == 1 else master_addr)
        self.node_command: Optional[str] = None
        self.store_path: Optional[str] = None  # the process group's FileStore (one host)
        self.start_timeout = start_timeout
        self.grace = grace
        self.secret = P.new_secret()
        self.launcher = make_launcher(start_method, self.secret)
        self.ranks: Dict[int, RankInfo] = {}
        self._conns: Dict[int, _Conn] = {}
        self._outs: Dict[tuple, _OutConn] = {}  # (rank, stream) -> socket
        self._by_fd: Dict[int, Any] = {}
        self._unsynced: Dict[int, dict] = {}  # DONE messages waiting for their output markers
        self._replies: Dict[str, Dict[int, Any]] = {}
        self._done: Dict[int, dict] = {}
        self._results: Dict[int, dict] = {}
        self._on_ready: Optional[Callable[[int, Any], None]] = None
        self._init_failures: List[RankFailure] = []
        self._cell = 0
        self.started = False
        self.broken: Optional[str] = None  # why the next cell must restart the pool
        self.generation = 0
        self.template_info = ""
        self.rejected_peers = 0
        self.control_port: Optional[int] = None
        self._finalizer = weakref.finalize(self, _stop_quietly, self.launcher, self._conns)
        atexit.register(self._finalizer)

    def _make_plan(self) -> Plan:
        plan = make_plan(**self.request)
        plan.nnodes = self.nnodes
        plan.pg_timeout = self.pg_timeout
        return plan

    # ------------------------------------------------------------ properties
    @property
    def nproc(self) -> int:
        """Ranks in all (world size)."""
        return self.plan.world_size

    @property
    def backend(self) -> str:
        return self.plan.backend

    @property
    def pids(self) -> List[Optional[int]]:
        return [self.ranks[r].pid for r in sorted(self.ranks)]

    @property
    def alive(self) -> bool:
        return self.started and not self.broken

    # ------------------------------------------------------------ start / stop
    def start(self, listener: Optional[Listener] = None) -> None:
        """Start the ranks and initialise the process group; on any failure, stop what started."""
        listener = listener or Listener()
        if self.started:
            return
        t0 = time.monotonic()
        try:
            self.template_info = self.launcher.start(timeout=self.start_timeout)
        except LaunchError as e:
            raise StartError(f"{e}\nIs torch installed for {sys.executable}? (pip install torch)") from None
        _raise_fd_limit(3 * self.nproc + 64)  # three sockets per rank: control, stdout, stderr
        lsock = socket.socket(socket.AF_INET6 if ":" in self.listen_addr else socket.AF_INET, socket.SOCK_STREAM)
        lsock.bind((self.listen_addr, 0))
        lsock.listen(max(64, self.nproc))
        port = lsock.getsockname()[1]
        self.control_port = port  # open only until every rank has joined
        joined: "queue.Queue[tuple]" = queue.Queue()
        wake_r, wake_w = os.pipe()
        stop_accepting = threading.Event()
        threading.Thread(target=self._accept_loop, args=(lsock, joined, wake_w, stop_accepting), daemon=True, name="ddp-accept").start()
        self.generation += 1
        self.ranks = {r: RankInfo(rank=r) for r in range(self.nproc)}
        for info in self.ranks.values():
            listener.on_state(info)
        try:
            base_env = worker_env()  # the kernel's env now, not when the template started
            if self.plan.backend == "nccl":
                # A broken NCCL collective errors out (and the rank exits) instead of spinning
                # the GPU forever; a value set in the kernel's env wins.
                base_env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
            if isinstance(self.launcher, TorchrunLauncher):
                self.node_command = self.launcher.launch(self.plan, self.listen_addr, port, base_env)
                listener.on_notice(self._node_instructions())
            else:
                self.store_path = _file_store_path(self.plan.run_id)
                for r in range(self.nproc):
                    env = dict(base_env, **self.plan.rank_env(r))
                    if self.store_path:
                        env["DDP_MAGIC_STORE"] = self.store_path
                    self.launcher.spawn(r, {"env": env, "kernel_addr": self.listen_addr, "kernel_port": port})
            ready: Dict[int, bool] = {}
            failures: List[RankFailure] = []

            def on_wake() -> None:
                try:
                    os.read(wake_r, 4096)
                except OSError:
                    pass
                self._register_joined(joined, listener)

            self._on_ready = lambda rank, dev: ready.__setitem__(rank, True)
            self._init_failures = failures
            deadline = t0 + self.start_timeout
            all_in = lambda: len(ready) == self.nproc and len(self._outs) == 2 * self.nproc  # noqa: E731
            self._pump(listener, lambda: all_in() or bool(failures) or bool(self._dead_ranks()), deadline, extra_fds={wake_r: on_wake})
            dead = self._dead_ranks()
            if failures or dead or not all_in():
                failures += [self._death_failure(r) for r in dead]
                if not failures:
                    missing = sorted(set(range(self.nproc)) - set(ready))
                    if self.nnodes > 1:
                        raise StartError(self._missing_nodes_text(missing))
                    failures = [RankFailure(rank=r, kind="init", message=f"did not start within {self.start_timeout:.0f}s") for r in missing]
                raise StartError(self._start_failure_text(failures))
        except BaseException:
            stop_accepting.set()
            lsock.close()
            self._teardown(kill_template=False)
            raise
        finally:
            stop_accepting.set()
            try:
                lsock.close()
            except OSError:
                pass
            for fd in (wake_r, wake_w):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._on_ready = None
        for info in self.ranks.values():
            info.state = "ready"
            info.finished = time.monotonic()
            listener.on_state(info)
        self.started = True
        self.broken = None
        self.start_seconds = time.monotonic() - t0

    def _node_instructions(self) -> str:
        return (
            f"pool of {self.nproc} ranks on {self.nnodes} nodes: this node runs {self.plan.nproc} of them under torchrun.\n"
            f"On each of the other {self.nnodes - 1} node(s), run (node ranks are given in the order nodes join):\n"
            f"  {self.node_command}\n"
            f"The secret file {self.launcher.secret_file} must be readable there with mode 0600: on a shared home it already is,\n"
            f"otherwise copy it (scp -p). Under Slurm: srun --nodes={self.nnodes - 1} --ntasks-per-node=1 {self.node_command}"
        )

    def _missing_nodes_text(self, missing: List[int]) -> str:
        joined: Dict[int, tuple] = {}
        for info in self.ranks.values():
            if info.state != "starting":
                joined.setdefault(info.node, (info.host, []))[1].append(info.rank)
        if joined:
            seen = "; ".join(f"node {n} on {h} (ranks {min(r)}-{max(r)})" for n, (h, r) in sorted(joined.items()))
            head = f"{self.nnodes - len(joined)} of {self.nnodes} nodes never joined within {self.start_timeout:.0f}s (joined: {seen}); {len(missing)} rank(s) missing."
        else:  # torchrun starts no rank anywhere until every node is in the rendezvous
            head = (
                f"the other {self.nnodes - 1} node(s) never joined the rendezvous at {self.plan.master_addr}:{self.plan.master_port} "
                f"within {self.start_timeout:.0f}s, so no rank started (this node's torchrun was waiting for them)."
            )
        return (
            f"{head} Run the command printed above on each other node, "
            f"check that they can reach {self.plan.master_addr}:{self.plan.master_port} (rendezvous) and "
            f"{self.listen_addr}:{self.control_port} (control), then run the cell again."
        )

    def _start_failure_text(self, failures: List[RankFailure]) -> str:
        root = failures[0]
        lines = [f"the pool of {self.nproc} could not start: {root.headline()}"]
        if root.traceback:
            lines += [root.traceback.rstrip()]
        if root.last_lines:
            lines += ["last lines it printed:"] + root.last_lines[-10:]
        log = self.launcher.log_text(2000).strip()
        if log:
            lines += ["worker log:", log]
        if "Address already in use" in "\n".join(lines) or "EADDRINUSE" in "\n".join(lines):
            lines += [f"MASTER_PORT {self.plan.master_port} was taken; run %ddp restart (a free port is chosen) or pass another --master-port"]
        return "\n".join(lines)

    def _register_joined(self, joined: "queue.Queue[tuple]", listener: Listener) -> None:
        """Take the authenticated sockets the accept thread queued: a control or an output socket each."""
        while True:
            try:
                sock, hello = joined.get_nowait()
            except queue.Empty:
                return
            rank = hello.get("rank")
            if hello["op"] == P.HELLO_OUT:
                key = (rank, hello.get("stream"))
                if rank not in self.ranks or key in self._outs or key[1] not in ("stdout", "stderr"):
                    sock.close()
                    continue
                out = self._outs[key] = _OutConn(rank, key[1], sock)
                sock.setblocking(False)
                self._by_fd[sock.fileno()] = out
                continue
            if rank not in self.ranks or rank in self._conns:
                sock.close()
                continue
            self._add_conn(rank, sock)
            info = self.ranks[rank]
            info.pid, info.host, info.device, info.state = hello["pid"], hello["host"], hello["device"], "connecting"
            info.node, info.local_rank = hello.get("node", 0), hello.get("local_rank", rank)
            if isinstance(self.launcher, TorchrunLauncher) and info.host == socket.gethostname():
                self.launcher.pids[info.pid] = rank
            listener.on_state(info)

    def _accept_loop(self, lsock: socket.socket, joined: "queue.Queue[tuple]", wake_w: int, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                sock, _ = lsock.accept()
            except OSError:
                return
            threading.Thread(target=self._admit, args=(sock, joined, wake_w), daemon=True, name="ddp-admit").start()

    def _admit(self, sock: socket.socket, joined: "queue.Queue[tuple]", wake_w: int) -> None:
        """Authenticate a peer before reading one byte of payload; strangers are dropped."""
        try:
            sock.settimeout(10)
            P.server_handshake(sock, self.secret)
            hello = P.recv(sock)
            if hello.get("op") not in (P.HELLO, P.HELLO_OUT):
                raise P.AuthenticationError("no hello")
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except Exception:  # a wrong secret, garbage, a timeout, a closed socket: all the same to us
            self.rejected_peers += 1
            sock.close()
            return
        joined.put((sock, hello))
        try:
            os.write(wake_w, b"x")
        except OSError:
            pass

    def _add_conn(self, rank: int, sock: socket.socket) -> None:
        conn = _Conn(rank, sock)
        sock.setblocking(False)
        self._conns[rank] = conn
        self._by_fd[sock.fileno()] = conn

    def stop(self, listener: Optional[Listener] = None) -> None:
        """Stop every rank and the template. Only our own pids are signalled."""
        self._teardown(kill_template=True)
        self.started = False

    def restart(self, listener: Optional[Listener] = None, **changes: Any) -> None:
        """Stop the ranks (the template stays warm) and start again with a fresh free port."""
        self._teardown(kill_template=False)
        self.started = False
        if changes:
            self.request.update(changes)
        self.plan = self._make_plan()
        self.start(listener)

    def _teardown(self, kill_template: bool) -> None:
        torchrun = isinstance(self.launcher, TorchrunLauncher)
        for conn in list(self._conns.values()):
            try:
                conn.sock.setblocking(True)
                conn.sock.settimeout(0.2)
                conn.sock.sendall(P.encode(P.message(P.SHUTDOWN)))
            except OSError:
                pass
        deadline = time.monotonic() + 1.0
        while self.launcher.pids and time.monotonic() < deadline:
            self.launcher.poll(0.02)
        if torchrun:  # remote ranks exit on SHUTDOWN; wait until their connections close
            deadline = time.monotonic() + 3.0
            while any(_peer_open(c.sock) for c in self._conns.values()) and time.monotonic() < deadline:
                time.sleep(0.02)
        for pid in list(self.launcher.pids):
            signal_pid(pid, signal.SIGKILL)
        deadline = time.monotonic() + 2.0
        while self.launcher.pids and time.monotonic() < deadline:
            self.launcher.poll(0.02)
        for conn in list(self._conns.values()) + list(self._outs.values()):
            try:
                conn.sock.close()
            except OSError:
                pass
        self._conns.clear()
        self._outs.clear()
        self._by_fd.clear()
        self._unsynced.clear()
        if self.store_path:
            try:
                os.unlink(self.store_path)
            except OSError:
                pass
            self.store_path = None
        for info in self.ranks.values():
            if info.state not in ("dead", "failed"):
                info.state = "stopped"
        if kill_template or torchrun:  # torchrun agents end with their ranks; a restart relaunches
            self.launcher.close()

    # ------------------------------------------------------------ the poll loop
    def _dead_ranks(self) -> List[int]:
        return [r for r, info in self.ranks.items() if info.state == "dead"]

    def _pump(
        self,
        listener: Listener,
        until: Callable[[], bool],
        deadline: Optional[float],
        extra_fds: Optional[Dict[int, Callable[[], None]]] = None,
        tick: Optional[Callable[[], None]] = None,
        due: Optional[Callable[[], Optional[float]]] = None,
    ) -> bool:
        """Dispatch messages and exits until until() holds (True) or the deadline passes (False).

        ``tick`` runs after each wake; ``due`` says when it next needs to run (a monotonic
        time, or None for "only on events"), so a quiet cell costs the kernel no busy polling.
        """
        extra_fds = extra_fds or {}
        poller = select.poll()
        registered: set = set()
        launcher_fd = self.launcher.fileno()
        while True:
            if until():
                return True
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return False
            fds = set(self._by_fd) | set(extra_fds) | ({launcher_fd} if launcher_fd is not None else set())
            for fd in fds - registered:
                poller.register(fd, select.POLLIN)
            for fd in registered - fds:
                poller.unregister(fd)
            registered = fds
            wait = IDLE_POLL_S if (due is not None and launcher_fd is not None) else POLL_S
            for limit in (deadline, due() if due is not None else None):
                if limit is not None:
                    wait = min(wait, limit - now)
            wait = max(0.0, wait)
            if fds:
                events = poller.poll(wait * 1000)
            else:
                time.sleep(wait)
                events = []
            for fd, _ in events:
                if fd in extra_fds:
                    extra_fds[fd]()
                elif fd in self._by_fd:
                    conn = self._by_fd[fd]
                    if isinstance(conn, _OutConn):
                        self._read_out(conn, listener)
                    else:
                        self._read_conn(conn, listener)
            for rank, pid, code in self.launcher.poll(0):
                self._on_exit(rank, pid, code, listener)
            if tick is not None:
                tick()

    def _read_conn(self, conn: _Conn, listener: Listener) -> None:
        try:
            data = conn.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop_conn(conn)
            if isinstance(self.launcher, TorchrunLauncher):  # no exit code to wait for: the rank is gone
                info = self.ranks.get(conn.rank)
                if info is not None and info.state not in ("stopped", "dead"):
                    self._on_exit(conn.rank, info.pid or 0, None, listener)
            return
        for msg in conn.reader.feed(data):
            self._dispatch(conn.rank, msg, listener)

    def _drop_conn(self, conn: _Conn) -> None:
        self._by_fd.pop(conn.sock.fileno(), None)
        self._conns.pop(conn.rank, None)
        try:
            conn.sock.close()
        except OSError:
            pass

    def _read_out(self, out: _OutConn, listener: Listener, limit: int = 1 << 20) -> bool:
        """Forward what a rank wrote to fd 1/2; returns False at EOF or when nothing was there."""
        try:
            data = out.sock.recv(limit)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            out.eof = True
            self._by_fd.pop(out.sock.fileno(), None)
            self._emit_text(out, out.scanner.rest(), listener, final=True)
            self._release_done(out.rank, listener)
            return False
        text, tokens = out.scanner.feed(data)
        self._emit_text(out, text, listener)
        if tokens:
            out.synced = max(out.synced, *tokens)
            self._release_done(out.rank, listener)
        return True

    def _emit_text(self, out: _OutConn, data: bytes, listener: Listener, final: bool = False) -> None:
        text = out.decoder.decode(data, final=final)
        if text:
            self._output(out.rank, out.stream, text, listener)

    def _release_done(self, rank: int, listener: Listener) -> None:
        """A DONE counts once both streams have shown everything printed before it."""
        msg = self._unsynced.get(rank)
        if msg is None:
            return
        cell = msg["cell"]
        for stream in ("stdout", "stderr"):
            out = self._outs.get((rank, stream))
            if out is not None and not out.eof and out.synced < cell:
                return
        del self._unsynced[rank]
        self._finish_rank(rank, msg, listener)

    def _drain_outs(self, rank: int, listener: Listener, timeout: float = 0.5) -> None:
        """Read what a (dead) rank left in its output sockets, until EOF or a quiet moment."""
        deadline = time.monotonic() + timeout
        for stream in ("stdout", "stderr"):
            out = self._outs.get((rank, stream))
            while out is not None and not out.eof and time.monotonic() < deadline:
                r, _, _ = select.select([out.sock], [], [], min(0.05, max(0.0, deadline - time.monotonic())))
                if not r or not self._read_out(out, listener):
                    break

    def _dispatch(self, rank: int, msg: dict, listener: Listener) -> None:
        op = msg["op"]
        info = self.ranks.get(rank)
        if op == P.DONE:
            self._unsynced[rank] = msg
            self._release_done(rank, listener)
        elif op == P.RESULT:
            self._results[rank] = msg
        elif op == P.READY:
            if info is not None:
                info.device = msg.get("device", info.device)
            if self._on_ready:
                self._on_ready(rank, msg.get("device"))
        elif op == P.INIT_FAILED:
            err = msg["error"]
            self._init_failures.append(
                RankFailure(rank=rank, kind="init", type=err["type"], message=err["message"], traceback=err["traceback"], pid=info.pid if info else None)
            )
        elif op in (P.STACK, P.ENV):
            self._replies.setdefault(op, {})[rank] = msg

    def _finish_rank(self, rank: int, msg: dict, listener: Listener) -> None:
        self._done[rank] = msg
        info = self.ranks.get(rank)
        if info is not None:
            info.state = {"ok": "done", "interrupted": "interrupted"}.get(msg["status"], "failed")
            info.finished = time.monotonic()
            info.memory = msg.get("memory")
            listener.on_state(info)

    def _output(self, rank: int, stream: str, text: str, listener: Listener) -> None:
        info = self.ranks.get(rank)
        if info is not None and text:
            pieces = text.replace("\r", "\n").split("\n")
            for piece in pieces[:-1]:
                if piece.strip():
                    info.tail.append(piece[-300:])
            if pieces[-1].strip():
                info.last_line = pieces[-1][-300:]
            elif len(pieces) > 1 and info.tail:
                info.last_line = info.tail[-1]
        if text:
            listener.on_output(rank, stream, text)

    def _on_exit(self, rank: Optional[int], pid: int, code: int, listener: Listener) -> None:
        if rank is None or rank not in self.ranks or self.ranks[rank].pid not in (None, pid):
            return
        info = self.ranks[rank]
        if info.state == "stopped":
            return
        conn = self._conns.get(rank)
        if conn is not None:  # whatever it sent before dying is still in the sockets
            try:
                while True:
                    data = conn.sock.recv(1 << 20)
                    if not data:
                        break
                    for msg in conn.reader.feed(data):
                        self._dispatch(rank, msg, listener)
            except (BlockingIOError, OSError):
                pass
        self._drain_outs(rank, listener)
        pending = self._unsynced.pop(rank, None)
        if pending is not None and info.state == "running":
            self._finish_rank(rank, pending, listener)
            return
        info.pid = info.pid or pid
        info.state = "dead"
        info.exit_code = code
        info.finished = time.monotonic()
        self.broken = f"rank {rank} {_describe(code)}"
        listener.on_state(info)

    def _death_failure(self, rank: int) -> RankFailure:
        info = self.ranks[rank]
        return RankFailure(rank=rank, kind="died", pid=info.pid, exit_code=info.exit_code, last_lines=list(info.tail)[-10:])

    def _broadcast(self, msg: dict, ranks: Optional[Sequence[int]] = None) -> None:
        frame = P.encode(msg)
        for rank in list(ranks if ranks is not None else self._conns):
            conn = self._conns.get(rank)
            if conn is None:
                continue
            try:
                _send_all_nonblocking(conn.sock, frame)
            except OSError:
                self._drop_conn(conn)

    # ------------------------------------------------------------ cells
    def ensure_started(self, listener: Optional[Listener] = None) -> Optional[str]:
        """Start, or restart a broken pool. Returns a notice for the user when state was lost."""
        listener = listener or Listener()
        if self.started and not self.broken and self.launcher.alive():
            return None
        why = self.broken
        if self.started:
            self.restart(listener)
            return f"restarted the pool ({why}); variables defined in earlier %%ddp cells are gone"
        self.start(listener)
        return None

    def run(
        self,
        source: str,
        names: Optional[Dict[str, bytes]] = None,
        *,
        listener: Optional[Listener] = None,
        timeout: Optional[float] = None,
        gather: str = "auto",
        argv: Optional[List[str]] = None,
        label: Optional[str] = None,
        owned: Sequence[str] = (),
    ) -> CellOutcome:
        """Run source on every rank; names are cloudpickled notebook values to bind first.

        ``owned`` are the names the workers own (assigned by earlier cells): a notebook
        function that refers to one of them sees the rank's value, not the notebook's.
        Returns when every rank has finished, or, after a failure, once the
        others finished, were interrupted, or were stopped (which breaks the pool;
        the next run restarts it). KeyboardInterrupt interrupts every rank, then
        propagates as a failed outcome.
        """
        guarded = _Guarded(listener or Listener())
        listener = guarded  # type: ignore[assignment]
        notes: List[str] = []
        notice = self.ensure_started(listener)
        if notice:
            listener.on_notice(notice)
        self._cell += 1
        cell = self._cell
        filename = f"<ddp-cell-{label if label is not None else cell}>"
        self._done, self._results = {}, {}
        self._replies = {}
        t0 = time.monotonic()
        for info in self.ranks.values():
            info.state, info.started, info.finished, info.last_line = "running", t0, None, ""
            info.tail.clear()
            listener.on_state(info)
        local_argv = argv
        here = socket.gethostname()
        for rank in range(self.nproc):
            local_rank = self.ranks[rank].local_rank if self.ranks[rank].local_rank is not None else rank
            a = list(local_argv) if local_argv is not None else ["ddp_cell", f"--local_rank={local_rank}"]
            same_host = self.ranks[rank].host in ("", here)
            msg = P.message(P.RUN, cell=cell, source=source, filename=filename, names=names or {}, owned=sorted(owned), argv=a, gather=gather, shm=same_host)
            self._broadcast(msg, [rank])
        state = CellWatch(self, listener, timeout, t0)
        try:
            self._pump(listener, state.finished, None, tick=state.tick, due=state.next_due)
        except KeyboardInterrupt:
            state.interrupted_by_user()
            try:
                self._pump(listener, state.finished, None, tick=state.tick, due=state.next_due)
            except KeyboardInterrupt:  # a second Ctrl-C: no more grace
                state._stop_ranks(state.running())
        failures, stacks = state.failures(), state.stacks
        notes += state.notes
        values: List[Any] = [None] * self.nproc
        if not state.cancelled:
            self._collect_results(values, failures, notes, listener)
        for rank, msg in self._done.items():
            if msg.get("result") is not None:
                try:
                    values[rank] = transfer.unpack(msg["result"])
                except Exception as e:
                    values[rank] = transfer.Unpicklable(rank, "result", f"{type(e).__name__}: {e}")
                    notes.append(f"the result of rank {rank} could not be unpickled in the kernel: {type(e).__name__}: {e}")
            elif msg.get("result_error"):
                err = msg["result_error"]
                values[rank] = transfer.Unpicklable(rank, err["type"], err["reason"])
                notes.append(f"rank {rank}'s result ({err['type']}) could not be pickled: {err['reason']}; the other ranks' results are returned")
        notes += guarded.errors
        lost = state.state_lost or bool(self.broken)
        if self.broken and not state.state_lost:
            notes.append(f"the pool restarts on the next cell ({self.broken}); variables defined in earlier %%ddp cells will be lost")
        return CellOutcome(values=values, failures=failures, notes=notes, elapsed=time.monotonic() - t0, stacks=stacks, state_lost=lost)

    def _collect_results(self, values: List[Any], failures: List[RankFailure], notes: List[str], listener: Listener) -> None:
        pending = {r: m["pending"] for r, m in self._done.items() if m.get("pending")}
        if not pending:
            return
        metas = list(pending.values())
        gather = not failures and len(pending) == self.nproc and all(m == metas[0] for m in metas)
        self._broadcast(P.message(P.DECIDE, mode="gather" if gather else "send"), list(pending))
        deadline = time.monotonic() + 600
        self._pump(listener, lambda: all(r in self._results or self.ranks[r].state == "dead" for r in pending), deadline)
        for r in pending:
            msg = self._results.get(r)
            if msg is None:
                failures.append(self._death_failure(r))
                continue
            if msg.get("gather_failed"):
                notes.append(f"all_gather of the results failed on rank {r} ({msg['gather_failed']}); results were sent rank by rank")
            if msg.get("result") is not None:
                self._done[r]["result"] = None
                value = transfer.unpack(msg["result"])
                if msg.get("gathered") and r == 0:
                    values[:] = list(value)
                elif not msg.get("gathered"):
                    values[r] = value
            elif msg.get("result_error"):
                self._done[r]["result_error"] = msg["result_error"]

    def ask(self, op: str, timeout: float = 5.0, listener: Optional[Listener] = None) -> Dict[int, dict]:
        """Ask every live rank for its STACK or ENV; returns the replies that came in time."""
        self._replies[op] = {}
        ranks = [r for r in self._conns]
        self._broadcast(P.message(op), ranks)
        self._pump(listener or Listener(), lambda: all(r in self._replies[op] or r not in self._conns for r in ranks), time.monotonic() + timeout)
        return dict(self._replies.get(op, {}))

    def live_env(self, timeout: float = 5.0) -> Dict[int, dict]:
        """What each rank actually sees: its os.environ and process-group state, read from the worker."""
        if not self.alive:
            return {}
        return {r: m["env"] for r, m in self.ask(P.ENV, timeout).items()}


def _describe(code: Optional[int]) -> str:
    from ..errors import describe_exit

    return describe_exit(code)


def _file_store_path(run_id: str) -> Optional[str]:
    """Where a one-host pool's ranks meet to initialise the process group (None: use env://)."""
    if not os.path.isdir(transfer.SHM_DIR):
        return None
    return os.path.join(transfer.SHM_DIR, f"{transfer.SHM_PREFIX}store-{run_id}-{os.getpid()}")


def _raise_fd_limit(needed: int) -> None:
    """Hundreds of ranks need more sockets than the usual soft limit of 1024; the hard limit allows it."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = len(os.listdir("/proc/self/fd")) + needed if os.path.isdir("/proc/self/fd") else needed + 256
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(want * 2, hard) if hard != resource.RLIM_INFINITY else want * 2, hard))
    except (ImportError, ValueError, OSError):
        pass


def _peer_open(sock: socket.socket) -> bool:
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def _send_all_nonblocking(sock: socket.socket, frame: bytes) -> None:
    view = memoryview(frame)
    while view:
        try:
            n = sock.send(view)
        except BlockingIOError:
            select.select([], [sock], [], 1.0)
            continue
        view = view[n:]


def _stop_quietly(launcher: Any, conns: Dict[int, _Conn]) -> None:
    try:
        for conn in list(conns.values()):
            conn.sock.close()
        launcher.close()
    except Exception:
        pass
