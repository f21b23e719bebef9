"""The kernel side of a pool: start, run cells on, and stop N worker processes.

Plain Python with no IPython and no torch import: the magics, the session, the benchmarks and the tests all drive it through
``Pool.run``. The lifecycle only: the hub (``hub.py``) holds the sockets, ``cell.py`` and ``failures/`` handle a running cell's
failures (the pool is their ``RankOps``), ``results/`` its values, ``launchers/`` make the ranks.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from ..errors import RankFailure, StartError
from ..plan.plan import Plan, make_plan
from ..plan.spec import PoolSpec
from ..states import FailureKind, RankState
from ..wire import liveness, protocol as P, shm
from ..wire.tls import ServerKey
from . import placement, texts
from .failures import heal as healing, unreachable
from .results import gather as results
from .admission import Admission, raise_fd_limit
from .cell import CellRun
from .cell_send import run_fields, send_run
from .hub import Hub
from .launchers import LaunchError, Launcher, make_launcher, signal_pid, worker_env
from .failures.policy import FailurePolicy
from .ranks import CellOutcome, Due, GuardedListener, Listener, RankInfo, Tick
from .failures.recovery import Recovery, note_death, stop_quietly
from .jobs.stdin import Ask, answer_all

SHUTDOWN_WAIT_S = 1.0  # local ranks get this long to exit on SHUTDOWN before SIGKILL
REMOTE_SHUTDOWN_WAIT_S = 3.0  # ranks on other hosts get this long to close their connections
KILL_WAIT_S = 2.0  # how long to wait for the exits SIGKILL causes
RESULT_WAIT_S = 600.0  # how long a decided (gathered or sent) tensor result may take to arrive


class Pool:
    """N ranks of a persistent worker pool, one per process, with torch.distributed's env.

    >>> pool = Pool(2)                     # validates; starts nothing yet
    >>> out = pool.run("import torch.distributed as d\\nd.get_rank()")
    >>> out.values
    [0, 1]
    >>> pool.stop()

    ``Pool(n, **options)`` takes the options of ``PoolSpec.from_options``; ``Pool(spec)`` a spec.
    It is also the ``RankOps`` a running cell's ``CellRun`` acts through.
    """

    def __init__(self, spec: Union[PoolSpec, int], **options: Any) -> None:
        if not isinstance(spec, PoolSpec):
            spec = PoolSpec.from_options(spec, **options)
        elif options:
            raise TypeError("Pool(spec) takes no further options; use spec.with_options(...)")
        self.spec = spec
        self.plan: Plan = make_plan(spec)  # raises PlanError before anything starts
        self.grace = spec.grace  # what a cell's failure policy waits (RankOps)
        self.ranks: Dict[int, RankInfo] = {}  # this start's ranks, shared with the hub
        self.secret = P.new_secret()
        me = weakref.ref(self)  # the hub outlives nothing, but must not keep the pool alive for the finalizer
        self.hub = Hub(make_launcher(spec.launcher_method, self.secret), lambda rank, code: note_death(me, rank, code))
        self.node_command: Optional[str] = None  # what the other nodes run (a pool over nodes)
        self.store_path: Optional[str] = None  # the process group's FileStore (one host)
        self.shm_prefix = shm.pool_prefix(os.urandom(4).hex())  # every file of this pool in /dev/shm (wire/shm.py)
        self.broken: Optional[str] = None  # why the next cell must restart the pool
        self.started, self.generation, self.template_info, self.rejected_peers, self._cell = False, 0, "", 0, 0
        self.recovery = Recovery()  # re-forms the group after a failure, starts a dead rank again (recovery.py)
        self.start_seconds: Optional[float] = None
        self.start_began: Optional[float] = time.monotonic()  # the one start clock of every view: runs from the pool's birth
        self.control_port: Optional[int] = None  # open only until every rank has joined
        self.listen_addr = spec.control_addr  # where it listens: an address the ranks reach (kernel/placement.py)
        self.tls_key: Optional[ServerKey] = None  # the control channel's TLS key, when ranks are on other hosts
        self.kept: Optional[Any] = None  # %ddp keep: the pool outlives this kernel (kernel/keep/keeping.py's KeptState)
        self._finalizer = weakref.finalize(self, stop_quietly, self.hub, self.shm_prefix)
        atexit.register(self._finalizer)

    @property
    def nproc(self) -> int:
        """Ranks in all (world size)."""
        return self.plan.world_size

    @property
    def backend(self) -> str:
        return self.plan.backend

    @property
    def launcher(self) -> Launcher:
        return self.hub.launcher

    @property
    def pids(self) -> List[Optional[int]]:
        return [self.ranks[r].pid for r in sorted(self.ranks)]

    @property
    def alive(self) -> bool:
        return self.started and not self.broken

    # ------------------------------------------------------------ start / stop
    def start(self, listener: Optional[Listener] = None) -> None:
        """Start the ranks and initialise the process group; on any failure, stop what started."""
        listener = listener or Listener()
        if self.started:
            return
        self.start_began = t0 = self.start_began if not self.generation and self.start_began else time.monotonic()  # warm-up, queue: all count
        shm.remove_orphans()  # files of this host's dead kernels that had no template to remove them
        self._warm_up()
        raise_fd_limit(3 * self.nproc + 64)  # three sockets per rank: control, stdout, stderr
        self.generation += 1
        self.recovery.reset()
        self.ranks = {r: RankInfo(rank=r) for r in range(self.nproc)}
        with self._bound(listener):
            for info in self.ranks.values():
                listener.on_state(info)
            self.listen_addr, self.tls_key = placement.place(self.launcher, self.spec, self.plan, self.ranks, listener)
            admission = Admission(self.listen_addr, self.secret, max(64, 3 * self.nproc), self._count_rejected, self.tls_key)  # every socket may knock at once
            self.control_port = admission.port
            self.plan = self.launcher.placed(self.plan, avoid=admission.port)
            self.hub.reset(self.ranks, admission)
            try:
                self._launch(listener, admission.port)
                self._await_ranks(t0)
            except BaseException:
                self._stop_admitting(admission)
                self._teardown(close_launcher=False)
                raise
            finally:
                self._stop_admitting(admission)
            for info in self.ranks.values():
                info.state = RankState.READY
                info.finished = time.monotonic()
                listener.on_state(info)
        self.started = True
        self.broken = None
        self.start_seconds = time.monotonic() - t0

    def _warm_up(self) -> None:
        try:
            self.template_info = self.launcher.start(timeout=self.spec.start_timeout)
        except LaunchError as e:
            raise StartError(f"{e}\nIs torch installed for {sys.executable}? (pip install torch)") from None

    def _launch(self, listener: Listener, port: int) -> None:
        """Start this host's ranks; a pool over nodes also tells the user what to run on the others."""
        base_env = self.launch_env = worker_env()  # the kernel's env now, not when the template started (kept for a rank started again)
        if self.plan.backend == "nccl":
            # A broken NCCL collective errors out (and the rank exits) instead of spinning
            # the GPU forever; a value set in the kernel's env wins.
            base_env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        base_env[shm.ENV] = self.shm_prefix
        base_env[liveness.CONNECT_ENV] = str(liveness.connect_timeout(self.spec.start_timeout))  # a blocked port is reported in time
        # A FileStore in /dev/shm is shared only by ranks on this host.
        self.store_path = None if self.launcher.remote_ranks else shm.new_store(self.shm_prefix, self.plan.run_id)
        command = self.launcher.launch(self.plan, base_env, self.listen_addr, port, self.store_path)
        if command:
            self.node_command = command
            listener.on_notice(texts.node_instructions(self.nproc, self.spec.nnodes, self.plan.nproc, command, self.launcher.secret_file))

    def _await_ranks(self, t0: float) -> None:
        """Pump until every rank is READY with both output streams joined; raise StartError with the cause."""
        hub = self.hub
        all_in = lambda: len(hub.ready) == self.nproc and len(hub.outs) == 2 * self.nproc  # noqa: E731
        hub.pump(lambda: all_in() or bool(hub.init_failures) or hub.deaths > 0, t0 + self.spec.start_timeout)  # O(1) a wake
        dead = hub.dead_ranks()
        if not (hub.init_failures or dead) and all_in():
            return
        unreachable.raise_if_cut_off(self.launcher, len(hub.conns), self.nproc)  # a node said it cannot reach us: name it, let go
        failures = hub.init_failures + [self.death_failure(r) for r in dead]
        if not failures:
            missing = sorted(set(range(self.nproc)) - hub.ready)
            if self.spec.nnodes > 1:
                control = f"{self.listen_addr}:{self.control_port}"
                unreachable.raise_if_never_joined(self.launcher, self.ranks, self.spec.start_timeout, control)  # Slurm started them
                rendezvous = f"{self.plan.master_addr}:{self.plan.master_port}"
                raise StartError(texts.missing_nodes_text(self.ranks, missing, self.spec.nnodes, self.spec.start_timeout, rendezvous, control))
            why = f"did not start within {self.spec.start_timeout:.0f}s"
            failures = [RankFailure(rank=r, kind=FailureKind.INIT, message=why) for r in missing]
        raise StartError(texts.start_failure_text(self.nproc, failures, self.launcher.log_text(2000), self.plan.master_port))

    def _stop_admitting(self, admission: Admission) -> None:
        self.hub.admission = None
        admission.close()

    def _count_rejected(self) -> None:
        self.rejected_peers += 1

    def stop(self, keep_template: bool = False) -> str:
        """Stop every rank and the template (``keep_template``: the next pool takes it, kernel/templates.py); what could not be reached."""
        unreached = unreachable.stop_note(self)  # ranks on a silent node ("" none), before the allocation goes
        self._teardown(close_launcher=not keep_template)
        return unreached

    def restart(self, listener: Optional[Listener] = None, spec: Optional[PoolSpec] = None, who: Optional[str] = "") -> None:
        """Stop the ranks (the template stays warm) and start again with a fresh free port.

        A new ``spec`` replaces the old one; one with another start method gets a new launcher.
        """
        if who is not None:  # a node whose ranks went silent is asked first: still silent, nothing is stopped (``who`` words it)
            unreachable.raise_if_restart_silent(self, who)
        self._teardown(close_launcher=False)
        if spec is not None:
            if spec.launcher_method != self.spec.launcher_method:
                self.launcher.close()
                self.hub.launcher = make_launcher(spec.launcher_method, self.secret)
            self.spec, self.grace = spec, spec.grace
        self.plan = make_plan(self.spec)
        self.start(listener)

    def _teardown(self, close_launcher: bool) -> None:
        """SHUTDOWN to every rank, SIGKILL to our own that stay, close every socket."""
        launcher, self.started = self.launcher, False
        self.start_began = None  # a start that failed is no longer under way
        self.hub.shutdown_all()
        self._wait_for_exits(SHUTDOWN_WAIT_S)
        if launcher.remote_ranks:  # remote ranks exit on SHUTDOWN; wait until their connections close
            deadline = time.monotonic() + REMOTE_SHUTDOWN_WAIT_S
            while self.hub.any_peer_open() and time.monotonic() < deadline:
                time.sleep(0.02)
        for pid in list(launcher.live_pids()):
            signal_pid(pid, signal.SIGKILL)
        self._wait_for_exits(KILL_WAIT_S)
        self.hub.close_all()
        shm.remove_pool_files(self.shm_prefix)  # the stores, and results a killed rank left half written
        self.store_path = None
        for info in self.ranks.values():
            if info.state not in (RankState.DEAD, RankState.FAILED):
                info.state = RankState.STOPPED
        if close_launcher or not launcher.keeps_template:
            launcher.close()

    def _wait_for_exits(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.launcher.live_pids() and time.monotonic() < deadline:
            self.launcher.poll(0.02)

    @contextlib.contextmanager
    def _bound(self, listener: Listener) -> Iterator[None]:
        """The hub tells ``listener`` about output and states for the duration."""
        before, self.hub.listener = self.hub.listener, listener
        try:
            yield
        finally:
            self.hub.listener = before

    # ------------------------------------------------------------ cells
    def ensure_started(self, listener: Optional[Listener] = None, owned: Sequence[str] = ()) -> Optional[str]:
        """Start, restart a broken pool, or start a dead rank again alone. Returns a notice for the user when state was lost."""
        listener = listener or Listener()
        if self.started and not self.broken and self.launcher.alive():
            notice = self.recovery.before_cell(self, listener, owned)
            if not self.broken:
                return notice
        if self.started:
            self.hub.reap()  # a template gone: what it said last (why it ended its ranks), and their exits
            why = (lost := self.launcher.lost()) or self.broken  # lost (revoked, or the template gone): no node to ask
            self.restart(listener, who=None if lost else "")
            return texts.restarted_notice(why)
        self.start(listener)
        return None

    def run(
        self,
        source: str,
        names: Optional[Dict[str, bytes]] = None,
        *,
        listener: Optional[Listener] = None,
        timeout: Optional[float] = None,
        gather: str = "auto",
        argv: Optional[List[str]] = None,
        label: Optional[str] = None,
        owned: Sequence[str] = (),
        stdin: Optional[Ask] = None,
        cancel: Optional[threading.Event] = None,
        reload: Optional[dict] = None,
        heal: bool = True,
    ) -> CellOutcome:
        """Run source on every rank; names are cloudpickled notebook values to bind first.

        ``owned`` are the names the workers own (assigned by earlier cells): a notebook
        function that refers to one of them sees the rank's value, not the notebook's.
        Returns when every rank has finished, or, after a failure, once the
        others finished, were interrupted, or were stopped (which breaks the pool;
        the next run restarts it). KeyboardInterrupt interrupts every rank, then
        a failed outcome is returned (``cancel`` set does the same off the main thread: a background cell).
        ``stdin(prompt, password)`` answers the ranks' input() and pdb (kernel/jobs/stdin.py); without it they read EOF.
        ``reload``: autoreload is on, what the ranks reload first (kernel/reload.py). ``heal``: a rank started again gets the others' names first.
        """
        guarded = GuardedListener(listener or Listener())
        with self._bound(guarded):
            if (cut := healing.after_start(self, guarded, owned, self.ensure_started(guarded, owned), heal)) is not None:
                return cut  # a rank started again is made whole first (heal.py); a Ctrl-C that stopped that: the cell is not sent
            t0 = self._send_cell(source, names or {}, gather, argv, label, owned, reload)
            cell = CellRun(self, FailurePolicy(timeout, self.grace, t0, remote=self.launcher.remote_ranks), stdin=stdin, cancel=cancel, sent=True)
            cell.drive()
            return self._outcome(cell, guarded, t0)

    def _send_cell(self, source: str, names: Dict[str, bytes], gather: str, argv: Optional[List[str]], label: Optional[str], owned: Sequence[str],
                   reload: Optional[dict] = None) -> float:
        """Mark every rank RUNNING and send it the cell; returns the cell's start time."""
        self._cell += 1
        filename = f"<ddp-cell-{label if label is not None else self._cell}>"
        self.hub.begin_cell()
        t0 = time.monotonic()
        for info in self.ranks.values():
            info.state, info.started, info.finished, info.last_line = RankState.RUNNING, t0, None, ""
            info.tail.clear()
        send_run(self.hub, self.ranks, self.nproc, run_fields(self._cell, source, filename, names, owned, gather, argv, reload))
        self.hub.listener.on_states(list(self.ranks.values()))  # then the views: a ticket's clock starts once the ranks hold it
        return t0

    def _outcome(self, cell: CellRun, guarded: GuardedListener, t0: float) -> CellOutcome:
        failures, notes = cell.failures(), list(cell.notes)
        fetched = {} if cell.cancelled else results.fetch_pending(self.hub, failures, RESULT_WAIT_S)
        self.recovery.after_cell(self, cell, notes)  # the group re-formed in place, if the cell broke it
        values = results.cell_values(self.nproc, self.hub.done, fetched, notes)
        notes += guarded.errors
        lost = cell.state_lost or bool(self.broken)
        if self.broken and not cell.state_lost:
            notes.append(texts.restarts_next_note(self.broken))
        recovered = bool(failures) and self.recovery.ready_again(self)  # whole again: every rank READY
        return CellOutcome(values, failures, notes, time.monotonic() - t0, stacks=cell.stacks, state_lost=lost, recovered=recovered,
                           cancelled=cell.job_cancelled, restarted=tuple(self.recovery.restarted()),
                           interrupted=cell.policy.user_interrupted and not cell.job_cancelled)

    def ask(self, op: str, timeout: float = 5.0, listener: Optional[Listener] = None, ranks: Optional[Sequence[int]] = None,
            fields: Optional[dict] = None) -> Dict[int, dict]:
        """Ask every live rank (or these of them) for its STACK, ENV or VERSIONS; returns the replies that came in time."""
        hub = self.hub
        replies = hub.replies[op] = {}
        ranks = list(hub.conns) if ranks is None else [r for r in ranks if r in hub.conns]
        hub.broadcast(P.message(op, **(fields or {})), ranks)
        answered = lambda: len(replies) >= len(ranks) or (len(hub.conns) < len(ranks) and all(r in replies or r not in hub.conns for r in ranks))  # noqa: E731
        with self._bound(listener) if listener is not None else contextlib.nullcontext():
            hub.pump(answered, time.monotonic() + timeout)
        return dict(hub.replies.get(op, {}))

    def refresh(self) -> None:
        """Take in what happened while idle (a rank's exit or lost connection), so a status is current."""
        if self.started:
            self.hub.reap()

    def live_env(self, timeout: float = 5.0) -> Dict[int, dict]:
        """What each rank actually sees: its os.environ and process-group state, read from the worker."""
        if not self.alive:
            return {}
        return {r: m["env"] for r, m in self.ask(P.ENV, timeout).items()}

    # ------------------------------------------------------------ RankOps (what a CellRun acts through)
    def pump(self, until: Callable[[], bool], deadline: Optional[float], tick: Optional[Tick] = None, due: Optional[Due] = None) -> bool:
        """The hub's poll loop; a cell's listener hears each wake's states at once (GuardedListener.holding)."""
        listener = self.hub.listener
        if not isinstance(listener, GuardedListener):
            return self.hub.pump(until, deadline, tick=tick, due=due)
        with listener.holding():
            return self.hub.pump(until, deadline, tick=listener.each_wake(tick), due=due)

    def answer_input(self, ask: Optional[Ask], cancelled: bool) -> None:
        answer_all(self.hub, self.ranks, ask, cancelled)

    def holding(self) -> bool:
        return self.hub.stdin.holding(self.ranks)

    def interrupt(self, ranks: Sequence[int]) -> None:
        self.hub.broadcast(P.message(P.INTERRUPT), ranks)

    def abort(self, ranks: Sequence[int], why: str) -> None:
        self.hub.broadcast(P.message(P.ABORT, why=why), ranks)

    def signal_ranks(self, ranks: Sequence[int], sig: int) -> None:
        if self.launcher.remote_ranks:  # ranks on other hosts: their reader thread exits the process for us
            self.hub.broadcast(P.message(P.KILL), ranks)
        for rank in ranks:
            pid = self.ranks[rank].pid
            if pid and self.launcher.owns(pid):
                signal_pid(pid, sig)

    def done_message(self, rank: int) -> Optional[dict]:
        return self.hub.done.get(rank)

    def death_failure(self, rank: int) -> RankFailure:
        return self.hub.death_failure(rank)

    def state_version(self) -> Tuple[int, int]:
        return self.hub.failed, self.hub.version

    def mark_dead(self, rank: int) -> None:
        info = self.ranks[rank]
        info.state, self.hub.version, self.hub.failed = RankState.DEAD, self.hub.version + 1, self.hub.failed + 1
        info.finished = info.finished or time.monotonic()
        self.hub.listener.on_state(info)

    def mark_broken(self, why: str) -> None:
        self.broken = why

