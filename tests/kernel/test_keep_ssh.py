"""A kept SSH pool on this machine (docs/keep.md, "Over SSH"), with a stand-in for ssh that runs the remote command here.

No sshd: the stand-in execs the remote command, so each host's template is the child of the kernel's anchor, as a
remote template is sshd's session's; the kernel's SIGKILL ends that parent and closes its stdin, as a lost session
does. The same code as over real ssh (tests/cluster/test_box_ssh_keep.py runs that): the first host's template holds
the lease on TCP and TLS, the other follows it, a lease keeper watches it from here. A kept job through a SIGKILL of
its kernel (then, second round, through a shutdown: the kernel ends its ssh sessions and the templates stay), attached
by the next one, which cannot unkeep it; a rank on the second host killed and forked again there; ``%ddp stop``:
nothing left.
"""
from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path
from typing import Iterator, List

import pytest
from conftest import pid_alive, wait_until
from kernel_helper import Kernel, drop_runtime_dir, own_runtime_dir
from keep_helper import TICKS, cell_texts, ticked, runtime_processes, ticks

pytestmark = pytest.mark.kernel

FAKE_SSH = """#!/bin/sh
# a stand-in for ssh: the remote command runs here (its options and host are dropped)
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done
shift
exec sh -c "$1"
"""
START = ("%%ddp --hosts ha,hb --ntasks-per-node 1\nimport os, torch, torch.distributed as dist\n"
         "kept = 100 + dist.get_rank()\nos.getpid()")
AGAIN = ("%%ddp\nimport os, torch, torch.distributed as dist\nx = torch.ones(1) * (dist.get_rank() + 1)\ndist.all_reduce(x)\n"
         "(globals().get('kept'), x.item(), os.getpid())")
N, AT = 20, 10


@pytest.fixture
def runtime() -> Iterator[str]:
    path = own_runtime_dir()
    yield path
    drop_runtime_dir(path)


def _kernel(runtime: str, bin_dir: Path) -> Kernel:
    path = os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    k = Kernel(extra_env={"JUPYTER_RUNTIME_DIR": runtime, "JPY_SESSION_NAME": "ssh.ipynb", "PATH": path})
    k.run("%load_ext ddp_magic").ok()
    return k


def _ours(runtime: str) -> List[int]:
    """Our templates and lease keeper."""
    return runtime_processes(runtime, b"ddp_magic.procs.ssh_template", b"ddp_magic.procs.lease_keeper")


def _sigkill(k: Kernel) -> None:
    os.kill(k.pid, signal.SIGKILL)
    assert wait_until(lambda: not pid_alive(k.pid), 10)
    k.collect(1.0)


def test_a_kept_ssh_pool_outlives_its_kernel_and_ends_with_stop(runtime: str, tmp_path: Path) -> None:
    (tmp_path / "ssh").write_text(FAKE_SSH)
    (tmp_path / "ssh").chmod(0o755)
    for end in ("sigkill", "shutdown"):
        _round(runtime, tmp_path, end)


def _round(runtime: str, bin_dir: Path, end: str) -> None:
    k = _kernel(runtime, bin_dir)
    try:
        ranks = [int(p) for p in re.findall(r"\[\d\] (\d+)", k.run(START, timeout=240).ok().result or "")]
        assert len(ranks) == 2, ranks
        gate = os.path.join(runtime, "gate")
        open(gate, "w").close()
        ex = k.run(TICKS.format(n=N, at=AT, gate=gate), timeout=120).ok()
        assert "kept pool" in ex.stdout, ex.stdout
        assert ticked(k, ex, 2)
        if end == "sigkill":
            _sigkill(k)
        else:
            k.km.shutdown_kernel(now=False)
            k.collect(1.0)
        first = cell_texts(k, ex)
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=True)
        assert all(pid_alive(p) for p in ranks), "kept through a SIGKILL of its kernel"
        k = _kernel(runtime, bin_dir)
        att = k.run("%ddp attach --out job", timeout=120).ok()
        assert "attached the kept pool" in att.stdout and "2 ranks alive" in att.stdout, att.stdout
        os.unlink(gate)
        assert k.value("job.wait(60)") is True
        off = k.run("%ddp keep --off", timeout=60)
        assert off.error is not None and "this kernel attached a kept SSH pool" in off.error[1], off.error
        shown, second = ticks(first), ticks(cell_texts(k, att))
        assert all(set(shown.get(r, []) + second.get(r, [])) == set(range(N)) for r in range(2)), (shown, second)
        os.kill(ranks[1], signal.SIGKILL)  # the second host's: forked again by its template, through the lease
        attached = k
        assert wait_until(lambda: re.search(r"rank 1: pid \d+ +dead", attached.run("%ddp status").stdout) is not None, 30)
        again = k.run(AGAIN, timeout=120).ok()
        values = k.value("[tuple(v) for v in _]")
        assert "started it again" in again.stdout and [v[:2] for v in values] == [(100, 3.0), (None, 3.0)], (values, again.stdout)
        assert "kept: only rank 0 kept its names, so whether it differs by rank cannot be told" in again.stdout, again.stdout  # not rank 0's 100
        said = k.run("%ddp stop", timeout=60).ok().stdout
        assert "its hosts' templates (ha, hb) ended with the lease" in said, said
        assert wait_until(lambda: not _ours(runtime), 30), f"left: {_ours(runtime)}"
        assert not [n for n in os.listdir(runtime) if n.startswith("ddp-kept-")], os.listdir(runtime)
    finally:
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=True)
