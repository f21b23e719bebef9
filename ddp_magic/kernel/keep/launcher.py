"""A kept pool's template as the attached kernel's launcher: the fork server, reached on its lease socket.

The template outlived the kernel that started it, so it is no child of ours and has no pipe to us: its
commands (``spawn`` a dead rank again, ``exit``) and events (``spawned``, ``exited``) travel on the
authenticated lease connection the attach opened (procs/lease.py), one JSON object a line, as on the
pipes of a template we started. Its liveness is its lock (wire/kept.py), not its pid.

A kept Slurm pool (``KeptSlurmLauncher``): the lease holder is the first node's template; a spawn names its
node, and the holder hands one for another node to that node's template, which holds a connection to the
lease socket since the keep (procs/template_keep.py), since srun's stdin, the way it came before, was the
first kernel's. As on Slurm, a joined rank's exit is its lost connection.

A kept SSH pool (``KeptSshLauncher``) is reached the same way: the first host's template holds the lease and hands a
spawn for another host to that host's template (its ssh session was the first kernel's, and is gone). So is a kept Ray
pool (``KeptRayLauncher``): the first node's template holds it, the pool's driver on the first kernel's host follows it.
"""
from __future__ import annotations

import json
import socket
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from ...logs import log
from ...wire import kept
from ..launchers import ForkServerLauncher, LaunchError
from ..launchers.base import Exit
from ..launchers.hosts import host_rank_env
from ..launchers.slurm_steps import rank_env, spawn_config

if TYPE_CHECKING:
    from ...plan.plan import Plan

EXIT_WAIT_S = 3.0  # %ddp stop: how long the template gets to end its ranks and release its lock
SPAWN_WAIT_S = 10.0  # the holder says within this whether the rank's node template took the spawn


