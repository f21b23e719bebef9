"""Every code pattern of the seed article (shared/SEED.md) runs unchanged in a %%ddp -n 2 cell (gloo, CPU)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.kernel


def test_1_print_env(ddp2):
    ex = ddp2.run(
        "%%ddp\nimport os\n"
        'print(f"MASTER_ADDR={os.environ[\'MASTER_ADDR\']} MASTER_PORT={os.environ[\'MASTER_PORT\']} '
        'WORLD_SIZE={os.environ[\'WORLD_SIZE\']} RANK={os.environ[\'RANK\']}")'
    ).ok()
    assert "[rank 0] MASTER_ADDR=127.0.0.1" in ex.stdout and "WORLD_SIZE=2 RANK=1" in ex.stdout


def test_2_legacy_local_rank_argparse(ddp2):
    ex = ddp2.run(
        "%%ddp\nimport argparse, torch\n"
        "parser = argparse.ArgumentParser()\n"
        'parser.add_argument("--local_rank", type=int, default=0)\n'
        "args = parser.parse_args()\n"
        "model = torch.nn.Linear(4, 2)\n"
        'device = f"cuda:{args.local_rank}" if torch.cuda.is_available() else "cpu"\n'
        "model = model.to(device)\n"
        "print('local rank', args.local_rank, 'on', device)\n"
        "args.local_rank"
    ).ok()
    assert ddp2.value("list(_)") == [0, 1]
    assert "[rank 1] local rank 1 on cpu" in ex.stdout


def test_3_init_and_query_unchanged(ddp2):
    # The tutorial calls init_process_group itself (with nccl); on this CPU machine the
    # pool's gloo group is kept, with one notice, and the code runs unchanged.
    ex = ddp2.run(
        "%%ddp\nimport torch.distributed as dist\n"
        "dist.init_process_group(backend='nccl')\n"
        "world_size = dist.get_world_size()\n"
        "print('world size', world_size)\nworld_size"
    ).ok()
    assert ddp2.value("list(_)") == [2, 2]
    assert "already initialised with gloo" in ex.stderr


def test_4_free_port_helper(ddp2):
    ddp2.run(
        "%%ddp\nimport socket\n"
        "def find_free_port():\n"
        "    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:\n"
        "        s.bind(('', 0))\n"
        "        return s.getsockname()[1]\n"
        "find_free_port() > 0"
    ).ok()
    assert ddp2.value("list(_)") == [True, True]


def test_5_backend_choice(ddp2):
    ddp2.run("%%ddp\nimport torch\nbackend = 'nccl' if torch.cuda.is_available() else 'gloo'\n(backend, dist.get_backend())").ok()
    assert ddp2.value("[tuple(v) for v in _]") == [("gloo", "gloo"), ("gloo", "gloo")]


GATHER = (
    "import torch, torch.distributed as dist\n"
    "def gather_tensors(tensor):\n"
    "    tensors_gather = [torch.zeros_like(tensor) for _ in range(dist.get_world_size())]\n"
    "    dist.all_gather(tensors_gather, tensor)\n"
    "    return tensors_gather\n"
)


def test_6_gather_tensors(ddp2):
    ddp2.run("%%ddp\n" + GATHER + "gathered = gather_tensors(torch.tensor([float(dist.get_rank())]))\ntorch.cat(gathered)").ok()
    assert ddp2.value("[v.tolist() for v in _]") == [[0.0, 1.0], [0.0, 1.0]]


def test_7_distributed_embedding(ddp2):
    ddp2.run(
        "%%ddp\n" + GATHER + "import torch.nn as nn\n"
        "class DistributedEmbedding(nn.Module):\n"
        "    def __init__(self, num_embeddings, embedding_dim):\n"
        "        super().__init__()\n"
        "        self.embedding = nn.Embedding(num_embeddings, embedding_dim)\n"
        "    def forward(self, x):\n"
        "        local = self.embedding(x)\n"
        "        return torch.cat(gather_tensors(local), dim=0)\n"
        "torch.manual_seed(dist.get_rank())\n"
        "emb = DistributedEmbedding(10, 4)\n"
        "with torch.no_grad():\n"
        "    out = emb(torch.tensor([1, 2, 3]))\n"
        "out.shape"
    ).ok()
    assert ddp2.value("[tuple(v) for v in _]") == [(6, 4), (6, 4)]


def test_8_validate_env(ddp2):
    ex = ddp2.run(
        "%%ddp\nimport os, torch.distributed as dist\n"
        "def validate_env():\n"
        "    required = ['MASTER_ADDR', 'MASTER_PORT', 'WORLD_SIZE', 'RANK']\n"
        "    missing = [var for var in required if var not in os.environ]\n"
        "    if missing:\n"
        "        raise RuntimeError(f'Missing env vars: {missing}')\n"
        "    dist.init_process_group(backend='gloo')\n"
        "    print(f\"Rank {dist.get_rank()}/{dist.get_world_size()} initialised\")\n"
        "validate_env()"
    ).ok()
    assert "[rank 0] Rank 0/2 initialised" in ex.stdout and "[rank 1] Rank 1/2 initialised" in ex.stdout
    assert "already initialised" not in ex.stderr  # same backend: silently kept


def test_9_nccl_debug_env_reaches_workers(kernel):
    # NCCL itself needs GPUs; what we can check here is that the settings reach every rank.
    kernel.run("import os\nos.environ['NCCL_DEBUG'] = 'INFO'\nos.environ['NCCL_DEBUG_SUBSYS'] = 'COLL'").ok()
    kernel.run("%%ddp -n 2 --restart\nimport os\n(os.environ.get('NCCL_DEBUG'), os.environ.get('NCCL_DEBUG_SUBSYS'))").ok()
    assert kernel.value("[tuple(v) for v in _]") == [("INFO", "COLL"), ("INFO", "COLL")]
    kernel.run("del os.environ['NCCL_DEBUG'], os.environ['NCCL_DEBUG_SUBSYS']").ok()


def test_10_gradient_accumulation_and_11_bucket_view(ddp2):
    ex = ddp2.run(
        "%%ddp\nimport torch, torch.nn as nn, torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "torch.manual_seed(0)\n"
        "model = DDP(nn.Linear(8, 1), gradient_as_bucket_view=True)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "criterion = nn.MSELoss()\n"
        "accumulation_steps = 4\n"
        "g = torch.Generator().manual_seed(dist.get_rank())\n"
        "steps = 0\n"
        "for i in range(8):\n"
        "    inputs, targets = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)\n"
        "    outputs = model(inputs)\n"
        "    loss = criterion(outputs, targets) / accumulation_steps\n"
        "    loss.backward()\n"
        "    if (i + 1) % accumulation_steps == 0:\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad()\n"
        "        steps += 1\n"
        "print('optimizer steps', steps)\n"
        "torch.cat([p.detach().flatten() for p in model.parameters()])"
    ).ok()
    assert "[rank 0] optimizer steps 2" in ex.stdout
    # DDP keeps replicas identical: the weights gathered from both ranks are equal.
    assert ddp2.value("bool((_[0] == _[1]).all())") is True
