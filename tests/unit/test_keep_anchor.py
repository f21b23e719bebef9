"""What lets a kept Slurm pool outlive its kernel (docs/keep.md, "Slurm"), with real processes and no Slurm: the anchor
under salloc and srun, the holder following the lease's lock (an attached pool's node templates forking a rank again:
tests/slurm/test_slurm_template.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import wait_until

from ddp_magic.wire import kept

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, PYTHONPATH=ROOT)
ANCHOR = [sys.executable, "-m", "ddp_magic.procs.anchor"]
# a stand-in for the kernel: starts the anchor (its child: sleep), prints their pids, lives until its stdin closes
KERNEL = (
    "import subprocess, sys, time\n"
    f"p = subprocess.Popen({ANCHOR!r} + ['sleep', '60'], stdout=subprocess.DEVNULL)\n"
    "child, deadline = [], time.monotonic() + 30\n"
    "while not child and time.monotonic() < deadline:  # a loaded machine: the anchor forks when it gets its turn\n"
    "    time.sleep(0.02)\n"
    "    child = open(f'/proc/{p.pid}/task/{p.pid}/children').read().split()\n"
    "print(p.pid, child[0], flush=True)\n"
    "sys.stdin.read()\n"
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _signals(pid: int, field: str) -> int:
    """A signal mask of /proc/PID/status (SigCgt: caught, SigPnd/ShdPnd: pending)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1], 16)
    return 0


def _bit(sig: int) -> int:
    return 1 << (int(sig) - 1)


def _keep(anchor: int) -> None:
    """Send the keep signal once the anchor catches it, and wait until it has taken it (no sleep that a loaded machine outruns)."""
    keep = _bit(kept.ANCHOR_KEEP)
    assert wait_until(lambda: bool(_signals(anchor, "SigCgt") & keep), 30, 0.02), "the anchor catches the keep signal"
    os.kill(anchor, kept.ANCHOR_KEEP)
    assert wait_until(lambda: not ((_signals(anchor, "SigPnd") | _signals(anchor, "ShdPnd")) & keep), 30, 0.02)
    time.sleep(0.2)  # its Python handler runs as soon as the signal is taken (waitpid returns EINTR)


def _gone(pids, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not any(_alive(p) for p in pids)


def test_the_anchor_passes_output_and_status_on() -> None:
    for _ in range(2):
        done = subprocess.run(ANCHOR + ["sh", "-c", "echo out; echo err >&2; exit 3"], capture_output=True, text=True, env=ENV, timeout=30)
        assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
        killed = subprocess.run(ANCHOR + ["sh", "-c", "kill -TERM $$"], capture_output=True, env=ENV, timeout=30)
        assert killed.returncode == -signal.SIGTERM, "a child's signal is the anchor's status"


@pytest.mark.parametrize("kept_", [False, True])
def test_the_anchor_goes_with_its_kernel_unless_kept(kept_: bool) -> None:
    for _ in range(2):
        kernel = subprocess.Popen([sys.executable, "-c", KERNEL], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV)
        assert kernel.stdout is not None and kernel.stdin is not None
        anchor, child = (int(x) for x in kernel.stdout.readline().split())
        try:
            if kept_:
                _keep(anchor)
            kernel.kill()  # SIGKILL: no code of the kernel's runs
            kernel.wait()
            if kept_:
                time.sleep(1.0)
                assert _alive(anchor) and _alive(child), "kept: they outlive the kernel"
            else:
                assert _gone([anchor, child]), "the kernel's death ends the anchor and its child (SIGTERM)"
        finally:
            for pid in (child, anchor):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _gone([anchor, child])


def test_the_holder_follows_the_lease_once_told(tmp_path) -> None:
    """``lease PATH`` on its stdin: the kernel's EOF no longer ends it; the lock's release does (salloc is a shell here)."""
    lock = str(tmp_path / "ddp-kept-x.lock")
    for _ in range(2):
        holder = subprocess.Popen(["sh", "-c", f"{sys.executable} -m ddp_magic.procs.slurm_hold; exit $?"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env={k: v for k, v in ENV.items() if not k.startswith("SLURM_")})
        assert holder.stdin is not None and holder.stdout is not None
        assert holder.stdout.readline().startswith("ddp_magic_hold")
        fd = kept.hold_lock(lock)
        try:
            holder.stdin.write(f"lease {lock}\n")
            holder.stdin.flush()
            holder.stdin.close()  # the kernel went
            time.sleep(1.5)
            assert holder.poll() is None, "kept: the kernel's EOF does not end the allocation"
        finally:
            os.close(fd)  # the lease ended
        assert holder.wait(timeout=10) == 0, "the lease's lock released: the holder exits, salloc releases"
