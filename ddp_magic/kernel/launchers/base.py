"""What every launcher is to the pool: one interface, with flags for what differs.

The pool calls only the methods below and reads only the capability flags;
it never asks which launcher it has. A launcher makes rank processes exist
(locally, or on other hosts as well) and says when they end; it never talks
to a rank (the control channel is the pool's).
"""
from __future__ import annotations

import os
import queue
import subprocess
import sys
import tempfile
import threading
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from ...logs import log
from ...plan.slurm import TASK_VARS

if TYPE_CHECKING:
    from ...plan.plan import Plan
    from ...wire.tls import ServerKey

Exit = Tuple[Optional[int], int, int]  # (rank, pid, exit code or -signal)


class LaunchError(RuntimeError):
    """Ranks could not be launched; the message says what failed and what it printed."""


def worker_env() -> Dict[str, str]:
    """The kernel's env for a worker process, less what must not leak into ranks (a kernel inside Slurm: its task's ids)."""
    env = dict(os.environ)
    for key in ("PYTEST_CURRENT_TEST", "JPY_PARENT_PID", "MPLBACKEND", *TASK_VARS):
        env.pop(key, None)
    env["PYTHONUNBUFFERED"] = "1"
    # The kernel's own sys.path (e.g. a source checkout) must reach the workers.
    path = [p for p in sys.path if p and os.path.isdir(p)]
    if os.getcwd() not in path:
        path.insert(0, os.getcwd())
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path + env.get("PYTHONPATH", "").split(os.pathsep)).keys()).strip(os.pathsep)
    return env


_SPAWNS: "queue.Queue[Tuple[Callable[[], Any], queue.Queue]]" = queue.Queue()
_SPAWNER: List[threading.Thread] = []
_SPAWNER_LOCK = threading.Lock()


def popen(*args: Any, **kwargs: Any) -> "subprocess.Popen[bytes]":
    """subprocess.Popen on a thread that lives as long as the kernel. Our programs ask Linux for a parent-death signal
    (procs/parent.py, ``setpriv --pdeathsig``), and Linux sends it when the *thread* that started them ends: a template
    a background job's thread started died with that job (and its ranks with it). The main thread lasts; any other
    thread hands the start to one that does (``ddp-spawner``)."""
    if threading.current_thread() is threading.main_thread():
        return subprocess.Popen(*args, **kwargs)
    with _SPAWNER_LOCK:
        if not _SPAWNER or not _SPAWNER[0].is_alive():
            _SPAWNER[:] = [threading.Thread(target=_spawn_loop, name="ddp-spawner", daemon=True)]
            _SPAWNER[0].start()
    answer: queue.Queue = queue.Queue(maxsize=1)
    _SPAWNS.put((lambda: subprocess.Popen(*args, **kwargs), answer))
    ok, value = answer.get()
    if not ok:
        raise value
    return value


def _spawn_loop() -> None:
    while True:
        start, answer = _SPAWNS.get()
        try:
            answer.put((True, start()))
        except BaseException as e:  # the caller raises it, on its own thread
            log.debug("a start on the spawner thread failed", exc_info=True)
            answer.put((False, e))


def slurm_without(nodes: str) -> str:
    """A Slurm pool without ``nodes``: the words a node that cannot be reached ends with."""
    return f'--slurm-args "--exclude={nodes}"'


def signal_pid(pid: int, sig: int) -> None:
    """Signal one of our own pids; gone already is fine. (Never by name, never someone else's.)"""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        log.debug("signal %s to pid %s: already gone or not ours", sig, pid, exc_info=True)


