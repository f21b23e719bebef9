"""Moving values between processes: cloudpickle, with tensors out of band.

A tensor's bytes never go through torch's own pickling (which copies them
through ``torch.save``) nor through torch.multiprocessing's fd-passing
reductions (which need a multiprocessing connection at both ends). Instead the
pickle stream carries the dtype and shape, and the bytes travel as pickle
protocol-5 buffers: through one file in /dev/shm when large and the kernel is on
this host, which the receiver maps without copying; else in the message, as the
tensor's own memory, which the control channel sends out of band (protocol.py)
and the receiver reads into the memory the tensor then keeps.
"""
from __future__ import annotations

import io
import mmap
import os
import pickle
import secrets
from typing import Any, List, Optional, Tuple

import cloudpickle

from ..logs import log
from . import sharded
from .shm import SHM_DIR, SHM_PREFIX

SHM_THRESHOLD = 1 << 20  # buffers smaller than this in total travel inline


class Unpicklable:
    """Stands in a result list for a rank whose value could not be sent back."""

    def __init__(self, rank: int, type_name: str, reason: str) -> None:
        self.rank, self.type_name, self.reason = rank, type_name, reason

    def __repr__(self) -> str:
        return f"<unpicklable {self.type_name} from rank {self.rank}: {self.reason}>"


def _rebuild_tensor(buf: Any, dtype: str, shape: Tuple[int, ...]) -> Any:
    """Receiver side: a tensor over the buffer itself (a mapped shm slice or a bytearray)."""
    import torch

    dt = getattr(torch, dtype)
    view = memoryview(buf).cast("B")
    if view.nbytes == 0:
        return torch.empty(shape, dtype=dt)
    if view.readonly:
        view = memoryview(bytearray(view))
    return torch.frombuffer(view, dtype=torch.uint8).view(dt).reshape(shape)


class _Pickler(cloudpickle.Pickler):
    """cloudpickle that hands plain dense tensors' bytes out of band."""

    def reducer_override(self, obj: Any) -> Any:  # noqa: D401 - pickle hook
        torch = _torch_if_loaded()
        if torch is not None and isinstance(obj, torch.Tensor) and type(obj) in (torch.Tensor, torch.nn.Parameter):
            if obj.layout == torch.strided and not obj.is_quantized:
                t = obj.detach()
                if t.device.type != "cpu":
                    t = t.cpu()
                t = t.contiguous()
                dtype = str(t.dtype).replace("torch.", "")
                flat = t.reshape(-1)
                if flat.numel() == 0:
                    return _rebuild_tensor, (bytearray(), dtype, tuple(t.shape))
                raw = flat.view(torch.uint8).numpy()
                return _rebuild_tensor, (pickle.PickleBuffer(raw), dtype, tuple(t.shape))
        if torch is not None and isinstance(obj, torch.Tensor):  # a subclass: a DTensor goes as its local shard
            reduced = sharded.reduce_dtensor(obj)
            if reduced is not None:
                return reduced
        return super().reducer_override(obj)


def _torch_if_loaded() -> Any:
    import sys

    return sys.modules.get("torch")


def dumps(value: Any) -> Tuple[bytes, List[pickle.PickleBuffer]]:
    """Pickle value; tensors' bytes come back separately as buffers."""
    buffers: List[pickle.PickleBuffer] = []
    f = io.BytesIO()
    _Pickler(f, protocol=5, buffer_callback=buffers.append).dump(value)
    return f.getvalue(), buffers


def pack(value: Any, shm_dir: Optional[str] = SHM_DIR, prefix: str = SHM_PREFIX) -> dict:
    """A message-ready form of value: pickle bytes plus buffers inline or in one shm file.

    The file is 0600 and named ``prefix`` + random (a rank passes its pool's, shm.result_prefix),
    so a file a killed rank half wrote is found and removed with the pool's others."""
    data, buffers = dumps(value)
    views = [b.raw() for b in buffers]
    sizes = [v.nbytes for v in views]
    total = sum(sizes)
    if total >= SHM_THRESHOLD and shm_dir and os.path.isdir(shm_dir):
        path = os.path.join(shm_dir, prefix + secrets.token_hex(12))
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            for v in views:
                written = 0
                while written < v.nbytes:
                    written += os.write(fd, v[written:])
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)
        return {"pickle": data, "shm": path, "sizes": sizes}
    # The tensors' own memory: the frame sends it out of band, uncopied. A tuple: a plain value's () leaves the dict it
    # arrives in untracked by the kernel's garbage collector (1,024 DONEs a cell), where a list would not.
    return {"pickle": data, "buffers": tuple(buffers)}


def unpack(packed: dict) -> Any:
    """Inverse of pack. A shm file is mapped (no copy), then unlinked at once."""
    if "shm" in packed:
        path = packed["shm"]
        if not (os.path.dirname(path) == SHM_DIR and os.path.basename(path).startswith(SHM_PREFIX)):
            raise ValueError(f"refusing result file outside {SHM_DIR}: {path!r}")
        fd = os.open(path, os.O_RDWR)
        try:
            os.unlink(path)
            total = sum(packed["sizes"])
            mm = mmap.mmap(fd, total) if total else None
        finally:
            os.close(fd)
        buffers, offset = [], 0
        for size in packed["sizes"]:
            buffers.append(memoryview(mm)[offset : offset + size] if mm is not None else b"")
            offset += size
        return pickle.loads(packed["pickle"], buffers=buffers)
    return pickle.loads(packed["pickle"], buffers=[_owned(b) for b in packed["buffers"]])


def _owned(buf: Any) -> Any:
    """A buffer the value may keep and write: what the control channel read (a bytearray, a private map) as it is; a
    copy of anything else (bytes, or a sender's own memory when nothing crossed a process)."""
    if isinstance(buf, (bytearray, mmap.mmap)):
        return buf
    return bytearray(memoryview(buf))


def dumps_names(namespace: dict) -> Tuple[dict, Optional[Tuple[str, str]]]:
    """Pickle each name on its own so a failure names the variable; returns (blobs, failure)."""
    blobs = {}
    for name, value in namespace.items():
        try:
            blobs[name] = cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # pickling can raise nearly anything
            log.debug("could not pickle notebook variable %r", name, exc_info=True)
            return blobs, (name, f"{type(value).__name__}: {type(e).__name__}: {e}")
    return blobs, None


def load_name(blob: bytes) -> Any:
    """Worker side: one notebook value from dumps_names (the frame carrying it was authenticated)."""
    return cloudpickle.loads(blob)
