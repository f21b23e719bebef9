"""Keep a running pool past its kernel (``%ddp keep``), or no more (``--off``): the kernel's half of the handshake.

The template takes the lease (procs/lease.py: lock, discovery file, timers), every rank starts spooling
its output and joins the lease socket (procs/rank_keep.py), and the kernel starts counting what it shows
(wire/kept.py ``ShownOffsets``). From then on the pool's finalizer, at the kernel's exit, detaches from the
ranks instead of stopping them. Nothing changes on a cell's path.
"""
from __future__ import annotations

import atexit
import base64
import json
import os
import pickle
import secrets
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Optional, Union

from ...logs import log
from ...wire import kept
from ...wire import protocol as P
from ..launchers import ForkServerLauncher, RayLauncher, SlurmLauncher, SshLauncher
from ..failures.recovery import stop_quietly
from ..output.fold import setting
from ..output.kept_output import KeptOutput
from .launcher import KeptLauncher, KeptSlurmLauncher
from .terms import Terms

NodesKept = Union[SlurmLauncher, SshLauncher, RayLauncher]  # pools across nodes that can be kept: a template a node, one holds the lease
NODES = (SlurmLauncher, SshLauncher, RayLauncher)

SPOOL_MIB = 64.0  # the default of spool_cap()

if TYPE_CHECKING:
    from ..hub import Hub
    from ..pool import Pool

KEEP_WAIT_S = 30.0  # the template and every rank answer a keep within this


class KeepError(RuntimeError):
    """The pool cannot be kept (or unkept); the message says why and what to do."""


@dataclass
class KeptState:
    """What the kernel holds of its pool's lease."""

    id: str
    dir: str
    where: str
    terms: Terms
    notebook: str = ""
    job: str = ""  # the background cell kept with it (%%ddp --bg --keep), as the user calls it

    def text(self) -> str:
        return self.terms.text()


SAVES = "saves.json"  # in a kept pool's directory here: its saves a kernel that attaches takes on (``record_saves``)


def record_saves(state: KeptState, **saves: Any) -> None:
    """What a kernel that attaches the kept pool takes on: ``armed`` (the ``--save-on-preempt`` folder: it arms the ranks
    again, so a preemption while it is attached saves) and ``every`` (``--save-every [interval, folder]`` of the kept
    job, [] for none: its saves go on at safe points while it is attached). None leaves a value as it was."""
    path = os.path.join(state.dir, SAVES)
    before = recorded_saves(state)
    merged = dict(before, **{k: v for k, v in saves.items() if v is not None})
    if json.loads(json.dumps(merged)) == before:  # every cell on a kept pool records its --save-every: no write when it is the same
        return
    try:
        with open(os.open(path + ".tmp", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600), "w") as f:
            json.dump(merged, f)
        os.replace(path + ".tmp", path)
    except OSError:  # the pool's directory went with its lease: nothing to take on
        log.warning("the kept pool's saves could not be recorded in %s; a kernel that attaches it will not take them on", path, exc_info=True)


def recorded_saves(state: KeptState) -> Dict[str, Any]:
    """``record_saves``' values ({} when none were recorded)."""
    try:
        with open(os.path.join(state.dir, SAVES)) as f:
            return dict(json.load(f))
    except (OSError, ValueError):  # none recorded (or the directory went with the lease)
        return {}


def notebook_name() -> str:
    """The notebook this kernel runs (Jupyter server sets JPY_SESSION_NAME), or "" where none says."""
    return os.environ.get("JPY_SESSION_NAME", "")


def pool_blob(pool: "Pool") -> str:
    """What a next kernel needs to take the pool on as if it had started it: spec, plan, files, env (0600 file)."""
    blob = {"spec": pool.spec, "plan": pool.plan, "shm_prefix": pool.shm_prefix, "store_path": pool.store_path,
            "launch_env": getattr(pool, "launch_env", None), "cell": pool._cell, "generation": pool.generation,
            "listen_addr": pool.listen_addr, "tls": pool.tls_key is not None, "start_seconds": pool.start_seconds}
    if isinstance(pool.launcher, (*NODES, KeptSlurmLauncher)) and pool.plan is not None:  # what forks a rank again there
        blob["ssh" if pool.plan.ssh is not None else "ray" if pool.plan.ray is not None else "slurm"] = pool.launcher.kept_blob()
    return base64.b64encode(pickle.dumps(blob)).decode()


