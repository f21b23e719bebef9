"""A kept pool's files, as both ends see them: where they are, the discovery file, the liveness lock, the shown offsets.

A kept pool (``%ddp keep``, docs/keep.md) outlives its kernel, anchored in its template.
Everything about it lives in the user's Jupyter runtime directory (0700 by Jupyter), each
file 0600: only the same Unix user may find it or prove its secret.

- ``ddp-kept-<id>.json``: the discovery file: the pool's secret, its spec, its ranks, its lease, who is attached.
- ``ddp-kept-<id>.lock``: held (flock) by the template for its whole life. Liveness is "is it locked?", never a
  pid that may be reused: a template that died, however, releases it (Monarch's once_daemon does the same).
- ``ddp-kept-<id>/``: the lease socket (``lease.sock``: kernels attach there, ranks wait for a kernel there),
  the ranks' output spools (``r<rank>.out``/``.err``: every byte, the offset is its sequence number) and
  ``shown``: how many bytes of each spool a kernel has shown (an mmap'd array, current even after a SIGKILL).

A kept Slurm pool whose nodes are other hosts (docs/keep.md, "Across hosts"): its lease is held on the first node
and listens on TCP there, TLS with a certificate of its own (``LeaseAt``: host, port, fingerprint), each peer
proving the pool's secret inside it as on the socket. That node's files sit in its own ``ddp-held/`` (``held_dir``).
On the kernel's host, the process that holds the allocation (procs/slurm_hold.py) follows the lease over that
connection (procs/lease_watch.py): it holds the liveness lock here and mirrors the holder's discovery file, so
that everything above reads the same files on either kind of pool.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import mmap
import os
import signal
import struct
import socket
import tempfile
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ..logs import log
from . import protocol as P
from . import tls

PREFIX = "ddp-kept-"
STREAMS = ("stdout", "stderr")
SUFFIX = {"stdout": "out", "stderr": "err"}
_OFFSET = struct.Struct("<Q")
ANCHOR_KEEP = signal.SIGUSR1  # to procs/anchor.py (salloc's or srun's parent on Slurm): outlive the kernel
ANCHOR_UNKEEP = signal.SIGUSR2  # to it: go with the kernel again


def runtime_dir() -> str:
    """The Jupyter runtime directory (JUPYTER_RUNTIME_DIR, else jupyter_core's default), made 0700 if new."""
    path = os.environ.get("JUPYTER_RUNTIME_DIR")
    if not path:
        try:
            from jupyter_core.paths import jupyter_runtime_dir

            path = jupyter_runtime_dir()
        except ImportError:  # no Jupyter here (a terminal's `python -m ddp_magic kept`): its default place
            path = os.path.join(os.environ.get("XDG_DATA_HOME", os.path.expanduser("~/.local/share")), "jupyter", "runtime")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def discovery_path(pool_id: str, where: Optional[str] = None) -> str:
    return os.path.join(where or runtime_dir(), f"{PREFIX}{pool_id}.json")


def lock_path(pool_id: str, where: Optional[str] = None) -> str:
    return os.path.join(where or runtime_dir(), f"{PREFIX}{pool_id}.lock")


def pool_dir(pool_id: str, where: Optional[str] = None) -> str:
    return os.path.join(where or runtime_dir(), f"{PREFIX}{pool_id}")


def socket_path(pool_id: str, where: Optional[str] = None) -> str:
    return os.path.join(pool_dir(pool_id, where), "lease.sock")


def held_dir() -> str:
    """Where a lease held for a kernel on another host keeps its files on this node (never the kernel's names)."""
    path = os.path.join(runtime_dir(), "ddp-held")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


LeaseAt = Dict[str, Any]  # {"path": the lease socket} or {"host", "port", "fp"}: a lease over TCP and TLS (another host's)


def dial_lease(at: LeaseAt, secret: bytes, timeout: float = 10.0) -> socket.socket:
    """A connection to a kept pool's lease, the pool's secret proved both ways (over TLS, the holder's certificate
    pinned first). Raises OSError (ConnectionError for a wrong secret or certificate)."""
    if at.get("path"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(str(at["path"]))
        except OSError:
            sock.close()
            raise
    else:
        sock = tls.connect((str(at["host"]), int(at["port"])), str(at["fp"]), timeout)  # the relay's plain twin
        sock.settimeout(timeout)
    try:
        P.client_handshake(sock, secret)
    except (OSError, EOFError, ValueError) as e:
        sock.close()
        raise ConnectionError(f"the kept pool's lease refused us: {e}") from None
    return sock


def spool_path(directory: str, rank: int, stream: str) -> str:
    return os.path.join(directory, f"r{rank}.{SUFFIX[stream]}")


def make_pool_dir(pool_id: str, where: Optional[str] = None) -> str:
    path = pool_dir(pool_id, where)
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def write_private(path: str, data: Dict[str, Any]) -> None:
    """Write a JSON file 0600, atomically (a reader sees the old or the new one, never half)."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=".json")  # mkstemp: 0600
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read(path: str) -> Dict[str, Any]:
    """A discovery file; PermissionError where it is another user's, ValueError where it is not one."""
    st = os.stat(path)
    if st.st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to another user")
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict) or "id" not in data:
        raise ValueError(f"{path} is not a kept pool's discovery file")
    return data


def discovery_files(where: Optional[str] = None) -> List[str]:
    where = where or runtime_dir()
    try:
        names = sorted(os.listdir(where))
    except OSError:
        return []
    return [os.path.join(where, n) for n in names if n.startswith(PREFIX) and n.endswith(".json")]


# ------------------------------------------------------------ the liveness lock
def hold_lock(path: str) -> int:
    """Create and lock ``path`` (0600) for the life of this process; the fd, never to be closed. Raises BlockingIOError
    where another process holds it."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    os.set_inheritable(fd, False)  # a forked rank must not keep the pool "alive" once its template is gone
    return fd


def is_held(path: str) -> bool:
    """Whether some process holds the lock at ``path`` (its kept pool lives); a missing file is not held."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


# ------------------------------------------------------------ what a kernel has shown
class ShownOffsets:
    """Per rank and stream, how many bytes of its output a kernel has shown: an mmap'd file, so a SIGKILLed kernel's
    last count is there for the next one (attach replays from it: no gap, no duplicate)."""

    def __init__(self, path: str, nproc: int) -> None:
        size = nproc * len(STREAMS) * _OFFSET.size
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.nproc = nproc

    def _at(self, rank: int, stream: str) -> int:
        return (rank * len(STREAMS) + STREAMS.index(stream)) * _OFFSET.size

    def add(self, rank: int, stream: str, n: int) -> None:
        at = self._at(rank, stream)
        _OFFSET.pack_into(self._map, at, _OFFSET.unpack_from(self._map, at)[0] + n)

    def set(self, rank: int, written: Dict[str, int]) -> None:
        """Where the rank's spools start (a rank kept now, or started again): nothing before is the next kernel's."""
        for stream, n in written.items():
            _OFFSET.pack_into(self._map, self._at(rank, stream), int(n))

    def get(self, rank: int, stream: str) -> int:
        return int(_OFFSET.unpack_from(self._map, self._at(rank, stream))[0])

    def all(self) -> Dict[int, Tuple[int, int]]:
        return {r: (self.get(r, "stdout"), self.get(r, "stderr")) for r in range(self.nproc)}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._map.close()


def listing(where: Optional[str] = None) -> Iterator[Tuple[str, Dict[str, Any], bool]]:
    """Every kept pool file of this user: (path, its data, whether its lease holder lives). Unreadable ones are logged."""
    for path in discovery_files(where):
        try:
            data = read(path)
        except (OSError, ValueError):
            log.debug("could not read kept pool file %s", path, exc_info=True)
            continue
        yield path, data, is_held(lock_path(data["id"], os.path.dirname(path)))
