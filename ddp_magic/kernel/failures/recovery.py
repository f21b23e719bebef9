"""A failure costs a cell, not the workers' state: the process group re-formed in place, a dead rank replaced alone.

After a cell in which the group was aborted (policy.py's ``Abort``: ranks waited in
a collective for a peer that raised, was interrupted, timed out) or a rank
reported its group broken, every live rank forms a new default group in the same
process (procs/rank_recover.py): a fresh FileStore file (or a PrefixStore over
the old TCP store), same backend, same ranks. The cell's message says so, with
the time it took.

A rank that died (SIGKILL, a segfault, ``os._exit``) costs only that rank, with a
launcher that can start one rank alone (the fork server, spawn, Slurm: a one-task
step on the rank's node): at the next cell a new process takes its RANK and joins
the survivors' new group (a fresh FileStore on one host; across hosts a PrefixStore
over rank 0's TCP store, which the newcomer finds by DDP_MAGIC_REFORM_GEN), and the
notice says whose variables are gone. torchrun pools restart whole, as before.
A SIGKILL is named the OOM killer's only with a counter's evidence (kernel/failures/deaths.py).

If the ranks cannot re-form within ``REFORM_WAIT_S`` the pool is marked broken
(the next cell restarts it, as before), and the message says so. A pool that is whole
after a failed cell is ready, and every rank says so (``ready_again``); the cell's
outcome stays the cell's (its view, its error, the session's last cell).
"""
from __future__ import annotations

import copy
import socket
import time
from collections import deque
import weakref
from typing import Any, Dict, Iterable, List, Optional, Protocol, Sequence, Set, Tuple

from ...errors import NodeLost, describe_exit
from ...logs import log
from ...plan.plan import Plan
from ...plan.spec import PoolSpec
from ...states import RankState, Waiting
from ...wire import liveness, shm
from ...wire import protocol as P
from ..admission import Admission
from ..cell import CellRun
from .deaths import cuda_oom_notes, why_killed
from ...words import fmt_seconds, ranks_phrase
from ..hub import Hub
from ..launchers import LaunchError, Launcher
from ..ranks import Listener, RankInfo, variables_kept
from .unreachable import held_text, node_key, raise_if_still_silent

REFORM_WAIT_S = 10.0  # how long live ranks get to form the new group
_GONE = (RankState.DEAD, RankState.STOPPED)


class Pool(Protocol):
    """The part of the pool (kernel/pool.py) recovery acts on."""

    hub: Hub
    ranks: Dict[int, RankInfo]
    spec: PoolSpec
    plan: Plan
    secret: bytes
    store_path: Optional[str]
    shm_prefix: str
    launch_env: Dict[str, str]
    broken: Optional[str]
    listen_addr: str
    tls_key: Any
    recovery: "Recovery"

    @property
    def launcher(self) -> Launcher: ...

    def mark_broken(self, why: str) -> None: ...

    def _count_rejected(self) -> None: ...


