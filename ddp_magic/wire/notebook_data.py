"""Notebook data at memory speed: the tensors and arrays a ``%%ddp`` cell takes from the notebook go through /dev/shm once.

The kernel's side is ``Outbox``: it pickles each name the cell needs (cloudpickle, as
before), except that a CPU tensor or numpy array of 1 MiB or more, at any depth in the
value (a dict of tensors, a list of arrays), is written once to a private file in
/dev/shm and the pickle carries only its name, dtype and shape. A later cell that
uses the same unchanged object writes nothing: a tensor is unchanged while its
object, data pointer and version counter (``t._version``, bumped by every in-place
torch op) are; a numpy array, which has no version counter, is compared with the
file (memcmp, about 50 ms per 256 MiB). Writes that bypass torch's counter (through
``t.numpy()`` or ``t.data``) are not seen: assign a new tensor, or use torch ops.
Smaller tensors and arrays travel as pickle protocol-5 buffers: when one value's add up
to 1 MiB (a list of many small samples), they go in one file for that cell, else in the pickle.

The ranks' side is ``_attach`` (and ``_load_oob``): each rank maps the file copy-on-write
(``MAP_PRIVATE``), so every rank reads the same pages of host memory, and a rank
that writes to the value gets its own copy of the pages it writes: the notebook's
tensor and the other ranks' views never change. The next cell maps the file afresh,
so a rank sees the notebook's value again, unless a ``%%ddp`` cell assigned the name
(then the rank owns it, as always). ``Scatter`` values (scatter.py) put each rank's
shard on its own pages; a rank maps only its own.

Files are named ``<session prefix>n-<random>`` (wire/shm.py), one prefix per session
since they outlive pools; they are removed when the value changes or is gone (at the
next cell), at ``%ddp stop``, when the kernel exits, and by the template when the
kernel is killed (procs/forkserver.py). Ranks on other hosts get everything in the pickle.
"""
from __future__ import annotations

import ctypes
import functools
import io
import mmap
import os
import pickle
import secrets
import sys
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import cloudpickle

from ..logs import log
from . import shm
from .scatter import THRESHOLD, Scatter, kind as _kind, nbytes as _nbytes, pick as _pick, rank as _rank, scattered, split as _split

__all__ = ["Outbox", "Scatter", "scattered", "THRESHOLD"]
PAGE = mmap.ALLOCATIONGRANULARITY  # every shard starts on a page: a rank maps only its own
FILE_TAG = "n-"
Layout = Tuple[int, int, Tuple[int, ...]]  # (offset, bytes, shape) of one tensor in a file


def _raw(obj: Any, kind: str) -> memoryview:
    """The value's bytes, C-contiguous (a copy only when it is not)."""
    if kind == "torch":
        import torch

        flat: Any = obj.detach().resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8).numpy()
        return memoryview(flat)
    import numpy as np

    flat = np.ascontiguousarray(obj).reshape(-1).view(np.uint8)
    return memoryview(flat)


def _signature(obj: Any, kind: str) -> tuple:
    if kind == "torch":
        try:
            version: Any = obj._version
        except RuntimeError:  # an inference-mode tensor has no version counter: written again every cell
            version = object()
        return (version, obj.data_ptr(), tuple(obj.shape), obj.stride(), obj.dtype)
    return (obj.__array_interface__["data"][0], obj.shape, obj.strides, obj.dtype.str)


def _meta(obj: Any, kind: str) -> Tuple[Any, dict]:
    """(dtype as the rank rebuilds it, what else it restores)."""
    if kind == "torch":
        return str(obj.dtype).replace("torch.", ""), {"parameter": type(obj) is not sys.modules["torch"].Tensor, "grad": obj.requires_grad}
    return obj.dtype, {}


class _Entry:
    """One value in /dev/shm: its file, where each piece sits, and the notebook object it is a copy of."""

    def __init__(self, ref: "Optional[weakref.ref[Any]]", sig: tuple, path: str, layouts: List[Layout]) -> None:
        self.ref, self.sig, self.path, self.layouts = ref, sig, path, layouts
        self.mm: Optional[mmap.mmap] = None  # numpy: the file as the kernel compares it


