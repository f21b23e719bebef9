"""Code shaped like the published PyTorch examples runs unchanged in %%ddp cells, and runs again.

The scripts below are written in the style of the official DDP / FSDP2 examples and the
"Writing Distributed Applications" tutorial (their own init_process_group and
destroy_process_group, argparse, ``if __name__ == "__main__"``, sys.exit), with the
device lines for CPU. Each is run more than once, the way a notebook user does.
"""
from __future__ import annotations

import re
from typing import Iterator

import pytest

from kernel_helper import Kernel

pytestmark = pytest.mark.kernel

PG_TIMEOUT = 6  # seconds: short, so a collective on a sub-group with a missing peer fails fast


@pytest.fixture(scope="module")
def k2() -> Iterator[Kernel]:
    k = Kernel()
    k.run("%load_ext ddp_magic").ok()
    k.run(f"%%ddp -n 2 --pg-timeout {PG_TIMEOUT}\nimport torch, torch.distributed as dist\n", timeout=180).ok()
    yield k
    k.shutdown()


def _agree(k: Kernel, expr: str) -> list:
    """``expr`` on every rank; the ranks agree."""
    k.run("%%ddp\n" + expr).ok()
    values = k.value("[v if not hasattr(v, 'tolist') else v.tolist() for v in _]")
    assert all(v == values[0] for v in values), values
    return values


DDP_SCRIPT = '''
import os
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(rank, world_size):
    os.environ.setdefault("MASTER_ADDR", "localhost")
    dist.init_process_group("{backend}", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(rank, world_size):
    print(f"Running basic DDP example on rank {{rank}}.")
    setup(rank, world_size)
    torch.manual_seed(0)
    model = ToyModel()
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    torch.manual_seed(rank)
    for _ in range(3):
        optimizer.zero_grad()
        loss_fn(ddp_model(torch.randn(20, 10)), torch.randn(20, 5)).backward()
        optimizer.step()
    checksum = sum(p.sum().item() for p in ddp_model.parameters())
    cleanup()
    print(f"Finished running basic DDP example on rank {{rank}}.")
    return round(checksum, 6)


if __name__ == "__main__":
    checksum = demo_basic(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
'''


def test_script_ending_in_destroy_runs_three_times_then_a_plain_cell(k2):
    sums = []
    for run in range(3):
        ex = k2.run("%%ddp\n" + DDP_SCRIPT.format(backend="gloo")).ok()
        assert "[rank 1] Finished running basic DDP example on rank 1." in ex.stdout
        assert ("destroy_process_group(): deferred" in ex.stderr) == (run == 0)  # said once
        assert "init_process_group()" not in ex.stderr  # same backend, rank and size: nothing ignored
        sums.append(_agree(k2, "checksum")[0])  # parameters agree across ranks
    assert sums[0] == sums[1] == sums[2]  # a re-run behaves like the first run
    assert _agree(k2, "t = torch.ones(1) * (dist.get_rank() + 1)\ndist.all_reduce(t)\nt.item()") == [3.0, 3.0]
    ex = k2.run("%ddp_env --json").ok()
    assert "'initialised': True" in (ex.result or "")


def test_setup_asking_for_nccl_on_cpu_runs_twice(k2):
    for _ in range(2):
        ex = k2.run("%%ddp\n" + DDP_SCRIPT.format(backend="nccl")).ok()
        notices = [ln for ln in ex.stderr.splitlines() if "init_process_group()" in ln]
        assert len(notices) == 1, ex.stderr  # one notice per cell, not per rank
        assert notices[0].startswith("[rank 0] ddp_magic: init_process_group(): the process group is already initialised with gloo")
        assert "ignored backend='nccl'" in notices[0] and "rank=" not in notices[0]
        _agree(k2, "checksum")


FSDP2_SCRIPT = '''
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class MLP(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.in_proj = nn.Linear(dim, 4 * dim)
        self.out_proj = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.out_proj(torch.relu(self.in_proj(x)))


def main():
    device = torch.device("cpu")
    dist.init_process_group(backend="gloo", device_id=device)
    torch.manual_seed(0)
    model = MLP()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    fully_shard(model.in_proj, mesh=mesh)
    fully_shard(model.out_proj, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(1 + dist.get_rank())
    x = torch.randn(8, 16)
    for _ in range(3):
        loss = model(x).pow(2).mean()
        loss.backward()
        optim.step()
        optim.zero_grad()
    full = {name: t.full_tensor() for name, t in model.state_dict().items()}
    dist.destroy_process_group()
    return round(sum(t.sum().item() for t in full.values()), 5)


if __name__ == "__main__":
    total = main()
'''