class Recovery:
    """One pool's recovery state: the group's generation, and the ranks that died and await replacement."""

    def __init__(self) -> None:
        self.gen = 0
        self.lost: Dict[int, str] = {}  # rank -> how it died, until a new rank takes its place
        self.notes: List[str] = []  # for the failing cell's message
        # a rank started again alone -> the workers' names it lost then that no cell has assigned on it since (one it
        # still lacks makes a re-formed group's message say its variables are gone; none left: it has the others' again)
        self.missing: Dict[int, Set[str]] = {}
        self.fresh: List[int] = []  # ranks started again before this cell, not yet healed (heal.py)
        self.started_line = ""  # "rank 1 (pid 4121) was killed by SIGKILL: started it again in 42 ms (rank 1 is pid 4188)"
        self.snapshot: Optional[str] = None  # the last snapshot this kernel saved or loaded: a healed rank's own names (heal.py)
        self.writing: Optional[str] = None  # the folder of a background save not yet waited for: a stop waits for it first
        self._store: Optional[str] = None  # the FileStore the ranks' group uses now (None: the pool's first)

    def reset(self) -> None:
        """A fresh start of the whole pool."""
        self.lost.clear()
        self.notes.clear()
        self.missing.clear()
        self._store = None

    def resume(self, gen: int, store_path: Optional[str]) -> None:
        """An attached kept pool whose group kernels before this one re-formed up to ``gen`` (its ranks say so): the next
        re-form takes the next generation (one taken again would meet the old group's keys in its store)."""
        self.gen = max(self.gen, gen)
        if gen and store_path:
            self._store = f"{store_path}.r{gen}"

    # ------------------------------------------------------------ deaths
    def on_death(self, pool: Pool, rank: int, code: Optional[int], how: str) -> Optional[str]:
        """A rank's process ended. Returns why the pool is broken, or None when the rank can be replaced alone."""
        info = pool.ranks[rank]
        launcher = pool.launcher
        cause = launcher.death_cause(rank)  # its template ended it, and said why first
        local = info.host == socket.gethostname() if info.host else not launcher.remote_ranks  # not joined: where it was asked
        info.death = f"{how}: {cause}" if cause else why_killed(code, info.mem, local)  # the OOM killer only with evidence
        how = info.death or how
        if info.silent:  # the check found it after its window of silence: every start on that node asks it first
            launcher.silent_since.setdefault(node_key(info), time.time() - liveness.SILENCE_S)
        if not launcher.replaces_ranks or not (pool.store_path or launcher.remote_ranks):
            return f"rank {rank} {how}"
        self.lost[rank] = f"(pid {info.pid}) {how}"  # "rank 2 (pid 4121) was killed by …"
        return None

    # ------------------------------------------------------------ after a cell
    def after_cell(self, pool: Pool, cell: CellRun, notes: List[str]) -> None:
        """Re-form the group if the cell aborted or broke it; a dead rank's survivors re-form at the next cell."""
        notes += self.notes + cuda_oom_notes(pool.hub.done)
        self.notes.clear()
        hub = pool.hub
        broken = cell.aborted or any(m.get("group_broken") for m in hub.done.values())
        if pool.broken or not (broken or self.lost):
            return
        if self.lost:
            gone = sorted(self.lost)
            notes.append(
                f"{ranks_phrase(gone)} will be started again at the next cell (same RANK, same world) and given the names the other "
                f"ranks agree on, unless that cell says --no-heal; the other ranks keep their variables"
            )
            return
        live = [r for r in sorted(pool.ranks) if r in hub.conns]
        seconds, error, replies = self.reform(pool, live, (), self.store(pool))
        if error:
            pool.mark_broken(f"the process group could not be re-formed ({error})")
            return
        notes.append(f"the process group was re-formed in {fmt_seconds(seconds)}; {variables_kept(pool.ranks, self.restarted())}")
        notes += swap_notes(replies)

    def restarted(self) -> List[int]:
        """The ranks started again alone that still lack names the others have (their variables from before)."""
        return sorted(r for r, names in self.missing.items() if names)

    def assigned(self, names: Iterable[str], but: Set[int]) -> None:
        """A cell ran without failing on every rank ``but`` those and assigned (or was sent) ``names``: a restarted rank has
        them again, and once it has every name it lost it is said to keep its variables like the others."""
        for r in list(self.missing):
            if r not in but:
                self.missing[r] -= set(names)
                if not self.missing[r]:
                    del self.missing[r]

    def ready_again(self, pool: Pool) -> bool:
        """After a failed cell: a pool that is whole (every rank alive and joined, its group re-formed if the cell
        broke it) is ready, and says so: every rank READY. The cell's own views keep the RankInfo objects they
        heard, with the cell's outcome; the pool takes copies. False (nothing changed) when it is not whole."""
        hub = pool.hub
        whole = not pool.broken and not self.lost and all(r in hub.conns and i.state not in _GONE for r, i in pool.ranks.items())
        if not whole:
            return False
        for r, info in list(pool.ranks.items()):
            again = pool.ranks[r] = copy.copy(info)  # what dataclasses.replace gives, without its __init__ per field (a thousand ranks: 17 ms -> 3)
            again.state, again.debugging, again.tail = RankState.READY, Waiting.NO, deque(info.tail, maxlen=info.tail.maxlen)
        return True

    def reform(self, pool: Pool, ranks: Sequence[int], joining: Sequence[int], store: Optional[str]) -> Tuple[float, Optional[str], Dict[int, dict]]:
        """REFORM to ``ranks`` in ``store`` (and wait for the ``joining`` ones' READY); (seconds, error or None, replies)."""
        hub = pool.hub
        t0 = time.monotonic()
        hub.replies[P.REFORM] = {}
        hub.broadcast(P.message(P.REFORM, gen=self.gen, store=store), list(ranks))
        replies = hub.replies[P.REFORM]

        everyone = list(ranks) + list(joining)
        deaths: List[Optional[int]] = [None]  # the deaths counted at the last full check (none yet)

        def settled() -> bool:
            """O(1) a wake until the replies are all in (or a rank died): the full checks only then."""
            now_dead = getattr(hub, "deaths", None)  # a hub that does not count is checked in full every wake
            if hub.init_failures or (now_dead is None or now_dead != deaths[0]) and any(pool.ranks[r].state == RankState.DEAD for r in everyone):
                return True
            deaths[0] = now_dead
            if len(replies) < len(ranks):
                return False
            joined = all(r in hub.ready and (r, "stdout") in hub.outs and (r, "stderr") in hub.outs for r in joining)
            return joined and all(r in replies for r in ranks)

        wait = REFORM_WAIT_S + (pool.spec.start_timeout if joining else 0)
        hub.pump(settled, t0 + wait)
        seconds = time.monotonic() - t0
        bad = [f"rank {r}: {m.get('error')}" for r, m in sorted(replies.items()) if not m.get("ok")]
        bad += [f.headline() for f in hub.init_failures]
        bad += [f"rank {r} died" for r in list(ranks) + list(joining) if pool.ranks[r].state == RankState.DEAD]
        slow = [r for r in ranks if r not in replies] + [r for r in joining if r not in hub.ready]
        if slow and not bad:
            bad.append(f"{ranks_phrase(slow)} did not answer within {wait:.0f}s")
        previous = self._store or pool.store_path
        if not bad and store:
            if previous and previous != store:
                shm.remove(previous)  # every rank is on the new store; a long session would pile them up
            self._store = store
        return seconds, "; ".join(bad) or None, dict(replies)

    def store(self, pool: Pool) -> Optional[str]:
        """The new group's FileStore (None: a PrefixStore over the old TCP store, made on the ranks)."""
        self.gen += 1
        return f"{pool.store_path}.r{self.gen}" if pool.store_path else None

    # ------------------------------------------------------------ before a cell
    def before_cell(self, pool: Pool, listener: Listener, owned: Iterable[str]) -> Optional[str]:
        """Deaths while idle are noticed; dead ranks are started again and join the survivors' new group.
        Returns a notice for the user, or None; a replacement that fails marks the pool broken. Raises NodeUnreachable
        (nothing ran, nothing changed) while a node whose ranks were unreachable still does not answer, and NodeLost (the
        same) while a lost node cannot be placed again (a Ray cluster with no room for its ranks)."""
        pool.hub.reap()  # exits, and connections lost while idle (ranks on other hosts report no exit code)
        if not self.lost or pool.broken:
            return None
        gone, how = sorted(self.lost), dict(self.lost)
        raise_if_still_silent(pool.launcher, pool.ranks, gone)  # a node still silent: say so now, run nothing
        t0 = time.monotonic()
        placed = place_lost_nodes(pool, listener, gone)  # a node that went with its allocation (a Ray node's bundles) first
        error, replies = self._replace(pool, listener, gone)
        if error:
            pool.mark_broken(f"{ranks_phrase(gone)} could not be started again ({error})")
            return None
        self.lost.clear()
        owned = set(owned)
        for r in gone:
            self.missing.setdefault(r, set()).update(owned)
        names = ", ".join(sorted(owned))
        died = "; ".join(f"rank {r} {how[r]}" for r in gone)
        new = ", ".join(f"rank {r} is pid {pool.ranks[r].pid}" for r in gone)
        survivors = [r for r in sorted(pool.ranks) if r not in gone]
        again = f"{placed}; " if placed else ""
        self.fresh, self.started_line = list(gone), f"{died}: {again}started it again in {fmt_seconds(time.monotonic() - t0)} ({new})"
        return (
            f"{self.started_line}. "
            f"{ranks_phrase(gone)}'s variables are gone" + (f" ({names})" if names else "")
            + (f"; {ranks_phrase(survivors)} kept {'its' if len(survivors) == 1 else 'theirs'}" if survivors else "")
            + ". %ddp restart gives every rank a fresh start."
        ) + "".join("\n" + note for note in swap_notes(replies))

    def _replace(self, pool: Pool, listener: Listener, gone: Sequence[int]) -> Tuple[Optional[str], Dict[int, dict]]:
        """Fork new ranks at the dead ranks' RANKs; the survivors re-form with them. (An error text or None, their replies.)"""
        hub = pool.hub
        admission = Admission(pool.listen_addr, pool.secret, 64, pool._count_rejected, pool.tls_key)
        replies: Dict[int, dict] = {}
        try:
            hub.admission = admission
            for r in gone:
                hub.forget_rank(r)
                shm.remove_pool_files(shm.rank_prefix(pool.shm_prefix, r))  # results it left half written
                pool.ranks[r] = RankInfo(rank=r)
                listener.on_state(pool.ranks[r])
            store = self.store(pool)
            base = pool.launch_env
            for r in gone:
                # the survivors' new group: a FileStore file, or a PrefixStore over rank 0's TCP store (procs/rank_torch.py)
                where = {"DDP_MAGIC_STORE": store} if store else {"DDP_MAGIC_REFORM_GEN": str(self.gen)}
                env = dict(base, **pool.plan.rank_env(r), **where)
                pool.launcher.spawn(r, {"env": env, "kernel_addr": pool.listen_addr, "kernel_port": admission.port})  # type: ignore[attr-defined]
            survivors = [r for r in sorted(pool.ranks) if r not in gone]
            _, error, replies = self.reform(pool, survivors, gone, store)
        except Exception as e:  # a launcher that cannot fork now: the pool restarts whole
            log.debug("replacing ranks %s failed", gone, exc_info=True)
            error = f"{type(e).__name__}: {e}"
        finally:
            hub.admission = None
            admission.close()
        if error:
            return error, replies
        for r in gone:
            info = pool.ranks[r]
            info.state, info.finished = RankState.READY, time.monotonic()
            listener.on_state(info)
        return None, replies