class Outbox:
    """The kernel's side: one session's notebook values in /dev/shm, and the bytes it sent (``written``, ``inline``)."""

    def __init__(self, prefix: Optional[str] = None) -> None:
        self.prefix = prefix or shm.pool_prefix(os.urandom(4).hex())
        self.entries: Dict[tuple, _Entry] = {}
        self._gone: List[_Entry] = []  # values that changed or died: their files go at the next cell
        self.written = 0  # bytes copied into /dev/shm
        self.inline = 0  # bytes of pickles sent in the cells' messages (once per rank)
        self._finalizer = weakref.finalize(self, shm.remove_pool_files, self.prefix)

    @property
    def sent(self) -> int:
        """Every byte the kernel sent the ranks for notebook values: to /dev/shm once, plus the pickles."""
        return self.written + self.inline

    def dumps_names(self, values: Dict[str, Any], nproc: int, local: bool = True) -> Tuple[Dict[str, bytes], Optional[Tuple[str, str]]]:
        """Pickle each name on its own (a failure names the variable); ``local``: the ranks share this host's /dev/shm."""
        self._sweep()
        blobs: Dict[str, bytes] = {}
        for name, value in values.items():
            try:
                blobs[name] = self._dump(value, nproc, local)
            except Exception as e:  # pickling can raise nearly anything
                log.debug("could not pickle notebook variable %r", name, exc_info=True)
                return blobs, (name, f"{type(value).__name__}: {type(e).__name__}: {e}")
            self.inline += len(blobs[name]) * nproc
        return blobs, None

    def _dump(self, value: Any, nproc: int, local: bool) -> bytes:
        """One value: its small tensors' and arrays' bytes out of band (pickle protocol 5), in one file
        for this cell when they add up to THRESHOLD (a container of many small tensors), else in the pickle."""
        buffers: List[pickle.PickleBuffer] = []
        f = io.BytesIO()
        _Pickler(f, self, nproc, local, buffers.append if local else None).dump(value)
        raws = [b.raw() for b in buffers]
        if sum(r.nbytes for r in raws) < THRESHOLD:
            if not buffers:
                return f.getvalue()
            f = io.BytesIO()
            _Pickler(f, self, nproc, local, None).dump(value)  # small: the bytes in the pickle
            return f.getvalue()
        try:
            path, layouts = self._write(raws, [(r.nbytes,) for r in raws], align=64)
        except OSError:  # /dev/shm full or missing: in the message, as before
            log.debug("notebook data could not go through %s; sending it in the message", shm.SHM_DIR, exc_info=True)
            return self._dump(value, nproc, local=False)
        self._gone.append(_Entry(None, (), path, layouts))  # a container can change unseen: this file serves this cell only
        return pickle.dumps(_OutOfBand(path, layouts, f.getvalue()), protocol=pickle.HIGHEST_PROTOCOL)

    def clear(self) -> None:
        """Remove every file (``%ddp stop``): the next cell writes what it needs again."""
        entries, self.entries = self.entries, {}  # a weakref callback may drop one meanwhile
        self._gone += entries.values()
        self._sweep()
        shm.remove_pool_files(self.prefix)

    def _sweep(self) -> None:
        gone, self._gone = self._gone, []
        for entry in gone:
            try:
                if entry.mm is not None:
                    entry.mm.close()
            except BufferError:  # a view of it still lives: the mapping goes with that view
                log.debug("notebook data mapping still in use", exc_info=True)
            shm.remove(entry.path)

    # ------------------------------------------------------------ values to files
    def stored(self, obj: Any, kind: str, mode: tuple, pieces: Callable[[], Sequence[Any]]) -> _Entry:
        """The file holding ``obj`` (as ``pieces()``, page-aligned), written only if it is new or changed."""
        key = (id(obj), mode)
        sig = _signature(obj, kind) + mode
        entry = self.entries.get(key)
        same = entry is not None and entry.ref is not None and entry.ref() is obj and entry.sig == sig
        if entry is not None and same and os.path.exists(entry.path) and (kind == "torch" or _same_bytes(entry, pieces())):
            return entry  # (a file someone removed is written again)
        if entry is not None:
            self._gone.append(self.entries.pop(key))
        parts = pieces()
        path, layouts = self._write([_raw(p, kind) for p in parts], [tuple(p.shape) for p in parts])
        entry = _Entry(weakref.ref(obj, functools.partial(self._died, key)), sig, path, layouts)
        if kind == "numpy":  # no version counter: the next cell compares the array with the file
            entry.mm = _map_readonly(path, layouts[-1][0] + layouts[-1][1])
        self.entries[key] = entry
        return entry

    def _died(self, key: tuple, _ref: object = None) -> None:
        entry = self.entries.get(key)
        if entry is not None and entry.ref is not None and entry.ref() is None:
            self._gone.append(self.entries.pop(key))

    def _write(self, raws: List[memoryview], shapes: List[Tuple[int, ...]], align: int = PAGE) -> Tuple[str, List[Layout]]:
        """One new private file with each piece at an ``align`` boundary (a page: a rank may map its piece alone)."""
        path = os.path.join(shm.SHM_DIR, f"{self.prefix}{FILE_TAG}{secrets.token_hex(8)}")
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        layouts: List[Layout] = []
        try:
            pos = 0
            for raw, shape in zip(raws, shapes):
                pos += -pos % align
                os.lseek(fd, pos, os.SEEK_SET)
                done = 0
                while done < raw.nbytes:
                    done += os.write(fd, raw[done:])
                layouts.append((pos, raw.nbytes, shape))
                pos += raw.nbytes
            os.ftruncate(fd, max(pos, 1))
        except BaseException:
            shm.remove(path)
            raise
        finally:
            os.close(fd)
        self.written += sum(r.nbytes for r in raws)
        return path, layouts


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, with large tensors and arrays by file name, small ones' bytes as protocol-5 buffers,
    and ``Scatter`` values split per rank."""

    def __init__(self, f: io.BytesIO, outbox: Outbox, nproc: int, local: bool, buffer_callback: Optional[Callable[[Any], None]]) -> None:
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=buffer_callback)
        self.outbox, self.nproc, self.local = outbox, nproc, local

    def reducer_override(self, obj: Any) -> Any:  # noqa: D401 - pickle hook
        if isinstance(obj, Scatter):
            return self._scatter(obj)
        kind = _kind(obj)
        if kind is not None and self.local and _nbytes(obj) >= THRESHOLD:
            try:
                entry = self.outbox.stored(obj, kind, ("full",), lambda: [obj])
            except OSError:  # /dev/shm full (a container's 64 MB) or missing: the bytes go in the message, as before
                log.debug("notebook data could not go through %s; sending it in the message", shm.SHM_DIR, exc_info=True)
                return super().reducer_override(obj)
            dtype, extra = _meta(obj, kind)
            return _attach, (entry.path, entry.layouts[0], kind, dtype, extra)
        if kind == "torch":  # small: its bytes as a buffer (numpy arrays do this themselves)
            dtype, extra = _meta(obj, kind)
            return _rebuild, (pickle.PickleBuffer(_raw(obj, kind)), dtype, tuple(obj.shape), extra)
        return super().reducer_override(obj)

    def _scatter(self, s: Scatter) -> Any:
        value, n = s.value, self.nproc
        kind = _kind(value)
        if kind is None or not self.local or _nbytes(value) < THRESHOLD:
            return _pick, (_split(value, n, s.dim),)
        try:
            entry = self.outbox.stored(value, kind, ("scatter", n, s.dim), lambda: _split(value, n, s.dim))
        except OSError:  # as in reducer_override: every shard in the message, each rank keeps its own
            log.debug("a scattered value could not go through %s; sending it in the message", shm.SHM_DIR, exc_info=True)
            return _pick, (_split(value, n, s.dim),)
        dtype, extra = _meta(value, kind)
        return _attach_shard, (entry.path, entry.layouts, kind, dtype, extra)


# ------------------------------------------------------------ the ranks' side
def _attach_shard(path: str, layouts: List[Layout], kind: str, dtype: Any, extra: dict) -> Any:
    """A scattered value in /dev/shm: this rank maps its own shard only."""
    return _attach(path, layouts[_rank()], kind, dtype, extra)


class _OutOfBand:
    """A value whose buffers wait in one file of this cell: unpickled on the rank over the mapped file (``_load_oob``)."""

    def __init__(self, path: str, layouts: List[Layout], inner: bytes) -> None:
        self.path, self.layouts, self.inner = path, layouts, inner

    def __reduce__(self) -> Tuple[Any, tuple]:
        return _load_oob, (self.path, self.layouts, self.inner)


def _load_oob(path: str, layouts: List[Layout], inner: bytes) -> Any:
    """The value over one private (copy-on-write) mapping of its buffers' file: no copy of their bytes."""
    view = memoryview(_map_private(path, 0, layouts[-1][0] + layouts[-1][1]))
    return pickle.loads(inner, buffers=[view[offset : offset + n] for offset, n, _ in layouts])


