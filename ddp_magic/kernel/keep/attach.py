"""``%ddp attach``: find a kept pool of this user, prove its secret to its template, and take its ranks on.

The ranks re-dial this kernel exactly as they joined their first one (kernel/admission.py: the secret
proved both ways), then send what they queued while no kernel was attached and replay the output the
last kernel had not shown. The pool is then this kernel's as if it had started it: the same plan,
secret, files and launcher interface (kernel/keep/launcher.py), so recovery, forensics and the views
work unchanged. A cell that ran meanwhile is resumed (kernel/keep/resume.py).
"""
from __future__ import annotations

import base64
import json
import os
import pickle
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set, Tuple

from ...states import RankState
from ...wire import kept, tls
from ...words import fmt_bytes, plural, ranks_phrase
from ..admission import Admission, raise_fd_limit
from ..output.kept_output import KeptOutput
from ..ranks import Listener, RankInfo
from . import front, replay
from .clocks import RankClocks
from .keeping import KeptState, detach_at_exit, notebook_name, spool_cap
from .launcher import KeptLauncher, kept_kind
from .terms import Terms, span

if TYPE_CHECKING:
    from ..pool import Pool

JOIN_WAIT_S = 60.0  # every live rank joins the attaching kernel within this
REPLY_WAIT_S = 10.0
REPLAY_WAIT_S = 10.0  # the ranks' replays come in full within this (or what is late is shown as it comes)


class AttachError(RuntimeError):
    """Nothing was attached; the message says why and what to do."""


@dataclass
class Found:
    """One kept pool's discovery file: its path, what it says, whether its lease holder lives."""

    path: str
    data: Dict[str, Any]
    alive: bool

    @property
    def id(self) -> str:
        return str(self.data["id"])

    @property
    def live(self) -> bool:
        """Its lease holder lives and has not ended it: a pool to attach. An ended one is history (``--list`` shows it)."""
        return self.alive and self.data.get("state") != "ended"

    def fields(self) -> Dict[str, str]:
        """The short facts of one kept pool, each said once (the panel's row, ``--list``'s two lines): ``notebook``
        (its file name: the folder is the server's), ``ranks``, ``job``, ``kernel``, ``lease``; ended: ``why``."""
        d = self.data
        out = {"id": self.id, "notebook": os.path.basename(str(d.get("notebook") or "")) or "(no notebook)",
               "ranks": plural(int(d.get("nproc") or 0), "rank")}
        if d.get("state") == "ended" or not self.alive:
            out["why"] = f"ended: {d.get('why') or 'its template died without ending its lease'}"
            return out
        busy = d.get("busy") or []
        who = d.get("attached")
        terms = Terms(float(d["idle"]), float(d["max"]), float(d["since"]))
        most = self._day_clock(terms.ends_at)
        out["job"] = f"{d.get('job') or 'a cell'} running on {ranks_phrase(busy)}" if busy else "idle"
        if who:
            out["kernel"] = f"attached to pid {who.get('pid')} since {self._day_clock(float(who.get('since') or 0))}"
            out["lease"] = f"ends {span(terms.idle)} after its kernel leaves, at most at {most}"
        else:
            left = d.get("left_at")
            out["kernel"] = f"no kernel since {self._day_clock(float(left))}" if left else "no kernel"
            idle_end = self._day_clock(min(float(left) + terms.idle, terms.ends_at)) if left else most
            out["lease"] = f"ends at most at {most}" if busy else f"ends at {idle_end} unless a kernel attaches"
        return out

    @staticmethod
    def _day_clock(at: float) -> str:
        """``06:14``, or ``Tue 06:14`` when not today (a lease's end is often tomorrow)."""
        return time.strftime("%H:%M" if time.localtime(at)[:3] == time.localtime()[:3] else "%a %H:%M", time.localtime(at))

    def line(self) -> str:
        """``3fa9c2e1  train.ipynb  4 ranks  cell [5] running on ranks 0-3`` and, indented under it,
        ``no kernel since 14:02 · ends at most at 06:14``: each fact once, short lines (an output area wraps anywhere)."""
        f = self.fields()
        if "why" in f:
            return f"{self.id}  {f['notebook']}  {f['ranks']}  {f['why']}"
        return f"{self.id}  {f['notebook']}  {f['ranks']}  {f['job']}\n{' ' * (len(self.id) + 4)}{f['kernel']} · {f['lease']}"


