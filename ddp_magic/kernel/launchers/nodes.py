"""What every launcher of node templates shares (Slurm's srun steps, SSH's sessions, Ray's actors): one template a node forks that node's ranks.

A subclass says how a template is started on nodes (``_start_step``: an srun step, an ssh
session), which nodes the pool has in order (``nodes``) and what env a rank gets
(``_rank_env``); everything else is here, once: asking a node's template to fork a rank, a
new template only where the node's is gone, the exits of ranks that never joined, pinging
the nodes whose ranks went silent, a kept pool's lease ending first when the templates end.
The templates themselves are procs/node_template.py's, whatever started them.
"""
from __future__ import annotations

import sys
import time
from abc import abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from ...logs import log
from ...wire import tls
from ...wire.kept import is_held
from .base import Exit, Launcher
from .slurm_steps import END_WAIT_S, TemplateStep, spawn_config

if TYPE_CHECKING:
    from ...plan.plan import Plan


@dataclass
class Pending:
    """A rank asked of a template that has not joined yet: where, its pid once forked, and how to ask again."""

    node: str
    step: TemplateStep
    args: Tuple[Dict[str, str], str, int]
    pid: Optional[int] = None
    retried: bool = False


class NodeLauncher(Launcher):
    """Ranks forked by one template a node; the templates are held across restarts and ended by ``close``."""

    remote_ranks = True  # the nodes may be other hosts: ranks are asked to exit by message, a closed connection is an exit
    reports_exits = False  # the templates' children are not ours: a lost control connection is the exit
    keeps_template = True  # the templates outlive a restart
    replaces_ranks = True  # a dead rank is forked again by its node's template (a new one only if that is gone)
    released = ""  # once the pool stopped: what became of what it held, for %ddp stop to say
    lease_lock = ""  # a kept pool's: the lock its lease holds (outlive_kernel)

    def __init__(self, secret: bytes, python: str = sys.executable) -> None:
        super().__init__(secret, python)
        self.steps: List[TemplateStep] = []  # our templates' starters: the pool's, and one a node whose template was lost
        self._pending: Dict[int, Pending] = {}  # ranks asked for that have not joined yet
        self.tls_key: Optional[tls.ServerKey] = None
        self.plan: Optional[Plan] = None
        self._pids: Dict[int, int] = {}  # pid -> rank, as the ranks said in their HELLO (not ours to signal)
        self._told_later: List[TemplateStep] = []  # the steps whose templates were told to import later (import_later)

    # ------------------------------------------------------------ what a sibling says
    @abstractmethod
    def nodes(self) -> List[str]:
        """The pool's nodes in rank order (node rank i runs on nodes()[i])."""

    @abstractmethod
    def _rank_env(self, rank: int, env: Dict[str, str]) -> Tuple[int, Dict[str, str]]:
        """``rank``'s node index and the env it gets (``env``: the pool's base env)."""

    @abstractmethod
    def _start_step(self, nodes: List[str], env: Dict[str, str]) -> TemplateStep:
        """Start a template on each of ``nodes`` with ``env`` as its env (appended to ``self.steps``)."""

    @abstractmethod
    def serves(self, plan: Plan) -> bool:
        """Whether the templates held can run ``plan``'s ranks (a new -n on the same nodes forks from them)."""

    def tls_server(self) -> Optional[tls.ServerKey]:
        return self.tls_key

    # ------------------------------------------------------------ ranks
    def _step_for(self, node: str) -> Optional[TemplateStep]:
        """The newest step whose template on ``node`` is still there."""
        return next((s for s in reversed(self.steps) if s.serves(node)), None)

    def _spawn(self, rank: int, env: Dict[str, str], control_addr: str, control_port: int) -> None:
        """Ask ``rank``'s node's template to fork it; a node whose template is gone gets a new one."""
        assert self.plan is not None
        node_rank, wanted = self._rank_env(rank, env)
        node = self.nodes()[node_rank]
        step = self._step_for(node)
        if step is None:
            first = self.steps[0].env if self.steps else wanted
            step = self._start_step([node], first)
        config = spawn_config(step.env, wanted, control_addr, control_port, self.tls_key.fingerprint if self.tls_key is not None else None)
        self._pending[rank] = Pending(node, step, (env, control_addr, control_port))
        self._tell_later(step)  # before the fork: this rank has the imports too
        step.spawn(rank, node, config, self.secret)

    def import_later(self) -> None:
        super().import_later()
        for step in list(self.steps):
            self._tell_later(step)

    def _tell_later(self, step: TemplateStep) -> None:
        if self.later_imports and step not in self._told_later:
            self._told_later.append(step)
            try:
                step.command({"op": "warm"})
            except OSError:  # its templates are gone: a rank asked of them is reported lost as it would be
                log.debug("could not tell a step to import later", exc_info=True)

    def spawn(self, rank: int, config: dict) -> None:
        """Start one rank again, alone: its node's template forks it (recovery.py); a new template only if that one is gone."""
        assert self.plan is not None
        self._pids = {pid: r for pid, r in self._pids.items() if r != rank}  # its new process has not joined yet
        self._spawn(rank, config["env"], config["kernel_addr"], config["kernel_port"])

    def node_of(self, rank: int) -> str:
        """The node a rank runs on (block distribution: plan.nproc ranks a node, or each node's slots)."""
        nodes = self.nodes()
        if self.plan is None or not nodes or self.plan.node_local(rank)[0] >= len(nodes):
            return ""
        return nodes[self.plan.node_local(rank)[0]]

    def death_cause(self, rank: int) -> str:
        """What the template on ``rank``'s node said as it ended its ranks (the newest step there: a new one says anew)."""
        node = self.node_of(rank)
        step = next((s for s in reversed(self.steps) if node in s.nodes), None)
        why = step.ending.get(node) if step is not None and node else None
        return f"{node}'s template ended its ranks: {why}" if why else ""

    def placement(self, plan: Plan) -> Dict[int, str]:
        """The block distribution over the nodes held."""
        nodes = self.nodes()
        return {r: nodes[plan.node_local(r)[0]] for r in range(plan.world_size) if plan.node_local(r)[0] < len(nodes)}

    def adopt(self, pid: int, rank: int, host: str) -> None:
        self._pids[pid] = rank
        self._pending.pop(rank, None)

    def live_pids(self) -> Dict[int, int]:
        """None to signal: the ranks are the templates' children, perhaps on other hosts; they end by message or with them."""
        return {}

    def owns(self, pid: int) -> bool:
        return False

    def poll(self, timeout: float = 0.0) -> List[Exit]:
        """Ranks that ended before they joined: a fork that failed, or its template gone (its words in the log). A
        joined rank's exit is its lost connection (remote_ranks); ours to report are only those the kernel cannot see."""
        if timeout:
            time.sleep(min(timeout, 0.05))
        out: List[Exit] = [e for step in list(self.steps) for e in self._exits_before_joining(step)]
        for rank, waiting in list(self._pending.items()):
            if waiting.step.serves(waiting.node):
                continue
            del self._pending[rank]
            if waiting.pid is None and not waiting.retried:  # asked of a template that was already gone: a new one forks it
                self._spawn(rank, *waiting.args)
                self._pending[rank].retried = True
            else:  # its template ended (or never started): its words are in the log
                out.append((rank, waiting.pid or 0, 1))
        return out

    def _exits_before_joining(self, step: TemplateStep) -> List[Exit]:
        """What ``step``'s templates said of the ranks still pending: their pids, and the exits of those that never joined."""
        out: List[Exit] = []
        for ev in step.take_events():
            rank, pid = ev.get("rank"), int(ev.get("pid") or 0)
            waiting = self._pending.get(rank) if isinstance(rank, int) else None
            if not isinstance(rank, int) or waiting is None or waiting.step is not step:
                continue
            if ev.get("event") == "spawned":
                waiting.pid = pid
            elif ev.get("event") == "exited" and waiting.pid == pid:
                del self._pending[rank]
                out.append((rank, pid, int(ev.get("code") or 1)))
        return out

    def unanswered(self, nodes: List[str], within: float) -> List[str]:
        """Each node's template is pinged (the way a new rank's spawn and events take); the nodes that did not answer
        within ``within`` seconds. A node with no template left is not asked: a new one there says for itself."""
        deadline = time.monotonic() + within
        asked: Dict[TemplateStep, Dict[str, int]] = {}
        for node in nodes:
            step = self._step_for(node)
            if step is not None:
                asked.setdefault(step, {})[node] = step.ping(node)
        return [n for step, pings in asked.items() for n in step.wait_pongs(pings, deadline)]

    def cannot_reach(self) -> List[dict]:
        return [ev for step in self.steps for ev in step.unreachable]

    # ------------------------------------------------------------ a kept pool (kernel/keep/keeping.py, docs/keep.md)
    @property
    def lease_node(self) -> str:
        """The node whose template holds a kept pool's lease (the other nodes' templates follow it)."""
        nodes = self.nodes()
        return nodes[0] if nodes else ""

    def follow_lease(self, pool_id: str, at: Dict[str, object], spools: str, secret: bytes) -> None:
        """The holder's lease is up: every other node's template follows it there (procs/template_keep.py ``follow``)."""
        self._write({"op": "follow", "node": self.lease_node, "id": pool_id, "lease": at, "dir": spools, "secret": secret.hex()})

    # ------------------------------------------------------------ commands to every template, and their end
    @property
    def notes(self) -> List[dict]:
        """What the templates answered to keep and unkeep (the first starter's: a kept pool's templates are one)."""
        return self.steps[0].notes if self.steps else []

    def _write(self, cmd: dict) -> None:
        """A command to every template (keep, unkeep)."""
        for step in self.steps:
            step.command(dict(cmd))

    def _end_steps(self) -> None:
        """End every template (its starter ends: every rank ends), then make sure. A kept pool's lease ends first as
        ``%ddp stop`` ends it (its files go), not as a pool whose nodes went."""
        if self.lease_lock:
            self._write({"op": "exit"})
            deadline = time.monotonic() + END_WAIT_S
            while is_held(self.lease_lock) and time.monotonic() < deadline:
                time.sleep(0.02)
            self.lease_lock = ""
        steps, self.steps = self.steps, []
        for step in steps:
            step.end()
        deadline = time.monotonic() + END_WAIT_S
        for step in steps:
            step.wait_end(deadline)
        self._pids.clear()
        self._pending.clear()