def _rebuild(buf: Any, dtype: str, shape: Tuple[int, ...], extra: dict) -> Any:
    """A small tensor over its buffer: a slice of the mapped file, or the bytes from the pickle."""
    import torch

    view = memoryview(buf).cast("B")
    if view.readonly:
        view = memoryview(bytearray(view))
    t = torch.frombuffer(view, dtype=torch.uint8) if view.nbytes else torch.empty(0, dtype=torch.uint8)
    return _restored(t.view(getattr(torch, dtype)).reshape(shape), extra)


def _restored(t: Any, extra: dict) -> Any:
    """A Parameter stays one; requires_grad stays set."""
    import torch

    if extra.get("parameter"):
        return torch.nn.Parameter(t, requires_grad=extra.get("grad", True))
    return t.requires_grad_(True) if extra.get("grad") else t


def _attach(path: str, layout: Layout, kind: str, dtype: Any, extra: dict) -> Any:
    """A value in /dev/shm, mapped copy-on-write: shared pages to read, this rank's own pages where it writes."""
    offset, nbytes, shape = layout
    if nbytes == 0:
        buf: Any = bytearray()
    else:
        buf = _map_private(path, offset, nbytes)
    if kind == "numpy":
        import numpy as np

        return np.frombuffer(buf, dtype=dtype).reshape(shape)
    import torch

    t = torch.frombuffer(buf, dtype=torch.uint8) if nbytes else torch.empty(0, dtype=torch.uint8)
    return _restored(t.view(getattr(torch, dtype)).reshape(shape), extra)