def found_pools(where: Optional[str] = None) -> List[Found]:
    """Every kept pool file of this user (ended ones included, until an attach or a stop reads them)."""
    return [Found(path, data, alive) for path, data, alive in kept.listing(where)]


def list_text(pools: List[Found]) -> str:
    if not pools:
        return "no kept pool of this user (%ddp keep, or %%ddp --bg --keep, keeps one)"
    return "kept pools of this user:\n" + "\n".join("  " + p.line() for p in pools)


def choose(pool_id: Optional[str], notebook: Optional[str] = None) -> Found:
    """The pool to attach: ``pool_id``; else this notebook's live one; else this user's only live one. With none
    live, the one that ended (attach says why); else AttachError listing them. An ended pool is never a candidate
    beside a live one."""
    pools = found_pools()
    if pool_id:
        match = [p for p in pools if p.id == pool_id or p.id.startswith(pool_id)]
        if len(match) != 1:
            raise AttachError(f"%ddp attach {pool_id}: no such kept pool of this user.\n{list_text(pools)}")
        return match[0]
    notebook = notebook_name() if notebook is None else notebook
    live = [p for p in pools if p.live]
    group = live or pools  # the ended ones only when none lives: attach then says why it ended
    if not group:
        raise AttachError("%ddp attach: " + list_text(pools))
    mine = [p for p in group if notebook and p.data.get("notebook") == notebook]
    if len(mine) == 1:
        return mine[0]
    if len(group) == 1:
        return group[0]
    if live:
        raise AttachError(f"%ddp attach: this user has {len(live)} kept pools running; name one: %ddp attach ID\n{list_text(pools)}")
    raise AttachError(f"%ddp attach: no kept pool of this user is running.\n{list_text(pools)}")


class Heard(Listener):
    """What the ranks sent while they joined (their replays, metrics rows): held until the attach has said what it found,
    and until every replay is whole, then told in the order the lines were printed (kernel/keep/replay.py)."""

    def __init__(self) -> None:
        self.calls: List[replay.Heard] = []
        self.heard_at: Dict[int, float] = {}  # rank -> when its HELLO was taken (its clock's "ago" counts back from there)
        self.lines: Dict[replay.Key, int] = {}  # the line ends heard of each rank's stream

    def on_state(self, info: RankInfo) -> None:
        self.heard_at.setdefault(info.rank, time.monotonic())

    def on_output(self, rank: int, stream: str, text: str) -> None:
        self.calls.append(("on_output", (rank, stream, text), time.monotonic()))
        self.lines[(rank, stream)] = self.lines.get((rank, stream), 0) + text.count("\n")

    def on_metrics(self, rank: int, rows: List[Any]) -> None:
        self.calls.append(("on_metrics", (rank, rows), time.monotonic()))

    def whole(self, want: Dict[replay.Key, int]) -> bool:
        """Whether every rank's replay has come in full (``want``: replay.expected)."""
        return all(self.lines.get(key, 0) >= n for key, n in want.items())


@dataclass
class Attached:
    """What an attach found: the pool (None when it had ended), and what happened meanwhile."""

    pool: Optional["Pool"]
    text: str
    resumed: bool = False  # a cell ran on while no kernel was attached: a job takes it on
    job: str = ""
    owned: Set[str] = field(default_factory=set)
    heard: Heard = field(default_factory=Heard)
    clocks: RankClocks = field(default_factory=RankClocks)  # the ranks' own times of the cell (kernel/keep/clocks.py)

    def replay(self, listener: Listener) -> None:
        """What was heard while the ranks joined, to the cell's listener now (its lines with how far they go: their marks
        went with the read, kernel/output/kept_output.py)."""
        heard, self.heard.calls = self.heard.calls, []
        hellos = self.pool.hub.hellos if self.pool is not None else {}
        calls = replay.merged(heard, hellos, self.heard.heard_at)
        out = self.pool.hub.shown if self.pool is not None else None
        if out is None:
            for name, args in calls:
                getattr(listener, name)(*args)
            return
        with out.capture() as staged:
            for name, args in calls:
                getattr(listener, name)(*args)
        out.commit(staged)


