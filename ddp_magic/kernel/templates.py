"""The template outlives pools: a pool hands its fork-server template to the next, and a kernel warms one at ``%load_ext``.

Forking ranks takes milliseconds; importing torch in a fresh template takes seconds.
So a change of ``-n`` (or of any option but the start method) stops only the old
pool's ranks, and the new pool forks its ranks from the same template
(``hand_over``). The template is replaced only when what it imported must
change: another Python or start method (here), or the env that torch reads at
import (``ForkServerLauncher.start``). No backend needs its own template: the
template never initialises a device or a process group.

``WarmTemplate`` is the template a kernel starts at ``%load_ext ddp_magic``, in the
background at low priority, so that the first ``%%ddp`` cell does not wait for
``import torch`` (the kernel's own import of torch follows once the kernel is idle); the first pool adopts it. It dies with the kernel (procs/parent.py),
and ``%ddp stop`` stops it.
"""
from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, List, Optional, Tuple

from ..logs import log
from ..words import fmt_seconds
from ..wire import protocol as P
from .launchers import ForkServerLauncher, Launcher
from .launchers.nodes import NodeLauncher
from .texts import NAMES_GONE

if TYPE_CHECKING:
    from .pool import Pool
    from .ranks import Listener

WARM_ENV = "DDP_MAGIC_WARM_TEMPLATE"  # "0": no template at %load_ext (the first cell starts one)
WARM_NICE = 10  # the warm template imports at this nice value (its ranks run at the kernel's)


def _fits(new: "Pool", launcher: Launcher) -> bool:
    """Whether ``new`` (not started) can fork its ranks from ``launcher``'s running template (or, for a Slurm pool, start
    them in its allocation: a new -n inside it is a new step, no new queue wait)."""
    mine = new.launcher
    if isinstance(launcher, NodeLauncher):  # Slurm, SSH: their serves() says
        return not new.started and type(mine) is type(launcher) and launcher.serves(new.plan)
    return (
        not new.started and isinstance(launcher, ForkServerLauncher) and type(mine) is type(launcher)
        and launcher.python == mine.python and launcher.alive()
    )


def adopt(new: "Pool", launcher: Launcher) -> bool:
    """Give ``new`` the running template of ``launcher``; False (nothing changed) where it cannot use it."""
    if not _fits(new, launcher):
        return False
    spare = new.launcher
    launcher.secret = new.secret  # each spawn carries it to the template: the new pool's ranks prove the new secret
    new.hub.launcher = launcher
    spare.close()
    return True


_REPLACED: "weakref.WeakKeyDictionary[Pool, Tuple[List[str], bool, float]]" = weakref.WeakKeyDictionary()  # new pool -> (changes, kept, stopped in)


def hand_over(old: "Pool", new: "Pool", changes: List[str]) -> bool:
    """Stop ``old``'s ranks; its template goes on in ``new`` where it fits (else it stops too). Returns whether it was kept.

    ``start_replaced`` then starts ``new`` and says what ``changes`` did."""
    if old.kept is not None:  # a kept pool replaced: its lease ends (the new pool is not kept; docs/keep.md)
        from .keep.keeping import unkeep

        unkeep(old, ending=True)
    launcher, since = old.launcher, time.monotonic()
    kept = _fits(new, launcher)
    if kept:
        old.stop(keep_template=True)
        spare = new.launcher
        adopt(new, launcher)
        old.hub.launcher = spare  # the old pool's finalizer closes a launcher that never started, not the template
    else:
        old.stop()
    if old.start_seconds is not None:  # its ranks came up once; else (a start refused, failed or interrupted) no ranks and
        # no names were there, and the new pool's start is a first start, said as one
        _REPLACED[new] = (changes, kept, time.monotonic() - since)
    return kept


def start_replaced(pool: "Pool", listener: "Listener") -> bool:
    """Start a pool that replaced another (hand_over) now, and tell the listener how long the old ranks took to stop and
    the new pool to start (``Pool.start_seconds``: the "pool started in" of the cell's view, the same figure) and what was kept.

    Returns whether it did; a pool that replaced none is left as it is."""
    replaced = _REPLACED.pop(pool, None)
    if replaced is None or pool.started:
        return False
    changes, kept, stopped = replaced
    before = _template_pid(pool)
    pool.start(listener)
    kept = kept and _template_pid(pool) == before  # the launcher may have replaced a stale template
    listener.on_notice(restart_notice(changes, stopped, pool.start_seconds or 0.0, kept, pool.template_info))
    return True


