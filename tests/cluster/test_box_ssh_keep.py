"""A kept pool on plain hosts over SSH (the cluster in a box; docs/keep.md, "Over SSH").

The kernel runs on ``login``, its ranks on ``n1`` and ``n2`` (``%%ddp --hosts n1,n2``; n2 through a ProxyJump over n1).
At keep, n1's template holds the lease on TCP and TLS, n2's follows it, both leave their ssh sessions, and on login a
process of its own watches the lease (procs/lease_keeper.py): the liveness lock and the discovery file there. A kept
background job through a SIGKILL of its kernel: a new kernel on login attaches over the network, every tick shown, the
result and a variable kept, a rank on n2 killed and forked again by n2's template, the all_reduce right. Then either
``--idle 5s`` and a SIGKILL of the attached kernel, or ``%ddp stop`` in it: no ddp_magic process left on n1, n2 or
login, nor the lease's files. Each twice. And ``%ddp keep --off``: the pool is its kernel's again, and ends with it;
n1 cut off with no kernel: login's lease keeper and n2's ranks hear its lease go silent and end.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

import box_fixtures
import box_ssh
import cluster_box
import pytest
import test_faults

from kernel_helper import Execution, Kernel, alive
from keep_helper import TICKS, cell_texts, ticked, kept_record, sigkill_kept, ticks

box = box_fixtures.box  # the fixtures, by name in this module
ssh_login = box_fixtures.ssh_login

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

START = ("%%ddp --hosts n1,n2 --ntasks-per-node 2\nimport os, socket, time, torch, torch.distributed as dist\n"
         "kept = 100 + dist.get_rank()\n(socket.gethostname(), os.getpid())")
N, AT = 30, 15
POOL = "get_ipython().magics_manager.registry['DDPMagics'].session.pool"
HOSTS = ("login", "n1", "n2")


def _ours(b: cluster_box.Box, host: str) -> List[int]:
    """Every process in ``host`` whose command line names ddp_magic: templates, ranks, the lease keeper, ssh clients."""
    net = os.readlink(f"/proc/{b.anchor(host)}/ns/net")
    out = []
    for pid in b.processes():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                named = b"ddp_magic" in f.read()
            same = os.readlink(f"/proc/{pid}/ns/net") == net
        except OSError:
            continue
        if named and same:
            out.append(pid)
    return out


def _left(b: cluster_box.Box, seconds: float) -> Dict[str, List[int]]:
    """What of ddp_magic is still running on the box's hosts once ``seconds`` passed or none is ({} then)."""
    deadline = time.monotonic() + seconds
    while True:
        left = {h: pids for h in HOSTS if (pids := _ours(b, h))}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _is_keeper(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"ddp_magic.procs.lease_keeper" in f.read()
    except OSError:
        return False


def _keeper_running(b: cluster_box.Box) -> bool:
    return any(_is_keeper(p) for p in _ours(b, "login"))


def _start(b: cluster_box.Box, k: Kernel, runtime: str) -> "tuple[List[int], str, Execution]":
    """The pool on n1 and n2, a kept ticking job held at tick AT; the ranks' pids, the gate file, what the cell showed."""
    k.run(START, timeout=240).ok()
    values = k.value("[tuple(v) for v in _]")
    assert [v[0] for v in values] == ["n1", "n1", "n2", "n2"], values
    gate = os.path.join(runtime, "gate")
    open(gate, "w").close()
    ex = k.run(TICKS.format(n=N, at=AT, gate=gate), timeout=120).ok()
    assert "kept pool" in ex.stdout, (ex.stdout, ex.stderr)
    ticked(k, ex, 4)
    record = kept_record(runtime)
    assert record["lease"].get("host") == b.host("n1").mgmt and record["lease"].get("fp") and record.get("holder") == "n1", record
    assert _keeper_running(b), "a lease keeper runs on login"
    return [v[1] for v in values], gate, ex


def _attach_and_finish(k: Kernel, first: str, gate: str) -> None:
    ex = k.run("%ddp attach --out job", timeout=120).ok()
    assert "attached the kept pool" in ex.stdout and "4 ranks alive" in ex.stdout, (ex.stdout, ex.stderr)
    assert "is still running: its output follows" in ex.stdout, ex.stdout
    print("attach over the network, with a job running:", re.search(r"in [\d.]+ s", ex.stdout).group())  # type: ignore[union-attr]
    os.unlink(gate)
    assert k.value("job.wait(120)") is True
    off = k.run("%ddp keep --off", timeout=60)  # its templates left the first kernel's sessions: not this kernel's to tie
    assert off.error is not None and "this kernel attached a kept SSH pool" in off.error[1], off.error
    result = k.run("job.result()", timeout=60).ok().result or ""
    assert all(f"('done', {100 + r})" in result for r in range(4)), result
    shown, second = ticks(first), ticks(cell_texts(k, ex))
    for r in range(4):
        assert set(shown.get(r, []) + second.get(r, [])) == set(range(N)), (r, shown.get(r), second.get(r))
        assert len(second.get(r, [])) == len(set(second.get(r, []))), (r, second.get(r))
    assert "[rank 3 n2] tick" in cell_texts(k, ex)


def _nothing_left(b: cluster_box.Box, held: str, seconds: float) -> float:
    """No ddp_magic process on any host within ``seconds`` (the time it took), and no file of the lease on n1."""
    t0 = time.monotonic()
    left = _left(b, seconds)
    took = time.monotonic() - t0
    assert not left, f"left on the hosts: {left}"
    assert not os.path.exists(held), f"the lease's files on n1: {held}"
    return took


def _idle_ends(b: cluster_box.Box, k: Kernel, runtime: str, held: str, env: Dict[str, str]) -> None:
    """``--idle 5s`` and a SIGKILL: nothing left on any host; a stop from login's terminal says why it had ended."""
    assert "kept pool" in k.run("%ddp keep --idle 5s").ok().stdout
    pool_id = k.value(f"{POOL}.kept.id")
    sigkill_kept(k)
    print(f"--idle 5s, then a SIGKILL: nothing of ours on login, n1 or n2 after {_nothing_left(b, held, 90):.1f} s")
    said = subprocess.run(b.enter("login") + [sys.executable, "-m", "ddp_magic", "stop", pool_id],
                          env=box_fixtures.kernel_env(b, **env), capture_output=True, text=True, timeout=60).stdout
    assert f"the kept pool {pool_id} had ended already: no kernel attached and no job running for its lease's --idle" in said, said
    assert os.listdir(runtime) == [], os.listdir(runtime)


@pytest.mark.parametrize("run", [1, 2])
@pytest.mark.parametrize("end", ["idle", "stop"])
def test_a_kept_ssh_pool_outlives_its_kernel(box: cluster_box.Box, ssh_login: box_ssh.Login, end: str, run: int) -> None:
    runtime = tempfile.mkdtemp(prefix="k-ssh-", dir="/tmp")
    env = {"JUPYTER_RUNTIME_DIR": runtime, "JPY_SESSION_NAME": "box.ipynb", "DDP_MAGIC_SSH_ARGS": f"-F {ssh_login.config}"}
    k = box_fixtures.login_kernel(box, **env)
    try:
        ranks, gate, ex = _start(box, k, runtime)
        held = str(kept_record(runtime)["dir"])  # the lease's own directory, on n1
        first = sigkill_kept(k, ex)
        assert all(alive(p) for p in ranks), "kept through a SIGKILL of its kernel"
        assert _keeper_running(box)
        k = box_fixtures.login_kernel(box, **env)
        _attach_and_finish(k, first, gate)
        box_fixtures.kept_rank_recovers(k, ranks)
        if end == "idle":
            _idle_ends(box, k, runtime, held, env)
        else:
            said = k.run("%ddp stop", timeout=60).ok().stdout
            assert "templates (n1, n2) ended with the lease" in said, said
            print(f"%ddp stop: nothing of ours on login, n1 or n2 after {_nothing_left(box, held, 30):.1f} s")
            assert os.listdir(runtime) == [], os.listdir(runtime)
    finally:
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=True)
        shutil.rmtree(runtime, ignore_errors=True)


