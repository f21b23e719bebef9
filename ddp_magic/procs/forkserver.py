"""The template process: imports torch once, then forks ranks in milliseconds.

Started by the kernel as a clean ``python -m ddp_magic.procs.forkserver`` (the kernel
itself is never forked, so CUDA initialised there cannot break a launch). It
never touches CUDA and runs no parallel op, so forking it is safe. It is
single-threaded on purpose: forking a process with threads can leave locks held
in the child.

Protocol, one JSON object a line: the kernel writes commands on our stdin
(``spawn``, ``exit``, ``warm``: procs/template_later.py); we write events on
stdout (``ready``, ``spawned``, ``exited``, ``error``). Our stdin closing means the kernel is gone: every child
is killed, the pool's files in /dev/shm are removed (wire/shm.py) and we exit;
Linux's parent-death signal (SIGTERM) covers a SIGKILLed kernel too.

One template serves every pool of its kernel in turn (kernel/templates.py): each
``spawn`` carries its pool's secret, so a new pool's ranks prove the new secret.
A template started at ``%load_ext`` imports at low priority, in a thread of its
own (Linux nice is per thread), so the ranks it forks later run at normal priority.
Idle for SPARE_IDLE_S, it forks spare ranks that wait for a ``spawn`` on a pipe of
their own (``_spare``): the next pool's ranks then need no fork.
"""
from __future__ import annotations

import json
import os
import select
import signal
import threading
import time
import traceback
from typing import Callable, Dict, List, Optional, Set

from ..logs import log
from ..wire import shm
from .lease import Lease
from .template_end import TemplateEnd, tell
from .template_keep import KeptTemplate, emit as _emit
from .template_later import LaterImports
from .template_preempt import PreemptibleTemplate
from .parent import die_with_parent


def _warm_imports_nice(nice: int) -> str:
    """The imports at lower priority, in a thread; joined before any fork, so the template is single-threaded again. A
    "hurry" gives the thread the kernel's own priority back (the template's at its start: never above what it was given)."""
    out: Dict[str, str] = {}
    base = os.getpriority(os.PRIO_PROCESS, 0)

    def run() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), max(base, nice))
        except OSError:
            log.debug("could not lower the priority of the template's imports", exc_info=True)
        try:
            out["info"] = _warm_imports()
        except BaseException as e:  # reported by the main thread, as without the thread
            log.debug("the template's imports failed", exc_info=True)
            out["error"], out["traceback"] = f"{type(e).__name__}: {e}", traceback.format_exc()

    thread = threading.Thread(target=run, name="ddp-template-import")
    thread.start()
    while thread.is_alive():  # the kernel may say "hurry" (a cell waits for us now) or "exit"
        if select.select([0], [], [], 0.1)[0]:
            cmd = json.loads(_read_line() or '{"op": "exit"}')
            if cmd.get("op") == "exit":
                os._exit(0)
            try:
                os.setpriority(os.PRIO_PROCESS, thread.native_id or 0, base)
            except OSError:  # raising a priority again takes a privilege: the import goes on at low priority
                log.debug("could not raise the priority of the template's imports", exc_info=True)
    if "error" in out:
        raise ImportError(out["error"] + "\n" + out["traceback"])
    return out["info"]


def _read_line() -> bytes:
    """One line of stdin, byte by byte: nothing after it may sit in a buffer the select loop cannot see."""
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte:
            return line
        line += byte
    return line


def _warm_imports() -> str:
    t0 = time.perf_counter()
    import cloudpickle  # noqa: F401
    import torch
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401

    from . import worker  # noqa: F401

    try:
        import numpy  # noqa: F401
    except ImportError:
        pass
    return f"torch {torch.__version__} imported in {time.perf_counter() - t0:.2f}s"


def _child(cmd: dict, secret: bytes, wake_r: int, wake_w: int) -> None:
    """In the forked child: become a worker. Never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the template's cleanup handler is not ours
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # nor its warning's: the worker takes it (procs/rank_preempt.py)
        # A session of its own, as torchrun gives each rank: Linux's autogroup scheduler
        # then shares the cores per rank, not per pool. With one session for all ranks,
        # 8 ranks on 2 cores got the CPU share of one process (bench/README.md, section 5).
        os.setsid()
        os.close(wake_r)
        os.close(wake_w)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(2, 1)  # until the worker captures fd 1, nothing may reach the event pipe
        from .worker import serve

        die_with_parent(cmd["parent"])
        os.environ.clear()
        os.environ.update(cmd["config"]["env"])
        code = serve(cmd["config"], secret)
    except BaseException:
        log.debug("forked rank failed outside a cell", exc_info=True)
        traceback.print_exc()
    finally:
        os._exit(code)


SPARE_IDLE_S = 2.0  # spare ranks are forked only after this long without a command: never while a pool starts
MAX_SPARES = 16


def _spare(pipe_r: int, inherited: List[int], wake_r: int, wake_w: int) -> None:
    """A rank forked ahead of need: it waits for its spawn command on a pipe of its own, then becomes that rank.

    Forking the template (torch imported) takes 10-20 ms a rank on a busy machine; a size change at n = 8
    spent most of its time there (docs/bench/data.md). Never returns."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for fd in inherited:  # the other spares' pipes: not ours to hold
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)  # the kernel's pipes are the template's, never a waiting spare's
        os.close(devnull)
        os.dup2(2, 1)
        die_with_parent(os.getppid())
        line = b""
        while not line.endswith(b"\n"):
            chunk = os.read(pipe_r, 65536)
            if not chunk:  # the template let us go
                os._exit(0)
            line += chunk
        cmd = json.loads(line)
    except BaseException:
        log.debug("a spare rank failed before its command", exc_info=True)
        os._exit(1)
    _child(cmd, bytes.fromhex(cmd["secret"]), wake_r, wake_w)