def keep(pool: "Pool", terms: Terms, job: str = "") -> KeptState:
    """Keep ``pool`` past this kernel under ``terms`` (again: the new terms). Raises KeepError."""
    if not pool.alive:
        raise KeepError("%ddp keep: no pool is running; start one first (%%ddp -n N), or put --keep on the cell that starts it")
    launcher = _keepable(pool)
    state: Optional[KeptState] = pool.kept
    pool_id = state.id if state is not None else secrets.token_hex(4)
    where = state.where if state is not None else kept.runtime_dir()
    notebook = state.notebook if state is not None else notebook_name()
    job = job or (state.job if state is not None else "")
    info = {"notebook": notebook, "nproc": pool.nproc, "job": job, "kernel_pid": os.getpid(), "pool": pool_blob(pool),
            "shm_prefix": pool.shm_prefix, "user": os.getuid()}
    bind = launcher.lease_bind() if isinstance(launcher, NODES) and state is None else ""  # its holder is another host
    launcher.notes.clear()
    launcher._write({"op": "keep", "id": pool_id, "node": launcher.lease_node if isinstance(launcher, NODES) else "",
                     "where": "" if bind else where, "bind": bind, "idle": terms.idle, "max": terms.max, "secret": pool.secret.hex(),
                     "kernel": os.environ.get("JPY_SESSION_NAME", "") or f"pid {os.getpid()}", "pid": os.getpid(), "info": info})
    note = _await_note(pool, "kept")
    spools = str(note.get("dir") or kept.pool_dir(pool_id, where))  # where the ranks' output logs are (on their nodes)
    directory = kept.make_pool_dir(pool_id, where) if bind else spools  # this host's: the count of what this kernel showed
    if state is None and isinstance(launcher, NODES):  # the other nodes and this host follow the lease from now on
        _follow_lease(pool, launcher, pool_id, where, note, spools)
    if state is None:
        pool.hub.shown = KeptOutput(pool_id, kept.ShownOffsets(os.path.join(directory, "shown"), pool.nproc))  # KEEP replies start it
        at = note.get("lease") or {"path": kept.socket_path(pool_id, where)}
        pool.hub.keep_msg = {"on": True, "lease": at, "dir": spools, "cap": spool_cap()}
        pool.hub.expect_spools(pool.ranks)  # what they wrote before their spools began counts for none (kernel/output/hub_output.py)
        replies = pool.ask(P.KEEP, KEEP_WAIT_S, fields=pool.hub.keep_msg)
        missing = sorted(set(pool.ranks) - {r for r, m in replies.items() if m.get("on")})
        if missing:
            raise KeepError(f"%ddp keep: ranks {missing} did not answer; the pool is not fully kept (%ddp keep --off, then try again)")
        detach_at_exit(pool)
    pool.kept = KeptState(pool_id, directory, where, terms if state is None else Terms(terms.idle, terms.max, state.terms.since),
                          notebook, job)
    return pool.kept


def _follow_lease(pool: "Pool", launcher: NodesKept, pool_id: str, where: str, note: Dict[str, Any], spools: str) -> None:
    """The other nodes' templates follow the holder's lease, and this host follows it instead of this kernel: its lock
    here, or, for a lease on another host, a watch of it (procs/lease_watch.py) in our Slurm allocation's holder, over
    SSH in a process of its own (procs/lease_keeper.py), on Ray in the pool's driver (procs/ray_keep.py)."""
    lock = kept.lock_path(pool_id, where)
    at = note.get("lease") or {"path": kept.socket_path(pool_id, where)}
    launcher.follow_lease(pool_id, at, spools, pool.secret)
    if at.get("path"):
        launcher.outlive_kernel(lock)
        return
    launcher.outlive_kernel(lock, watch={"lease": at, "secret": pool.secret.hex(), "id": pool_id, "where": where, "node": launcher.lease_node})
    deadline = time.monotonic() + KEEP_WAIT_S
    while not kept.is_held(lock) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not kept.is_held(lock):
        launcher.outlive_kernel("")
        launcher._write({"op": "unkeep"})
        raise KeepError(f"%ddp keep: this host could not reach the lease on {launcher.lease_node} ({at.get('host')}:{at.get('port')}) "
                        f"within {KEEP_WAIT_S:.0f} s; the pool is not kept (see %ddp log, then try again)")


def spool_cap() -> int:
    """A kept rank's output log, per stream, in bytes: past it its oldest half is dropped (``DDP_MAGIC_SPOOL_MIB``)."""
    return int(setting("DDP_MAGIC_SPOOL_MIB", SPOOL_MIB) * (1 << 20))


def _keepable(pool: "Pool") -> "Union[ForkServerLauncher, NodesKept]":
    """The pool's launcher, if its pool can be kept; else KeepError says why."""
    launcher = pool.launcher
    if isinstance(launcher, NODES):
        why = launcher.keepable()
        if why:
            kind = 'Slurm' if isinstance(launcher, SlurmLauncher) else 'SSH' if isinstance(launcher, SshLauncher) else 'Ray'
            raise KeepError(f"%ddp keep: this {kind} pool cannot be kept: {why}")
        return launcher
    if not isinstance(launcher, ForkServerLauncher) or launcher.remote_ranks and not isinstance(launcher, KeptLauncher):
        raise KeepError(f"%ddp keep: a pool started with {pool.spec.launcher_method!r} cannot be kept yet; kept pools are "
                        "fork-server pools on this host (the default --start-method auto), Slurm pools, SSH pools (--hosts) and Ray pools (--ray)")
    return launcher


