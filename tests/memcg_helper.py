"""A memory cgroup with a limit, for a test that makes the kernel's OOM killer act: cgroup v1 or v2, whichever the host
has writable (root). A host with both (v1's memory controller and an empty v2 hierarchy) uses v1, where the controller is."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator, Optional

from conftest import wait_until

V1 = Path("/sys/fs/cgroup/memory")
V2_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
WHY = "needs a writable memory cgroup, v1 or v2 (root): TOOLCHAIN.md"


def memory_root() -> Optional[Path]:
    """The root of the memory controller's hierarchy we may write (None: none)."""
    if (V1 / "memory.limit_in_bytes").exists() and os.access(V1 / "cgroup.procs", os.W_OK):
        return V1
    for root in V2_ROOTS:
        controllers = root / "cgroup.controllers"
        if controllers.exists() and "memory" in controllers.read_text().split() and os.access(root / "cgroup.subtree_control", os.W_OK):
            return root
    return None


@contextlib.contextmanager
def limited(name: str, limit: int) -> Iterator[Path]:
    """A new memory cgroup under the root, limited to ``limit`` bytes (no swap on v2); removed once its processes are gone."""
    root = memory_root()
    assert root is not None, WHY
    if root != V1 and "memory" not in (root / "cgroup.subtree_control").read_text().split():
        (root / "cgroup.subtree_control").write_text("+memory")
    d = root / name
    d.mkdir()
    try:
        if root == V1:
            (d / "memory.limit_in_bytes").write_text(str(limit))
        else:
            (d / "memory.max").write_text(str(limit))
            if (d / "memory.swap.max").exists():
                (d / "memory.swap.max").write_text("0")
        yield d
    finally:
        wait_until(lambda: not (d / "cgroup.procs").read_text().strip(), 30)
        d.rmdir()
