"""The pool's files in /dev/shm: one name prefix per pool, every file private (0600), swept by whoever outlives the ranks.

Three kinds of file: the process group's FileStore (``<prefix>store-<run id>``, and
``.N`` for a group a cell re-formed), large results on their way to the kernel
(``<prefix>r<rank>-<random>``, transfer.py), and notebook data on its way to the ranks
(``<prefix>n-<random>``, notebook_data.py; one prefix per session, as its files outlive pools). The prefix names the kernel's pid
namespace, its pid and a token per Pool, so every path finds them by name:

- the kernel removes its pool's files after every stop, restart and teardown (the ranks are gone then);
- the template removes them when the kernel goes, even SIGKILLed (forkserver.py), and then every file named after that kernel;
- a rank killed mid-write leaves a half-written file that the pool's next teardown removes;
- a starting pool removes the files of dead kernels of this pid namespace (a spawn pool whose kernel was SIGKILLed).

torch's FileStore would create its file 0644 (less the umask), readable by every
user of the host; ``create_private`` makes it first, 0600, and torch opens it as it is.
"""
from __future__ import annotations

import os
import re
from typing import List, Optional, Tuple

from ..logs import log
from .kept import is_held

SHM_DIR = "/dev/shm"
SHM_PREFIX = "ddp_magic-"
ENV = "DDP_MAGIC_SHM_PREFIX"  # in every rank's env: the prefix of the files it creates
KEPT_MARKER = "kept"  # <prefix>kept: locked for life by a kept pool's template (procs/lease.py); its files are not orphans
_OWNER = re.compile(re.escape(SHM_PREFIX) + r"(\d+)-(\d+)-[0-9a-f]+-")


def pid_namespace() -> int:
    """This process's pid namespace (0 where /proc does not say): pids mean something only within it."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def pool_prefix(token: str, pid: Optional[int] = None) -> str:
    """The prefix of every file of one pool: ``ddp_magic-<pid namespace>-<kernel pid>-<token>-``."""
    return f"{SHM_PREFIX}{pid_namespace()}-{pid or os.getpid()}-{token}-"


def owner(name: str) -> Optional[Tuple[int, int]]:
    """(pid namespace, kernel pid) of a pool file's name; None for a name that is not one."""
    m = _OWNER.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def result_prefix(rank: int) -> str:
    """On a rank: the prefix of its result files (the pool's, or the bare one outside a pool)."""
    return rank_prefix(os.environ.get(ENV, SHM_PREFIX), rank)


def rank_prefix(pool: str, rank: int) -> str:
    """The prefix of one rank's files in a pool: what a rank that died alone may have left half written."""
    return pool + f"r{rank}-"


def armed_file(pool: str, shm_dir: str = SHM_DIR) -> str:
    """The marker of a pool armed with ``--save-on-preempt`` on this host: its ranks write it, its template reads it on
    SIGTERM and lets them save before they end (procs/rank_preempt.py, procs/forkserver.py)."""
    return os.path.join(shm_dir, pool + "preempt-armed")


def create_private(path: str, fresh: bool = False) -> None:
    """Make ``path`` exist with mode 0600 (``fresh``: empty, whatever was there before).

    Every rank calls it before torch's FileStore opens the file, so whoever creates it creates it private.
    """
    if fresh:
        remove(path)
    fd = os.open(path, os.O_CREAT | os.O_RDWR | (os.O_EXCL if fresh else 0), 0o600)
    os.close(fd)


def new_store(prefix: str, run_id: str) -> Optional[str]:
    """A one-host pool's FileStore, created empty and private; None where there is no /dev/shm (use env://)."""
    if not os.path.isdir(SHM_DIR):
        return None
    path = os.path.join(SHM_DIR, f"{prefix}store-{run_id}")
    create_private(path, fresh=True)
    return path


def remove(path: str) -> bool:
    """Remove one file; already gone is fine. Returns whether it was there."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
    except OSError:
        log.debug("could not remove %s", path, exc_info=True)
        return False


def pool_files(prefix: str, shm_dir: str = SHM_DIR) -> List[str]:
    """The files in ``shm_dir`` that one pool made."""
    if not prefix.startswith(SHM_PREFIX) or "/" in prefix:
        raise ValueError(f"not a pool's file prefix: {prefix!r}")
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return []
    return [os.path.join(shm_dir, n) for n in sorted(names) if n.startswith(prefix)]


def remove_pool_files(prefix: str, shm_dir: str = SHM_DIR) -> List[str]:
    """Remove every file of one pool (call once its ranks are gone); returns those removed."""
    return [path for path in pool_files(prefix, shm_dir) if remove(path)]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _kept(shm_dir: str, name: str) -> bool:
    """Whether ``name`` belongs to a kept pool whose template lives (it holds the lock on its prefix's marker)."""
    m = _OWNER.match(name)
    if m is None:
        return False
    return is_held(os.path.join(shm_dir, m.group(0) + KEPT_MARKER))


def remove_kernel_files(kernel_pid: int, shm_dir: str = SHM_DIR) -> List[str]:
    """Remove every file of one kernel of this pid namespace (call once it is dead): its pools' and its notebook data."""
    ns = pid_namespace()
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return []
    return [os.path.join(shm_dir, n) for n in names if owner(n) == (ns, kernel_pid) and remove(os.path.join(shm_dir, n))]


def remove_orphans(shm_dir: str = SHM_DIR) -> List[str]:
    """Remove pool files of this user whose kernel is dead, in this pid namespace only; returns those removed."""
    ns = pid_namespace()
    if not ns:
        return []
    removed = []
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return []
    for name in names:
        who = owner(name)
        if who is None or who[0] != ns or _pid_alive(who[1]) or _kept(shm_dir, name):
            continue
        path = os.path.join(shm_dir, name)
        try:
            if os.stat(path).st_uid != os.getuid():
                continue
        except OSError:
            continue
        if remove(path):
            removed.append(path)
    return removed
