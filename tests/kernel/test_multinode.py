"""%%ddp across nodes on torchrun's c10d rendezvous — two "nodes" on loopback.

The kernel's node runs its ranks under torchrun; the test plays the other
node by running the exact command the kernel printed.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from conftest import wait_until
from kernel_helper import Kernel

pytestmark = [pytest.mark.kernel, pytest.mark.slow]


class OtherNode:
    """Starts the printed torchrun command once it shows up in the cell's output."""

    def __init__(self) -> None:
        self.proc = None
        self.seen = ""

    def __call__(self, name: str, text: str) -> None:
        self.seen += text
        if self.proc is None and "--rdzv-endpoint" in self.seen:
            line = next(ln for ln in self.seen.splitlines() if ln.strip().startswith("torchrun"))
            args = shlex.split(line.strip())
            assert "--secret-file" in args and "--connect" in args
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run"] + args[1:],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture(scope="module")
def mk():
    k = Kernel()
    k.run("%load_ext ddp_magic").ok()
    yield k
    k.shutdown()


def test_two_nodes_all_reduce_and_results(mk):
    node = OtherNode()
    try:
        t0 = time.monotonic()
        ex = mk.run(
            "%%ddp -n 4 --nnodes 2 --join-timeout 90\nimport os, torch, torch.distributed as dist\n"
            "x = torch.ones(1) * dist.get_rank()\ndist.all_reduce(x)\n"
            "print('node', os.environ['GROUP_RANK'], 'local', os.environ['LOCAL_RANK'])\n"
            "(int(os.environ['RANK']), int(os.environ['GROUP_RANK']), int(os.environ['LOCAL_RANK']), x.item())",
            timeout=150,
            on_stream=node,
        ).ok()
        print(f"two-node pool started and ran in {time.monotonic() - t0:.1f}s")
        assert "On the other node, run" in ex.stdout  # a notice: stdout
        values = mk.value("[tuple(v) for v in _]")
        assert [v[0] for v in values] == [0, 1, 2, 3]
        assert all(v[3] == 6.0 for v in values)  # the all_reduce spanned both nodes
        assert sorted({v[1] for v in values}) == [0, 1]
        for rank, node_rank, local_rank, _ in values:
            assert rank == node_rank * 2 + local_rank  # consistent with torchrun's numbering
        assert "[rank 3] node 1 local 1" in ex.stdout
        for _ in range(2):  # %ddp stacks on torchrun's ranks too, both nodes': the same control channel answers it
            stacks = mk.run("%ddp stacks", timeout=60).ok().stdout
            assert stacks.startswith("4 ranks in 1 stack") and "--- ranks 0-3 (4) ---" in stacks, stacks
        # The secret is a file path in argv, never the secret itself.
        secret = mk.value("get_ipython().magics_manager.registry['DDPMagics'].pool.secret.hex()")
        assert secret not in ex.stderr and secret not in ex.stdout
        # A node that dies mid-cell is reported like dead ranks.
        t1 = time.monotonic()
        ex = mk.run(
            "%%ddp\nimport time\nif dist.get_rank() >= 2:\n    print('node 1 working', flush=True)\ntime.sleep(60)\nprint('slept', flush=True)",
            timeout=90,
            interrupt_after=None,
            on_stream=lambda n, t: node.kill() if "node 1 working" in t else None,
        )
        print(f"node death reported in {time.monotonic() - t1:.1f}s")
        assert ex.error is not None and "slept" not in ex.stdout, "reported while node 0's ranks still slept"
        assert "lost its connection to the kernel" in ex.error[1] and ("rank 2" in ex.error[1] or "rank 3" in ex.error[1])
    finally:
        node.kill()
        mk.run("%ddp stop", timeout=60)


def test_node_that_never_joins_times_out_clearly(mk):
    t0 = time.monotonic()
    ex = mk.run("%%ddp -n 4 --nnodes 2 --join-timeout 6\n1", timeout=60)
    took = time.monotonic() - t0
    assert ex.error is not None and ex.error[0] == "StartError"
    assert "never joined the rendezvous" in ex.error[1] and "Run the command printed above" in ex.error[1]
    assert took >= 6, "it waited out the join timeout first"
    kids = lambda: [p for p in os.listdir("/proc") if p.isdigit() and _is_child_of(int(p), mk.pid)]  # noqa: E731
    assert wait_until(lambda: kids() == [], 10), "the waiting torchrun agent was left behind"


def test_bad_node_count():
    from ddp_magic.errors import PlanError
    from ddp_magic.kernel.pool import Pool

    with pytest.raises(PlanError, match="split evenly"):
        Pool(3, nnodes=2)


def _is_child_of(pid: int, parent: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1]) == parent
    except (OSError, ValueError, IndexError):
        return False