def test_keep_off_ties_the_pool_to_its_kernel_again(box: cluster_box.Box, ssh_login: box_ssh.Login) -> None:
    """keep, then keep --off: the lease keeper is gone, and a SIGKILL of the kernel ends everything on the hosts."""
    runtime = tempfile.mkdtemp(prefix="k-ssh-", dir="/tmp")
    k = box_fixtures.login_kernel(box, JUPYTER_RUNTIME_DIR=runtime, DDP_MAGIC_SSH_ARGS=f"-F {ssh_login.config}")
    try:
        k.run(START, timeout=240).ok()
        for _attempt in range(2):
            assert "kept pool" in k.run("%ddp keep", timeout=60).ok().stdout
            assert _keeper_running(box)
            k.run("%ddp keep --off", timeout=60).ok()
            deadline = time.monotonic() + 10
            while _keeper_running(box) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not _keeper_running(box) and os.listdir(runtime) == [], os.listdir(runtime)
            assert k.run("%%ddp\nkept", timeout=120).ok().result.endswith("[3] 103")
        sigkill_kept(k)
        left = _left(box, 45)  # the sessions' end reaches each template at once; the beat's silence at 12 s
        assert not left, f"left after keep --off and a SIGKILL: {left}"
    finally:
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=True)
        shutil.rmtree(runtime, ignore_errors=True)


