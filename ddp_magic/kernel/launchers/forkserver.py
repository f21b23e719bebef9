"""The fork-server launcher: one template process imports torch once; each rank is a fork of it.

The kernel itself is never forked. The template reports each child's exit
as an event on its stdout, so the pool sees a dead rank within one poll,
whatever killed it.

The template outlives pools (kernel/templates.py hands it from one to the next):
each spawn carries the current pool's secret, and ``start`` replaces a template
whose imports no longer fit, when the env that torch reads at import changed.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple

from ...logs import log
from .base import Exit, LaunchError, LocalLauncher, popen, signal_pid, worker_env

if TYPE_CHECKING:
    from ...plan.plan import Plan


class ForkServerLauncher(LocalLauncher):
    """One template process imports torch once; each rank is a fork of it (milliseconds)."""

    name = "forkserver"
    remote_ranks = False
    reports_exits = True
    keeps_template = True

    def __init__(self, secret: bytes, python: str = sys.executable) -> None:
        super().__init__(secret, python)
        self.proc: Optional[subprocess.Popen] = None  # the template (bench reads its pid)
        self._buf = b""
        self._exits: List[Exit] = []
        self._pids: Dict[int, int] = {}  # pid -> rank, live children
        self._before: Set[int] = set()  # the pool before's ranks not yet heard to exit: their exits are not this pool's
        self._ending: Dict[int, str] = {}  # rank -> why its template ended it (an "ending" event), until it is spawned again
        self.import_env: Tuple[Tuple[str, str], ...] = ()  # what the template's imports read (import_env)
        self.ready_info = ""  # the template's "ready" line, once read
        self.later_sent = False  # this template was told to import later (import_later)
        self.nice = 0  # the template imports at this nice value (a warm one, kernel/templates.py)
        self.notes: List[dict] = []  # a kept pool's events (kept, unkept, fenced: kernel/keep/)
        self.fenced: Optional[dict] = None  # another kernel attached our kept pool with --force (kernel/keep/)

    def begin(self, nice: int = 0) -> None:
        """Start the template without waiting for its imports (``nice``: import at lower priority)."""
        if self.alive():
            return
        self.close()  # a template that died: its pipes go
        env = worker_env()
        self.import_env, self.ready_info, self.nice = import_env(env), "", nice
        self.later_sent = False
        self.proc = popen(
            [self.python, "-m", "ddp_magic.procs.forkserver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            start_new_session=True,  # Jupyter's SIGINT to the kernel's group must not hit ranks
            close_fds=True,
        )
        self._write({"secret": self.secret.hex(), "nice": nice})

    def stale(self) -> List[str]:
        """What changed since the template imported: the names of env variables torch reads at import."""
        now, then = dict(import_env(worker_env())), dict(self.import_env)
        return sorted(k for k in set(now) | set(then) if now.get(k) != then.get(k))

    def start(self, timeout: float = 120.0) -> str:
        changed = self.stale() if self.alive() else []
        if changed:  # what the template imported no longer fits: a new one
            self.close()
        if self.alive() and self.ready_info:
            return "template already running"
        if self.alive() and self.nice:  # a pool waits for the warm template now: its imports at normal priority, if allowed
            self._write({"op": "hurry"})
        self.begin()
        info = self._await_ready(timeout)
        return info + (f" (new template: {', '.join(changed)} changed)" if changed else "")

    def _await_ready(self, timeout: float) -> str:
        """Wait for the template's imports; a failed or silent template is a LaunchError."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for ev in self._read_events(timeout=0.2):
                if ev["event"] == "ready":
                    self.ready_info = str(ev.get("info", "")) or "template ready"
                    return self.ready_info
                if ev["event"] == "error":
                    self.close()
                    raise LaunchError(f"the worker template could not start: {ev['message']}\n{ev.get('traceback', '')}")
            if self.proc.poll() is not None:
                text, code = self.log_text(), self.proc.returncode
                self.close()
                raise LaunchError(f"the worker template exited with code {code}:\n{text}")
        self.close()
        raise LaunchError(f"the worker template did not start within {timeout:.0f}s")

    def _write(self, obj: dict) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        self.proc.stdin.flush()

    def fileno(self) -> Optional[int]:
        return self.proc.stdout.fileno() if self.proc and self.proc.stdout else None

    def _read_events(self, timeout: float = 0.0) -> List[dict]:
        fd = self.fileno()
        if fd is None:
            return []
        events = []
        r, _, _ = select.select([fd], [], [], timeout)
        if r:
            data = os.read(fd, 65536)
            if not data:
                return [{"event": "template_gone"}]
            self._buf += data
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            events.append(json.loads(line))
        for ev in events:
            if ev["event"] in ("kept", "unkept", "fenced", "attached", "refused"):
                self.notes.append(ev)
                self.fenced = ev if ev["event"] == "fenced" else self.fenced
            elif ev["event"] == "spawned":
                self._pids[ev["pid"]] = ev["rank"]
            elif ev["event"] == "exited":
                self._pids.pop(ev["pid"], None)
                if ev["pid"] in self._before:  # a rank of the pool before, its exit read after that pool stopped waiting
                    self._before.discard(ev["pid"])
                    continue
                self._exits.append((ev["rank"], ev["pid"], ev["code"]))
            elif ev["event"] == "ending":  # it ends its ranks on its own (a SIGTERM to it): why, before their exits
                self._ending.update(dict.fromkeys(ev.get("ranks") or [], str(ev.get("why"))))
        return events

    def death_cause(self, rank: int) -> str:
        why = self._ending.get(rank)
        return f"its template ended its ranks: {why}" if why else ""

    def launch(self, plan: "Plan", base_env: Dict[str, str], control_addr: str, control_port: int, store_path: Optional[str] = None) -> Optional[str]:
        """A new pool on this template: a rank of the one before that has not been heard to exit yet (a loaded machine
        reaps late) is no rank of this one. Its exit, "rank 0 exited with code 0" with that pool's pid, once failed the
        new pool's start (fc24)."""
        self._before |= set(self._pids)
        return super().launch(plan, base_env, control_addr, control_port, store_path)

    def spawn(self, rank: int, config: dict) -> None:
        self._ending.pop(rank, None)
        self._send_later()  # before the fork: this rank has the imports too
        self._write({"op": "spawn", "rank": rank, "config": config, "secret": self.secret.hex()})

    def import_later(self) -> None:
        super().import_later()
        if self.alive() and self.ready_info:  # before its ready line a template reads any line as "hurry": it goes with the next spawn
            self._send_later()

    def _send_later(self) -> None:
        if self.later_imports and not self.later_sent:
            self._write({"op": "warm"})
            self.later_sent = True

    def live_pids(self) -> Dict[int, int]:
        return dict(self._pids)

    def poll(self, timeout: float = 0.0) -> List[Exit]:
        """Exits since the last poll. A vanished template counts as every child dying."""
        events = self._read_events(timeout)
        if any(ev["event"] == "template_gone" for ev in events):
            for pid, rank in list(self._pids.items()):
                self._exits.append((rank, pid, -signal.SIGKILL))
            self._pids.clear()
        out, self._exits = self._exits, []
        return out

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def lost(self) -> str:
        """The template ended under a started pool (a ``kill``), its ranks with it: why, as it said, else its exit code."""
        if self.proc is None or self.proc.poll() is None:
            return ""
        why = next(iter(self._ending.values()), "")
        return f"its template ended its ranks: {why}" if why else f"its template ended (code {self.proc.returncode})"

    def detach(self) -> None:
        """A kept pool's kernel goes (or lost it): our pipes close, the template and its ranks go on (kernel/keep/)."""
        for stream in (self.proc.stdin, self.proc.stdout) if self.proc is not None else ():
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                log.debug("closing a pipe to the kept template failed", exc_info=True)
        self.proc, self._pids = None, {}

    def close(self) -> None:
        if self.proc is None:
            return
        for pid in list(self._pids):
            signal_pid(pid, signal.SIGKILL)
        try:
            if self.proc.poll() is None:
                self._write({"op": "exit"})
                self.proc.wait(timeout=3)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            log.debug("the template did not exit when asked; killing it", exc_info=True)
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                log.debug("closing a pipe to the template failed", exc_info=True)
        self._pids.clear()
        self.proc = None
        self.ready_info = ""


# What torch and its libraries read once, at import (the rest of the env reaches each rank at fork):
# thread pools, allocators, the CUDA and library paths, Python's own startup.
IMPORT_ENV_PREFIXES = ("OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "TORCH_", "PYTORCH_", "CUDA_", "LD_", "PYTHON", "DNNL_", "ONEDNN_")


def import_env(env: Dict[str, str]) -> Tuple[Tuple[str, str], ...]:
    """The part of ``env`` that the template's imports read: a change means a new template."""
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_ENV_PREFIXES) and k != "PYTHONUNBUFFERED"))
