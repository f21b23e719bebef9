"""A rank started again alone, brought up to the others before the next cell: its imports, and every name the healthy ranks agree on.

The kernel runs ``heal`` on every rank right after the new process joined the re-formed group, before the user's
next cell (kernel/failures/heal.py). Each healthy rank fingerprints the names the workers own: an import by its
module, a module or optimizer by a hash of its state, any other value by a hash of its pickle. The fingerprints are
gathered, and every rank reads the same verdict from them: a name equal on every healthy rank is copied from the
lowest of them (the donor) to each new rank over the process group, through the snapshots' machinery
(procs/rank_snapshot_objects.py: a module's skeleton and its state, DDP's own options, an optimizer over the rebuilt
module's parameters, values with references to them). A name that differs by rank (a loss, a data iterator's
position), that a healthy rank lacks, or that cannot be pickled is named with why; never dropped silently.
A new DDP wrapper is made with ``init_sync=False``: its weights are the donor's already, so no survivor takes part.
Its gradient buckets are then laid out as rank 0's on every rank (``_align_buckets``): a survivor's reducer keeps the
layout its training rebuilt, a new one starts from the parameters' order, and one all_reduce over two layouts adds
up gradients of different parameters.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import pickle
import sys
import threading
import time
import types
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from ..logs import log
from ..wire import snapshot as S
from . import rank_heal_send, rank_rng
from . import rank_snapshot_objects as O
from .rank_snapshot_digest import digest

DDP = torch.nn.parallel.DistributedDataParallel


SURE = "same on every rank by construction; "  # a fingerprint's mark: one healthy rank's word is enough for it


def fingerprints(ns: Dict[str, Any], names: Sequence[str]) -> Dict[str, str]:
    """Each of ``names`` this rank has, as a string equal on two ranks only where the two hold the same thing. Marked
    SURE where the kind itself makes it the same on every rank: an import, a function or class, a DDP module (DDP keeps
    its replicas equal), an optimizer of one, and a scheduler of such an optimizer."""
    found = O.sort_names(ns, list(names))
    out = {n: f"{SURE}import {m}" for n, m in found.imports.items()}
    synced = {id(m) for m in found.modules.values() if _ddp_kind(m) == "yes"}
    for name, module in found.modules.items():
        sure = SURE if id(module) in synced else ""
        out[name] = f"{sure}module {type(O.inner(module)).__qualname__} ddp={_ddp_kind(module)} {digest(O.inner(module).state_dict())[0]}"
    stepped = set()
    for name, opt in found.optimizers.items():
        owner = next((m for m in found.modules.values() if {id(p) for g in opt.param_groups for p in g["params"]} <= {id(p) for p in m.parameters()}), None)
        sure = SURE if owner is not None and id(owner) in synced else ""
        stepped |= {id(opt)} if sure else set()
        out[name] = f"{sure}optimizer {type(opt).__qualname__} {digest(opt.state_dict())[0]}"
    _, sizes, unpicklable = O.pickle_values(found.values, O.references(found.modules, found.optimizers), ns)
    for name, (_size, value_print) in sizes.items():
        value = found.values[name]
        if isinstance(value, (types.FunctionType, type)):  # its pickle differs by process (cloudpickle's class ids)
            out[name] = f"{SURE}code {_code_digest(value)}"
        else:
            out[name] = f"{SURE if id(getattr(value, 'optimizer', None)) in stepped else ''}value {value_print}"
    out.update({n: f"unpicklable {why}" for n, why in unpicklable.items()})
    return out


def _code_digest(value: Any) -> str:
    """A function's or class's code, the same on two ranks that ran the same cell: names, bytecode, constants."""
    h = hashlib.sha256(f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', '')}".encode())
    functions = [value] if isinstance(value, types.FunctionType) else [v for _k, v in sorted(vars(value).items()) if isinstance(v, types.FunctionType)]
    for fn in functions:
        code = fn.__code__
        h.update(code.co_code + repr((code.co_names, code.co_varnames, [c for c in code.co_consts if not isinstance(c, types.CodeType)])).encode())
    if isinstance(value, type):
        h.update(repr(sorted(vars(value))).encode() + repr([b.__qualname__ for b in value.__mro__]).encode())
    return h.hexdigest()


def _ddp_kind(module: torch.nn.Module) -> str:
    """How a module is wrapped, for the verdict: "no", "yes", or why a new rank could not wrap it the same way."""
    options = O.ddp_options(module)
    if options is None:
        return "no"
    if options.get("_comm_hooks") or options.get("_own_group"):
        return "unwrappable (a DDP wrapper with a communication hook or a process group of its own: wrap it again in a cell)"
    if "init_sync" not in inspect.signature(DDP.__init__).parameters:
        return "unwrappable (a DDP wrapper needs torch 2.4 or later here: wrap it again in a cell)"
    return "yes"


def verdict(everyone: Sequence[Dict[str, str]], healthy: Sequence[int], names: Sequence[str]) -> Tuple[List[str], Dict[str, str]]:
    """The names to copy (equal on every healthy rank; with one healthy rank, only those SURE), and the others with
    why, the same on every rank."""
    copy: List[str] = []
    lost: Dict[str, str] = {}
    for name in sorted(names):
        prints = [everyone[r].get(name) for r in healthy]
        if all(p is None for p in prints):
            continue  # no rank holds it (a name a failed cell never set)
        lacking = [r for r, p in zip(healthy, prints) if p is None]
        if lacking:
            lost[name] = f"rank {lacking[0]} lacks it too"
        elif any(p.startswith("unpicklable ") for p in prints if p):
            lost[name] = (prints[0] or "")[len("unpicklable "):]
        elif " ddp=unwrappable (" in (prints[0] or ""):
            lost[name] = (prints[0] or "").split("ddp=unwrappable (", 1)[1].rsplit(")", 1)[0]
        elif len(set(prints)) > 1:
            lost[name] = "it differs by rank"
        elif len(healthy) == 1 and not (prints[0] or "").startswith(SURE):
            lost[name] = f"only rank {healthy[0]} kept its names, so whether it differs by rank cannot be told"
        else:
            copy.append(name)
    return copy, lost


def payload(ns: Dict[str, Any], copy: Sequence[str]) -> Dict[str, Any]:
    """What the donor sends: the imports, the skeletons and states of modules and optimizers, the values' pickles."""
    found = O.sort_names(ns, list(copy))
    blob, problems = O.skeletons(found.modules, found.optimizers)
    for name in problems:
        del found.optimizers[name]
    values, _sizes, unpicklable = O.pickle_values(found.values, O.references(found.modules, found.optimizers), ns)
    states = {n: O.inner(m).state_dict() for n, m in found.modules.items()}  # its tensors sent as they are (_send)
    states.update({n: o.state_dict() for n, o in found.optimizers.items()})
    return {"imports": found.imports, "skeletons": blob, "states": states, "values": values, "lost": {**problems, **unpicklable}}