def _template_pid(pool: "Pool") -> Optional[int]:
    proc = getattr(pool.launcher, "proc", None)
    return proc.pid if proc is not None else None


def restart_notice(changes: List[str], stopped: float, started: float, kept: bool, info: str = "") -> str:
    """What the user reads once the new pool's ranks are up: what changed, how long the old ranks took to stop and the
    new pool to start (one clock: the view's "pool started in" says the same), what was kept."""
    why = info[info.find("(new template: ") + len("(new template: ") : -1] if info.endswith(")") and "(new template: " in info else ""
    if kept and info.startswith("slurm"):
        how = "in the same Slurm allocation: no new queue wait"
    else:
        how = "from the same template: torch stayed imported" if kept else "with a new template" + (f" ({why})" if why else "")
    took = f"old ranks stopped in {fmt_seconds(stopped)}, pool started in {fmt_seconds(started)}"
    return f"restarting the pool ({', '.join(changes)}): {took}, {how}; {NAMES_GONE}"


class WarmTemplate:
    """The kernel's template before its first pool: started at %load_ext, adopted by the first pool."""

    def __init__(self) -> None:
        self.launcher: Optional[ForkServerLauncher] = None

    def begin(self) -> None:
        """Start importing torch in a template now, at low priority, and in the kernel (it unpickles tensors) once
        it is idle; never fails the %load_ext. (Without the kernel's import, a first cell after a pause took
        1.2 s instead of 0.35 s on a busy machine.)"""
        if self.launcher is not None or os.environ.get(WARM_ENV, "1") == "0" or not sys.platform.startswith("linux"):
            return
        import_torch_when_idle()
        try:
            launcher = ForkServerLauncher(P.new_secret())
            launcher.begin(nice=WARM_NICE)
            self.launcher = launcher
        except Exception:  # the first cell starts a template as before
            log.debug("could not start a warm template at %load_ext", exc_info=True)

    def give(self, pool: "Pool") -> bool:
        """The first pool takes the warm template; one it cannot use is stopped."""
        launcher, self.launcher = self.launcher, None
        if launcher is None:
            return False
        if adopt(pool, launcher):
            return True
        launcher.close()
        return False

    def close(self) -> bool:
        """Stop the warm template (%ddp stop, unloading the extension); whether there was one."""
        launcher, self.launcher = self.launcher, None
        if launcher is not None:
            launcher.close()
        return launcher is not None

    @property
    def pid(self) -> Optional[int]:
        proc = self.launcher.proc if self.launcher is not None else None
        return proc.pid if proc is not None else None


IDLE_IMPORT_S = 0.5  # after %load_ext, the kernel imports torch once it has been idle this long


def import_torch_when_idle() -> None:
    """Import torch on the kernel's main thread, from its event loop, between cells.

    Never in a thread here: the user's next cell is most often ``import torch``, and two
    threads importing torch at once deadlocked the kernel (seen: ``%load_ext ddp_magic``,
    then ``import torch.distributed``, hung for good). From the loop, a cell that arrives
    meanwhile waits for the import to end, which it would have needed anyway."""
    if "torch" in sys.modules:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # no event loop (plain IPython in a terminal): the first %%ddp cell imports it
        return

    def _import() -> None:
        try:
            import torch  # noqa: F401
        except Exception:
            log.debug("idle import of torch failed", exc_info=True)

    loop.call_later(IDLE_IMPORT_S, _import)


def warm_torch_import() -> None:
    """Results (tensors) unpickle in the kernel, which then needs torch: import it in the
    background while the ranks start, instead of making the first result wait ~2 s."""
    if "torch" in sys.modules:
        return

    def _import() -> None:
        if sys.platform.startswith("linux"):  # elsewhere a thread id is no pid: never renice another process
            try:
                # Linux nice is per thread: on few cores the template's own import of torch,
                # which every rank waits for, goes first.
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), max(os.getpriority(os.PRIO_PROCESS, 0), 10))
            except OSError:
                log.debug("could not lower the priority of the torch import", exc_info=True)
        try:
            import torch  # noqa: F401
        except Exception:
            log.debug("background import of torch failed", exc_info=True)

    threading.Thread(target=_import, name="ddp-warm-torch", daemon=True).start()
