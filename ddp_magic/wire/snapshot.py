"""A snapshot's layout on disk and its metadata, as both ends read them: ``%ddp save`` writes it, ``load`` and ``snapshots`` read it.

A snapshot folder (``DIR/<name>/``) holds ``meta.json``, the ``dcp/`` checkpoint of the
modules and optimizers (torch.distributed.checkpoint: replicated state once, sharded
state sharded) and one ``rank-R.pkl`` per rank (its RNG states, its other values, the
skeletons its objects are rebuilt from). Ranks write into ``DIR/.partial-<name>/``; rank 0
renames it when every rank has written, so a save that dies leaves only a partial folder
beside the whole snapshots (docs/snapshots.md).
"""
from __future__ import annotations

import enum
import hashlib
import json
import os
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

FORMAT = 2  # meta.json's "format": a load refuses a newer one (2: files checked by crc32; 1, by sha256, still loads)
META = "meta.json"
DCP_DIR = "dcp"
PARTIAL = ".partial-"  # a save in progress, or one that died before every rank had written


class Refused(Exception):
    """A save or load a rank refuses for a reason the user can act on (a folder a node cannot see, a damaged snapshot,
    --into a name the ranks lack): the kernel says its words alone, without the traceback of the cell that ran it."""


class Kind(str, enum.Enum):
    """How a saved name is kept (and rebuilt)."""

    MODULE = "module"  # torch.nn.Module, DDP-wrapped or not: skeleton per rank, state through DCP
    OPTIMIZER = "optimizer"  # its class, hyperparameters and parameters' names; state through DCP
    PICKLED = "pickled"  # anything else (LR schedulers and GradScalers included): cloudpickle, per rank
    IMPORT = "import"  # a module object: imported again by name


class Sharing(str, enum.Enum):
    """Whose copy of a name's state is on disk."""

    REPLICATED = "replicated"  # equal on every rank: written once, loadable at any world size
    SHARDED = "sharded"  # DTensors: DCP keeps each shard, reshards on load
    PER_RANK = "per-rank"  # differs by rank: each rank's own, loadable only at the same world size


def rank_file(rank: int) -> str:
    return f"rank-{rank}.pkl"


def snapshot_name(step: Optional[int], when: float) -> str:
    """``step-000050-20261206T043000`` (or ``snap-<time>`` without a step): sorts by step, then time."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(when)) + f"{int(when * 1000) % 1000:03d}"
    return f"step-{step:09d}-{stamp}" if step is not None else f"snap-{stamp}"


@dataclass
class Meta:
    """meta.json: what a load checks and ``%ddp snapshots`` lists."""

    world_size: int
    time: float
    step: Optional[int] = None
    names: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # name -> kind, sharing, bytes, hash (per rank for per-rank)
    unsaved: Dict[str, str] = field(default_factory=dict)  # name -> why it could not be saved
    files: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # relative path -> bytes, crc32 (format 1: sha256)
    versions: Dict[str, str] = field(default_factory=dict)
    format: int = FORMAT

    @property
    def bytes(self) -> int:
        return sum(int(f["bytes"]) for f in self.files.values())

    def write(self, folder: str) -> None:
        path = os.path.join(folder, META)
        with open(path + ".tmp", "w") as f:
            json.dump(asdict(self), f, indent=1, sort_keys=True)
        os.replace(path + ".tmp", path)

    @classmethod
    def read(cls, folder: str) -> "Meta":
        with open(os.path.join(folder, META)) as f:
            data = json.load(f)
        if int(data.get("format", 0)) > FORMAT:
            raise ValueError(f"{folder} was written by a newer ddp_magic (format {data['format']}); upgrade ddp_magic to load it")
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


BLOCK = 8 << 20  # read into one buffer: no new bytes object a block


class Digest(str, enum.Enum):
    """How a file's content is checked: the key of its entry in ``Meta.files``. A check against damage (a file cut
    short, a block gone bad), not against someone who writes the folder: a snapshot holds pickles, which run code when
    loaded, so only a folder the user trusts is loaded at all. crc32 runs at 2-3× sha256's pace (zlib lets go of the GIL)."""

    CRC32 = "crc32"
    SHA256 = "sha256"  # format 1


def file_digest(path: str, how: Digest = Digest.CRC32) -> str:
    """``path``'s content digest, read in large blocks into one buffer."""
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    crc, h = 0, hashlib.sha256() if how == Digest.SHA256 else None
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            if h is not None:
                h.update(view[:n])
            else:
                crc = zlib.crc32(view[:n], crc)
    return h.hexdigest() if h is not None else f"{crc:08x}"