def test_fsdp2_with_a_cpu_device_id_runs_twice(k2):
    totals = []
    for _ in range(2):
        ex = k2.run("%%ddp\n" + FSDP2_SCRIPT, timeout=240).ok()
        notices = [ln for ln in ex.stderr.splitlines() if "init_process_group()" in ln]
        assert len(notices) == 1 and "ignored device_id=cpu" in notices[0], ex.stderr
        totals.append(_agree(k2, "total")[0])  # the full weights agree across ranks
    assert totals[0] == totals[1]


def test_sub_groups_inherit_the_pools_timeout(k2):
    """new_group and a device mesh's groups get --pg-timeout, not torch's 30 minutes."""
    ex = k2.run(
        "%%ddp\nfrom datetime import timedelta\nfrom torch.distributed.device_mesh import init_device_mesh\n"
        "def timeout_of(group):\n"
        "    return group._get_backend(torch.device('cpu')).options._timeout.total_seconds()\n"
        "pair = dist.new_group([0, 1])\n"
        "own = dist.new_group([0, 1], timeout=timedelta(seconds=42))\n"
        "mesh = init_device_mesh('cpu', (1, 2), mesh_dim_names=('dp', 'tp'))\n"
        "(timeout_of(pair), timeout_of(own), timeout_of(mesh.get_group('dp')))"
    ).ok()
    assert k2.value("[tuple(v) for v in _]") == [(PG_TIMEOUT, 42.0, PG_TIMEOUT)] * 2, ex.stderr
    # And it holds: a collective on the sub-group with a peer that never comes fails after
    # --pg-timeout with torch's own error, long before the cell's --timeout.
    ex = k2.run("%%ddp --timeout 120\nif dist.get_rank() == 0:\n    dist.all_reduce(torch.ones(1), group=pair)\n", timeout=180)
    assert ex.error is not None
    assert "rank 0 raised" in ex.error[1] and "ran past --timeout" not in ex.error[1], ex.error[1]
    assert re.search(r"[Tt]imed? ?out", ex.error[1]), ex.error[1]
    assert _agree(k2, "t = torch.ones(1)\ndist.all_reduce(t)\nt.item()") == [2.0, 2.0]  # the pool's group is fine


def test_group_destroyed_around_the_deferral_is_re_formed(k2):
    for _ in range(2):
        k2.run("%%ddp\ndist.destroy_process_group.__wrapped__()  # torch's own: really gone\n").ok()
        ex = k2.run("%%ddp\nt = torch.ones(1)\ndist.all_reduce(t)\n(dist.is_initialized(), t.item())").ok()
        assert k2.value("[tuple(v) for v in _]") == [(True, 2.0), (True, 2.0)]
        assert ex.stderr.count("re-formed it") == 1, ex.stderr


TORCHRUN_ERA = '''
import argparse, os

def parse_args():
    parser = argparse.ArgumentParser(description="toy trainer")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1)
    return parser.parse_args()

args = parse_args()
(args.epochs, args.lr, int(os.environ["LOCAL_RANK"]))
'''

LAUNCH_ERA = '''
import argparse

parser = argparse.ArgumentParser()
parser.add_argument("--local-rank", "--local_rank", type=int, default=-1)
parser.add_argument("--batch-size", type=int, default=32)
args = parser.parse_args()
(args.local_rank, args.batch_size)
'''


def test_argparse_scripts_of_both_eras_run_without_argv(k2):
    for _ in range(2):
        k2.run("%%ddp\n" + TORCHRUN_ERA).ok()
        assert k2.value("[tuple(v) for v in _]") == [(2, 0.1, 0), (2, 0.1, 1)]
        k2.run("%%ddp\n" + LAUNCH_ERA).ok()
        assert k2.value("[tuple(v) for v in _]") == [(0, 32), (1, 32)]
    k2.run('%%ddp --argv "--epochs 5"\n' + TORCHRUN_ERA).ok()
    assert k2.value("[tuple(v) for v in _]") == [(5, 0.1, 0), (5, 0.1, 1)]
    k2.run("%%ddp\nimport sys\nsys.argv").ok()
    assert k2.value("list(_)") == [["ddp_cell"], ["ddp_cell"]]  # torchrun's convention: no arguments


