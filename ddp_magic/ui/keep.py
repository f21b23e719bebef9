"""``%ddp keep``, ``%%ddp --keep`` and ``%ddp attach`` in a notebook: what they print, and the job an attach takes on.

The mechanism is kernel/keep/'s; here the magics' side: the lines a user reads, and, when a cell ran on
while no kernel was attached, a ``Job`` (ui/jobs.py) that shows its output and chart in the attach cell
and gives its result, as if this kernel had started it with ``%%ddp --bg``.
"""
from __future__ import annotations

import argparse
import functools
import time
import types
from typing import Any, Optional

from ..errors import CellError, UsageError
from ..kernel.keep import attach as attaching
from ..kernel.keep import keeping
from ..kernel.keep.resume import resume
from ..kernel.keep.terms import Terms, TermsError
from ..kernel.results.metrics import CellMetrics
from ..kernel.jobs.turns import Ticket
from ..session import Session
from . import lab_hello
from . import preempt as preempting
from . import save_every
from .cell_listener import MagicListener
from .jobs import Job
from .output import RankPrinter
from .results import RankResults, running_cell


def terms(args: argparse.Namespace) -> Terms:
    try:
        return Terms.parse(getattr(args, "idle", None), getattr(args, "max", None))
    except TermsError as e:
        raise UsageError(str(e)) from None


def keep(session: Session, args: argparse.Namespace) -> None:
    """``%ddp keep [--idle 30m] [--max 24h]``, ``%ddp keep --off``."""
    pool = session.pool
    if args.off:
        if pool is None or not keeping.unkeep(pool):
            print("the pool was not kept; it ends with this kernel")
        else:
            print("the pool is no longer kept: it ends with this kernel, as a pool does by default")
        return
    session.turns.check_idle("%ddp keep waits for the running cell (put --keep on a background cell to keep it while it runs)")
    if pool is None:
        raise UsageError("%ddp keep: no pool is running; start one first (%%ddp -n N), or put --keep on the cell that starts it")
    state = _keep(session, terms(args))
    print(f"{kept_line(state)}\nafter a kernel restart: %load_ext ddp_magic, then %ddp attach")


def kept_line(state: keeping.KeptState) -> str:
    """``kept pool 53f7d1a3: ends 30 min after its kernel leaves, at most at Mon 05:01``: kept once, short enough that an
    output area (which wraps anywhere) keeps the time whole."""
    return f"kept pool {state.id}: {state.terms.lease()}"


def _keep(session: Session, lease: Terms, job: str = "") -> keeping.KeptState:
    assert session.pool is not None
    try:
        state = keeping.keep(session.pool, lease, job)
    except keeping.KeepError as e:
        raise UsageError(str(e)) from None
    keeping.record_saves(state, armed=preempting.armed_folder(session.pool) or None)  # armed before the keep: the next kernel arms it too
    return state


def keep_cell(session: Session, spec: Any, listener: Any, job: str, armed: Optional[str] = None) -> None:
    """``%%ddp --keep``: the pool started (if it was not) and kept before the cell is sent, so the job outlives the kernel
    (``armed``: its ``--save-on-preempt`` folder, recorded for the kernel that attaches next; its ``--save-every`` is
    recorded as every cell's is, by ui/save_every.py)."""
    session.turns.check_idle("%%ddp --keep waits for the running cell")
    pool = session.pool
    if spec is not None or pool is None or not pool.alive:
        session.start(spec if spec is not None else pool.spec if pool is not None else None, listener)  # type: ignore[arg-type]
    pool = session.pool
    assert pool is not None
    state = _keep(session, pool.kept.terms if pool.kept is not None else Terms.parse(None, None), job)
    keeping.record_saves(state, armed=armed)  # now: a kernel killed before the cell armed the ranks leaves it for the next
    listener.on_notice(kept_line(state))


