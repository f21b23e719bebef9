"""%%ddp --nnodes 2 by hand across real hosts (the cluster in a box): the kernel's node is login, the other node is
n1, which runs the torchrun command the kernel printed. DDP trains with either style of /etc/hosts, each node's
collectives on its route to MASTER_ADDR. Each cell runs twice."""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from typing import Optional

import box_fixtures
import cluster_box
import pytest

box = box_fixtures.box  # the fixtures, by name in this module
box_kernel = box_fixtures.box_kernel

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

CELL = """
import os, socket, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(dist.get_rank())
m = DDP(torch.nn.Linear(4, 2))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad(); m(torch.randn(8, 4)).sum().backward(); opt.step()
(socket.gethostname(), os.environ.get('GLOO_SOCKET_IFNAME'), torch.cat([p.detach().flatten() for p in m.parameters()]).tolist())
"""


class OtherNode:
    """Runs the printed torchrun command on host n1 once it shows up in the cell's output."""

    def __init__(self, b: cluster_box.Box) -> None:
        self.box, self.seen = b, ""
        self.proc: Optional[subprocess.Popen] = None

    def __call__(self, name: str, text: str) -> None:
        self.seen += text
        if self.proc is None and "--rdzv-endpoint" in self.seen:
            line = next(ln for ln in self.seen.splitlines() if ln.strip().startswith("torchrun"))
            env = dict(os.environ, **box_fixtures.kernel_env(self.box))
            self.proc = subprocess.Popen([*self.box.enter("n1"), sys.executable, "-m", "torch.distributed.run", *shlex.split(line)[1:]],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.mark.parametrize("style", cluster_box.STYLES)
def test_two_hosts_by_hand_train_ddp(box: cluster_box.Box, box_kernel, style: str) -> None:
    box.hosts_style(style)
    node = OtherNode(box)
    login = box.host("login").mgmt
    try:
        for _attempt in range(2):
            ex = box_kernel.run(f"%%ddp -n 4 --nnodes 2 --master-addr {login} --join-timeout 120" + CELL, timeout=200, on_stream=node)
            assert ex.error is None, f"{ex.error}\n{ex.stderr[-3000:]}"
            assert "connectFullMesh" not in ex.stderr
            values = box_kernel.value("[tuple(v) for v in _]")
            assert [v[0] for v in values] == ["login", "login", "n1", "n1"]
            assert {v[1] for v in values} == {"mgmt0"}, "each host chose the interface on its route to MASTER_ADDR"
            assert all(v[2] == values[0][2] for v in values), "identical weights on every rank"
        env = box_kernel.run("%ddp_env", timeout=60).ok().result or ""
        assert re.search(r"login: mgmt0, on the route to (MASTER_ADDR|the kernel) \S+ \(from " + login, env), env
        assert re.search(r"n1: mgmt0, on the route to MASTER_ADDR \S+ \(from " + box.host("n1").mgmt, env), env
    finally:
        box.hosts_style("resolve")
        box_kernel.run("%ddp stop", timeout=60)
        node.kill()