def _wrap(module: torch.nn.Module, options: Dict[str, Any]) -> torch.nn.Module:
    """DDP again with the donor's options, without the init's collectives (the survivors are not in this call; the
    verdict copied no wrapper a new rank cannot make so)."""
    device_ids = [torch.cuda.current_device()] if next(module.parameters(), torch.empty(0)).is_cuda else None
    return DDP(module, device_ids=device_ids, init_sync=False, **options)


def adopt_state(module: torch.nn.Module, state: Dict[str, Any]) -> None:
    """The received tensors become the module's own (``load_state_dict(assign=True)``): no copy of the state into fresh
    memory, the heal's largest cost (on one host they are the pages of the donor's file, mapped). A tensor the module
    holds under two names (tied weights) is one tensor again after. Where they must move to another device (a GPU
    model), they are copied into the module's own tensors instead: a second copy on the GPU could not fit."""
    held = module.state_dict(keep_vars=True)
    if any(isinstance(v, torch.Tensor) and isinstance(held.get(k), torch.Tensor) and v.device != held[k].device for k, v in state.items()):
        module.load_state_dict(state)
        return
    first: Dict[int, str] = {}
    ties = []
    for key, value in held.items():
        if isinstance(value, torch.Tensor):
            if id(value) in first:
                ties.append((key, first[id(value)]))
            else:
                first[id(value)] = key
    module.load_state_dict(state, assign=True)
    for key, same_as in ties:
        owner, _, attr = key.rpartition(".")
        source, _, source_attr = same_as.rpartition(".")
        setattr(module.get_submodule(owner), attr, getattr(module.get_submodule(source), source_attr))


def take(ns: Dict[str, Any], got: Dict[str, Any]) -> Tuple[List[str], Dict[str, str]]:
    """Rebuild what the donor sent in this rank's namespace: the names set, and what could not be, with why."""
    lost: Dict[str, str] = dict(got["lost"])
    data = pickle.loads(got["skeletons"])
    modules: Dict[str, torch.nn.Module] = {}
    for name, item in data["modules"].items():
        if item["module"] is None:
            lost[name] = item["why"]
            continue
        adopt_state(item["module"], got["states"][name])
        modules[name] = _wrap(item["module"], dict(item["ddp"])) if item["ddp"] is not None else item["module"]
    optimizers = {}
    for name, skeleton in data["optimizers"].items():
        if skeleton["module"] not in modules:
            lost[name] = f"its module {skeleton['module']} was not copied"
            continue
        optimizers[name] = O.rebuild_optimizer(skeleton, modules)
        optimizers[name].load_state_dict(got["states"][name])
    before = dict(ns)
    values = O.unpickle_values(got["values"], {**modules, **optimizers}, ns)
    O.follow_schedulers(values)
    imports = {n: importlib.import_module(m) for n, m in got["imports"].items()}
    _undo_leaks(ns, before, {*imports, *modules, *optimizers, *values})
    for part in (imports, modules, optimizers, values):
        ns.update(part)
    return sorted([*imports, *modules, *optimizers, *values]), lost