class Template(KeptTemplate, PreemptibleTemplate, LaterImports):
    """The template's state: its children (ranks), spare ranks, their pools' file prefixes, and the SIGCHLD wake-up pipe."""

    def __init__(self, kernel_pid: int = 0) -> None:
        self.secret = b""  # the first pool's; each spawn may carry its own pool's
        self.kernel_pid = kernel_pid
        self.children: Dict[int, int] = {}  # pid -> rank
        self.prefixes: Set[str] = set()  # the pools whose files in /dev/shm our ranks make (wire/shm.py)
        self.wake_r = self.wake_w = -1
        self.spares: Dict[int, int] = {}  # pid -> the write end of its command pipe
        self.retired: Set[int] = set()  # spares let go (procs/template_later.py)
        self.want = 0  # spares to keep: the most ranks one pool asked for (MAX_SPARES at most)
        self.burst = 0  # spawns since the template was last idle
        self.kernel_fd = 0  # where the kernel's commands come from: stdin, or an attached kernel's lease connection
        self.cmd_buf = b""
        self.lease: Optional[Lease] = None  # %ddp keep: the pool outlives its kernel (procs/lease.py)

    terminated_why = "its template was terminated (SIGTERM)"  # a kept pool's end, as the next attach says it

    def kernel_gone(self, *_: object, dead: bool = True) -> None:
        """The kernel is going (``dead``: its SIGTERM, or EOF) or asked us to exit: our ranks go, then every file
        their pools left; once the kernel is really gone, its other files too (the notebook data it shipped,
        wire/notebook_data.py). Linux sends the SIGTERM when the kernel's thread that started us exits,
        before the whole kernel is gone, and a large kernel takes a second or more to go. A kept pool's lease ends
        first (its files go, its discovery file says why)."""
        lease, self.lease = self.lease, None
        if lease is not None:
            if dead:
                lease.end(self.terminated_why)
            else:
                lease.off()
        try:
            self.children.update(dict.fromkeys([*self.spares, *self.retired], -1))  # the live dict: a nested call (SIGTERM) sees what is reaped
            self.spares.clear()
            self.retired.clear()
            _kill_all(self.children)
        finally:
            for prefix in self.prefixes:
                try:
                    shm.remove_pool_files(prefix)
                except Exception:  # a bad prefix in a spawn command: nothing of ours to remove
                    log.debug("could not remove the files of %r", prefix, exc_info=True)
            deadline = time.monotonic() + KERNEL_EXIT_WAIT_S
            while dead and self.kernel_pid and not _exited(self.kernel_pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if dead and self.kernel_pid and _exited(self.kernel_pid):
                shm.remove_kernel_files(self.kernel_pid)
            os._exit(0)


    def watch_children(self) -> None:
        """SIGCHLD wakes the select loop through a pipe (signal.set_wakeup_fd)."""
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def spawn(self, cmd: dict) -> None:
        cmd["parent"] = os.getpid()
        prefix = cmd["config"]["env"].get(shm.ENV)
        if prefix:
            self.prefixes.add(prefix)
        secret = bytes.fromhex(cmd["secret"]) if cmd.get("secret") else self.secret
        self.burst += 1
        pid = self._use_spare(dict(cmd, secret=secret.hex()))
        if pid is None:
            pid = os.fork()
            if pid == 0:
                _child(cmd, secret, self.wake_r, self.wake_w)
        self.children[pid] = cmd["rank"]
        _emit({"event": "spawned", "rank": cmd["rank"], "pid": pid})

    def _use_spare(self, cmd: dict) -> Optional[int]:
        """Hand ``cmd`` to a waiting spare; its pid, or None when there is none (or it died meanwhile)."""
        while self.spares:
            pid, fd = self.spares.popitem()
            try:
                os.write(fd, (json.dumps(cmd) + "\n").encode())  # one line, far below the pipe's atomic size
                return pid
            except OSError:
                log.debug("spare %s is gone", pid, exc_info=True)
            finally:
                os.close(fd)
        return None

    def top_up(self) -> None:
        """Idle: fork spares up to the most ranks one pool asked for, so the next pool's ranks need no fork."""
        self.want, self.burst = min(MAX_SPARES, max(self.want, self.burst)), 0
        while len(self.spares) < self.want:
            pipe_r, pipe_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                _spare(pipe_r, [pipe_w, *self.spares.values()], self.wake_r, self.wake_w)
            os.close(pipe_r)
            self.spares[pid] = pipe_w

    def reap(self) -> None:
        """Every exited child: a rank's exit is an event for the kernel, a spare's is not."""
        _reap(self.children, self.spares, self.lease.on_exit if self.lease is not None else None, self.retired)

    def serve(self) -> None:
        """Reap exited ranks and run the kernel's commands until the kernel goes (a kept pool: until its lease ends)."""
        last = time.monotonic()
        while True:
            fds = ([self.kernel_fd] if self.kernel_fd >= 0 else []) + [self.wake_r] + self.kept_fds()
            ready = readable(fds, SPARE_IDLE_S / 2)
            if self.kernel_fd in ready:
                last = time.monotonic()
            elif time.monotonic() - last >= SPARE_IDLE_S and len(self.spares) < max(self.want, self.burst):
                self.top_up()
            if self.wake_r in ready:
                try:
                    while os.read(self.wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass  # drained
            self.reap()
            self.preempt_due()
            if self.kernel_fd >= 0 and self.kernel_fd in ready:
                self.read_commands()
            self.serve_kept(ready)

    def read_commands(self) -> None:
        try:
            data = os.read(self.kernel_fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # no "exit": the kernel is going
            if self.lease is None and not self.follows_lease:
                tell(self.node, self.children, TemplateEnd.COMMANDS_CLOSED)
                self.kernel_gone()
            self.kernel_left()
            return
        self.cmd_buf += data
        while b"\n" in self.cmd_buf and self.kernel_fd >= 0:
            line, self.cmd_buf = self.cmd_buf.split(b"\n", 1)
            self.command(json.loads(line))

    def command(self, cmd: dict) -> None:
        if cmd.get("op") == "warm":
            self.import_later()
        else:
            super().command(cmd)


def main() -> None:
    kernel_pid = os.getppid()
    template = Template(kernel_pid)
    # SIGTERM (not SIGKILL) when the kernel dies, so the ranks and their files go with us.
    signal.signal(signal.SIGTERM, template.terminated)  # --save-on-preempt: armed ranks save first
    signal.signal(signal.SIGUSR1, template.warned)
    die_with_parent(kernel_pid, signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    first = json.loads(_read_line())
    template.secret = bytes.fromhex(first["secret"])
    try:
        info = _warm_imports_nice(int(first["nice"])) if first.get("nice") else _warm_imports()
    except BaseException as e:
        log.debug("the template could not import torch", exc_info=True)
        _emit({"event": "error", "message": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        os._exit(1)
    template.watch_children()
    _emit({"event": "ready", "pid": os.getpid(), "info": info})
    template.serve()


def readable(fds: List[int], seconds: float) -> List[int]:
    """The readable (or closed) fds of ``fds``: poll(), as a kept pool's lease holds a socket per rank, past select()'s 1,024."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    try:
        return [fd for fd, _ in poller.poll(seconds * 1000)]
    except InterruptedError:
        return []


def _reap(children: Dict[int, int], spares: Optional[Dict[int, int]] = None, on_exit: Optional[Callable[[Optional[int], int, int], None]] = None,
          retired: Optional[Set[int]] = None) -> None:
    """Every exited child: a rank's exit (``children``: pid -> rank) is an event for the kernel (and for a kept pool's
    lease, ``on_exit``), a waiting spare's (``spares``: pid -> its command pipe; ``retired``: one let go) is not."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if spares and pid in spares:
            os.close(spares.pop(pid))
            continue
        if retired and pid in retired:
            retired.discard(pid)
            continue
        rank, code = children.pop(pid, None), os.waitstatus_to_exitcode(status)
        if on_exit is not None:
            on_exit(rank, pid, code)
        _emit({"event": "exited", "pid": pid, "rank": rank, "code": code})


KERNEL_EXIT_WAIT_S = 15.0  # how long a template whose kernel is going waits for it to be gone, to remove its files


def _exited(pid: int) -> bool:
    """Whether ``pid`` is gone or a zombie (its memory and threads are)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def _kill_all(children: Dict[int, int]) -> None:
    for pid in list(children):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 2
    while children and time.monotonic() < deadline:
        _reap(children)
        time.sleep(0.01)


if __name__ == "__main__":
    main()