def place_lost_nodes(pool: Pool, listener: Listener, gone: Sequence[int]) -> str:
    """Before ``gone`` are started again: the launcher places again the nodes they were lost with, where their allocation
    went with them (a Ray node's bundles: kernel/launchers/ray.py ``place_again``); meanwhile they wait QUEUED with its words.
    Returns what it said ("" for a launcher that has nothing to place); NodeLost when it could not (nothing ran, nothing
    changed: the next cell asks again), and an interrupt leaves everything as it was."""
    by_node: Dict[str, List[int]] = {}
    for r in gone:
        node = pool.launcher.node_of(r)
        if node:
            by_node.setdefault(node, []).append(r)
    if not by_node:
        return ""
    before = {r: (pool.ranks[r].state, pool.ranks[r].last_line) for r in gone}

    def waiting(text: str) -> None:
        for r in gone:
            info = pool.ranks[r]
            info.state, info.last_line = RankState.QUEUED, text
            listener.on_state(info)

    try:
        return pool.launcher.place_again(by_node, waiting)
    except BaseException as e:
        for r, (state, line) in before.items():
            pool.ranks[r].state, pool.ranks[r].last_line = state, line
            listener.on_state(pool.ranks[r])
        if not isinstance(e, LaunchError):
            raise
        kept = [r for r, info in sorted(pool.ranks.items()) if r not in gone and info.state not in _GONE]
        raise NodeLost(f"{e}: nothing ran, {held_text(kept)}") from None