def forget(found: Found) -> None:
    """An ended (or dead) kept pool's files, once its end was reported."""
    for path in (found.path, kept.lock_path(found.id, os.path.dirname(found.path))):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def attach(found: Found, force: bool) -> Attached:
    """Join the kept pool's ranks from this kernel. Raises AttachError (refused, gone)."""
    data = found.data
    if data.get("state") == "ended" or not found.alive:
        forget(found)
        why = data.get("why") or "its template died without ending its lease"
        at = f" at {_clock(data.get('at'))}" if data.get("at") else ""
        job = f"; {data['job']} ended with it" if data.get("job") else ""
        return Attached(None, f"the kept pool {found.id} ended{at}: {why}{job}.{_meanwhile(data.get('meanwhile') or [])}")
    pool, nodes = _pool_from(data)
    told = front.held(found.id) is not None
    admission = Admission(pool.listen_addr, pool.secret, max(64, 3 * pool.nproc), pool._count_rejected, pool.tls_key)
    try:
        sock, report = _knock(found, pool.listen_addr, admission.port, force, pool.tls_key)
    except BaseException:
        admission.close()
        raise
    pids = {int(pid): int(rank) for rank, pid in report["ranks"].items()}
    lock = kept.lock_path(found.id, os.path.dirname(found.path))
    if pool.plan is not None and nodes is not None:  # a pool across nodes (Slurm, SSH, Ray): its node templates fork a rank again
        pool.hub.launcher = kept_kind(pool.plan)(pool.secret, sock, pids, lock, pool.plan, nodes)
        pool.hub.launcher.tls_fp = pool.tls_key.fingerprint if pool.tls_key is not None else None
    else:
        pool.hub.launcher = KeptLauncher(pool.secret, sock, pids, lock)
    pool.hub.reset(pool.ranks, admission)
    pool.hub.begin_cell()
    pool.hub.shown = KeptOutput(found.id, kept.ShownOffsets(os.path.join(kept.make_pool_dir(found.id, os.path.dirname(found.path)), "shown"), pool.nproc))
    t0 = time.monotonic()
    heard = Heard()
    try:
        _join(pool, set(pids.values()), heard)
    finally:
        pool.hub.admission = None
        admission.close()
    _dead_meanwhile(pool, set(pids.values()), report.get("meanwhile") or [])
    clocks = RankClocks.heard(pool.hub.hellos, heard.heard_at)
    clocks.apply(pool.ranks)
    pool.recovery.resume(max((int(h.get("reform_gen") or 0) for h in pool.hub.hellos.values()), default=0), pool.store_path)
    for rank, hello in pool.hub.hellos.items():  # a rank whose output log dropped what no kernel showed: it replays from its oldest byte
        if hello.get("dropped"):
            pool.hub.shown.skip(rank, hello["dropped"])
    terms = Terms(float(report["idle"]), float(report["max"]), float(report["since"]))
    where = os.path.dirname(found.path)
    pool.kept = KeptState(found.id, kept.pool_dir(found.id, where), where, terms, str(data.get("notebook") or ""), str(data.get("job") or ""))
    pool.hub.keep_msg = {"on": True, "lease": lease_at(found), "dir": str(data.get("dir") or pool.kept.dir), "cap": spool_cap()}
    pool.started = True  # its start_seconds stay the pool's own start (the pool's blob), not this attach's
    detach_at_exit(pool)
    hellos = pool.hub.hellos
    resumed = any(h.get("busy") or h.get("undelivered") for h in hellos.values())
    owned = set(hellos[min(hellos)].get("names") or []) if hellos else set()
    text = _report(found, pool, report, resumed, time.monotonic() - t0, told)
    return Attached(pool, text, resumed, pool.kept.job, owned, heard, clocks)