def _hashed(paths: List[str], how: Dict[str, Digest]) -> Dict[str, str]:
    """Each file's digest (``how``: by path), on threads (zlib and hashlib let go of the GIL): a 1 GiB model's files
    are checked at the disk's or the cores' pace, not one core's; the largest first, so the last thread is not left with
    the longest."""
    paths = sorted(paths, key=os.path.getsize, reverse=True)
    with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1, len(paths)))) as pool:
        return dict(zip(paths, pool.map(lambda p: file_digest(p, how[p]), paths)))


def digest_of(entry: Dict[str, Any]) -> Digest:
    """The digest a file's entry records (a format-1 snapshot's: sha256)."""
    return Digest.CRC32 if Digest.CRC32.value in entry else Digest.SHA256


def file_table(folder: str) -> Dict[str, Dict[str, Any]]:
    """Every file under ``folder`` but meta.json: its size and crc32, what a load checks."""
    paths = [os.path.join(root, name) for root, _dirs, files in os.walk(folder) for name in files]
    paths = [p for p in paths if os.path.relpath(p, folder) != META]
    hashes = _hashed(paths, {p: Digest.CRC32 for p in paths}) if paths else {}
    return {os.path.relpath(p, folder): {"bytes": os.path.getsize(p), Digest.CRC32.value: hashes[p]} for p in paths}


def shares(meta: Meta, count: int) -> List[List[str]]:
    """The recorded files dealt to ``count`` checkers by size, the largest first to the least loaded: the same on every
    rank, so the ranks of a load hash about 1/count of the bytes each instead of one rank all of them."""
    out: List[List[str]] = [[] for _ in range(max(1, count))]
    load = [0] * len(out)
    for rel, want in sorted(meta.files.items(), key=lambda item: (-int(item[1]["bytes"]), item[0])):
        least = load.index(min(load))
        out[least].append(rel)
        load[least] += int(want["bytes"])
    return out


def damaged(folder: str, meta: Meta, share: Tuple[int, int] = (0, 1)) -> List[str]:
    """The files whose size or content differ from what the save recorded (empty: the snapshot is whole); ``share``
    (index, count): only that share of the files (``shares``), the others' checkers check theirs."""
    mine = set(shares(meta, share[1])[share[0]])
    bad, whole = [], []
    for rel, want in sorted((rel, want) for rel, want in meta.files.items() if rel in mine):
        path = os.path.join(folder, rel)
        if not os.path.exists(path):
            bad.append(f"{rel} (missing)")
        elif os.path.getsize(path) != int(want["bytes"]):
            bad.append(f"{rel} (its size differs)")
        else:
            whole.append(rel)
    how = {os.path.join(folder, rel): digest_of(meta.files[rel]) for rel in whole}
    hashes = _hashed(list(how), how) if whole else {}
    bad += [f"{rel} (its content hash differs)" for rel in whole
            if hashes[os.path.join(folder, rel)] != meta.files[rel][digest_of(meta.files[rel]).value]]
    return sorted(bad)


@dataclass(frozen=True)
class Entry:
    """One folder of DIR as ``%ddp snapshots`` sees it: a whole snapshot (``meta``) or a partial one."""

    path: str
    meta: Optional[Meta]
    problem: str = ""  # why it cannot be loaded ("" when it can)


def entries(parent: str) -> List[Entry]:
    """The snapshots in ``parent``, oldest first (partial ones and unreadable ones too, with why)."""
    out = []
    for name in sorted(os.listdir(parent)) if os.path.isdir(parent) else []:
        path = os.path.join(parent, name)
        if not os.path.isdir(path):
            continue
        if name.startswith(PARTIAL):
            why = "partial: a save not finished (being written in the background, or stopped before every rank had written); never loaded"
            out.append(Entry(path, None, why))
            continue
        if not os.path.exists(os.path.join(path, META)):
            continue
        try:
            out.append(Entry(path, Meta.read(path)))
        except (OSError, ValueError, TypeError) as e:
            out.append(Entry(path, None, f"unreadable meta.json: {e}"))
    return sorted(out, key=lambda e: (e.meta.time if e.meta else 0.0, e.path))


def resolve(path: str) -> str:
    """The snapshot ``path`` names: itself when it holds meta.json, else the newest whole snapshot in it."""
    if os.path.exists(os.path.join(path, META)):
        return path
    whole = [e for e in entries(path) if e.meta is not None]
    if not whole:
        raise FileNotFoundError(f"no snapshot in {path}: save one with %ddp save {path}")
    return whole[-1].path
