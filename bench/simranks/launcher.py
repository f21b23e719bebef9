"""The simulated ranks' launcher: the pool's Launcher ABC (kernel/launchers/base.py), outside the product package.

It starts a few host processes (host.py), each running up to ``per_host`` ranks
on one loop, and reads their exit events from one shared pipe, whose read end
is its ``fileno``: the pool's poll loop wakes on a rank's exit as it does with
the fork server. ``spawn`` starts one rank alone (a dead rank replaced,
kernel/failures/recovery.py).

A host process carries many ranks, so no rank's pid is ours to signal alone:
``owns`` is False, and the policy's SIGTERM/SIGKILL escalation reaches no
simulated rank (a deaf rank is given up, as a real one is after SIGKILL).
The pool's teardown still SIGKILLs the host processes (``live_pids``).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import weakref
from typing import TYPE_CHECKING, Dict, List, Optional, Set

from ddp_magic.kernel.launchers import Launcher, signal_pid
from ddp_magic.kernel.launchers.base import Exit
from ddp_magic.logs import log
from ddp_magic.wire import shm

if TYPE_CHECKING:
    from ddp_magic.plan.plan import Plan

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # bench/: where ``simranks`` imports from
PER_HOST = 256  # ranks per host process
HOST_POLL_S = 0.02  # a host process that ended is seen within this (its ranks' exits come through the event pipe at once)
ENV_KEYS = (shm.ENV, "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "DDP_MAGIC_BACKEND", "TORCHELASTIC_RUN_ID")


class SimLauncher(Launcher):
    """Simulated ranks, many per process; exits reported as the fork server reports them."""

    name = "simulated"
    remote_ranks = False
    reports_exits = True
    keeps_template = True
    replaces_ranks = True  # spawn(rank, config) starts one dead rank again, in a host process of its own

    def __init__(self, secret: bytes, python: str = sys.executable, per_host: int = PER_HOST) -> None:
        super().__init__(secret, python)
        self.per_host = per_host
        self.hosts: Dict[int, subprocess.Popen] = {}  # pid -> host process
        self.ranks_of: Dict[int, Set[int]] = {}  # host pid -> its live ranks
        self._r, self._w = os.pipe()  # every host writes its exit events here
        os.set_blocking(self._r, False)
        weakref.finalize(self, _close_fds, self._r, self._w)
        self._buf = b""
        self._exits: List[Exit] = []
        self._hosts_polled = float("-inf")  # when poll last looked at the host processes

    def start(self, timeout: float = 0) -> str:
        return f"simulated ranks, {self.per_host} per process (bench/simranks)"

    def launch(self, plan: "Plan", base_env: Dict[str, str], control_addr: str, control_port: int, store_path: Optional[str] = None) -> Optional[str]:
        ranks = list(range(plan.world_size))
        env = dict(base_env, **plan.rank_env(0))
        for i in range(0, len(ranks), self.per_host):
            self._host(ranks[i : i + self.per_host], plan.world_size, env, control_addr, control_port)
        return None

    def spawn(self, rank: int, config: dict) -> None:
        """One rank alone, at ``rank`` (what recovery calls to replace a dead rank)."""
        env = config["env"]
        self._host([rank], int(env["WORLD_SIZE"]), env, config["kernel_addr"], int(config["kernel_port"]))

    def _host(self, ranks: List[int], world: int, env: Dict[str, str], addr: str, port: int) -> None:
        proc_env = dict(env, PYTHONPATH=os.pathsep.join([HERE, env.get("PYTHONPATH", "")]).strip(os.pathsep))
        proc = subprocess.Popen(
            [self.python, "-m", "simranks.host"], stdin=subprocess.PIPE, stdout=self._w, stderr=self.log,
            env=proc_env, start_new_session=True, close_fds=True,
        )
        config = {"addr": addr, "port": port, "secret": self.secret.hex(), "ranks": ranks, "world": world,
                  "parent_pid": os.getpid(), "env": {k: env[k] for k in ENV_KEYS if k in env}}
        assert proc.stdin is not None
        proc.stdin.write((json.dumps(config) + "\n").encode())
        proc.stdin.close()
        self.hosts[proc.pid] = proc
        self.ranks_of[proc.pid] = set(ranks)

    def adopt(self, pid: int, rank: int, host: str) -> None:
        return None  # we started it: its host process is known already

    def live_pids(self) -> Dict[int, int]:
        """Host process pid -> one of its live ranks (what the pool's teardown waits for and signals)."""
        return {pid: min(ranks) for pid, ranks in self.ranks_of.items() if ranks and pid in self.hosts}

    def owns(self, pid: int) -> bool:
        return False  # a host process is many ranks: a signal for one rank must not reach the others

    def fileno(self) -> Optional[int]:
        return self._r

    def poll(self, timeout: float = 0.0) -> List[Exit]:
        """Rank exits since the last poll; a host process that ended takes its remaining ranks with it.

        The hub polls after every wake of its loop (dozens a cell at 1,024 ranks): the host processes are looked at
        (a waitpid each) at most every ``HOST_POLL_S``, so a poll costs about what the fork server's one select does."""
        if timeout:
            time.sleep(min(timeout, 0.05))
        self._read_events()
        now = time.monotonic()
        if not timeout and now - self._hosts_polled < HOST_POLL_S and not self._exits:
            return []
        self._hosts_polled = now
        for pid, proc in list(self.hosts.items()):
            code = proc.poll()
            if code is None:
                continue
            self._read_events()  # its last words first
            self._exits += [(r, pid, code) for r in sorted(self.ranks_of.pop(pid, set()))]
            del self.hosts[pid]
        out, self._exits = self._exits, []
        return out

    def _read_events(self) -> None:
        try:
            while True:
                data = os.read(self._r, 1 << 16)
                if not data:
                    break
                self._buf += data
        except BlockingIOError:
            pass
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            ev = json.loads(line)
            self.ranks_of.get(ev["pid"], set()).discard(ev["rank"])
            self._exits.append((ev["rank"], ev["pid"], ev["code"]))

    def alive(self) -> bool:
        return True

    def close(self) -> None:
        """SIGKILL every host process still there (ours, by pid) and wait for it."""
        for pid, proc in list(self.hosts.items()):
            if proc.poll() is None:
                signal_pid(pid, signal.SIGKILL)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log.debug("simulated host %d did not exit after SIGKILL", pid, exc_info=True)
        self.hosts.clear()
        self.ranks_of.clear()


def _close_fds(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            log.debug("the event pipe's fd %d was closed already", fd, exc_info=True)
