"""A load's reader of DCP's files: each whole tensor read straight into the tensor it fills, one copy.

DCP's ``FileSystemReader`` reads each tensor item by ``torch.load`` of its slice of the file into a new tensor, then
copies that into the target: two copies and two rounds of page faults, where ``torch.load`` of a file is one
(docs/bench/snapshots.md: 2.0 of a 2.45 s load of 1 GiB a rank went there). An item is a ``torch.save`` archive (a
zip) whose one storage record is stored uncompressed: where the target is a contiguous CPU tensor of the item's
dtype and its whole size, the record's bytes are read into the target's memory. Anything else (a shard of a
resharded tensor, a transformed item, a device tensor, bytes, an archive laid out otherwise) goes DCP's own way, so
a load never depends on this path being taken.
"""
from __future__ import annotations

import io
import os
import struct
import sys
import zipfile
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from ..logs import log

_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")  # a zip local file header: 30 bytes, the name's and extra's lengths last
_LOCAL_MAGIC = 0x04034B50


class _Slice(io.RawIOBase):
    """One item's bytes of a larger file, as a file of its own (zipfile reads the archive's directory through it)."""

    def __init__(self, f: Any, start: int, length: int) -> None:
        self.f, self.start, self.length, self.pos = f, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence]
        self.pos = max(0, min(self.length, base + offset))
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buf: Any) -> int:
        n = min(len(buf), self.length - self.pos)
        if n <= 0:
            return 0
        got = os.preadv(self.f.fileno(), [memoryview(buf)[:n]], self.start + self.pos)
        self.pos += got
        return got


def storage_record(f: Any, start: int, length: int) -> Optional[Tuple[int, int]]:
    """(file offset, bytes) of the one storage of the ``torch.save`` archive at ``start``; None where it is not one
    uncompressed little-endian storage."""
    try:
        with zipfile.ZipFile(_Slice(f, start, length)) as zf:
            infos = zf.infolist()
            data = [i for i in infos if "/data/" in i.filename and not i.filename.endswith("/")]
            order = [i for i in infos if i.filename.endswith("/byteorder")]
            if len(data) != 1 or data[0].compress_type != zipfile.ZIP_STORED or sys.byteorder != "little":
                return None
            if order and zf.read(order[0]).strip() != b"little":
                return None
            info = data[0]
    except (zipfile.BadZipFile, OSError, ValueError):
        return None
    header = os.pread(f.fileno(), _LOCAL_HEADER.size, start + info.header_offset)
    if len(header) != _LOCAL_HEADER.size:
        return None
    fields = _LOCAL_HEADER.unpack(header)
    if fields[0] != _LOCAL_MAGIC:
        return None
    name_len, extra_len = fields[-2], fields[-1]
    return start + info.header_offset + _LOCAL_HEADER.size + name_len + extra_len, info.file_size


class DirectReader(FileSystemReader):
    """DCP's FileSystemReader, whose whole CPU tensors go straight into their targets (``direct`` counts them)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.direct = 0

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: Dict[str, List[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        rest: List[ReadItem] = []
        for relative, items in per_file.items():
            with open(os.path.join(str(self.path), relative), "rb", buffering=0) as f:
                rest += [item for item in items if not self._read_into(f, item, planner)]
        if rest:
            return super().read_data(LoadPlan(rest, plan.storage_data, plan.planner_data), planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _read_into(self, f: Any, item: ReadItem, planner: LoadPlanner) -> bool:
        """``item`` read into its target; False (nothing read) where DCP's own way must read it."""
        info = self.storage_data[item.storage_index]
        if item.type == LoadItemType.BYTE_IO or info.transform_descriptors or any(item.storage_offsets) or any(item.dest_offsets):
            return False
        target = planner.resolve_tensor(item).detach()
        saved = getattr(getattr(planner, "metadata", None), "state_dict_metadata", {}).get(item.dest_index.fqn)
        saved_dtype = getattr(getattr(saved, "properties", None), "dtype", None)
        if target.device.type != "cpu" or not target.is_contiguous() or saved_dtype != target.dtype or tuple(item.lengths) != tuple(target.shape):
            return False
        where = storage_record(f, info.offset, info.length)
        if where is None or where[1] != target.nbytes:
            return False
        view = target.reshape(-1).view(torch.uint8).numpy().data if target.nbytes else memoryview(bytearray())
        got = 0
        while got < target.nbytes:
            n = os.preadv(f.fileno(), [view[got:]], where[0] + got)
            if n <= 0:
                log.warning("snapshot load: %s ended early; DCP reads it", info.relative_path)
                return False
            got += n
        planner.commit_tensor(item, target)
        self.direct += 1
        return True
