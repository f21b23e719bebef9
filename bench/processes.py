"""The benchmarks' processes: run a child in its own session, find a kernel's descendants, and leave nothing behind.

``Watch`` remembers every pid a measurement created; after the measurement each
must be gone (a leftover is noted in the report, and killed by its pid when the
bench owns it). Nothing here signals a process by name. ``SRC`` is the directory
whose ``ddp_magic`` the children import (bench_core.py's ``--src`` and ``--git-rev``).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from typing import Dict, List, Optional, Tuple

from harness import REPO, Store, log, short_error

SRC = REPO


def set_src(path: str) -> None:
    global SRC
    SRC = os.path.abspath(path)


def child_env() -> dict:
    """The env of a child: ours, without pytest's marker, with SRC first on PYTHONPATH."""
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    env["PYTHONPATH"] = os.pathsep.join([SRC] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def tail(text: str, n: int = 400) -> str:
    return (text or "").strip()[-n:]


def proc_table() -> Dict[int, int]:
    """pid -> ppid for every live process, from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                table[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return table


def descendants(root: int) -> List[int]:
    children: Dict[int, List[int]] = {}
    for pid, ppid in proc_table().items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def where(pid: int) -> str:
    """"ppid P, cwd D" of a process someone may have to recognise."""
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = "?"
    return f"ppid {proc_table().get(pid, '?')}, cwd {cwd}"


def pgrep(pattern: str) -> Dict[int, str]:
    """pid -> command line of the processes `pgrep -af PATTERN` lists (not this one)."""
    try:
        out = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    rows = {}
    for line in out.splitlines():
        pid, _, cmd = line.partition(" ")
        if pid.isdigit() and int(pid) != os.getpid():
            rows[int(pid)] = cmd
    return rows


def proc_mem_kib(pid: int) -> Tuple[int, int, int]:
    """(RSS, USS, PSS) in KiB. USS: private pages, what this process alone costs (pages a fork shares with its parent are not);
    PSS: each page divided by the number of processes mapping it, so a pool's PSS adds up to what the pool costs."""
    rss = uss = pss = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    uss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1])
    except OSError:
        pass
    return rss, uss, pss


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (all its threads), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def killpg(proc: subprocess.Popen) -> None:
    """SIGKILL a child's whole session (it was started in one of its own), then drain its pipes."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.communicate(timeout=10)
    except Exception as e:  # the group is killed; its pipes are only drained
        log(f"draining pid {proc.pid} after SIGKILL: {short_error(e)}")


def run_proc(argv: List[str], env: Optional[dict] = None, timeout: float = 300.0, cwd: Optional[str] = None) -> Tuple[int, str, str]:
    """Run to completion in its own session; on timeout the whole group is killed and TimeoutError raised."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env or child_env(), cwd=cwd or SRC,
                            start_new_session=True, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        killpg(proc)
        raise TimeoutError(f"{' '.join(argv[:3])}… ran past {timeout:.0f}s")
    return proc.returncode, out, err


def child_json(argv: List[str], timeout: float = 600.0, env: Optional[dict] = None) -> dict:
    """Run a child that prints one ``BENCHJSON {...}`` line; its last such line, or RuntimeError with its stderr."""
    code, out, err = run_proc(argv, env=env, timeout=timeout)
    got = [json.loads(line[len("BENCHJSON "):]) for line in out.splitlines() if line.startswith("BENCHJSON ")]
    if not got:
        raise RuntimeError(f"exit {code}: {tail(err, 300)}")
    return got[-1]


class Watch:
    """Every pid a measurement created: each must be gone after it (noted if not; ``kill``: SIGKILLed by pid, it is ours)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.pids: Dict[int, str] = {}  # every pid seen, with what it was
        self.leftover: Dict[int, str] = {}

    def remember(self, pids: List[int], what: str) -> None:
        for p in pids:
            if p and p != os.getpid():
                self.pids.setdefault(p, f"{cmdline(p)[:100]}  ({what})")

    def expect_gone(self, pids: List[int], what: str, timeout: float = 10.0, kill: bool = False) -> None:
        pids = [p for p in pids if p and p != os.getpid()]
        self.remember(pids, what)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
            time.sleep(0.05)
        alive = [p for p in pids if pid_alive(p)]
        if not alive:
            return
        note = f"{what}: {len(alive)} process(es) still alive {timeout:.0f}s after stop" + (", killed by pid: " if kill else ": ")
        self.store.notes.append(note + "; ".join(f"{p} {cmdline(p)[:80]}" for p in alive))
        log("WARNING " + self.store.notes[-1])
        for p in alive:
            self.leftover[p] = f"{cmdline(p)}  (after {what})"
            if kill:
                _kill(p)

    def final(self) -> List[str]:
        """The remembered pids still alive at the end, SIGKILLed (ours); their descriptions."""
        left = [p for p in self.pids if pid_alive(p)]
        for p in left:
            _kill(p)
        return [f"{p} {self.pids[p]}" for p in left]


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def export_rev(rev: str) -> Tuple[str, str]:
    """ddp_magic as committed at rev, unpacked into a temp dir (read-only git: the checkout is untouched); (dir, sha)."""
    sha = subprocess.run(["git", "-C", REPO, "rev-parse", "--verify", rev + "^{commit}"], capture_output=True, text=True, check=True).stdout.strip()
    dest = tempfile.mkdtemp(prefix="ddp_bench_src_")
    archive = subprocess.run(["git", "-C", REPO, "archive", "--format=tar", sha, "ddp_magic"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    return dest, sha
