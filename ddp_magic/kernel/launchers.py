"""How worker processes come to exist: a fork server (fast) or plain spawn (portable).

Neither forks the kernel. Both report process exits as (rank, pid, code)
events, so the pool sees a dead rank within one poll, whatever killed it.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

Exit = Tuple[Optional[int], int, int]  # (rank, pid, exit code or -signal)


def worker_env() -> Dict[str, str]:
    """The kernel's env for a worker process, less what must not leak into ranks."""
    env = dict(os.environ)
    for key in ("PYTEST_CURRENT_TEST", "JPY_PARENT_PID", "MPLBACKEND"):
        env.pop(key, None)
    env["PYTHONUNBUFFERED"] = "1"
    # The kernel's own sys.path (e.g. a source checkout) must reach the workers.
    path = [p for p in sys.path if p and os.path.isdir(p)]
    if os.getcwd() not in path:
        path.insert(0, os.getcwd())
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path + env.get("PYTHONPATH", "").split(os.pathsep)).keys()).strip(os.pathsep)
    return env


class LaunchError(RuntimeError):
    pass


class ForkServerLauncher:
    """One template process imports torch once; each rank is a fork of it."""

    name = "forkserver"

    def __init__(self, secret: bytes, python: str = sys.executable) -> None:
        self.secret = secret
        self.python = python
        self.proc: Optional[subprocess.Popen] = None
        self.log = tempfile.TemporaryFile()
        self._buf = b""
        self._exits: List[Exit] = []
        self._spawned: Dict[int, int] = {}
        self.pids: Dict[int, int] = {}  # pid -> rank, live children

    def start(self, timeout: float = 120.0) -> str:
        if self.proc is not None and self.proc.poll() is None:
            return "template already running"
        self.proc = subprocess.Popen(
            [self.python, "-m", "ddp_magic.procs.forkserver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=worker_env(),
            start_new_session=True,  # Jupyter's SIGINT to the kernel's group must not hit ranks
            close_fds=True,
        )
        self._write({"secret": self.secret.hex()})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for ev in self._read_events(timeout=0.2):
                if ev["event"] == "ready":
                    return ev.get("info", "")
                if ev["event"] == "error":
                    self.close()
                    raise LaunchError(f"the worker template could not start: {ev['message']}\n{ev.get('traceback', '')}")
            if self.proc.poll() is not None:
                text = self.log_text()
                self.close()
                raise LaunchError(f"the worker template exited with code {self.proc.returncode}:\n{text}")
        self.close()
        raise LaunchError(f"the worker template did not start within {timeout:.0f}s")

    def log_text(self, limit: int = 4000) -> str:
        try:
            self.log.seek(0)
            return self.log.read().decode(errors="replace")[-limit:]
        except (OSError, ValueError):
            return ""

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
            if ev["event"] == "spawned":
                self.pids[ev["pid"]] = ev["rank"]
                self._spawned[ev["rank"]] = ev["pid"]
            elif ev["event"] == "exited":
                self.pids.pop(ev["pid"], None)
                self._exits.append((ev["rank"], ev["pid"], ev["code"]))
        return events

    def spawn(self, rank: int, config: dict) -> None:
        self._write({"op": "spawn", "rank": rank, "config": config})

    def poll(self, timeout: float = 0.0) -> List[Exit]:
        """Exits since the last poll. A vanished template counts as every child dying."""
        events = self._read_events(timeout)
        if any(ev["event"] == "template_gone" for ev in events):
            for pid, rank in list(self.pids.items()):
                self._exits.append((rank, pid, -signal.SIGKILL))
            self.pids.clear()
        out, self._exits = self._exits, []
        return out

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        if self.proc is None:
            return
        for pid in list(self.pids):
            signal_pid(pid, signal.SIGKILL)
        try:
            if self.proc.poll() is None:
                self._write({"op": "exit"})
                self.proc.wait(timeout=3)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream and stream.close()
            except OSError:
                pass
        self.pids.clear()
        self.proc = None


class SpawnLauncher:
    """One fresh interpreter per rank: slower (each imports torch), works everywhere."""

    name = "spawn"

    def __init__(self, secret: bytes, python: str = sys.executable) -> None:
        self.secret = secret
        self.python = python
        self.procs: Dict[int, Tuple[int, subprocess.Popen]] = {}  # pid -> (rank, proc)
        self.log = tempfile.TemporaryFile()

    @property
    def pids(self) -> Dict[int, int]:
        return {pid: rank for pid, (rank, _) in self.procs.items()}

    def start(self, timeout: float = 0) -> str:
        return "spawn: no template"

    def log_text(self, limit: int = 4000) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-limit:]

    def fileno(self) -> Optional[int]:
        return None

    def spawn(self, rank: int, config: dict) -> None:
        env = config["env"]
        proc = subprocess.Popen(
            [self.python, "-m", "ddp_magic.procs.worker"],
            stdin=subprocess.PIPE,
            stdout=self.log,
            stderr=self.log,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
        assert proc.stdin is not None
        proc.stdin.write((json.dumps(dict(config, secret=self.secret.hex(), parent_pid=os.getpid())) + "\n").encode())
        proc.stdin.close()
        self.procs[proc.pid] = (rank, proc)

    def poll(self, timeout: float = 0.0) -> List[Exit]:
        if timeout:
            time.sleep(min(timeout, 0.05))
        out = []
        for pid, (rank, proc) in list(self.procs.items()):
            code = proc.poll()
            if code is not None:
                out.append((rank, pid, code))
                del self.procs[pid]
        return out

    def alive(self) -> bool:
        return True

    def close(self) -> None:
        for pid, (_, proc) in list(self.procs.items()):
            proc.kill()
            proc.wait()
        self.procs.clear()


def signal_pid(pid: int, sig: int) -> None:
    """Signal one of our own pids; gone already is fine. (Never by name, never someone else's.)"""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def make_launcher(method: str, secret: bytes) -> "ForkServerLauncher | SpawnLauncher | TorchrunLauncher":
    if method == "torchrun":
        return TorchrunLauncher(secret)
    if method == "auto":
        method = "fork" if sys.platform.startswith("linux") else "spawn"
    if method == "fork":
        return ForkServerLauncher(secret)
    if method == "spawn":
        return SpawnLauncher(secret)
    raise ValueError(f"unknown start method {method!r}; use auto, fork, spawn or torchrun")


class TorchrunLauncher:
    """A pool across nodes: every node, this one included, runs its ranks under torchrun.

    torchrun's c10d rendezvous (the engine PyTorch users already trust) assigns
    node and global ranks; each rank then dials back to the kernel's control
    port. This node's agent is our child; the other nodes' agents are started
    by the user (or a scheduler) with the command ``launch`` returns.
    """

    name = "torchrun"

    def __init__(self, secret: bytes, python: str = sys.executable) -> None:
        self.secret = secret
        self.python = python
        self.agent: Optional[subprocess.Popen] = None
        self.store: Optional[subprocess.Popen] = None
        self.secret_file: Optional[str] = None
        self.log = tempfile.TemporaryFile()
        self.pids: Dict[int, int] = {}  # local rank pids, learnt from their HELLO

    def start(self, timeout: float = 0) -> str:
        return "torchrun (c10d rendezvous)"

    def log_text(self, limit: int = 4000) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-limit:]

    def fileno(self) -> Optional[int]:
        return None

    def _write_secret(self, run_id: str) -> str:
        folder = os.path.join(os.path.expanduser("~"), ".ddp_magic")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)
        path = os.path.join(folder, f"secret-{run_id}")
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.secret.hex())
        return path

    def launch(self, plan: Any, ctrl_addr: str, ctrl_port: int, env: Dict[str, str], timeout: float = 60) -> str:
        """Start the rendezvous store and this node's agent; return the command for the other nodes."""
        host, port = plan.master_addr, plan.master_port
        self.secret_file = self._write_secret(plan.run_id)
        self.store = subprocess.Popen(
            [self.python, "-m", "ddp_magic.procs.rendezvous", host, str(port)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env, start_new_session=True, close_fds=True,
        )
        assert self.store.stdout is not None
        r, _, _ = select.select([self.store.stdout], [], [], timeout)
        if not r or self.store.stdout.readline().strip() != b"ready":
            raise LaunchError(f"the rendezvous store on {host}:{port} did not start:\n{self.log_text()}")
        worker_args = ["-m", "ddp_magic.procs.worker", "--connect", f"{ctrl_addr}:{ctrl_port}", "--secret-file", self.secret_file,
                       "--backend", plan.backend] + ([] if plan.init else ["--no-init"])
        rdzv = ["--nnodes", str(plan.nnodes), "--nproc-per-node", str(plan.nproc), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"{host}:{port}", "--rdzv-id", plan.run_id, "--max-restarts", "0"]
        self.agent = subprocess.Popen(
            [self.python, "-m", "torch.distributed.run"] + rdzv + ["--rdzv-conf", "is_host=false"] + worker_args,
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, env=env, start_new_session=True, close_fds=True,
        )
        return " ".join(["torchrun"] + rdzv + worker_args)

    def spawn(self, rank: int, config: dict) -> None:
        raise LaunchError("ranks of a multi-node pool are started by torchrun, not one by one")

    def poll(self, timeout: float = 0.0) -> List[Exit]:
        """Deaths are seen as lost control connections (a remote exit code is not ours to read)."""
        if timeout:
            time.sleep(min(timeout, 0.05))
        return []

    def alive(self) -> bool:
        return self.agent is not None and self.agent.poll() is None

    def close(self) -> None:
        """Let the agent leave torchrun's exit barrier on its own, then make sure it is gone."""
        if self.agent is not None:
            try:
                # Ranks that were told to shut down let the agent pass its exit barrier within
                # moments; an agent with no ranks (still in rendezvous) has nothing to wait for.
                self.agent.wait(timeout=10 if self.pids else 0.1)
            except subprocess.TimeoutExpired:
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    try:
                        os.killpg(self.agent.pid, sig)
                    except ProcessLookupError:
                        break
                    try:
                        self.agent.wait(timeout=3)
                        break
                    except subprocess.TimeoutExpired:
                        continue
            self.agent = None
        if self.store is not None:
            try:
                assert self.store.stdin is not None
                self.store.stdin.close()
                self.store.wait(timeout=3)
            except (OSError, subprocess.TimeoutExpired):
                self.store.kill()
                self.store.wait()
            self.store = None
        if self.secret_file:
            try:
                os.unlink(self.secret_file)
            except OSError:
                pass
            self.secret_file = None
        self.pids.clear()