def swap_notes(replies: Dict[int, dict]) -> List[str]:
    """What the ranks said about objects on the old group: DDP modules moved, the rest to re-create."""
    out: List[str] = []
    swapped = sorted({n for m in replies.values() for n in m.get("swapped", ())})
    if swapped:
        out.append(f"DDP module{'s' if len(swapped) > 1 else ''} {', '.join(swapped)} moved onto the new group (weights as they were)")
    stale = sorted({(n, k) for m in replies.values() for n, k in m.get("stale", ())})
    fixes = {"DDP": "{n} = DDP({n}.module)", "DeviceMesh": "make {n} again (init_device_mesh)", "FSDP2": "fully_shard {n} again on a new mesh",
             "process group": "make {n} again (dist.new_group)"}
    for name, kind in stale:
        out.append(f"{name} ({kind}) holds the old process group: " + fixes.get(kind, "make it again").format(n=name))
    return out


def note_death(pool_ref: "weakref.ref[Any]", rank: int, code: Optional[int]) -> None:
    """A rank's process is gone while it held state: started again alone at the next cell, or the pool restarts."""
    pool = pool_ref()
    if pool is not None:
        info = pool.ranks.get(rank)
        how = f"was unreachable on {node_key(info)}" if info is not None and info.silent else describe_exit(code)
        pool.broken = pool.recovery.on_death(pool, rank, code, how) or pool.broken  # None: started again alone


def stop_quietly(hub: Hub, shm_prefix: str) -> None:
    """At exit or when a Pool is collected without stop(): close the sockets and the launcher, remove the files."""
    try:
        hub.close_all()
        hub.launcher.close()
        shm.remove_pool_files(shm_prefix)
    except Exception:  # interpreter shutdown: modules may already be half torn down
        log.debug("stopping a pool at exit failed", exc_info=True)