def _pool_from(data: Dict[str, Any]) -> "Tuple[Pool, Optional[Dict[str, Any]]]":
    """A Pool object for the kept ranks: their spec, plan, secret and files, no process of its own; on Slurm, what
    forks a rank again there (SlurmLauncher.kept_blob), over SSH and on Ray the same (SshLauncher's, RayKeep's kept_blob)."""
    from ..pool import Pool

    blob = pickle.loads(base64.b64decode(data["pool"]))  # our own 0600 file, written by our own template
    pool = Pool(blob["spec"])
    pool.launcher.close()  # never started
    pool._finalizer.detach()
    pool.plan, pool.secret, pool.shm_prefix, pool.store_path = blob["plan"], bytes.fromhex(data["secret"]), blob["shm_prefix"], blob["store_path"]
    pool.listen_addr, pool._cell, pool.generation = blob["listen_addr"], int(blob["cell"]), int(blob["generation"])
    pool.start_seconds = blob.get("start_seconds")  # "pool started in": when the first kernel started it
    if blob.get("launch_env") is not None:
        pool.launch_env = blob["launch_env"]
    pool.tls_key = tls.ServerKey() if blob.get("tls") else None  # its ranks dial us over TLS, pinned to this key (told on the lease)
    pool.ranks = {r: RankInfo(rank=r) for r in range(pool.nproc)}
    raise_fd_limit(3 * pool.nproc + 64)
    return pool, blob.get("slurm") or blob.get("ssh") or blob.get("ray")


def lease_at(found: Found) -> kept.LeaseAt:
    """Where the pool's lease listens: what its record says (a lease on another host), else its socket here."""
    return found.data.get("lease") or {"path": kept.socket_path(found.id, os.path.dirname(found.path))}


def _knock(found: Found, addr: str, port: int, force: bool, key: "Optional[tls.ServerKey]") -> "tuple[socket.socket, Dict[str, Any]]":
    """Prove the secret to the lease and ask for the pool; the template's answer. Raises AttachError when refused."""
    data, where = found.data, os.path.dirname(found.path)
    shown = kept.ShownOffsets(os.path.join(kept.make_pool_dir(found.id, where), "shown"), int(data["nproc"]))
    sock: Optional[socket.socket] = None
    try:
        sock = kept.dial_lease(lease_at(found), bytes.fromhex(data["secret"]), REPLY_WAIT_S)
        offsets = replay_from(found.id, shown)
        me = notebook_name() or f"kernel pid {os.getpid()}"
        sock.sendall((json.dumps({"op": "attach", "kernel": me, "pid": os.getpid(), "force": force, "addr": addr,
                                  "port": port, "offsets": offsets, "tls": key.fingerprint if key is not None else None}) + "\n").encode())
        reply = json.loads(_line(sock))
        if reply.get("event") != "refused":  # ours now: the file counts what this kernel shows from there
            for rank, pair in offsets.items():
                shown.set(int(rank), dict(zip(kept.STREAMS, pair)))
            front.forget(found.id)  # said of the kernel before: this kernel's own messages say more from now on
    except (OSError, ValueError) as e:
        if sock is not None:
            sock.close()
        raise AttachError(f"%ddp attach: the kept pool {found.id} did not answer ({e}); %ddp attach --list shows it") from None
    finally:
        shown.close()
    if reply.get("event") == "refused":
        sock.close()
        who = reply.get("attached") or {}
        raise AttachError(f"%ddp attach: the kept pool {found.id} is attached to {who.get('kernel') or 'another kernel'} (pid {who.get('pid')}) "
                          f"since {_clock(who.get('since'))}; --force takes it over (that kernel's next cell then says it lost the pool)")
    sock.settimeout(None)
    return sock, reply


def replay_from(pool_id: str, shown: kept.ShownOffsets) -> Dict[str, List[int]]:
    """Per rank, where its replay starts: what the front end said it holds (kernel/keep/front.py), else what the last
    kernel counted (``shown``)."""
    told = front.held(pool_id) or {}
    return {str(r): list(told[r]) if r in told else list(o) for r, o in shown.all().items()}


def _line(sock: socket.socket) -> bytes:
    """One line, byte by byte: what follows it is the launcher's to read."""
    out = b""
    while not out.endswith(b"\n"):
        byte = sock.recv(1)
        if not byte:
            raise OSError("the kept pool's template closed the connection")
        out += byte
    return out