class Launcher(ABC):
    """How rank processes come to exist and how the pool learns that they ended.

    Capability flags (class attributes), the only differences the pool acts on:

    ``remote_ranks``
        ranks may run on other hosts: after SHUTDOWN the pool waits for their
        connections to close, asks a rank to exit by message before signalling
        the ones it owns, and a closed control connection counts as the rank's
        exit, since no exit code comes.
    ``reports_exits``
        ``poll()`` reports (rank, pid, code) for every rank exit.
    ``keeps_template``
        a warm template survives a restart; when False the pool's teardown
        closes the launcher and the next start launches afresh.
    ``replaces_ranks``
        ``spawn(rank, config)`` starts one dead rank again alone (kernel/failures/recovery.py).

    A launcher whose ranks wait for a scheduler (Slurm) also implements ``acquire``
    (the pool's ranks are QUEUED meanwhile), ``placed``, ``listen_addr`` and ``tls_server``.
    """

    name = ""
    remote_ranks = False
    reports_exits = True
    keeps_template = True
    replaces_ranks = False

    def __init__(self, secret: bytes, python: str = sys.executable) -> None:
        self.secret = secret
        self.python = python
        self.log = tempfile.TemporaryFile()  # what the launched processes print outside a cell
        self.secret_file: Optional[str] = None  # a file other hosts read the secret from, if any
        # node -> since when its ranks have been unreachable (wall clock), until it answers a ping: held with the launcher
        # (its allocation, its templates) across restarts, so every start on it asks first (kernel/failures/unreachable.py)
        self.silent_since: Dict[str, float] = {}

    def start(self, timeout: float = 0) -> str:
        """Warm up (e.g. import torch once in a template); returns a line describing it."""
        return f"{self.name}: no template"

    later_imports = False  # import_later was asked: the launcher's templates import before their next forks

    def import_later(self) -> None:
        """This pool will save or load snapshots: where ranks are forked from a template, it imports what DDP and
        torch.distributed.checkpoint need once (procs/template_later.py), so the ranks it forks next need not. A
        launcher without a template has nothing to warm."""
        self.later_imports = True

    def acquire(self, plan: Plan, progress: Callable[[str], None]) -> Optional[str]:
        """Wait for what the ranks run on (a scheduler's allocation), saying ``progress(text)`` while queued; a line for the user, or None."""
        return None

    def placed(self, plan: Plan, avoid: int = 0) -> Plan:
        """The plan as the allocation places it (MASTER_ADDR on the first node, a port that is not ``avoid``, the control
        port); the same plan for one host."""
        return plan

    def listen_addr(self, asked: Optional[str], default: str) -> str:
        """Where the control channel listens: what the user asked (--control-addr), else ``default``."""
        return asked or default

    def where(self) -> str:
        """Where the ranks run, for %ddp status, when it is more than this host (a Slurm job, its state and nodes)."""
        return ""

    def tls_server(self) -> Optional[ServerKey]:
        """The pool's TLS key when the control channel must be encrypted (ranks on other hosts); None: plain TCP."""
        return None

    @abstractmethod
    def launch(self, plan: Plan, base_env: Dict[str, str], control_addr: str, control_port: int, store_path: Optional[str] = None) -> Optional[str]:
        """Start every rank of this host; returns the command other hosts must run, or None."""

    @abstractmethod
    def adopt(self, pid: int, rank: int, host: str) -> None:
        """A rank joined from ``host`` with ``pid``; a launcher that did not start it itself may take it on."""

    @abstractmethod
    def live_pids(self) -> Dict[int, int]:
        """pid -> rank of the live rank processes on this host that we started."""

    def owns(self, pid: int) -> bool:
        """Whether ``pid`` is one of our rank processes, so ours to signal."""
        return pid in self.live_pids()

    @abstractmethod
    def poll(self, timeout: float = 0.0) -> List[Exit]:
        """Rank exits seen since the last poll, waiting up to ``timeout`` for one."""

    def fileno(self) -> Optional[int]:
        """A descriptor that becomes readable when an exit event is waiting; None: poll on a timer."""
        return None

    @abstractmethod
    def alive(self) -> bool:
        """Whether the launcher can still start or watch ranks (its template or agent is up)."""

    @abstractmethod
    def close(self) -> None:
        """Stop every process we started (ranks, template, agent) and release what we hold."""

    def lost(self) -> str:
        """Why what the ranks ran on is gone under us (a scheduler revoked the allocation), "" when it is not."""
        return ""

    def cannot_reach(self) -> List[dict]:
        """What ranks said when they could not reach the control port at start-up (events: rank, node, addr, why)."""
        return []

    def unanswered(self, nodes: List[str], within: float) -> List[str]:
        """Of ``nodes`` (whose ranks were unreachable), those that do not answer now within ``within`` seconds: a new rank
        asked of one would wait out the whole join timeout. None, for a launcher that cannot ask a node (its ranks
        share this host, or nothing of ours runs there between ranks)."""
        return []

    def place_again(self, lost: Dict[str, List[int]], progress: Callable[[str], None]) -> str:
        """Before ranks lost with their nodes (``lost``: node -> its ranks) are started again alone: a launcher whose
        allocation of a node went with it (a Ray node's bundles) places the node again, saying ``progress(text)`` while it
        waits; what it did, for the notice ("" for the others: a new rank's own start makes a new template where needed).
        LaunchError in one line when it cannot (no room, Ctrl-C raises as it is): nothing else changed."""
        return ""

    def placement(self, plan: Plan) -> Dict[int, str]:
        """rank -> the node each rank of ``plan`` starts on, for a launcher that places ranks on named nodes ({} otherwise)."""
        return {}

    def without(self, nodes: str) -> str:
        """How to start a pool without ``nodes`` (comma-separated), in this launcher's options (Slurm's by default)."""
        return slurm_without(nodes)

    def left_there(self, nodes: List[str]) -> str:
        """What ends whatever of ours still runs on ``nodes``, which ``%ddp stop`` could not reach (Slurm's words by default)."""
        return f"Slurm ends what ran there once {'it answers' if len(nodes) == 1 else 'they answer'}"

    def give_up(self) -> str:
        """The pool could not start and retrying in place would not help: let go of what we hold; says what became of it."""
        return "nothing is held"

    def node_of(self, rank: int) -> str:
        """The node a rank was asked to run on, when the launcher places ranks on nodes ("" otherwise)."""
        return ""

    def death_cause(self, rank: int) -> str:
        """Why ``rank``'s template ended it, as the template said before it did (procs/template_end.py); "" when none did."""
        return ""

    def log_text(self, limit: int = 4000) -> str:
        """The last ``limit`` characters the launched processes printed outside cells."""
        try:
            self.log.seek(0)
            return self.log.read().decode(errors="replace")[-limit:]
        except (OSError, ValueError):
            log.debug("the launcher's log could not be read", exc_info=True)
            return ""


class LocalLauncher(Launcher):
    """Ranks started one by one on this host: each one our child, with an exit code we read."""

    replaces_ranks = True

    def launch(self, plan: Plan, base_env: Dict[str, str], control_addr: str, control_port: int, store_path: Optional[str] = None) -> Optional[str]:
        for rank in range(plan.world_size):
            env = dict(base_env, **plan.rank_env(rank))
            if store_path:
                env["DDP_MAGIC_STORE"] = store_path
            self.spawn(rank, {"env": env, "kernel_addr": control_addr, "kernel_port": control_port})
        return None

    def adopt(self, pid: int, rank: int, host: str) -> None:
        """Nothing to learn: we started the process ourselves and know its pid already."""
        return None

    @abstractmethod
    def spawn(self, rank: int, config: dict) -> None:
        """Start one rank with ``config`` (its env and where the kernel listens)."""