class KeptLauncher(ForkServerLauncher):
    """ForkServerLauncher over a kept template's lease connection."""

    def __init__(self, secret: bytes, sock: socket.socket, pids: Dict[int, int], lock: str) -> None:
        super().__init__(secret)
        self.sock: Optional[socket.socket] = sock
        self._pids = dict(pids)
        self.lock = lock
        self.ready_info = "the kept pool's template (attached)"

    def begin(self, nice: int = 0) -> None:
        """Nothing to start: the template runs."""

    def stale(self) -> list:
        return []

    def start(self, timeout: float = 120.0) -> str:
        return self.ready_info

    def _write(self, obj: dict) -> None:
        if self.sock is None:
            raise OSError("the kept template's connection is closed")
        self.sock.sendall((json.dumps(obj) + "\n").encode())

    def fileno(self) -> Optional[int]:
        return self.sock.fileno() if self.sock is not None else None

    def alive(self) -> bool:
        """Its connection is open and, while it holds a lease, its lock is held (after keep --off: the connection alone)."""
        return self.sock is not None and (not self.lock or kept.is_held(self.lock))

    def detach(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()
        self._pids = {}

    def close(self) -> None:
        """%ddp stop (or a pool that replaces this one): the template ends its ranks and its lease, then exits."""
        if self.sock is None:
            return
        try:
            self._write({"op": "exit"})
        except OSError:
            log.debug("the kept template was gone already", exc_info=True)
        deadline = time.monotonic() + EXIT_WAIT_S
        while self.lock and kept.is_held(self.lock) and time.monotonic() < deadline:
            time.sleep(0.02)
        self.detach()
        self.ready_info = ""


class KeptSlurmLauncher(KeptLauncher):
    """KeptLauncher for a kept Slurm pool: a spawn goes to the rank's node template, as SlurmLauncher sends it over srun."""

    remote_ranks = True  # as SlurmLauncher: a rank is asked to exit by message, a closed connection is its exit
    reports_exits = False
    tls_fp: Optional[str] = None  # a TLS pool's: the attached kernel's certificate, which a rank forked again pins

    def __init__(self, secret: bytes, sock: socket.socket, pids: Dict[int, int], lock: str, plan: "Plan", slurm: Dict[str, Any]) -> None:
        super().__init__(secret, sock, pids, lock)
        self.plan, self.nodes, self.step_env = plan, list(slurm["nodes"]), dict(slurm["step_env"])
        self.job = str(slurm.get("job") or "")  # the allocation that follows the lease (procs/slurm_hold.py)
        self.released = ""  # what %ddp stop says of it (session.py), as SlurmLauncher's
        self._pending: Dict[int, Optional[int]] = {}  # rank -> its pid once forked, until it joins
        self._unserved: Dict[int, str] = {}  # rank -> why its node's template could not take the spawn

    def kept_blob(self) -> Dict[str, object]:
        """The same, for the next kernel (%ddp keep again from this one)."""
        return {"nodes": self.nodes, "step_env": self.step_env, "job": self.job}

    def close(self) -> None:
        """%ddp stop: the lease ends, and with its lock the allocation (its holder follows the lock): said as on Slurm."""
        ended = self.sock is not None
        super().close()
        if ended and self.job and not (self.lock and kept.is_held(self.lock)):
            self.released = f"; Slurm job {self.job} released with the lease: its nodes are free"

    def spawn(self, rank: int, config: dict) -> None:
        """``rank`` forked again by its node's template; LaunchError when the holder cannot reach that template."""
        node_rank, wanted = self._rank_env(rank, config["env"])
        node = self.nodes[node_rank]
        self._pending[rank] = None
        self._unserved.pop(rank, None)
        self._write({"op": "spawn", "rank": rank, "node": node, "secret": self.secret.hex(),
                     "config": spawn_config(self.step_env, wanted, config["kernel_addr"], config["kernel_port"], self.tls_fp)})
        deadline = time.monotonic() + SPAWN_WAIT_S
        while self._pending.get(rank) is None and rank not in self._unserved and self.sock is not None and time.monotonic() < deadline:
            self._read_events(0.1)
        if rank in self._unserved:
            self._pending.pop(rank, None)
            raise LaunchError(f"{node}'s template could not fork rank {rank}: {self._unserved.pop(rank)}")

    def _rank_env(self, rank: int, env: Dict[str, str]) -> "tuple[int, Dict[str, str]]":
        return rank_env(self.plan, rank, env)

    def _read_events(self, timeout: float = 0.0) -> List[dict]:
        events = super()._read_events(timeout)
        for ev in events:
            rank = ev.get("rank")
            if ev["event"] == "spawned" and rank in self._pending:
                self._pending[rank] = ev["pid"]
            elif ev["event"] == "unserved" and isinstance(rank, int):
                self._unserved[rank] = str(ev.get("why"))
            elif ev["event"] == "template_gone":  # the lease holder ended: its connection is read no more (the ranks' go too)
                self.detach()
        return events

    def poll(self, timeout: float = 0.0) -> List[Exit]:
        """Ranks that ended before they joined (a joined rank's exit is its lost connection)."""
        self._read_events(timeout)
        exits, self._exits = self._exits, []
        out: List[Exit] = []
        for rank, pid, code in exits:
            if rank is not None and rank in self._pending and self._pending[rank] == pid:
                del self._pending[rank]
                out.append((rank, pid, code))
        return out

    def adopt(self, pid: int, rank: int, host: str) -> None:
        self._pending.pop(rank, None)

    def live_pids(self) -> Dict[int, int]:
        """None to signal: as on Slurm, ranks end by message (remote_ranks) or with the allocation."""
        return {}

    def owns(self, pid: int) -> bool:
        return False

    def node_of(self, rank: int) -> str:
        assert self.plan.slurm is not None
        return self.nodes[rank // self.plan.slurm.ntasks_per_node]


class KeptSshLauncher(KeptSlurmLauncher):
    """KeptSlurmLauncher for a kept SSH pool: a rank's env as the SSH launcher builds it (kernel/launchers/hosts.py),
    its host by the plan's slots; no allocation to release, its hosts' templates end with the lease."""

    def _rank_env(self, rank: int, env: Dict[str, str]) -> "tuple[int, Dict[str, str]]":
        return host_rank_env(self.plan, self.nodes, rank, env)

    def close(self) -> None:
        """%ddp stop: the lease ends, every host's template with it (they follow it), and this host's watch of it."""
        ended = self.sock is not None
        KeptLauncher.close(self)
        if ended and not (self.lock and kept.is_held(self.lock)):
            self.released = f"; its hosts' templates ({', '.join(self.nodes)}) ended with the lease"

    def node_of(self, rank: int) -> str:
        return self.nodes[self.plan.node_local(rank)[0]]


class KeptRayLauncher(KeptSshLauncher):
    """KeptSshLauncher for a kept Ray pool: its nodes' templates as an SSH pool's hosts'; the lease's end ends them, and
    the first kernel's driver, which follows the lease, kills the actors and removes the placement group before its lock
    goes (procs/ray_keep.py)."""

    def close(self) -> None:
        ended = self.sock is not None
        KeptLauncher.close(self)
        if ended and not (self.lock and kept.is_held(self.lock)):
            self.released = f"; its Ray actors ({', '.join(self.nodes)}) and placement group were removed with the lease"

    def spawn(self, rank: int, config: dict) -> None:
        """As over SSH; a node whose template is gone is the pool's driver's to place again (procs/ray_unattended.py)."""
        try:
            super().spawn(rank, config)
        except LaunchError as e:
            raise LaunchError(f"{e}; the pool's driver places a lost Ray node again by itself once the cluster has room for it "
                              "(ray status): run the cell again then, or %ddp stop and start a new pool") from None


def kept_kind(plan: "Plan") -> "type[KeptSlurmLauncher]":
    """The attached kernel's launcher for a kept pool across nodes (Slurm, SSH or Ray)."""
    return KeptSlurmLauncher if plan.slurm is not None else KeptRayLauncher if plan.ray is not None else KeptSshLauncher
