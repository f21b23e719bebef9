"""A module's skeleton (procs/rank_snapshot_objects.py) comes back with what its state dict does not hold: DCP and a
heal fill only the state, so a non-persistent buffer (a positional table, a mask) or a plain tensor attribute has to
travel in the skeleton itself. It came back as uninitialised memory before."""
from __future__ import annotations

import math
import pickle

import torch

from ddp_magic.procs import rank_snapshot_objects as O


class PositionalEncoding(torch.nn.Module):
    """The official tutorial's shape: its table a buffer that is not saved (``persistent=False``)."""

    def __init__(self, d_model: int, max_len: int = 16) -> None:
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(position * div_term)
        pe[:, 0, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe, persistent=False)
        self.proj = torch.nn.Linear(d_model, d_model)
        self.head = torch.nn.Linear(d_model, d_model)
        self.head.weight = self.proj.weight  # tied
        self.register_buffer("seen", torch.zeros(1))  # persistent: DCP fills it
        self.scale = torch.full((3,), 0.5, dtype=torch.bfloat16)  # a plain attribute


def test_a_skeleton_keeps_what_the_state_does_not_hold_and_placeholders_for_what_it_does():
    model = PositionalEncoding(8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    blob, problems = O.skeletons({"model": model}, {"opt": opt})
    assert problems == {}
    back = pickle.loads(blob)["modules"]["model"]["module"]
    assert torch.equal(back.pe, model.pe) and not back.pe.requires_grad
    assert back.scale.dtype == torch.bfloat16 and torch.equal(back.scale, model.scale)
    assert back.head.weight is back.proj.weight, "tied weights stay tied"
    assert "pe" not in back.state_dict() and set(back.state_dict()) == set(model.state_dict())
    assert back.proj.weight.data_ptr() != model.proj.weight.data_ptr()  # a placeholder of its own, for DCP to fill


def test_a_skeleton_of_a_ddp_module_keeps_its_inner_modules_buffer(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(PositionalEncoding(4))
        blob, _ = O.skeletons({"model": ddp}, {})
        item = pickle.loads(blob)["modules"]["model"]
        assert item["ddp"] is not None and torch.equal(item["module"].pe, ddp.module.pe)
    finally:
        dist.destroy_process_group()


def test_a_background_saves_share_is_a_copy_and_nothing_is_pinned_without_a_gpu():
    """procs/rank_snapshot_bg.py's staging on CPUs: every tensor a copy of its own (the training goes on writing the
    original), values deep-copied, nothing counted as pinned."""
    from ddp_magic.procs import rank_snapshot_bg as bg

    weight = torch.ones(4, 4)
    tree = {"model": {"w": weight, "cfg": {"lr": [0.1]}}}
    got = bg.share(tree, {"model"}, rank=0, world=1)
    weight.add_(1)
    assert torch.equal(got["model.w"], torch.ones(4, 4)) and got["model.w"].data_ptr() != weight.data_ptr()
    assert bg.WRITER.pinned == 0
