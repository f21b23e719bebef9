"""The spawn launcher: one fresh interpreter per rank — slower (each imports torch), works everywhere."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Dict, List, Tuple

from .base import Exit, LocalLauncher, popen


class SpawnLauncher(LocalLauncher):
    """One fresh interpreter per rank: slower (each imports torch), works everywhere."""

    name = "spawn"
    remote_ranks = False
    reports_exits = True
    keeps_template = True  # nothing to keep, nothing lost by keeping the launcher

    def __init__(self, secret: bytes, python: str = sys.executable) -> None:
        super().__init__(secret, python)
        self.procs: Dict[int, Tuple[int, subprocess.Popen]] = {}  # pid -> (rank, proc)

    def spawn(self, rank: int, config: dict) -> None:
        proc = popen(
            [self.python, "-m", "ddp_magic.procs.worker"],
            stdin=subprocess.PIPE,
            stdout=self.log,
            stderr=self.log,
            env=config["env"],
            start_new_session=True,
            close_fds=True,
        )
        assert proc.stdin is not None
        proc.stdin.write((json.dumps(dict(config, secret=self.secret.hex(), parent_pid=os.getpid())) + "\n").encode())
        proc.stdin.close()
        self.procs[proc.pid] = (rank, proc)

    def live_pids(self) -> Dict[int, int]:
        return {pid: rank for pid, (rank, _) in self.procs.items()}

    def poll(self, timeout: float = 0.0) -> List[Exit]:
        if timeout:
            time.sleep(min(timeout, 0.05))
        out: List[Exit] = []
        for pid, (rank, proc) in list(self.procs.items()):
            code = proc.poll()
            if code is not None:
                out.append((rank, pid, code))
                del self.procs[pid]
        return out

    def alive(self) -> bool:
        return True

    def close(self) -> None:
        for _, proc in list(self.procs.values()):
            proc.kill()
            proc.wait()
        self.procs.clear()
