"""The launchers behind one interface: their capability flags, make_launcher, and the fork-server
and spawn launchers driven with tiny fake programs instead of torch (the real template is
exercised by the kernel tests)."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

import pytest

from ddp_magic.kernel.launchers import (
    ForkServerLauncher,
    LaunchError,
    Launcher,
    SpawnLauncher,
    TorchrunLauncher,
    make_launcher,
    signal_pid,
    worker_env,
)
from ddp_magic.kernel.launchers.base import LocalLauncher

SECRET = b"s" * 32


@dataclass
class FakePlan:
    nproc: int = 2
    nnodes: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29555
    run_id: str = "abc123"
    backend: str = "gloo"
    init: bool = True
    extra: Dict[str, str] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes

    def rank_env(self, local_rank: int) -> Dict[str, str]:
        return {"RANK": str(local_rank), "WORLD_SIZE": str(self.world_size)}


def _fake_python(tmp_path: Path, body: str) -> str:
    """An executable standing in for the interpreter: it ignores ``-m module`` and runs ``body``."""
    script = tmp_path / "fake_program.py"
    script.write_text(body)
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {script}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(exe)


def _poll_until(launcher: Launcher, count: int, limit: float = 10.0) -> List[tuple]:
    exits: List[tuple] = []
    deadline = time.monotonic() + limit
    while len(exits) < count and time.monotonic() < deadline:
        exits += launcher.poll(0.05)
    return exits


# ------------------------------------------------------------------ one interface, flags for what differs
@pytest.mark.parametrize(
    "cls, remote, exits, keeps",
    [(ForkServerLauncher, False, True, True), (SpawnLauncher, False, True, True), (TorchrunLauncher, True, False, False)],
)
def test_capability_flags(cls, remote, exits, keeps):
    launcher = cls(SECRET)
    assert isinstance(launcher, Launcher)
    assert (launcher.remote_ranks, launcher.reports_exits, launcher.keeps_template) == (remote, exits, keeps)
    assert launcher.secret_file is None and launcher.name


def test_the_interface_cannot_be_used_half_implemented():
    with pytest.raises(TypeError):
        Launcher(SECRET)  # type: ignore[abstract]


def test_make_launcher_picks_by_start_method():
    assert isinstance(make_launcher("fork", SECRET), ForkServerLauncher)
    assert isinstance(make_launcher("spawn", SECRET), SpawnLauncher)
    assert isinstance(make_launcher("torchrun", SECRET), TorchrunLauncher)
    auto = make_launcher("auto", SECRET)
    assert isinstance(auto, ForkServerLauncher if sys.platform.startswith("linux") else SpawnLauncher)


def test_make_launcher_names_the_choices_for_an_unknown_method():
    with pytest.raises(ValueError, match="unknown start method 'threads'; use auto, fork, spawn or torchrun"):
        make_launcher("threads", SECRET)


# ------------------------------------------------------------------ what every local launcher does
class Recorder(LocalLauncher):
    name = "recorder"

    def __init__(self) -> None:
        super().__init__(SECRET)
        self.spawned: List[tuple] = []

    def spawn(self, rank: int, config: dict) -> None:
        self.spawned.append((rank, config))

    def live_pids(self) -> Dict[int, int]:
        return {}

    def poll(self, timeout: float = 0.0) -> List[tuple]:
        return []

    def alive(self) -> bool:
        return True

    def close(self) -> None:
        pass


def test_local_launch_gives_each_rank_its_env_and_the_way_back():
    rec = Recorder()
    assert rec.launch(FakePlan(nproc=3), {"BASE": "1"}, "127.0.0.1", 4242, "/dev/shm/store") is None
    assert [r for r, _ in rec.spawned] == [0, 1, 2]
    rank, config = rec.spawned[2]
    assert config["kernel_addr"] == "127.0.0.1" and config["kernel_port"] == 4242
    assert config["env"] == {"BASE": "1", "RANK": "2", "WORLD_SIZE": "3", "DDP_MAGIC_STORE": "/dev/shm/store"}
    rec2 = Recorder()
    rec2.launch(FakePlan(nproc=1), {}, "::1", 1, None)
    assert "DDP_MAGIC_STORE" not in rec2.spawned[0][1]["env"]


def test_worker_env_leaves_out_what_must_not_reach_ranks(monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    monkeypatch.setenv("JPY_PARENT_PID", "1")
    env = worker_env()
    assert "MPLBACKEND" not in env and "JPY_PARENT_PID" not in env and "PYTEST_CURRENT_TEST" not in env
    assert env["PYTHONUNBUFFERED"] == "1"
    assert os.getcwd() in env["PYTHONPATH"].split(os.pathsep)


def test_signal_pid_to_a_gone_process_is_quiet():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    signal_pid(proc.pid, signal.SIGTERM)  # reaped already: nothing to signal, nothing raised


# ------------------------------------------------------------------ spawn, with a fake interpreter
def test_spawn_launcher_reports_each_exit_and_forgets_the_pid(tmp_path):
    # one write() per rank: both ranks share the launcher's log, and print() may write piecewise
    program = "import json, os, sys\nconf = json.loads(sys.stdin.readline())\nos.write(1, f\"rank {conf['env']['RANK']} up\\n\".encode())\nsys.exit(3)\n"
    python = _fake_python(tmp_path, program)
    launcher = SpawnLauncher(SECRET, python=python)
    launcher.launch(FakePlan(nproc=2), dict(os.environ), "127.0.0.1", 1, None)
    pids = launcher.live_pids()
    assert sorted(pids.values()) == [0, 1] and all(launcher.owns(p) for p in pids)
    exits = _poll_until(launcher, 2)
    assert sorted(exits) == sorted((rank, pid, 3) for pid, rank in pids.items())
    assert launcher.live_pids() == {} and not any(launcher.owns(p) for p in pids)
    assert "rank 0 up" in launcher.log_text() and "rank 1 up" in launcher.log_text()
    launcher.close()


# ------------------------------------------------------------------ the fork server, with a fake template
FAKE_TEMPLATE = r"""
import json, subprocess, sys
def emit(ev):
    sys.stdout.write(json.dumps(ev) + "\n"); sys.stdout.flush()
