"""Both ends of autoreload (``%ddp autoreload``): which modules are the user's, a file's version, the IPython we support.

The kernel (kernel/reload.py) and each rank (procs/rank_reload.py) name a module's
version the same way: the SHA-256 of its file's bytes. A file is only read again when
its ``stat`` changed (mtime in ns and size), so a warm cell costs one ``stat`` a watched
file and no read. Only the user's own modules are watched: a file outside the
interpreter's prefixes and site-packages (the notebook's ``model.py``, an editable
install of the user's package), never torch or the stdlib, whose few thousand files
IPython's own ``%autoreload 2`` stats at every cell.
"""
from __future__ import annotations

import hashlib
import os
import site
import sys
import sysconfig
from types import ModuleType
from typing import Dict, Optional, Tuple

StatKey = Tuple[int, int]  # (st_mtime_ns, st_size)

# IPython releases whose autoreload is broken: 8.17.0 and 8.17.1 (pre_run_cell's signature, ipython#14230),
# 9.0.0 (IPython.extensions.deduperreload missing, ipython#14808). pyproject.toml excludes the same.
BROKEN_IPYTHON = ("8.17.0", "8.17.1", "9.0.0")
MIN_IPYTHON = (8, 0)
IPYTHON_REQUIREMENT = "ipython>=8.0,!=8.17.0,!=8.17.1,!=9.0.0"


def ipython_problem(version: str) -> Optional[str]:
    """Why this IPython cannot reload modules on the ranks (None: it can)."""
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    base = ".".join(version.split(".")[:3])
    if tuple(parts) < MIN_IPYTHON or base in BROKEN_IPYTHON:
        return (f"autoreload on the ranks needs {IPYTHON_REQUIREMENT} (8.17.0, 8.17.1 and 9.0.0 have a broken autoreload: "
                f"ipython#14230, #14808); the ranks have IPython {version}. Run pip install -U ipython, or %ddp autoreload off")
    return None


def digest(data: bytes) -> str:
    """A file's version: the hex SHA-256 of its bytes."""
    return hashlib.sha256(data).hexdigest()


def short(sha: str) -> str:
    """A version as the user reads it: its first 8 hex digits."""
    return sha[:8]


def stat_key(path: str) -> Optional[StatKey]:
    """The file's (mtime ns, size); None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def read(path: str) -> Tuple[Optional[bytes], Optional[StatKey]]:
    """The file's bytes and its stat key at that read (None, None: gone or unreadable)."""
    key = stat_key(path)
    try:
        with open(path, "rb") as f:
            return f.read(), key
    except OSError:
        return None, None


def _system_dirs() -> Tuple[str, ...]:
    """Where modules that are not the user's live: the interpreter's prefixes, site-packages, ddp_magic itself."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(path)
    try:
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    except AttributeError:  # a virtualenv's old site.py
        pass
    dirs.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # ddp_magic
    return tuple(os.path.realpath(d) + os.sep for d in dirs if d)


SYSTEM_DIRS = _system_dirs()


def user_file(module: object) -> Optional[str]:
    """The ``.py`` file of a user's module (real path), or None: a builtin, a package of the interpreter, ``__main__``."""
    if not isinstance(module, ModuleType):
        return None
    name = getattr(module, "__name__", None)
    path = getattr(module, "__file__", None)
    if not name or name in ("__main__", "__mp_main__") or not isinstance(path, str) or not path.endswith(".py"):
        return None
    real = real_path(path)
    if real.startswith(SYSTEM_DIRS) or "site-packages" in real or "dist-packages" in real:
        return None
    return real


_REAL_DIRS: Dict[str, str] = {}  # an absolute folder -> its real path (a rank's first scan looks at a thousand of torch's files)


def real_path(path: str) -> str:
    """``os.path.realpath``, with each absolute folder resolved once: a file that is no link costs one ``lstat``, not one a folder of its path."""
    folder, base = os.path.split(path)
    if not os.path.isabs(folder) or os.path.islink(path):
        return os.path.realpath(path)
    real = _REAL_DIRS.get(folder)
    if real is None:
        real = _REAL_DIRS[folder] = os.path.realpath(folder)
    return os.path.join(real, base)
