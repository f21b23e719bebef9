"""A rank's side of ``%ddp save`` and ``%ddp load``: its names written to, and rebuilt from, a snapshot (wire/snapshot.py).

Both run on the main thread between cells, as a cell the kernel sends (kernel/snapshots.py),
so every rank is at the same cell boundary and the collectives here cannot meet a user's.
Modules and optimizers go through torch.distributed.checkpoint: state equal on every rank
(a DDP replica, its optimizer) under one key, written once and loadable at any world size;
state that differs by rank under a key per rank; DTensors as DCP shards them. The rest is
per rank (rank_snapshot_objects.py). Rank 0 renames the partial folder only after every rank
has reported its files, so a rank that dies mid-save leaves the previous snapshots whole.
"""
from __future__ import annotations

import difflib
import importlib
import os
import pickle
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import state_dict as sd

from ..wire import snapshot as S
from ..words import ranks_phrase
from ..wire.snapshot import Kind, Sharing
from . import rank_rng
from . import rank_snapshot_bg as bg
from . import rank_snapshot_objects as O
from .rank_snapshot_digest import digest
from .rank_snapshot_reader import DirectReader


def _versions() -> Dict[str, str]:
    ours = getattr(sys.modules.get("ddp_magic"), "__version__", "?")  # the package this module is in (procs may not import its top)
    versions = {"python": sys.version.split()[0], "torch": torch.__version__, "ddp_magic": ours}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        versions["numpy"] = numpy.__version__
    return versions


def _state(name: str, obj: Any, found: O.Sorted, modules: Dict[str, torch.nn.Module]) -> Dict[str, Any]:
    if name in found.optimizers:
        return sd.get_optimizer_state_dict(modules[O.owner_of(obj, modules)], obj)
    return sd.get_model_state_dict(obj)


def _tree(found: O.Sorted, rank: int) -> Tuple[Dict[str, Any], Dict[str, Dict[str, Any]]]:
    """The DCP state tree (one key per name, or one per rank where ranks differ) and each name's entry for meta.json."""
    stateful = {**found.modules, **found.optimizers}
    states = {n: _state(n, o, found, found.modules) for n, o in stateful.items()}
    digests = {n: digest(s) for n, s in states.items()}
    everyone: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, {n: d[0] for n, d in digests.items()})
    tree, info = {}, {}
    for name, state in states.items():
        hashes = [d.get(name) for d in everyone]
        sharing = Sharing.SHARDED if digests[name][1] else Sharing.REPLICATED if len(set(hashes)) == 1 else Sharing.PER_RANK
        tree[name if sharing != Sharing.PER_RANK else f"{name}@rank{rank}"] = state
        info[name] = {"kind": found.kind(name).value, "sharing": sharing.value, "hash": hashes[0] if len(set(hashes)) == 1 else hashes}
    return tree, info


def save(ns: Dict[str, Any], args: Dict[str, Any]) -> Dict[str, Any]:
    """Write this rank's share of the snapshot into ``args['partial']``; rank 0 renames it once every rank has written.
    Returns what the kernel says: the folder, the names by kind, what could not be saved. ``args['background']``:
    only the copy of the rank's share is taken here; a thread writes it (procs/rank_snapshot_bg.py)."""
    t0 = time.monotonic()
    earlier = bg.failure(bg.wait())  # a background save still being written goes first: one at a time
    rank, world = dist.get_rank(), dist.get_world_size()
    partial, background = args["partial"], bool(args.get("background"))
    if args.get("user_named"):
        _refuse_unknown(ns, list(args["names"]), world)
    _shared_folder(partial, rank)
    found = O.sort_names(ns, list(args["names"]))
    blob, problems = O.skeletons(found.modules, found.optimizers)
    for name, why in problems.items():
        found.unsaved[name] = why
        del found.optimizers[name]
    tree, info = _tree(found, rank)
    replicated = {n for n, e in info.items() if e["sharing"] == Sharing.REPLICATED.value}
    staged = bg.share(tree, replicated, rank, world) if background else None
    if staged is None:
        dcp.save(tree, checkpoint_id=os.path.join(partial, S.DCP_DIR))
    values, sizes, unpicklable = O.pickle_values(found.values, O.references(found.modules, found.optimizers), ns)
    found.unsaved.update(unpicklable)
    record = {"skeletons": blob, "values": values, "rng": rank_rng.rng_state(), "imports": found.imports}
    data = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
    if staged is None:
        _write_record(partial, rank, data)
    step = ns.get("step") if isinstance(ns.get("step"), int) and not isinstance(ns.get("step"), bool) else args.get("step")
    step = args.get("at", step)  # at a safe point (procs/rank_safepoint.py): that point's step
    mine = {"info": info, "sizes": {n: b for n, (b, _h) in sizes.items()}, "hashes": {n: h for n, (_b, h) in sizes.items()},
            "imports": found.imports, "unsaved": found.unsaved, "step": step}
    reports: List[Any] = [None] * world
    dist.all_gather_object(reports, mine)  # a foreground save: every rank has written, the only way past this line
    final = os.path.join(os.path.dirname(partial.rstrip("/")), S.snapshot_name(reports[0]["step"], args["time"]))
    meta = S.Meta(world_size=world, time=args["time"], step=reports[0]["step"], names=_names(reports),
                  unsaved=_unsaved(reports), files={}, versions=_versions())
    if staged is not None:
        label = os.path.join(args.get("typed") or os.path.dirname(final), os.path.basename(final))
        bg.start(staged, data, partial, rank, lambda: _finish(partial, final, meta), _write_record, label)
        if rank:
            return {"rank": rank, "unsaved": found.unsaved}
        return {"rank": 0, "path": final, "names": meta.names, "unsaved": meta.unsaved, "step": meta.step, "background": True,
                "paused": time.monotonic() - t0, "earlier": earlier}
    return dict(_finish(partial, final, meta), earlier=earlier) if rank == 0 else {"rank": rank, "unsaved": found.unsaved}


