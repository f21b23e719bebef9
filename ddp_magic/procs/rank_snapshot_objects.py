"""A rank's names as a snapshot keeps them: which kind each is, the skeletons modules and optimizers are rebuilt from, the pickles.

A module's skeleton is the module pickled with every tensor replaced by a placeholder
(shape, dtype, device type): its class, constructor's work and submodules come back
without its weights, which DCP then fills. An optimizer's skeleton is its class, its
hyperparameters and its parameters' names in a saved module. Every other value is
pickled per rank, a reference in place of each saved module, optimizer or parameter, so
``parts = [model, opt]`` comes back pointing at the rebuilt ones. Nothing is dropped
silently: what cannot be pickled is returned with the reason.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import io
import pickle
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Collection, Dict, Iterable, List, Optional, Set, Tuple

import cloudpickle
import torch

from ..logs import log
from ..wire.snapshot import Kind
from . import rank_snapshot_fsdp as F

DDP = torch.nn.parallel.DistributedDataParallel
DDP_OPTIONS = ("find_unused_parameters", "gradient_as_bucket_view", "static_graph", "forward_sync_buffers", "dim",
               "skip_all_reduce_unused_params")
REASONS = {  # the usual unpicklable values, said in the user's terms
    types.GeneratorType: "a generator: its running frame cannot be saved; create it again after the load",
    io.IOBase: "an open file: reopen it after the load",
}


@dataclass
class Sorted:
    """A rank's names by how they are saved (wire/snapshot.py ``Kind``), and those that cannot be."""

    modules: Dict[str, torch.nn.Module] = field(default_factory=dict)
    optimizers: Dict[str, torch.optim.Optimizer] = field(default_factory=dict)
    values: Dict[str, Any] = field(default_factory=dict)
    imports: Dict[str, str] = field(default_factory=dict)
    unsaved: Dict[str, str] = field(default_factory=dict)

    def kind(self, name: str) -> Kind:
        if name in self.modules:
            return Kind.MODULE
        if name in self.optimizers:
            return Kind.OPTIMIZER
        return Kind.IMPORT if name in self.imports else Kind.PICKLED


def sort_names(ns: Dict[str, Any], names: List[str]) -> Sorted:
    """Each name by kind; a name that is not there is unsaved, with why."""
    out = Sorted()
    for name in names:
        if name not in ns:
            out.unsaved[name] = "not defined on this rank"
            continue
        value = ns[name]
        if isinstance(value, types.ModuleType):
            out.imports[name] = value.__name__
        elif isinstance(value, torch.nn.Module) and inner(value).state_dict():
            out.modules[name] = value  # one with no state (nn.MSELoss()) is a value: DCP refuses an empty state dict
        elif isinstance(value, torch.optim.Optimizer):
            out.optimizers[name] = value
        else:
            out.values[name] = value
    return out


def inner(module: torch.nn.Module) -> torch.nn.Module:
    """The module a DDP wrapper holds (the module itself when it is not wrapped)."""
    return module.module if isinstance(module, DDP) else module


def ddp_options(module: torch.nn.Module) -> Optional[Dict[str, Any]]:
    """A DDP wrapper's constructor options, read back from it (None: not DDP-wrapped)."""
    if not isinstance(module, DDP):
        return None
    options = {k: getattr(module, k) for k in DDP_OPTIONS if hasattr(module, k)}
    options["bucket_cap_mb"] = module.bucket_bytes_cap / (1024 * 1024)
    if getattr(module, "_comm_hooks", None):  # a hook is code and state of the user's: said on load, not guessed
        options["_comm_hooks"] = len(module._comm_hooks)
    if getattr(module, "process_group", None) is not None and module.process_group != torch.distributed.distributed_c10d._get_default_group():
        options["_own_group"] = True  # a sub-group of the user's: the load has only the pool's
    return options


# ------------------------------------------------------------ skeletons
def _placeholder(shape: Tuple[int, ...], dtype: torch.dtype, requires_grad: bool, parameter: bool, device_type: str) -> torch.Tensor:
    """An uninitialised tensor where a saved one was (DCP fills it), on this rank's device of the same type."""
    device = rank_device(device_type)
    tensor = torch.empty(shape, dtype=dtype, device=device)
    return torch.nn.Parameter(tensor, requires_grad=requires_grad) if parameter else tensor


def rank_device(device_type: str) -> torch.device:
    """This rank's device of ``device_type`` (its current CUDA device; the CPU where there is none)."""
    if device_type == "meta":
        return torch.device("meta")
    if device_type == "cuda" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _valued(value: torch.Tensor, requires_grad: bool, parameter: bool, device_type: str) -> torch.Tensor:
    """A tensor the state does not hold (a non-persistent buffer, a plain tensor attribute), as it was, on this rank's
    device of the same type."""
    tensor = value.to(rank_device(device_type))
    return torch.nn.Parameter(tensor, requires_grad=requires_grad) if parameter else tensor.requires_grad_(requires_grad)


