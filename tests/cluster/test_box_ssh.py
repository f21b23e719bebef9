"""%%ddp --hosts across real hosts over SSH (the cluster in a box: an sshd in each node, the test's own key, known_hosts
and ssh config; n2 reached only through a ProxyJump over n1).

DDP trains on both hosts with identical weights, from --hosts and from a DeepSpeed hostfile; an interrupt ends a cell
and the ranks keep their state; --bg and --peek; a SIGKILLed kernel leaves nothing on n1 or n2; a killed sshd session
ends its host's template and ranks (the next cell starts them again); a changed host key and a host without ddp_magic
are refused by name with nothing started. Each twice, as a notebook user runs a cell again."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import List

import box_fixtures
import box_ssh
import cluster_box
import pytest
from kernel_helper import Kernel, alive

box = box_fixtures.box  # the fixtures, by name in this module
box_kernel = box_fixtures.box_kernel
ssh_login = box_fixtures.ssh_login

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

HOSTS = "%%ddp --hosts n1,n2 --ntasks-per-node 2"
TRAIN = """
import os, socket, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(dist.get_rank())  # different starting weights: DDP's broadcast makes them one
m = DDP(torch.nn.Linear(4, 2))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad(); m(torch.randn(8, 4)).sum().backward(); opt.step()
w = torch.cat([p.detach().flatten() for p in m.parameters()])
print(f"trained {dist.get_rank()}")
(socket.gethostname(), os.environ.get('GLOO_SOCKET_IFNAME'), w.tolist(), os.getpid())
"""
SESSION = "get_ipython().magics_manager.registry['DDPMagics'].session"


def _use(k: Kernel, login: box_ssh.Login) -> None:
    """The kernel's ssh reads this test's config (ssh takes ~/.ssh from the passwd entry, not $HOME: -F)."""
    k.run(f"import os; os.environ['DDP_MAGIC_SSH_ARGS'] = '-F {login.config}'").ok()


def _stop(k: Kernel) -> None:
    k.run("%ddp stop", timeout=60).ok()
    k.run("import os; os.environ.pop('DDP_MAGIC_SSH_ARGS', None)").ok()


def _values(k: Kernel, ex) -> list:
    ex.ok()
    return k.value("[tuple(v) for v in _]") if ex.result else []


def _ours(b: cluster_box.Box, node: str) -> List[int]:
    """The pids of ddp_magic's processes in ``node`` (its ssh template and the ranks forked from it)."""
    out = []
    for pid in b.processes():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/ns/uts") as _:
                pass
        except OSError:
            continue
        if any(b"ddp_magic.procs.ssh_template" in a for a in argv) and _in_host(b, pid, node):
            out.append(pid)
    return out


def _in_host(b: cluster_box.Box, pid: int, node: str) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/net") == os.readlink(f"/proc/{b.anchor(node)}/ns/net")
    except OSError:
        return False


def _wait_gone(pids: List[int], seconds: float) -> List[int]:
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


@pytest.mark.parametrize("how", ["--hosts", "--hostfile"])
def test_ddp_trains_on_two_hosts_over_ssh(box: cluster_box.Box, box_kernel: Kernel, ssh_login: box_ssh.Login, tmp_path: Path, how: str) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# the box's nodes, DeepSpeed's format\nn1 slots=2\n\nn2 slots=2   # through n1 (ProxyJump)\n")
    head = HOSTS if how == "--hosts" else f"%%ddp --hostfile {hostfile}"
    _use(box_kernel, ssh_login)
    try:
        for _attempt in range(2):
            ex = box_kernel.run(head + TRAIN, timeout=240)
            assert ex.error is None, f"{ex.error}\n{ex.stdout[-3000:]}\n{ex.stderr[-3000:]}"
            values = _values(box_kernel, ex)
            assert [v[0] for v in values] == ["n1", "n1", "n2", "n2"], values
            assert {v[1] for v in values} == {"mgmt0"}, "each host chose the interface on its route to MASTER_ADDR"
            assert all(v[2] == values[0][2] for v in values), "identical weights on every rank"
            assert "[rank 3 n2] trained 3" in ex.stdout and "[rank 0 n1] trained 0" in ex.stdout, ex.stdout
        env = box_kernel.run("%ddp_env", timeout=60).ok().result or ""
        assert f"MASTER_ADDR={box.host('n1').mgmt}" in env.replace("'", "").replace(": ", "="), env
    finally:
        _stop(box_kernel)
    left = _wait_gone(_ours(box, "n1") + _ours(box, "n2"), 15)
    assert not left, f"%ddp stop left processes on the hosts: {left}"