def _checked(path: str) -> str:
    if os.path.dirname(path) != shm.SHM_DIR or not os.path.basename(path).startswith(shm.SHM_PREFIX):
        raise ValueError(f"refusing a notebook data file outside {shm.SHM_DIR}: {path!r}")
    return path


def _map_private(path: str, offset: int, nbytes: int) -> mmap.mmap:
    fd = os.open(_checked(path), os.O_RDONLY)
    try:
        return mmap.mmap(fd, nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)
    finally:
        os.close(fd)


def _map_readonly(path: str, nbytes: int) -> mmap.mmap:
    fd = os.open(path, os.O_RDONLY)
    try:
        return mmap.mmap(fd, nbytes, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)


def _same_bytes(entry: _Entry, pieces: Sequence[Any]) -> bool:
    """Whether each (C-contiguous) piece still equals its bytes in the file: libc memcmp, at memory speed."""
    import numpy as np

    if entry.mm is None or len(entry.mm) == 0:
        return False
    mapped = np.frombuffer(entry.mm, dtype=np.uint8)
    base = mapped.__array_interface__["data"][0]
    memcmp = _libc().memcmp
    for piece, (offset, nbytes, _) in zip(pieces, entry.layouts):
        if not piece.flags.c_contiguous or piece.nbytes != nbytes:
            return False
        if nbytes and memcmp(piece.__array_interface__["data"][0], base + offset, nbytes) != 0:
            return False
    return True


_LIBC: List[Any] = []


def _libc() -> Any:
    """libc, with memcmp's C signature (loaded on first use: ranks never need it)."""
    if not _LIBC:
        libc = ctypes.CDLL(None)
        libc.memcmp.restype, libc.memcmp.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        _LIBC.append(libc)
    return _LIBC[0]