class _SkeletonPickler(cloudpickle.CloudPickler):
    """Modules without their weights: each tensor of their state a placeholder (DCP or a heal fills it); identity kept
    (tied weights stay tied). A tensor outside the state (``register_buffer(..., persistent=False)``: a positional
    table, a mask) goes by value: nothing else would fill it."""

    def __init__(self, file: Any, filled: Set[int]) -> None:
        super().__init__(file)
        self.filled = filled  # ids of the tensors the modules' state dicts hold
        self.copies: Dict[int, torch.Tensor] = {}  # the CPU copies sent by value, pickled as torch pickles them

    def reducer_override(self, obj: Any) -> Any:
        if id(obj) in self.copies:
            return NotImplemented
        if isinstance(obj, torch.Tensor) and not isinstance(obj, torch.nn.parameter.UninitializedTensorMixin):  # type: ignore[attr-defined]
            device = "meta" if F.is_dtensor(obj) else obj.device.type  # a shard's full shape: allocated once sharded again
            if id(obj) not in self.filled and device != "meta":
                copy = obj.detach().to("cpu", copy=True)
                self.copies[id(copy)] = copy
                return _valued, (copy, obj.requires_grad, isinstance(obj, torch.nn.Parameter), device)
            return _placeholder, (tuple(obj.shape), obj.dtype, obj.requires_grad, isinstance(obj, torch.nn.Parameter), device)
        if F.managed(obj):
            return F.plain_reduce(obj)
        return super().reducer_override(obj)


def _state_ids(modules: Iterable[torch.nn.Module]) -> Set[int]:
    """The tensors the modules' state dicts hold (parameters, persistent buffers): what is saved or sent apart."""
    return {id(t) for m in modules for t in inner(m).state_dict(keep_vars=True).values() if isinstance(t, torch.Tensor)}


def skeletons(modules: Dict[str, torch.nn.Module], optimizers: Dict[str, torch.optim.Optimizer]) -> Tuple[bytes, Dict[str, str]]:
    """The skeletons of the modules (their inner module, DDP's options beside) and optimizers; and the optimizers that
    cannot be rebuilt from them (their parameters are not all in one saved module), with why. A module without a
    skeleton (FSDP2, one holding a process group) keeps its state in DCP and says why it is not rebuilt."""
    plain = {name: _module_skeleton(m) for name, m in modules.items()}
    opts, problems = {}, {}
    for name, opt in optimizers.items():
        try:
            opts[name] = optimizer_skeleton(opt, modules)
        except LookupError as e:
            problems[name] = str(e)
    buf = io.BytesIO()
    _SkeletonPickler(buf, _state_ids(modules.values())).dump({"modules": plain, "optimizers": opts})
    return buf.getvalue(), problems


def _module_skeleton(module: torch.nn.Module) -> Dict[str, Any]:
    try:
        steps = F.plan(module) if F.is_sharded(module) else None  # FSDP2 (fully_shard): sharded again at the load
    except ValueError as e:
        return {"module": None, "ddp": None, "why": f"an FSDP2 (fully_shard) module whose sharding is not made again: {e}"}
    try:
        _SkeletonPickler(io.BytesIO(), _state_ids([module])).dump(inner(module))
    except Exception as e:  # its state is still saved (DCP); only the rebuild needs the user's setup cell
        log.debug("no skeleton for a %s", type(module).__name__, exc_info=True)
        return {"module": None, "ddp": None, "why": f"its structure cannot be pickled ({type(e).__name__}: {e})"}
    return {"module": inner(module), "ddp": ddp_options(module), "fsdp": steps}


def owner_of(opt: torch.optim.Optimizer, modules: Dict[str, torch.nn.Module]) -> str:
    """The saved module whose parameters this optimizer steps (LookupError: none holds all of them)."""
    ids = {id(p) for g in opt.param_groups for p in g["params"]}
    for name, module in modules.items():
        if ids <= {id(p) for p in module.parameters()}:
            return name
    raise LookupError("its parameters are not all in one saved module: save that module too, or load it with --into")


def optimizer_skeleton(opt: torch.optim.Optimizer, modules: Dict[str, torch.nn.Module]) -> Dict[str, Any]:
    owner = owner_of(opt, modules)
    names = {id(p): fqn for fqn, p in inner(modules[owner]).named_parameters(remove_duplicate=False)}
    groups = [{"params": [names[id(p)] for p in g["params"]], **{k: v for k, v in g.items() if k != "params"}} for g in opt.param_groups]
    return {"cls": type(opt), "defaults": dict(opt.defaults), "groups": groups, "module": owner, "state": _state_shapes(opt, names)}


