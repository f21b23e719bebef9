"""One srun step of node templates, as the kernel sees it: the srun client, what its templates say, which nodes it still serves.

The step runs one task a node, that node's template (procs/slurm_template.py). The kernel
writes spawn commands to srun's stdin, which srun gives every task; a thread reads srun's
output: the templates' events (one JSON line each: ready, spawned, exited, pong), srun's own
"srun: error: n2: task 1: Killed" when a template ends, and anything else (the launcher's
log). A node whose template ended is no longer served: its next rank needs a new step there.
srun runs under procs/anchor.py: it goes with the kernel, unless the pool is kept (``outlive_kernel``).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from typing import IO, TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

from ...logs import log
from ...wire import seal, slurm_env
from ...wire.kept import ANCHOR_KEEP, ANCHOR_UNKEEP
from .base import popen
from .slurm_alloc import anchored

if TYPE_CHECKING:
    from ...plan.plan import Plan

END_WAIT_S = 5.0  # an srun asked to end (SIGTERM) cancels its step within moments
_TASK_ENDED = re.compile(r"^srun: error: (\S+): tasks? ([\d,-]+): ")  # a task (a template) ended abnormally
Event = Tuple[str, dict]  # (node, event)
KEEP_EVENTS = ("kept", "unkept", "fenced")
# a starter's own words, not a template's (procs/ray_driver.py: its placement, a lost node's placing again); read by its launcher
STARTER_EVENTS = ("placed", "refused", "waiting", "plan", "placed_again", "waiting_again", "not_placed")
SAID_LINES = 20  # how many of srun's (ssh's) own last lines a step keeps, for a start that failed  # a template's answers to %ddp keep (procs/template_keep.py)


class TemplateStep:
    """An srun client whose tasks are the templates of ``nodes``; spawn commands go to its stdin. (An ssh client whose
    remote command is one node's template is one too: kernel/launchers/ssh.py; ``proc_env`` is then the ssh client's
    env, ``env`` the template's as the kernel asked it.)"""

    def __init__(self, argv: List[str], env: Dict[str, str], secret: bytes, nodes: List[str], log_file: IO[bytes],
                 proc_env: Optional[Dict[str, str]] = None) -> None:
        self.nodes = list(nodes)
        self.secret = secret  # the one in the step's env: a later pool's is sealed with it
        self.env = {k: v for k, v in env.items() if k not in (slurm_env.SECRET_ENV, slurm_env.MUNGED_ENV)}  # the templates' env (less Slurm's)
        self.lost: Dict[str, str] = {}  # node -> how its template ended
        self.ending: Dict[str, str] = {}  # node -> why its template ended its ranks on its own (procs/template_end.py)
        self.ready: Dict[str, str] = {}  # node -> the template's import line
        self.events: List[dict] = []  # spawned / exited, for the launcher's poll
        self.unreachable: List[dict] = []  # ranks that could not reach the kernel's control port (procs/worker.py)
        self.pongs: Dict[str, int] = {}  # node -> the last ping its template answered (``ping``)
        self.notes: List[dict] = []  # a kept pool's template answers (kept, unkept, fenced): kernel/keep/keeping.py
        self.hello: Dict[str, dict] = {}  # node -> what its template said of itself before anything (an ssh template's)
        self.said: List[str] = []  # the last lines that were no event (ssh's or srun's own words: why a start failed)
        self.starter: List[dict] = []  # the starter's own events (STARTER_EVENTS), for its launcher alone
        self._lock = threading.Lock()
        self._heard = threading.Condition(self._lock)
        self._log = log_file
        self._nonce = 0
        self._pings = 0  # the last ping's id
        self.proc = popen(anchored() + argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          env=env if proc_env is None else proc_env, start_new_session=True, close_fds=True)
        self._reader = threading.Thread(target=self._read, args=(argv,), name="ddp-slurm-step", daemon=True)
        self._reader.start()

    # ------------------------------------------------------------ what the templates say
    def _read(self, argv: List[str]) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            event = _event(line)
            if event is not None:
                self._on_event(event)
                continue
            ended = _TASK_ENDED.match(line)
            with self._lock:
                if ended:
                    self.lost.setdefault(ended.group(1), line)
                self.said = (self.said + [line])[-SAID_LINES:]
            self._to_log(raw)
        self.proc.wait()
        with self._lock:  # srun is gone: so is every template it ran
            for node in self.nodes:
                self.lost.setdefault(node, f"{os.path.basename(argv[0])} ended (code {self.proc.returncode})")
            self._heard.notify_all()

    def _on_event(self, event: dict) -> None:
        with self._lock:
            if event.get("event") == "ready":
                self.ready[str(event.get("node"))] = str(event.get("info", ""))
                self._heard.notify_all()
            elif event.get("event") == "unreachable":
                self.unreachable.append(event)
            elif event.get("event") == "pong" and isinstance(event.get("id"), int):
                node = str(event.get("node"))
                self.pongs[node] = max(event["id"], self.pongs.get(node, 0))
                self._heard.notify_all()
            elif event.get("event") in KEEP_EVENTS:
                self.notes.append(event)
            elif event.get("event") == "hello":
                self.hello[str(event.get("node"))] = event
                self._heard.notify_all()
            elif event.get("event") in STARTER_EVENTS:
                self.starter.append(event)
                self._heard.notify_all()
            elif event.get("event") == "lost":  # a starter that outlives its node's template says so (procs/ray_driver.py)
                self.lost.setdefault(str(event.get("node")), str(event.get("why") or "its template ended"))
                self._heard.notify_all()
            elif event.get("event") == "ending":  # before its ranks' exits: why they end
                node = str(event.get("node"))
                self.ending[node] = str(event.get("why"))
                self._to_log(f"{node}: its template ends its ranks: {self.ending[node]}\n".encode())
            elif event.get("event") == "error":
                self.lost.setdefault(str(event.get("node")), f"the template could not start: {event.get('message')}")
                self._to_log((str(event.get("traceback", "")) + "\n").encode())
            else:
                self.events.append(event)

    def _to_log(self, data: bytes) -> None:
        """Append to the launcher's log without moving its file position (the kernel reads it meanwhile: log_text)."""
        try:
            fd = self._log.fileno()
            os.pwrite(fd, data, os.fstat(fd).st_size)
        except (OSError, ValueError):
            log.debug("the launcher's log is closed", exc_info=True)

    def take_events(self) -> List[dict]:
        with self._lock:
            out, self.events = self.events, []
            return out

    def take_starter(self) -> List[dict]:
        """The starter's own events since the last take (a Ray driver's: placed, waiting, placed_again, ...)."""
        with self._lock:
            out, self.starter = self.starter, []
            return out

    def serve_again(self, old: str, new: str) -> None:
        """A starter placed the lost node ``old``'s template again, as ``new`` (a Ray node's bundles placed again, perhaps on
        another host): the step serves ``new`` once its template says its hello, with nothing of ``old``'s kept."""
        with self._lock:
            self.nodes = [new if n == old else n for n in self.nodes]
            for said in (self.lost, self.ending, self.hello, self.ready, self.pongs):
                said.pop(old, None)
                said.pop(new, None)

    def serves(self, node: str) -> bool:
        """Whether this step's template on ``node`` is (as far as srun has said) still there."""
        with self._lock:
            return node in self.nodes and node not in self.lost and self.proc.poll() is None

    def mark_lost(self, node: str, why: str) -> None:
        """``node``'s template is not ours to use (its starter said so, or the kernel refused it): no longer served."""
        with self._lock:
            self.lost.setdefault(node, why)
            self._heard.notify_all()

    def lost_nodes(self) -> Dict[str, str]:
        with self._lock:
            return dict(self.lost)

    # ------------------------------------------------------------ commands
    def spawn(self, rank: int, node: str, config: dict, secret: bytes) -> None:
        """One rank on ``node``: its env as changes to the template's, the pool's secret sealed when it is not the step's."""
        self._write(self._sealed({"op": "spawn", "rank": rank, "node": node, "config": config}, secret))

    def _sealed(self, cmd: dict, secret: bytes) -> dict:
        """``cmd`` with the pool's ``secret`` sealed when it is not the step's own (srun's wire is clear)."""
        if secret != self.secret:
            self._nonce += 1
            nonce = os.urandom(8) + self._nonce.to_bytes(8, "big")
            cmd.update(sealed=seal.seal(self.secret, secret, nonce), nonce=nonce.hex())
        return cmd

    def ping(self, node: str) -> int:
        """Ask ``node``'s template to answer (a round trip through srun and the node's link); the id to wait for."""
        self._pings += 1
        self._write({"op": "ping", "node": node, "id": self._pings})
        return self._pings

    def wait_until(self, done: Callable[[], bool], deadline: float) -> bool:
        """Wait until ``done()`` (read under the step's lock), the starter ends, or ``deadline``; whether ``done()``."""
        with self._heard:
            while not done():
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    return done()
                self._heard.wait(min(left, 0.2))
            return True

    def send(self, cmd: dict) -> None:
        """One line to the templates as it is (an ssh template's first line: procs/ssh_template.py)."""
        self._write(cmd)

    def wait_pongs(self, asked: Dict[str, int], deadline: float) -> List[str]:
        """Wait until every node of ``asked`` (node -> ping id) answered its ping, or ``deadline``; the nodes that did not."""
        with self._heard:
            while True:
                silent = [n for n, i in asked.items() if self.pongs.get(n, 0) < i]
                left = deadline - time.monotonic()
                if not silent or left <= 0:
                    return silent
                self._heard.wait(left)

    def _write(self, cmd: dict) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
            self.proc.stdin.flush()
        except (OSError, ValueError):  # srun is gone: the rank never joins, and poll says so
            log.debug("srun %s no longer reads commands", self.proc.pid, exc_info=True)

    def command(self, cmd: dict) -> None:
        """One command to every template of the step (keep, unkeep: procs/template_keep.py); a pool's secret in it sealed."""
        self._write(self.wire_form(cmd))

    def wire_form(self, cmd: dict) -> dict:
        """``cmd`` as ``command`` writes it: its pool's secret sealed (or dropped when it is the step's own)."""
        secret = cmd.pop("secret", None)
        return self._sealed(cmd, bytes.fromhex(secret)) if secret else cmd

    def outlive_kernel(self, keep: bool) -> None:
        """A kept pool: srun outlives this kernel (its anchor's parent-death signal lifted); ``keep=False``: no more."""
        os.kill(self.proc.pid, ANCHOR_KEEP if keep else ANCHOR_UNKEEP)  # our child, not reaped: its pid is its own

    def end(self) -> None:
        """Ask srun to end (stdin closed, then SIGTERM: it cancels the step, every template and rank ends)."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            log.debug("the step's stdin was closed already", exc_info=True)
        if self.proc.poll() is None:
            signal_group(self.proc, signal.SIGTERM)

    def wait_end(self, deadline: float) -> None:
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.debug("srun %s did not end on SIGTERM; killing it", self.proc.pid, exc_info=True)
            signal_group(self.proc, signal.SIGKILL)
            self.proc.wait()
        self._reader.join(timeout=2)


def _event(line: str) -> Optional[dict]:
    """A template's event line (a JSON object with "event"), else None."""
    if not line.startswith('{"event"'):
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def env_changes(base: Dict[str, str], wanted: Dict[str, str]) -> Tuple[Dict[str, str], List[str]]:
    """What turns ``base`` (a template's env) into ``wanted`` (a rank's): names to set, names to remove."""
    return {k: v for k, v in wanted.items() if base.get(k) != v}, sorted(k for k in base if k not in wanted)


def rank_env(plan: "Plan", rank: int, env: Dict[str, str]) -> Tuple[int, Dict[str, str]]:
    """``rank``'s node index (the block distribution the step asks for) and its env: ``env`` with torchrun's set for it
    and its own Slurm task variables, no secret carrier (a rank proves the secret its template hands it)."""
    assert plan.slurm is not None
    per_node, world = plan.slurm.ntasks_per_node, plan.world_size
    local, node_rank = rank % per_node, rank // per_node
    wanted = dict(env, **plan.rank_env(local, node_rank), **slurm_env.task_vars(rank, local, node_rank, world, per_node))
    for carrier in (slurm_env.SECRET_ENV, slurm_env.MUNGED_ENV):
        wanted.pop(carrier, None)
    return node_rank, wanted


def spawn_config(step_env: Dict[str, str], wanted: Dict[str, str], addr: str, port: int, fingerprint: Optional[str]) -> dict:
    """A spawn's config for a node template whose step env is ``step_env``: the rank's env as changes to it, and where
    the kernel listens. One home for the kernel that started the step and one that attached its kept pool."""
    env_set, env_unset = env_changes(step_env, wanted)
    return {"env_set": env_set, "env_unset": env_unset, "kernel_addr": addr.strip("[]"), "kernel_port": int(port), "tls": fingerprint}


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        log.debug("srun %s: already gone", proc.pid, exc_info=True)
