"""FSDP2 (``fully_shard``) modules in a snapshot: a plain skeleton, and the plan to shard it again on the pool's ranks.

A fully_shard module is an instance of a class FSDP2 made (``FSDPLinear``: FSDPModule, then Linear), with hooks bound
to its FSDP state, which holds process groups: it cannot be pickled as it is. Its skeleton is the original class with
FSDP's hooks and marks left out, and its sharded parameters as meta placeholders of their full shapes (no memory). The
plan names the modules fully_shard was called on, children first, with their options. A load builds the skeleton,
calls fully_shard on the same modules in the same order on a 1-D mesh of the pool's ranks, allocates each rank's
shards, and DCP fills them (resharded where the world size changed). FSDP2's internals this reads are private: a torch
whose differ gets the note and ``--into``, never a wrong module.
"""
from __future__ import annotations

import sys
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

MARKS = ("_is_fsdp_managed_module", "_fsdp_use_orig_params")  # what fully_shard sets on the modules it manages
COMPOSABLE = "__composable_api_state_key"  # torch.distributed._composable.contract's key in a module's __dict__


def fsdp_class() -> Optional[type]:
    """FSDPModule, if this rank imported FSDP2 (only such a rank can hold one: the import is not made here, it costs 1.5 s)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return getattr(fsdp, "FSDPModule", None) if fsdp is not None else None


def is_sharded(obj: Any) -> bool:
    cls = fsdp_class()
    return cls is not None and isinstance(obj, cls)


def managed(obj: Any) -> bool:
    """A module fully_shard sharded or manages (its state-dict hooks hold FSDP's state too): pickled by plain_reduce."""
    return is_sharded(obj) or (isinstance(obj, torch.nn.Module) and bool(obj.__dict__.get(MARKS[0])))


def is_dtensor(obj: Any) -> bool:
    return type(obj).__name__ == "DTensor"


def _fsdp_hook(hook: Any) -> bool:
    """A hook of FSDP's own: a method of its state, a function of its param groups, either wrapped (_WrappedHook)."""
    fn = getattr(hook, "hook", hook)
    fn = getattr(fn, "__func__", getattr(fn, "func", fn))
    return str(getattr(fn, "__module__", "")).startswith("torch.distributed")


def _plain(cls: Any, state: Dict[str, Any]) -> torch.nn.Module:
    module = cls.__new__(cls)
    module.__dict__.update(state)
    return module


def plain_reduce(module: torch.nn.Module) -> Tuple[Any, Tuple[type, Dict[str, Any]]]:
    """How a skeleton pickles a module fully_shard sharded or manages: as its original class, without FSDP's hooks
    and marks."""
    cls = type(module)
    original = cls.__mro__[getattr(cls, "_orig_cls_mro_index", 2)] if is_sharded(module) else cls  # FSDPLinear -> Linear
    state: Dict[str, Any] = {}
    for key, value in module.__dict__.items():
        if key in MARKS or key.startswith(COMPOSABLE):  # the composable API's registry: fully_shard -> its FSDPState
            continue
        if "hooks" in key and isinstance(value, OrderedDict):
            value = OrderedDict((i, h) for i, h in value.items() if not _fsdp_hook(h))
        state[key] = value
    return _plain, (original, state)


def plan(module: torch.nn.Module) -> List[Dict[str, Any]]:
    """The fully_shard calls that made ``module``, children first (the order FSDP2 needs); ValueError: not redoable."""
    cls = fsdp_class()
    steps = []
    for fqn, sub in module.named_modules():
        if cls is None or not isinstance(sub, cls):
            continue
        try:
            state = sub._get_fsdp_state()  # type: ignore[attr-defined]
            group = state._fsdp_param_group
            mesh = group.mesh_info.mesh if group is not None else None
            auto = state._auto_reshard_after_forward
            reshard = None if auto else (group is not None and group.post_forward_mesh_info is not None)
            offload = getattr(group, "offload_policy", None)
            mp = state._mp_policy
        except AttributeError as e:
            raise ValueError(f"this torch's FSDP2 differs from what ddp_magic reads ({e})") from None
        if mesh is not None and mesh.ndim != 1:
            raise ValueError(f"it was sharded on a {mesh.ndim}-D mesh (HSDP); only a 1-D mesh of every rank is made again")
        if mesh is not None and mesh.size() != dist.get_world_size():
            raise ValueError(f"it was sharded on a mesh of {mesh.size()} of the {dist.get_world_size()} ranks")
        steps.append({"fqn": fqn, "reshard_after_forward": reshard, "mp_policy": mp,
                      "offload_policy": offload if type(offload).__name__ != "OffloadPolicy" else None})
    steps.sort(key=lambda s: -(s["fqn"].count(".") + 1 if s["fqn"] else 0))  # deepest first, the root last
    return steps


def shard_again(module: torch.nn.Module, steps: List[Dict[str, Any]]) -> torch.nn.Module:
    """fully_shard on the same modules in the same order, on a 1-D mesh of this pool's ranks; each rank's shards
    allocated (uninitialised: DCP fills them next)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    cuda = "nccl" in str(dist.get_backend()) and torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for step in steps:
        options = {k: step[k] for k in ("reshard_after_forward", "mp_policy", "offload_policy") if step.get(k) is not None}
        fully_shard(module.get_submodule(step["fqn"]), mesh=mesh, **options)
    return module.to_empty(device=device)
