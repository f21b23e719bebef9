"""The pool's default process group against what scripts do to it: their own init and destroy, sub-groups' timeouts.

The pool owns the default group. A published script calls ``init_process_group``
itself (nccl, a ``device_id``, its own timeout) and ends with
``destroy_process_group()``; in a notebook that script runs again, and the next
cell runs on the same ranks. So, on the ranks:

- ``init_process_group`` on an initialised group keeps it; one notice per cell
  (rank 0's) names the arguments that were ignored;
- ``destroy_process_group()`` of the pool's group is deferred until the pool ends:
  the script's own sub-groups go, the default group stays for later cells;
- sub-groups (``new_group``, device meshes) get the pool's ``--pg-timeout`` unless
  the call gives one (torch's defaults are 10 or 30 minutes);
- a pool group that really went (code reaching around the deferral) is re-formed
  before the next cell (``gone``), with a notice.

torch is imported inside functions only (see rank_torch.py).
"""
from __future__ import annotations

import functools
import inspect
import os
import sys
from datetime import timedelta
from typing import Any, Dict, List, Mapping, Optional

from ..logs import log


class _State:
    rank = 0
    pool_group: Any = None  # the pool's default ProcessGroup, once formed (None: --no-init)
    kept: List[Any] = []  # every group the pool made before its first cell (--mesh's too): never a script's to end
    reforms = 0  # how many times the pool's group was re-formed (names its fresh store)
    init_noticed = False  # this cell
    destroy_noticed = False  # this pool: said once


STATE = _State()
DESTROY_NOTICE = (
    "destroy_process_group(): deferred; the pool keeps its process group for later cells "
    "(said once; %ddp restart gives a fresh pool)"
)


def pool_timeout() -> Optional[timedelta]:
    """The pool's --pg-timeout, as the plan wrote it into the env."""
    seconds = os.environ.get("DDP_MAGIC_PG_TIMEOUT")
    return timedelta(seconds=float(seconds)) if seconds else None


def notice(text: str) -> None:
    """One line on rank 0's stderr: the same notice from every rank would only repeat it."""
    if STATE.rank == 0:
        print(f"ddp_magic: {text}", file=sys.stderr, flush=True)


def _shown(name: str, value: Any) -> str:
    if isinstance(value, str):
        return f"{name}={value!r}"
    if isinstance(value, (int, float, timedelta)) or type(value).__name__ == "device":
        return f"{name}={value}"
    return f"{name}={type(value).__name__}"


def ignored_arguments(given: Mapping[str, Any], current: Mapping[str, Any]) -> List[str]:
    """The arguments of a call to init_process_group that the kept group does not match, as ``name=value``.

    ``current``: backend, world_size, rank, timeout (timedelta or None), device_id of the group kept.
    """
    same = {
        "backend": lambda v: str(v).lower() == str(current.get("backend", "")).lower(),
        "init_method": lambda v: v == "env://",
        "world_size": lambda v: v in (-1, current.get("world_size")),
        "rank": lambda v: v in (-1, current.get("rank")),
        "timeout": lambda v: current.get("timeout") is not None and v == current.get("timeout"),
        "device_id": lambda v: v == current.get("device_id"),
        "group_name": lambda v: not v,
    }
    out = []
    for name, value in given.items():
        if value is None or same.get(name, lambda v: False)(value):
            continue
        out.append(_shown(name, value))
    return out


def _given(real: Any, args: tuple, kwargs: dict) -> Dict[str, Any]:
    """The arguments a call passed, by name."""
    try:
        return dict(inspect.signature(real).bind_partial(*args, **kwargs).arguments)
    except (TypeError, ValueError):
        log.debug("could not bind init_process_group's arguments", exc_info=True)
        return dict(zip(("backend", "init_method"), args), **kwargs)


def _current() -> Dict[str, Any]:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    group = c10d._get_default_group()
    return {
        "backend": str(dist.get_backend()), "world_size": dist.get_world_size(), "rank": dist.get_rank(),
        "timeout": pool_timeout() if group is STATE.pool_group else None, "device_id": getattr(group, "bound_device_id", None),
    }


def _is_pool_group(group: Any) -> bool:
    """Whether ``destroy_process_group(group)`` would tear down the pool's default group."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if STATE.pool_group is None or not dist.is_initialized():
        return False
    default = c10d._get_default_group()
    return default is STATE.pool_group and (group is None or group is default)


def _destroy_subgroups(real_destroy: Any) -> None:
    """What destroy_process_group() means to the script: its own groups end; the pool's stays."""
    import torch.distributed.distributed_c10d as c10d

    for group in list(c10d._world.pg_map):
        if group is STATE.pool_group or any(group is k for k in STATE.kept):
            continue
        try:
            real_destroy(group)
        except Exception:  # a group torch already let go of: nothing left to end
            log.debug("could not destroy a sub-group at the script's destroy_process_group()", exc_info=True)


def _inherit_timeout() -> None:
    """Sub-groups created without a timeout (new_group, split_group, device meshes) get the pool's --pg-timeout."""
    import torch.distributed.distributed_c10d as c10d

    timeout = pool_timeout()
    if timeout is None:
        return
    c10d.default_pg_timeout = timeout
    if isinstance(getattr(c10d, "default_pg_nccl_timeout", None), timedelta):
        c10d.default_pg_nccl_timeout = timeout


def install() -> None:
    """Patch torch.distributed's init_process_group and destroy_process_group on this rank (once)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    STATE.rank = int(os.environ.get("RANK", "0"))
    _inherit_timeout()
    real_init, real_destroy = c10d.init_process_group, c10d.destroy_process_group
    if getattr(real_init, "_ddp_magic", False):
        return

    @functools.wraps(real_init)
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        if not dist.is_initialized():
            return real_init(*args, **kwargs)
        ignored = ignored_arguments(_given(real_init, args, kwargs), _current())
        if ignored and not STATE.init_noticed:
            STATE.init_noticed = True
            notice(
                f"init_process_group(): the process group is already initialised with {dist.get_backend()} "
                f"({dist.get_world_size()} ranks); kept it, ignored {', '.join(ignored)}"
            )
        return None

    @functools.wraps(real_destroy)
    def destroy_process_group(group: Any = None) -> None:
        if not _is_pool_group(group):
            return real_destroy(group)
        _destroy_subgroups(real_destroy)
        if not STATE.destroy_noticed:
            STATE.destroy_noticed = True
            notice(DESTROY_NOTICE)
        return None

    init_process_group._ddp_magic = True  # type: ignore[attr-defined]
    destroy_process_group._ddp_magic = True  # type: ignore[attr-defined]
    c10d.init_process_group = dist.init_process_group = init_process_group
    c10d.destroy_process_group = dist.destroy_process_group = destroy_process_group


def adopt() -> None:
    """The default group that was just formed is the pool's."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if dist.is_initialized():
        STATE.pool_group = c10d._get_default_group()


def keep_groups() -> None:
    """The pool is ready: the groups it made (the default one, --mesh's) outlive a script's destroy_process_group()."""
    if "torch" in sys.modules:
        import torch.distributed.distributed_c10d as c10d

        STATE.kept = list(c10d._world.pg_map)


def begin_cell() -> None:
    STATE.init_noticed = False


def gone() -> bool:
    """Whether the pool formed a group that no longer exists (destroyed around the deferral): re-form it."""
    if STATE.pool_group is None or "torch" not in sys.modules:
        return False
    import torch.distributed as dist

    return not dist.is_initialized()