def attach(magics: Any, args: argparse.Namespace) -> Optional[Job]:
    """``%ddp attach [--out job] [--force] [ID]``, ``%ddp attach --list``."""
    session: Session = magics.session
    if args.list:
        print(attaching.list_text(attaching.found_pools()))
        return None
    if session.pool is not None and session.pool.started:
        raise UsageError("%ddp attach: this kernel has a pool already; %ddp stop ends it, then %ddp attach (or attach from a new kernel)")
    number, _ = running_cell(magics.shell)
    name = f"cell [{number}]" if isinstance(number, int) else "the attach cell"
    printer = RankPrinter(read_back=f"{args.out}.output({{rank}})" if args.out else "%ddp output --rank {rank}")
    listener = MagicListener(printer)
    lab_hello.wait_for_hello(magics.shell)  # loaded in this very cell: the page's word comes with its hello
    try:
        found = attaching.choose(args.target)
        done = attaching.attach(found, args.force)
    except attaching.AttachError as e:
        raise UsageError(str(e)) from None
    print(done.text)
    pool = done.pool
    if pool is None:
        return None
    session.template.close()  # this kernel's own warm template: the kept pool has one
    session.pool, session.owned, session.last = pool, set(done.owned), None
    listener.name_nodes(pool)  # [rank 3 n2] on a Slurm pool, as before the kernel left
    if not done.resumed:
        listener.on_pool(pool)
        done.replay(listener)
        printer.flush()
        _rearm(session)
        return None
    ticket = Ticket(f"{attaching.previous(done.job) or 'the kept cell'} (attached in {name})", background=True)
    label = str(number) if isinstance(number, int) else "attach"
    job = Job(ticket, functools.partial(_finish, session, pool, listener, printer, ticket, label, done), live=lambda: listener.metrics.data)
    job.outputs = functools.partial(session.output, cell=label)
    magics.jobs = [j for j in magics.jobs if not j.done()] + [job]
    job.start(held=True)
    _rearm(session)  # once the job holds the turn: the watcher never pumps the hub in its place
    if args.out:
        magics.user_ns[args.out] = job
        return None
    return job


def _rearm(session: Session) -> None:
    """``--save-on-preempt`` on the kept pool: armed again by this kernel, whose cell then says a preemption's line."""
    pool = session.pool
    folder = keeping.recorded_saves(pool.kept).get("armed") if pool is not None and pool.kept is not None else None
    if folder:
        preempting.arm(session, folder)
        print(f"armed: a preemption saves to {folder} (--save-on-preempt)", flush=True)


def _finish(session: Session, pool: Any, listener: MagicListener, printer: RankPrinter, ticket: Ticket, label: str,
            done: attaching.Attached, job: Job) -> RankResults:
    """The job's work: the resumed cell to its end, shown in the attach cell; its RankResults (or its CellError)."""
    metrics = CellMetrics(label)
    ticket.progress = metrics.last_step
    try:
        with session.turns.turn(ticket, True, None, job.cancel_event):
            ranks = sorted(pool.hub.hellos)
            ticket.ran = done.clocks.start(ranks) or time.monotonic()  # the ranks' clock (kernel/keep/clocks.py)
            ended = done.clocks.end(ranks)
            if ended is not None:  # it ended while no kernel was attached: its run time is known now, not as the resume ends
                ticket.ran_for = max(0.0, ended - ticket.ran)
            listener.on_pool(pool)
            listener.on_states([info for _, info in sorted(pool.ranks.items())])  # the view's run clock starts where theirs did
            heard = metrics.tee(session.outputs.tap(listener, label), listener)
            done.replay(heard)
            every = (keeping.recorded_saves(pool.kept).get("every") or None) if pool.kept is not None else None
            with save_every.saving(session, types.SimpleNamespace(save_every=every, save_on_preempt=None), ticket):  # its --save-every goes on
                outcome = resume(pool, heard, job.cancel_event, done.clocks)
    except BaseException as e:
        printer.flush()
        listener.finish(None, e)
        raise
    ticket.ran_for = outcome.elapsed  # the job's run time is its cell's, on the ranks
    printer.flush()
    listener.finish(outcome, metrics=metrics)
    results = RankResults(outcome.values)
    results.metrics = metrics.columns() if metrics else {}
    if outcome.failures:
        raise CellError(outcome.failures, outcome.notes, partial=results)
    for note in outcome.notes:
        listener.on_notice(note)
    return results


def lost(session: Session) -> None:
    """A kept pool another kernel took over (--force): this kernel forgets it, and its next cell says so."""
    pool = session.pool
    if pool is None or pool.kept is None:
        return
    pool.refresh()  # reads the template's events: "fenced" among them
    why = keeping.lost_text(pool)
    if why is None:
        return
    keeping.drop_lost(pool)
    session.pool, session.last = None, None
    session.owned.clear()
    raise UsageError(why)
