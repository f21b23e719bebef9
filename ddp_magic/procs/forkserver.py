"""The template process: imports torch once, then forks ranks in milliseconds.

Started by the kernel as a clean ``python -m ddp_magic.procs.forkserver`` (the kernel
itself is never forked, so CUDA initialised there cannot break a launch). It
never touches CUDA and runs no parallel op, so forking it is safe. It is
single-threaded on purpose: forking a process with threads can leave locks held
in the child.

Protocol, one JSON object a line: the kernel writes commands on our stdin
(``spawn``, ``exit``); we write events on stdout (``ready``, ``spawned``,
``exited``, ``error``). Our stdin closing means the kernel is gone: every child
is killed, the pool's files in /dev/shm are removed (wire/shm.py) and we exit;
Linux's parent-death signal (SIGTERM) covers a SIGKILLed kernel too.
"""
from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
import traceback
from typing import Dict, Set

from ..logs import log
from ..wire import shm
from .parent import die_with_parent


def _emit(event: dict) -> None:
    """One event to the kernel; a kernel that is gone reads none (and must not stop our cleanup)."""
    data = (json.dumps(event) + "\n").encode()
    try:
        while data:
            n = os.write(1, data)
            data = data[n:]
    except OSError:  # EPIPE: the kernel died; kernel_gone still kills the ranks and removes the files
        log.debug("the kernel no longer reads our events", exc_info=True)


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


class Template:
    """The template's state: its children (ranks), their pools' file prefixes, and the SIGCHLD wake-up pipe."""

    def __init__(self) -> None:
        self.secret = b""
        self.children: Dict[int, int] = {}  # pid -> rank
        self.prefixes: Set[str] = set()  # the pools whose files in /dev/shm our ranks make (wire/shm.py)
        self.wake_r = self.wake_w = -1

    def kernel_gone(self, *_: object) -> None:
        """The kernel is gone or asked us to exit: our ranks go, then every file their pool left."""
        try:
            _kill_all(self.children)
        finally:
            for prefix in self.prefixes:
                try:
                    shm.remove_pool_files(prefix)
                except Exception:  # a bad prefix in a spawn command: nothing of ours to remove
                    log.debug("could not remove the files of %r", prefix, exc_info=True)
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
        pid = os.fork()
        if pid == 0:
            _child(cmd, self.secret, self.wake_r, self.wake_w)
        self.children[pid] = cmd["rank"]
        _emit({"event": "spawned", "rank": cmd["rank"], "pid": pid})

    def serve(self) -> None:
        """Reap exited ranks and run the kernel's commands until stdin closes."""
        stdin_buf = b""
        while True:
            try:
                ready, _, _ = select.select([0, self.wake_r], [], [], 1.0)
            except InterruptedError:
                ready = []
            if self.wake_r in ready:
                try:
                    while os.read(self.wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass  # drained
            _reap(self.children)
            if 0 in ready:
                data = os.read(0, 65536)
                if not data:
                    self.kernel_gone()
                stdin_buf += data
                while b"\n" in stdin_buf:
                    line, stdin_buf = stdin_buf.split(b"\n", 1)
                    cmd = json.loads(line)
                    if cmd["op"] == "spawn":
                        self.spawn(cmd)
                    elif cmd["op"] == "exit":
                        self.kernel_gone()


def main() -> None:
    kernel_pid = os.getppid()
    template = Template()
    # SIGTERM (not SIGKILL) when the kernel dies, so the ranks and their files go with us.
    signal.signal(signal.SIGTERM, template.kernel_gone)
    die_with_parent(kernel_pid, signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    first = json.loads(sys.stdin.readline())
    template.secret = bytes.fromhex(first["secret"])
    try:
        info = _warm_imports()
    except BaseException as e:
        log.debug("the template could not import torch", exc_info=True)
        _emit({"event": "error", "message": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        os._exit(1)
    template.watch_children()
    _emit({"event": "ready", "pid": os.getpid(), "info": info})
    template.serve()


def _reap(children: Dict[int, int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        rank = children.pop(pid, None)
        code = os.waitstatus_to_exitcode(status)
        _emit({"event": "exited", "pid": pid, "rank": rank, "code": code})


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
