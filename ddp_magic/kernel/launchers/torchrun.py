"""The torchrun launcher: a pool across nodes, every node (this one included) running its ranks under torchrun.

torchrun's c10d rendezvous (the engine PyTorch users already trust) assigns
node and global ranks; each rank then dials back to the kernel's control
port. This node's agent is our child; the other nodes' agents are started
by the user (or a scheduler) with the command ``launch`` returns.
"""
from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Dict, List, Optional

from ...logs import log
from .base import Exit, LaunchError, Launcher, popen

if TYPE_CHECKING:
    from ...plan.plan import Plan


def rendezvous_args(nnodes: int, nproc_per_node: int, endpoint: str, run_id: str) -> List[str]:
    """torchrun's options for a c10d rendezvous over nodes: one list for the pool and for %ddp_export's sbatch file."""
    return ["--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", endpoint, "--rdzv-id", run_id, "--max-restarts", "0"]


class TorchrunLauncher(Launcher):
    """This node's torchrun agent and the rendezvous store; ranks elsewhere are reached by message only."""

    name = "torchrun"
    remote_ranks = True
    reports_exits = False  # a remote exit code is not ours to read: a lost connection is the exit
    keeps_template = False  # the agents end with their ranks; a restart launches afresh

    def __init__(self, secret: bytes, python: str = sys.executable) -> None:
        super().__init__(secret, python)
        self.agent: Optional[subprocess.Popen] = None
        self.store: Optional[subprocess.Popen] = None
        self._pids: Dict[int, int] = {}  # pid -> rank of the ranks on this host, learnt from their HELLO

    def start(self, timeout: float = 0) -> str:
        return "torchrun (c10d rendezvous)"

    def _write_secret(self, run_id: str) -> str:
        folder = os.path.join(os.path.expanduser("~"), ".ddp_magic")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)
        path = os.path.join(folder, f"secret-{run_id}")
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.secret.hex())
        return path

    def launch(self, plan: Plan, base_env: Dict[str, str], control_addr: str, control_port: int, store_path: Optional[str] = None) -> Optional[str]:
        """Start the rendezvous store and this node's agent; return the command for the other nodes.

        ``store_path`` is unused: ranks on several hosts cannot share a FileStore."""
        host, port = plan.master_addr, plan.master_port
        self.secret_file = self._write_secret(plan.run_id)
        self.store = popen(
            [self.python, "-m", "ddp_magic.procs.rendezvous", host, str(port)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=base_env, start_new_session=True, close_fds=True,
        )
        assert self.store.stdout is not None
        r, _, _ = select.select([self.store.stdout], [], [], 60)
        if not r or self.store.stdout.readline().strip() != b"ready":
            raise LaunchError(f"the rendezvous store on {host}:{port} did not start:\n{self.log_text()}")
        worker_args = ["-m", "ddp_magic.procs.worker", "--connect", f"{control_addr}:{control_port}", "--secret-file", self.secret_file,
                       "--backend", plan.backend] + ([] if plan.init else ["--no-init"])
        rdzv = rendezvous_args(plan.nnodes, plan.nproc, f"{host}:{port}", plan.run_id)
        self.agent = popen(
            [self.python, "-m", "torch.distributed.run"] + rdzv + ["--rdzv-conf", "is_host=false"] + worker_args,
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, env=base_env, start_new_session=True, close_fds=True,
        )
        return " ".join(["torchrun"] + rdzv + worker_args)

    def adopt(self, pid: int, rank: int, host: str) -> None:
        """A rank on this host is a child of our agent: ours to signal. Ranks elsewhere are not."""
        if host == socket.gethostname():
            self._pids[pid] = rank

    def live_pids(self) -> Dict[int, int]:
        """The adopted ranks still alive (they are the agent's children, so no exit event tells us)."""
        live = {}
        for pid, rank in self._pids.items():
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            except PermissionError:  # the pid was reused by someone else's process: not ours
                continue
            live[pid] = rank
        return live

    def owns(self, pid: int) -> bool:
        return pid in self._pids

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
            self._end_agent(self.agent)
            self.agent = None
        if self.store is not None:
            try:
                assert self.store.stdin is not None
                self.store.stdin.close()
                self.store.wait(timeout=3)
            except (OSError, subprocess.TimeoutExpired):
                log.debug("the rendezvous store did not exit when asked; killing it", exc_info=True)
                self.store.kill()
                self.store.wait()
            self.store = None
        if self.secret_file:
            try:
                os.unlink(self.secret_file)
            except OSError:
                log.debug("the secret file %s could not be removed", self.secret_file, exc_info=True)
            self.secret_file = None
        self._pids.clear()

    def _end_agent(self, agent: subprocess.Popen) -> None:
        try:
            # Ranks that were told to shut down let the agent pass its exit barrier within
            # moments; an agent with no ranks (still in rendezvous) has nothing to wait for.
            agent.wait(timeout=10 if self._pids else 0.1)
            return
        except subprocess.TimeoutExpired:
            log.debug("the torchrun agent did not exit on its own; signalling its group", exc_info=True)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(agent.pid, sig)
            except ProcessLookupError:
                return
            try:
                agent.wait(timeout=3)
                return
            except subprocess.TimeoutExpired:
                continue