def unkeep(pool: "Pool", ending: bool = False) -> bool:
    """``%ddp keep --off``: the pool ends with this kernel again (``ending``: it is being replaced, and stops next).
    Whether it was kept."""
    if pool.kept is None:
        return False
    launcher = pool.launcher
    across = pool.plan is not None and (pool.plan.slurm is not None or pool.plan.ssh is not None or pool.plan.ray is not None)
    attached_nodes = across and not isinstance(launcher, NODES)
    if attached_nodes and not ending:
        raise KeepError(_unkeep_refused(pool))
    if ending and (attached_nodes or not launcher.alive()):  # its stop ends the lease (or it is gone already: Slurm revoked its job)
        pool.hub.shown, pool.hub.keep_msg, pool.kept = None, None, None
        _set_finalizer(pool, stop_quietly, pool.hub, pool.shm_prefix)
        return True
    if isinstance(launcher, NODES):
        launcher.outlive_kernel("")  # this host follows us again before the lease's lock goes
    if isinstance(launcher, (ForkServerLauncher, *NODES)):
        launcher.notes.clear()
        launcher._write({"op": "unkeep"})
        _await_note(pool, "unkept")
        if getattr(launcher, "lock", None):  # an attached kept template: its lock is gone, its connection is its life now
            setattr(launcher, "lock", "")  # noqa: B010 (KeptLauncher's, kernel/keep/launcher.py)
    pool.ask(P.KEEP, KEEP_WAIT_S, fields={"on": False})
    pool.hub.shown, pool.hub.keep_msg = None, None
    pool.kept = None
    _set_finalizer(pool, stop_quietly, pool.hub, pool.shm_prefix)
    return True


def _unkeep_refused(pool: "Pool") -> str:
    """Why an attached kept pool across nodes cannot be tied to this kernel again, and what to do."""
    if pool.plan is not None and pool.plan.ray is not None:
        return ("%ddp keep --off: this kernel attached a kept Ray pool; its driver, which holds the actors and the placement "
                "group, follows the lease and cannot be tied to this kernel again. %ddp stop ends the pool and removes them")
    if pool.plan is not None and pool.plan.ssh is not None:
        return ("%ddp keep --off: this kernel attached a kept SSH pool; its hosts' templates left the first kernel's ssh sessions and "
                "follow the lease, so they cannot be tied to this kernel again. %ddp stop ends the pool on every host")
    return ("%ddp keep --off: this kernel attached a kept Slurm pool; its allocation follows the lease and cannot be "
            "tied to this kernel again. %ddp stop ends the pool and releases the allocation")


def _await_note(pool: "Pool", event: str) -> Dict[str, Any]:
    launcher = pool.launcher
    assert isinstance(launcher, (ForkServerLauncher, *NODES))
    found = lambda: next((n for n in launcher.notes if n.get("event") == event), None)  # noqa: E731
    if isinstance(launcher, NODES):
        gone = lambda: not launcher.alive()  # noqa: E731
    else:
        gone = lambda: launcher.proc is not None and not launcher.alive()  # noqa: E731
    pool.hub.pump(lambda: found() is not None or gone(), time.monotonic() + KEEP_WAIT_S)
    note = found()
    if note is None:
        raise KeepError(f"%ddp keep: the template did not answer ({event}); see %ddp log")
    return note


def detach_quietly(hub: "Hub") -> None:
    """At this kernel's exit, a kept pool: close our sockets and pipes; the ranks and their template go on."""
    try:
        hub.close_all()
        detach = getattr(hub.launcher, "detach", None)
        if detach is not None:
            detach()
    except Exception:  # interpreter shutdown: modules may already be half torn down
        log.debug("detaching from a kept pool at exit failed", exc_info=True)


def detach_at_exit(pool: "Pool") -> None:
    _set_finalizer(pool, detach_quietly, pool.hub)


def _set_finalizer(pool: "Pool", fn: Any, *args: Any) -> None:
    pool._finalizer.detach()
    pool._finalizer = weakref.finalize(pool, fn, *args)
    atexit.register(pool._finalizer)


def lost_text(pool: "Pool") -> Optional[str]:
    """Why this kernel no longer has its kept pool (another kernel attached it with --force), or None."""
    fenced = getattr(pool.launcher, "fenced", None)
    if fenced is None:
        return None
    by = fenced.get("by") or "another kernel"
    at = time.strftime("%H:%M:%S", time.localtime(float(fenced.get("at") or time.time())))
    return (f"this kernel lost its kept pool: {by} (pid {fenced.get('pid')}) took it over with %ddp attach --force at {at}. "
            "The next %%ddp cell here starts a new pool; %ddp attach --force takes the kept one back.")


def drop_lost(pool: "Pool") -> None:
    """Forget a pool another kernel took over: our sockets close, nothing of it is stopped."""
    pool.kept = None
    detach_quietly(pool.hub)
    pool._finalizer.detach()
    pool.started = False