def _undo_leaks(ns: Dict[str, Any], before: Dict[str, Any], copied: set) -> None:
    """A function's pickle carries the donor's values of the globals it reads, set into the namespace as it loads
    (cloudpickle): the donor's ``rank`` would become this rank's. Every name not copied is put back as it was."""
    for name in [n for n in ns if n not in copied and (n not in before or ns[n] is not before[n])]:
        if name in before:
            ns[name] = before[name]
        else:
            del ns[name]


def from_snapshot(ns: Dict[str, Any], path: Any, lost: Dict[str, str], rank: int, world: int) -> Dict[str, Any]:
    """This new rank's own values of the ``lost`` names, and its RNG states, from the last snapshot this kernel saved or
    loaded (this rank's file, at the same world size); they leave ``lost``. What came: {"names", "when"}, or {}."""
    if not path or not lost:
        return {}
    try:
        meta = S.Meta.read(str(path))
        if meta.world_size != world:
            return {}
        with open(os.path.join(str(path), S.rank_file(rank)), "rb") as f:
            record = pickle.load(f)
        objects = {n: v for n, v in ns.items() if isinstance(v, (torch.nn.Module, torch.optim.Optimizer))}
        before = dict(ns)
        values = O.unpickle_values(record["values"], objects, ns)
    except (OSError, ValueError, KeyError, pickle.UnpicklingError):  # gone, damaged, or it references what this rank lacks
        log.warning("healing rank %d: the snapshot %s could not be read", rank, path, exc_info=True)
        return {}
    wanted = {n: v for n, v in values.items() if n in lost}
    _undo_leaks(ns, before, set(wanted))
    ns.update(wanted)
    for name in wanted:
        del lost[name]
    rank_rng.set_rng_state(record["rng"])
    return {"names": sorted(wanted) + ["RNG states"], "when": time.strftime("%H:%M:%S", time.localtime(meta.time))}


def _align_buckets(ns: Dict[str, Any], copy: Sequence[str]) -> None:
    """Every copied DDP module's gradient buckets as rank 0 lays them out, on every rank (a collective each, in name order)."""
    for name in copy:
        module = ns.get(name)
        if isinstance(module, DDP) and module.reducer is not None:
            module.reducer._push_all_rebuilt_params()
            module.reducer._rebuild_buckets()  # a no-op where find_unused_parameters keeps the first layout (on every rank)
            module._has_rebuilt_buckets = True


def _warm_ddp(prints: Sequence[str]) -> Optional[threading.Thread]:
    """Where a DDP module is copied, the new rank imports torch._dynamo (DDP's constructor does: about 1 s of CPU in a
    process that never made one) on a thread while the donor's state is on its way, not after it."""
    if not any(" ddp=yes " in p for p in prints) or "torch._dynamo" in sys.modules:
        return None
    thread = threading.Thread(target=importlib.import_module, args=("torch._dynamo",), name="ddp_magic-heal-warm", daemon=True)
    thread.start()
    return thread


def heal(ns: Dict[str, Any], args: Dict[str, Any]) -> Dict[str, Any]:
    """This rank's part: fingerprint (a healthy rank), then send (the donor) or take (a new rank). Its report."""
    rank, world = dist.get_rank(), dist.get_world_size()
    fresh = set(args["fresh"])
    healthy = [r for r in range(world) if r not in fresh]
    # a new rank says what it has already (the pool's --mesh, made at its start): that stays its own
    mine = {n: "its own" for n in args["names"] if n in ns} if rank in fresh else fingerprints(ns, args["names"])
    everyone: List[Any] = [None] * world
    dist.all_gather_object(everyone, mine)
    own = {n for r in fresh for n in everyone[r]}
    copy, lost = verdict(everyone, healthy, [n for n in args["names"] if n not in own])
    donor = healthy[0]
    warming = _warm_ddp([everyone[donor].get(n, "") for n in copy]) if rank in fresh else None
    got = rank_heal_send.send(payload(ns, copy) if rank == donor else None, donor, sorted(fresh))
    report: Dict[str, Any] = {"rank": rank}
    if rank in fresh:
        if warming is not None:
            warming.join()
        names, unset = take(ns, got)
        lost = {**lost, **unset}
        restored = from_snapshot(ns, args.get("snapshot"), lost, rank, world)
        report = {"rank": rank, "donor": donor, "names": names, "imports": sorted(got["imports"]), "lost": lost, "restored": restored,
                  "moved": got.get("moved")}
    _align_buckets(ns, copy)
    return report