json.loads(sys.stdin.readline())  # the secret
MODE
emit({"event": "ready", "info": "fake template"})
children = []
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd.get("op") == "exit":
        break
    child = subprocess.Popen(["sleep", "30"] if cmd["config"]["env"].get("STAY") else [sys.executable, "-c", "raise SystemExit(5)"],
                             stdout=subprocess.DEVNULL)  # not our pipe: its end is the template's end
    emit({"event": "spawned", "rank": cmd["rank"], "pid": child.pid})
    if not cmd["config"]["env"].get("STAY"):
        emit({"event": "exited", "rank": cmd["rank"], "pid": child.pid, "code": child.wait()})
"""


def _template(tmp_path: Path, mode: str = "") -> ForkServerLauncher:
    return ForkServerLauncher(SECRET, python=_fake_python(tmp_path, FAKE_TEMPLATE.replace("MODE", mode)))


def test_fork_server_starts_launches_and_reports_exits(tmp_path):
    launcher = _template(tmp_path)
    try:
        assert launcher.start(timeout=20) == "fake template"
        assert launcher.alive() and launcher.fileno() is not None
        assert launcher.start(timeout=20) == "template already running"
        launcher.launch(FakePlan(nproc=2), {}, "127.0.0.1", 1, None)
        exits = _poll_until(launcher, 2)
        assert sorted((rank, code) for rank, _, code in exits) == [(0, 5), (1, 5)]
        assert launcher.live_pids() == {}
    finally:
        launcher.close()
    assert not launcher.alive() and launcher.proc is None


def test_a_vanished_template_counts_as_every_child_dying(tmp_path):
    launcher = _template(tmp_path)
    child = None
    try:
        launcher.start(timeout=20)
        launcher.launch(FakePlan(nproc=1), {"STAY": "1"}, "127.0.0.1", 1, None)
        deadline = time.monotonic() + 10
        while not launcher.live_pids() and time.monotonic() < deadline:
            launcher.poll(0.05)
        (child, rank), = launcher.live_pids().items()
        assert launcher.owns(child)
        assert launcher.proc is not None
        launcher.proc.kill()
        assert _poll_until(launcher, 1) == [(0, child, -signal.SIGKILL)]
        assert launcher.live_pids() == {}
    finally:
        if child is not None:
            signal_pid(child, signal.SIGKILL)  # the fake's own sleep, which we started
        launcher.close()


@pytest.mark.parametrize(
    "mode, needle",
    [
        ('emit({"event": "error", "message": "no torch here", "traceback": "tb"}); sys.exit(1)', "the worker template could not start: no torch here"),
        ('sys.stderr.write("crashed early\\n"); sys.exit(4)', "the worker template exited with code 4:\ncrashed early"),
    ],
)
def test_a_template_that_cannot_start_says_why(tmp_path, mode, needle):
    launcher = _template(tmp_path, mode)
    with pytest.raises(LaunchError) as e:
        launcher.start(timeout=20)
    assert needle in str(e.value)
    assert launcher.proc is None


# ------------------------------------------------------------------ torchrun, without torch
def test_torchrun_adopts_only_ranks_on_this_host():
    import socket

    launcher = TorchrunLauncher(SECRET)
    launcher.adopt(os.getpid(), 0, socket.gethostname())
    launcher.adopt(os.getpid() + 1, 1, "another-node")
    assert launcher.owns(os.getpid()) and not launcher.owns(os.getpid() + 1)
    assert launcher.live_pids() == {os.getpid(): 0}
    assert launcher.poll(0) == [] and not launcher.alive()


def test_torchrun_forgets_ranks_that_have_exited():
    import socket

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    launcher = TorchrunLauncher(SECRET)
    launcher.adopt(proc.pid, 0, socket.gethostname())
    assert launcher.live_pids() == {}


def test_torchrun_secret_file_is_private_and_removed_on_close(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    launcher = TorchrunLauncher(SECRET)
    path = launcher._write_secret("run1")
    launcher.secret_file = path
    assert Path(path).read_text() == SECRET.hex()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    launcher.close()
    assert not os.path.exists(path) and launcher.secret_file is None