def test_argparse_error_says_how_to_pass_arguments(k2):
    for _ in range(2):
        ex = k2.run('%%ddp --argv "--epochs five"\n' + TORCHRUN_ERA)
        assert ex.error is not None and ex.error[0] == "CellError"
        assert "exit code 2 from argparse" in ex.error[1] and '%%ddp --argv "' in ex.error[1], ex.error[1]
        assert "Traceback" not in ex.error[1]
        assert "invalid int value: 'five'" in ex.stderr


def test_newest_definition_wins(k2):
    k2.run(
        "%%ddp\ndef run(rank, size):\n    return f'v1 on {rank}'\n\n"
        "def main():\n    return run(dist.get_rank(), dist.get_world_size())\n\nmain()"
    ).ok()
    assert k2.value("list(_)") == ["v1 on 0", "v1 on 1"]
    k2.run("def run(rank, size):\n    return f'v2 on {rank} of {size}'").ok()  # an ordinary cell, as the tutorial does
    ex = k2.run("%%ddp\nrun(dist.get_rank(), dist.get_world_size())").ok()
    assert k2.value("list(_)") == ["v2 on 0 of 2", "v2 on 1 of 2"]
    assert ex.stdout.count("newest definition wins") == 1 and "newest" not in ex.stderr  # a notice: stdout
    k2.run("%%ddp\nmain()").ok()  # the workers' own function calls the new one too
    assert k2.value("list(_)") == ["v2 on 0 of 2", "v2 on 1 of 2"]
    k2.run("def run(rank, size):\n    return 'v3'").ok()
    ex = k2.run("%%ddp\nmain()").ok()
    assert k2.value("list(_)") == ["v3", "v3"] and "newest definition wins" not in ex.stdout + ex.stderr  # said once
    k2.run("%%ddp\ndef run(rank, size):\n    return 'v4'").ok()  # the reverse is as before: the workers' is newest
    k2.run("%%ddp\nmain()").ok()
    assert k2.value("list(_)") == ["v4", "v4"]
    assert k2.value("run(0, 2)") == "v3"


def test_sys_exit_zero_is_a_normal_end_and_nonzero_a_failure(k2):
    script = "import sys\n\ndef main():\n    print('training done')\n    sys.exit({code})\n\nif __name__ == '__main__':\n    main()\n"
    for code in ("0", "", "0"):
        ex = k2.run("%%ddp\n" + script.format(code=code)).ok()
        assert "[rank 1] training done" in ex.stdout and ex.result is None
    for _ in range(2):
        ex = k2.run("%%ddp\n" + script.format(code="3"))
        assert ex.error is not None and ex.error[0] == "CellError"
        assert re.match(r"rank [01] raised SystemExit: sys\.exit\(3\): the cell ended with exit code 3", ex.error[1]), ex.error[1]
        assert "Traceback" not in ex.error[1] and "[rank 0] training done" in ex.stdout
    assert _agree(k2, "dist.get_world_size()") == [2, 2]  # the pool is fine


def test_a_warning_on_four_ranks_is_shown_once(k2):
    code = (
        "%%ddp{n}\nimport warnings\nimport torch.distributed as dist\ndist.barrier()\n"
        "warnings.warn('pin_memory is set but no accelerator is found ({run})')\nprint('rank', dist.get_rank())"
    )
    for run, n in enumerate((" -n 4", "")):  # (a warning's text and line shows once per process, as in Python)
        ex = k2.run(code.format(n=n, run=run), timeout=240).ok()
        lines = [ln for ln in ex.stderr.splitlines() if "UserWarning: pin_memory" in ln]
        assert len(lines) == 1 and lines[0].startswith("[ranks 0-3] "), ex.stderr
        assert all(f"[rank {r}] rank {r}" in ex.stdout for r in range(4))  # stdout stays per rank