def written() -> Optional[Dict[str, Any]]:
    """The kernel's wait for a background save (before a stop): its outcome on this rank, None when none was written."""
    return bg.wait()


def _write_record(partial: str, rank: int, data: bytes) -> None:
    """This rank's file (skeletons, values, RNG, imports), on disk before the rank says it has written."""
    with open(os.path.join(partial, S.rank_file(rank)), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _finish(partial: str, final: str, meta: S.Meta) -> Dict[str, Any]:
    """Rank 0, once every rank has written: meta.json with every file's size and hash, then the rename that makes it whole."""
    meta.files = S.file_table(partial)
    meta.write(partial)
    os.rename(partial, final)
    return {"rank": 0, "path": final, "names": meta.names, "unsaved": meta.unsaved, "bytes": meta.bytes, "step": meta.step}


def _refuse_unknown(ns: Dict[str, Any], names: List[str], world: int) -> None:
    """Names the user typed that no rank defines (a typo: ``%ddp save ckpt/ modle``) refuse the save before anything is
    written, on every rank alike (what each lacks is gathered first: a rank that refused alone would leave the others
    in the save's collectives)."""
    lacking: List[Any] = [None] * world
    dist.all_gather_object(lacking, [n for n in names if n not in ns])
    nowhere = [n for n in names if all(n in mine for mine in lacking)]
    if nowhere:
        near = difflib.get_close_matches(nowhere[0], [k for k in ns if not k.startswith("_")], 1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise S.Refused(f"{', '.join(nowhere)}: not defined on any rank{hint}; nothing was written. "
                        "Name what the ranks hold, or leave the names out to save every name the ranks own")


def _shared_folder(partial: str, rank: int) -> None:
    """Every rank must see the one folder rank 0 renames: on nodes with their own disks a save would be split silently."""
    if rank == 0:
        os.makedirs(os.path.join(partial, S.DCP_DIR), exist_ok=True)
    dist.barrier()
    seen: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(seen, os.path.isdir(os.path.join(partial, S.DCP_DIR)))
    blind = [r for r, ok in enumerate(seen) if not ok]
    if blind:
        see = "does" if len(blind) == 1 else "do"
        raise S.Refused(f"{ranks_phrase(blind)} {see} not see {os.path.dirname(partial)} as rank 0 does: "
                                f"a snapshot needs a folder every node shares (NFS, Lustre, ...); nothing was saved")


def _names(reports: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    names: Dict[str, Dict[str, Any]] = dict(reports[0]["info"])
    for name in reports[0]["sizes"]:
        hashes = [r["hashes"].get(name, "") for r in reports]
        same = len(set(hashes)) == 1 and hashes[0] != ""
        names[name] = {"kind": Kind.PICKLED.value, "sharing": (Sharing.REPLICATED if same else Sharing.PER_RANK).value,
                       "bytes": [r["sizes"].get(name, 0) for r in reports], "hash": hashes[0] if same else hashes}
    for name, module in reports[0]["imports"].items():
        names[name] = {"kind": Kind.IMPORT.value, "module": module}
    return names


def _unsaved(reports: List[Dict[str, Any]]) -> Dict[str, str]:
    """Each name some rank could not save, with the first rank's reason and which ranks."""
    out: Dict[str, str] = {}
    for name in sorted({n for r in reports for n in r["unsaved"]}):
        ranks = [i for i, r in enumerate(reports) if name in r["unsaved"]]
        why = reports[ranks[0]]["unsaved"][name]
        out[name] = why if len(ranks) == len(reports) else f"{why} (on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))})"
    return out


# ------------------------------------------------------------ load
def load(ns: Dict[str, Any], args: Dict[str, Any]) -> Dict[str, Any]:
    """Rebuild the snapshot's names here (``args['into']``: take these objects from the namespace and fill them).
    Returns the names set and what could not be mapped, with why."""
    bg.wait()  # a background save still being written is whole (or failed) before anything is read
    path, into = args["path"], set(args.get("into") or ())
    rank, world = dist.get_rank(), dist.get_world_size()
    meta = S.Meta.read(path)
    flags: List[Any] = [None] * world
    dist.all_gather_object(flags, S.damaged(path, meta, share=(rank, world)))  # each rank hashes its share of the bytes
    bad = sorted(f for part in flags for f in part)
    if bad:
        raise S.Refused(f"the snapshot {path} is damaged: {', '.join(bad)}; load another (%ddp snapshots {os.path.dirname(path)})")
    same = meta.world_size == world
    notes = [f"saved with {k} {v}, loaded with {_versions().get(k)}" for k, v in sorted(meta.versions.items())
             if k in ("torch", "python") and _versions().get(k) != v]
    with open(os.path.join(path, S.rank_file(rank if same else 0)), "rb") as f:
        record = pickle.load(f)
    modules, opt_skeletons = _objects(ns, record, into, meta, notes)
    optimizers = {n: ns[n] if n in into else O.rebuild_optimizer(s, modules) for n, s in opt_skeletons.items()}
    _fill(path, meta, modules, optimizers, rank, same, notes)
    objects: Dict[str, Any] = {**modules, **optimizers}
    values = O.unpickle_values(record["values"], objects, ns)
    if not same:
        values = _mappable(values, meta, notes)
    O.follow_schedulers(values)
    imports = {n: importlib.import_module(m) for n, m in record["imports"].items()}
    ns.update(imports)
    ns.update(objects)
    ns.update(values)
    if same:
        rank_rng.set_rng_state(record["rng"])
    else:
        notes.append(f"RNG states are per rank: saved at world size {meta.world_size}, not restored at {world}")
    return {"rank": rank, "names": sorted([*imports, *objects, *values]), "notes": notes, "step": meta.step, "path": path}


def _objects(ns: Dict[str, Any], record: Dict[str, Any], into: set, meta: S.Meta,
             notes: List[str]) -> Tuple[Dict[str, torch.nn.Module], Dict[str, Dict[str, Any]]]:
    missing = sorted(n for n in into if n not in ns)
    if missing:
        raise S.Refused(f"--into {','.join(missing)}: not defined on the ranks; run the cell that builds {'them' if len(missing) > 1 else 'it'} first")
    stateful = {n for n, e in meta.names.items() if e.get("kind") in (Kind.MODULE.value, Kind.OPTIMIZER.value)}
    for name in sorted(into - stateful):
        notes.append(f"--into {name}: the snapshot holds no module or optimizer {name}; it is left as it is")
    filled = {n for n, e in meta.names.items() if e.get("sharing") != Sharing.PER_RANK.value or meta.world_size == dist.get_world_size()}
    return O.rebuild_modules(record["skeletons"], {n: ns[n] for n in into & stateful}, notes, filled)


def _fill(path: str, meta: S.Meta, modules: Dict[str, Any], optimizers: Dict[str, Any], rank: int, same: bool, notes: List[str]) -> None:
    """The modules' and optimizers' state from the DCP checkpoint (resharded to this world size where it is one copy)."""
    states: Dict[str, Any] = {}
    keys: Dict[str, str] = {}
    for name, obj in {**modules, **optimizers}.items():
        sharing = meta.names.get(name, {}).get("sharing")
        if sharing == Sharing.PER_RANK.value and not same:
            notes.append(f"{name}: its state differs by rank (saved at world size {meta.world_size}): "
                         f"cannot be mapped to {dist.get_world_size()} ranks; left as built")
            continue
        keys[name] = name if sharing != Sharing.PER_RANK.value else f"{name}@rank{rank}"
        states[keys[name]] = sd.get_optimizer_state_dict(modules[O.owner_of(obj, modules)], obj) if name in optimizers else sd.get_model_state_dict(obj)
    dcp.load(states, storage_reader=DirectReader(os.path.join(path, S.DCP_DIR)))  # whole tensors read straight into place
    for name, key in keys.items():
        if name in optimizers:
            opt = optimizers[name]
            sd.set_optimizer_state_dict(modules[O.owner_of(opt, modules)], opt, states[key])
        else:
            sd.set_model_state_dict(modules[name], states[key])


def _mappable(values: Dict[str, Any], meta: S.Meta, notes: List[str]) -> Dict[str, Any]:
    """At another world size: the values that were equal on every rank; the others named."""
    kept = {}
    for name, value in values.items():
        if type(value).__name__ == "DeviceMesh":  # its ranks are the saved world's: this pool's --mesh makes its own
            notes.append(f"{name}: a DeviceMesh of the {meta.world_size} saved ranks: not loaded into {dist.get_world_size()}; "
                         f"make one with init_device_mesh (or start the pool with --mesh)")
        elif meta.names.get(name, {}).get("sharing") == Sharing.REPLICATED.value:
            kept[name] = value
        else:
            notes.append(f"{name}: differs by rank (saved at world size {meta.world_size}): cannot be mapped to {dist.get_world_size()} ranks; not loaded")
    return kept


def entry(op: str, ns: Dict[str, Any], args: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """What the kernel's cell calls: ``save``, ``load`` or ``written`` in this rank's namespace."""
    return save(ns, args) if op == "save" else load(ns, args) if op == "load" else written()