def _state_shapes(opt: torch.optim.Optimizer, names: Dict[int, str]) -> Optional[Dict[str, Dict[str, Any]]]:
    """Each parameter's optimizer state as shapes (a tensor: shape, dtype, device type; else the value), so a load
    allocates it instead of DCP's zero-gradient step (0.8 s for 512 MiB of SGD momentum). None where a state tensor is
    a DTensor (FSDP2: DCP makes those)."""
    out: Dict[str, Dict[str, Any]] = {}
    for param, state in opt.state.items():
        entry: Dict[str, Any] = {}
        for key, value in state.items():
            if F.is_dtensor(value) or (isinstance(value, torch.Tensor) and value.is_sparse):
                return None
            entry[key] = ("tensor", tuple(value.shape), value.dtype, value.device.type) if isinstance(value, torch.Tensor) else ("value", value)
        out[names[id(param)]] = entry
    return out


def _allocate_state(opt: torch.optim.Optimizer, params: Dict[str, torch.nn.Parameter], shapes: Optional[Dict[str, Dict[str, Any]]]) -> None:
    """The optimizer's state allocated from its shapes (DCP fills it next): a tensor on its parameter's device where it
    was on one of that type (Adam's step stays on the CPU)."""
    for fqn, entry in (shapes or {}).items():
        param = params[fqn]
        state = {}
        for key, spec in entry.items():
            if spec[0] == "value":
                state[key] = spec[1]
                continue
            _kind, shape, dtype, device_type = spec
            device = param.device if param.device.type == device_type else rank_device(device_type)
            state[key] = torch.empty(shape, dtype=dtype, device=device)
        opt.state[param] = state


def rebuild_modules(blob: bytes, into: Dict[str, Any], notes: List[str],
                    filled: Collection[str] = ()) -> Tuple[Dict[str, torch.nn.Module], Dict[str, Dict[str, Any]]]:
    """The modules from their skeletons, DDP-wrapped again on the pool's process group with their own options (those in
    ``into``: the user's own, filled instead); the optimizers' skeletons whose module is there. A DDP wrapper of a
    module in ``filled`` (DCP loads its state on every rank next) is made without DDP's broadcast of rank 0's weights:
    they would be overwritten (0.8 s of a 512 MiB load here)."""
    data = pickle.loads(blob)
    modules: Dict[str, torch.nn.Module] = {}
    for name, item in data["modules"].items():
        module, options = item["module"], item["ddp"]
        if name in into:
            modules[name] = into[name]
            continue
        if module is None:
            notes.append(f"{name}: {item['why']}, which is not exact: build it in a setup cell, then %ddp load DIR --into {name}")
            continue
        if options is not None and options.pop("_comm_hooks", 0):
            notes.append(f"{name}: its DDP communication hook was not restored, which is not exact: register it again, "
                         f"or rebuild {name} in a setup cell and use --into {name}")
        if options is not None and options.pop("_own_group", False):
            notes.append(f"{name}: it was DDP-wrapped on a process group of its own; rebuilt on the pool's, which is not exact: "
                         f"rebuild {name} in a setup cell and use --into {name}")
        if options is not None:
            device_ids = [torch.cuda.current_device()] if next(module.parameters(), torch.empty(0)).is_cuda else None
            no_sync: Dict[str, Any] = {"init_sync": False} if name in filled and "init_sync" in inspect.signature(DDP.__init__).parameters else {}
            module = DDP(module, device_ids=device_ids, **options, **no_sync)
        if item.get("fsdp"):
            module = F.shard_again(module, item["fsdp"])
        modules[name] = module
    optimizers = {}
    for name, skeleton in data["optimizers"].items():
        if skeleton["module"] in modules or name in into:
            optimizers[name] = skeleton
        else:
            notes.append(f"{name}: its module {skeleton['module']} was not rebuilt, so neither is it: %ddp load DIR --into {skeleton['module']},{name}")
    return modules, optimizers


def rebuild_optimizer(skeleton: Dict[str, Any], modules: Dict[str, torch.nn.Module]) -> torch.optim.Optimizer:
    """An optimizer of the saved class over the rebuilt module's parameters, with the saved groups' hyperparameters."""
    params = dict(inner(modules[skeleton["module"]]).named_parameters(remove_duplicate=False))
    groups = [{**g, "params": [params[n] for n in g["params"]]} for g in skeleton["groups"]]
    cls = skeleton["cls"]
    try:
        opt = cls(groups, **skeleton["defaults"])
    except TypeError:  # a default its constructor does not take (one torch added to .defaults): the groups carry them all
        log.debug("%s(**defaults) refused; rebuilding from the groups alone", cls.__name__, exc_info=True)
        opt = cls(groups, lr=skeleton["defaults"].get("lr", 1e-3))
    _allocate_state(opt, params, skeleton.get("state"))
    return opt