def _join(pool: "Pool", live: Set[int], heard: Heard) -> None:
    """Every live rank joins this kernel; then its replay comes in full before any is shown (they merge in time order)."""
    hub = pool.hub
    joined = lambda: all(r in hub.conns and (r, "stdout") in hub.outs and (r, "stderr") in hub.outs for r in live)  # noqa: E731
    with pool._bound(heard):
        hub.pump(joined, time.monotonic() + JOIN_WAIT_S)
        want = replay.expected(hub.hellos)
        hub.pump(lambda: heard.whole(want), time.monotonic() + REPLAY_WAIT_S)
    missing = sorted(live - set(hub.conns))
    if missing:
        pool.broken = f"{ranks_phrase(missing)} of the kept pool did not join this kernel"


def _dead_meanwhile(pool: "Pool", live: Set[int], meanwhile: List[Dict[str, Any]]) -> None:
    """Ranks that died while no kernel was attached: dead here too, so recovery starts them again at the next cell."""
    codes = {int(m["rank"]): m for m in meanwhile if m.get("kind") == "died" and m.get("rank") is not None}
    for rank in sorted(set(pool.ranks) - live):
        info = pool.ranks[rank]
        note = codes.get(rank, {})
        info.pid, info.state, info.exit_code = note.get("pid"), RankState.DEAD, note.get("code")
        info.finished = time.monotonic()
        pool.hub.deaths += 1
        pool.hub.on_death(rank, info.exit_code)


def _meanwhile(events: List[Dict[str, Any]]) -> str:
    lines = [f"\n  {_clock(e.get('at'))} {e.get('text')}" for e in events if e.get("kind") in ("died", "node")]
    ended = [e for e in events if e.get("kind") == "cell_ended"]
    if ended:
        lines.append(f"\n  {_clock(ended[-1].get('at'))} the running cell ended on {ranks_phrase(sorted({int(e['rank']) for e in ended}))}")
    return ("\nwhile no kernel was attached:" + "".join(lines)) if lines else ""


def _report(found: Found, pool: "Pool", report: Dict[str, Any], resumed: bool, seconds: float, told: bool) -> str:
    """What the attach cell says first (``told``: the replay starts where the front end said its output stops)."""
    live = [r for r, i in sorted(pool.ranks.items()) if i.state != RankState.DEAD]
    pids = [p for p in (pool.ranks[r].pid for r in live) if p is not None]
    head = (f"attached the kept pool {found.id}" + (f" of {found.fields()['notebook']}" if found.data.get("notebook") else "")
            + f" in {seconds:.2f} s: {plural(len(live), 'rank')} alive" + (f" (pids {min(pids)}-{max(pids)})" if pids else ""))
    left = report.get("left_at")
    if left:
        head += f", no kernel for {span(time.time() - float(left))}"
    job = previous(str(found.data.get("job") or "")) or "the last cell"
    running = any(h.get("busy") for h in pool.hub.hellos.values())
    after = " after the last line this page received" if told else ""  # kernel/keep/front.py
    if running:
        head += f"; {job} is still running: its output follows{after}"
    elif resumed:
        head += f"; {job} ended while no kernel was attached: its output and result follow{after}"
    elif found.data.get("job"):
        head += f"; {job} had ended"
    return head + "." + _meanwhile(report.get("meanwhile") or []) + _dropped(pool.hub.hellos) + "\n" + pool.kept.text() if pool.kept else head


def previous(job: str) -> str:
    """A kept job's name as the kernel that attached it says it: ``cell [2] of the previous kernel`` (this kernel's own
    cell [2] is another); "" for none."""
    return f"{job} of the previous kernel" if job else ""


def _dropped(hellos: Dict[int, Dict[str, Any]]) -> str:
    """What the output logs' cap dropped before any kernel showed it: said, never replayed as if whole."""
    lines = [f"\n  rank {rank}: {fmt_bytes(int(n))} of its {stream} that no kernel showed were dropped from its output log "
             f"(it keeps at most its newest {fmt_bytes(spool_cap())} a stream; DDP_MAGIC_SPOOL_MIB sets it)"
             for rank, hello in sorted(hellos.items()) for stream, n in sorted((hello.get("dropped") or {}).items())]
    return ("\nlost while no kernel was attached:" + "".join(lines)) if lines else ""


def _clock(at: Any) -> str:
    return time.strftime("%H:%M:%S", time.localtime(float(at))) if at else "?"