def test_a_lost_lease_holder_ends_the_pool_on_the_other_hosts(box: cluster_box.Box, ssh_login: box_ssh.Login) -> None:
    """n1 (the lease holder's host) cut off once the kernel is gone: login's lease keeper and n2's template hear its TLS
    connection go silent (keepalive): the keeper exits, the discovery file saying why, and n2's ranks end; n1's own
    ranks and template end at the lease's --idle, as with no kernel. Nothing left anywhere."""
    runtime = tempfile.mkdtemp(prefix="k-ssh-", dir="/tmp")
    k = box_fixtures.login_kernel(box, JUPYTER_RUNTIME_DIR=runtime, DDP_MAGIC_SSH_ARGS=f"-F {ssh_login.config}")
    try:
        k.run(START, timeout=240).ok()
        assert "kept pool" in k.run("%ddp keep --idle 40s", timeout=60).ok().stdout
        sigkill_kept(k)
        assert _ours(box, "n2") and _keeper_running(box)
        test_faults._link(box, "n1", False)
        t0 = time.monotonic()
        try:
            deadline = time.monotonic() + 60
            while (_ours(box, "n2") or _keeper_running(box)) and time.monotonic() < deadline:
                time.sleep(0.2)
            took = time.monotonic() - t0
            assert not _ours(box, "n2") and not _keeper_running(box), (_ours(box, "n2"), _ours(box, "login"))
            why = kept_record(runtime).get("why", "")
            assert "n1" in why and ("went away" in why or "lost its connection" in why), why
            print(f"n1 cut off: login's lease keeper and n2's ranks gone after {took:.1f} s ({why})")
        finally:
            test_faults._link(box, "n1", True)
        left = _left(box, 90)  # n1's: at its lease's --idle (40 s after the kernel left)
        assert not left, f"left on the hosts: {left}"
    finally:
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=True)
        shutil.rmtree(runtime, ignore_errors=True)


def test_stop_from_a_terminal_ends_a_kept_ssh_pool(box: cluster_box.Box, ssh_login: box_ssh.Login) -> None:
    """No kernel: ``python -m ddp_magic stop ID`` on login reaches the lease on n1 over TLS; nothing left anywhere."""
    runtime = tempfile.mkdtemp(prefix="k-ssh-", dir="/tmp")
    env = {"JUPYTER_RUNTIME_DIR": runtime, "DDP_MAGIC_SSH_ARGS": f"-F {ssh_login.config}"}
    k = box_fixtures.login_kernel(box, **env)
    try:
        k.run(START, timeout=240).ok()
        assert "kept pool" in k.run("%ddp keep", timeout=60).ok().stdout
        pool_id = k.value(f"{POOL}.kept.id")
        held = str(kept_record(runtime)["dir"])
        sigkill_kept(k)
        assert _ours(box, "n1") and _ours(box, "n2") and _keeper_running(box)
        done = subprocess.run(box.enter("login") + [sys.executable, "-m", "ddp_magic", "stop", pool_id],
                              env=box_fixtures.kernel_env(box, **env), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and pool_id in done.stdout, (done.stdout, done.stderr)
        print(f"python -m ddp_magic stop: nothing of ours on login, n1 or n2 after {_nothing_left(box, held, 30):.1f} s ({done.stdout.strip()})")
        assert os.listdir(runtime) == [], os.listdir(runtime)
    finally:
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=True)
        shutil.rmtree(runtime, ignore_errors=True)


def test_a_kernel_shut_down_leaves_its_kept_ssh_pool_and_nothing_else(box: cluster_box.Box, ssh_login: box_ssh.Login) -> None:
    """A kept pool's kernel shut down (not killed): its ssh clients go with it, the templates and ranks stay, the next
    kernel attaches them and its ``%ddp stop`` leaves nothing."""
    runtime = tempfile.mkdtemp(prefix="k-ssh-", dir="/tmp")
    env = {"JUPYTER_RUNTIME_DIR": runtime, "DDP_MAGIC_SSH_ARGS": f"-F {ssh_login.config}"}
    k = box_fixtures.login_kernel(box, **env)
    try:
        values = (k.run(START, timeout=240).ok(), k.value("[tuple(v) for v in _]"))[1]
        assert "kept pool" in k.run("%ddp keep", timeout=60).ok().stdout
        held = str(kept_record(runtime)["dir"])
        k.km.shutdown_kernel(now=False)
        k.kc.stop_channels()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and [p for p in _ours(box, "login") if not _is_keeper(p)]:
            time.sleep(0.2)
        assert not [p for p in _ours(box, "login") if not _is_keeper(p)], "the kernel's ssh clients went with it"
        assert all(alive(v[1]) for v in values) and _keeper_running(box), "the kept pool stays"
        k = box_fixtures.login_kernel(box, **env)
        assert "4 ranks alive" in k.run("%ddp attach", timeout=120).ok().stdout
        assert k.run("%%ddp\nkept", timeout=120).ok().result.endswith("[3] 103")
        assert "ended with the lease" in k.run("%ddp stop", timeout=60).ok().stdout
        print(f"a kept pool's kernel shut down, the next one's %ddp stop: nothing left after {_nothing_left(box, held, 30):.1f} s")
    finally:
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=True)
        shutil.rmtree(runtime, ignore_errors=True)