def follow_schedulers(values: Dict[str, Any]) -> None:
    """An LR scheduler's hold on its optimizer's step (its check that step() came first), on the rebuilt optimizer."""
    for value in values.values():
        opt = getattr(value, "optimizer", None)
        if isinstance(value, torch.optim.lr_scheduler.LRScheduler) and isinstance(opt, torch.optim.Optimizer):
            _track_step(opt)


def _track_step(opt: torch.optim.Optimizer) -> None:
    if hasattr(opt.step, "_wrapped_by_lr_sched"):
        return
    func, ref = opt.step.__func__, weakref.ref(opt)  # type: ignore[attr-defined]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        o = ref()
        o._opt_called = True  # type: ignore[union-attr]
        return func.__get__(o, o.__class__)(*args, **kwargs)

    wrapper._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    opt.step = wrapper  # type: ignore[method-assign]


# ------------------------------------------------------------ values
class _ValuePickler(cloudpickle.CloudPickler):
    """Values per rank; a saved module, optimizer or parameter is a reference to the one the load rebuilds."""

    def __init__(self, file: Any, refs: Dict[int, Tuple[str, ...]], ns: Dict[str, Any]) -> None:
        super().__init__(file)
        self.refs = {**refs, id(ns): ("ns",)}
        # a function a cell defined keeps the rank's namespace as its globals (cloudpickle would give it a copy of its
        # own, and `global step; step += 1` would count in that copy): its globals are pickled as a reference to it
        self.globals_ref[id(ns)] = ns

    def persistent_id(self, obj: Any) -> Any:
        return self.refs.get(id(obj))


class _ValueUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, objects: Dict[str, Any], ns: Dict[str, Any]) -> None:
        super().__init__(file)
        self.objects = objects
        self.ns = ns

    def persistent_load(self, pid: Any) -> Any:
        if pid[0] == "ns":
            return self.ns
        if pid[0] == "param":
            return dict(inner(self.objects[pid[1]]).named_parameters(remove_duplicate=False))[pid[2]]
        if pid[0] == "inner":
            return inner(self.objects[pid[1]])
        return self.objects[pid[1]]


def references(modules: Dict[str, torch.nn.Module], optimizers: Dict[str, torch.optim.Optimizer]) -> Dict[int, Tuple[str, ...]]:
    refs: Dict[int, Tuple[str, ...]] = {}
    for name, module in modules.items():
        refs.update({id(p): ("param", name, fqn) for fqn, p in inner(module).named_parameters(remove_duplicate=False)})
        refs[id(inner(module))] = ("inner", name)
        refs[id(module)] = ("object", name)
    refs.update({id(o): ("object", name) for name, o in optimizers.items()})
    return refs


def pickle_values(values: Dict[str, Any], refs: Dict[int, Tuple[str, ...]],
                  ns: Dict[str, Any]) -> Tuple[bytes, Dict[str, Tuple[int, str]], Dict[str, str]]:
    """The values that pickle (together: shared objects stay shared), each one's size and sha256 alone, and why each
    other could not."""
    sizes: Dict[str, Tuple[int, str]] = {}
    unsaved: Dict[str, str] = {}
    for name, value in values.items():
        buf = io.BytesIO()
        try:
            _ValuePickler(buf, refs, ns).dump(value)
            sizes[name] = (buf.tell(), hashlib.sha256(buf.getvalue()).hexdigest())
        except Exception as e:  # any failure to pickle is the user's to read: named with its reason, never dropped
            log.debug("cannot pickle %r", name, exc_info=True)
            unsaved[name] = reason(value, e)
    buf = io.BytesIO()
    _ValuePickler(buf, refs, ns).dump({n: v for n, v in values.items() if n in sizes})
    return buf.getvalue(), sizes, unsaved


def unpickle_values(blob: bytes, objects: Dict[str, Any], ns: Dict[str, Any]) -> Dict[str, Any]:
    """The values, a function's globals the namespace ``ns`` (what they referenced at the save is set there as it loads)."""
    return _ValueUnpickler(io.BytesIO(blob), objects, ns).load()


def reason(value: Any, error: BaseException) -> str:
    """Why ``value`` cannot be saved, in the user's terms where the type is a usual one."""
    for kind, words in REASONS.items():
        if isinstance(value, kind):
            return words
    name = type(value).__qualname__
    if name.endswith("DataLoaderIter") or "DataLoaderIter" in name:
        return "a DataLoader's live iterator: make a new one with iter(loader) after the load"
    return f"{type(value).__module__}.{name} cannot be pickled ({type(error).__name__}: {error})"
