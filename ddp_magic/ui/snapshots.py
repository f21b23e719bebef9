"""``%ddp save``, ``%ddp load`` and ``%ddp snapshots`` in a notebook: each run as a cell on the session's pool, and what they print.

The ranks' work is procs/rank_snapshot.py, the cell and the words kernel/snapshots.py; here
the session runs that cell (it waits its turn like any cell, and a rank that fails it is a
CellError as a cell's would be), and a load's names become the workers' (``session.owned``).
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from ..errors import CellError, UsageError
from ..kernel import snapshots
from ..kernel.jobs import safe_save
from ..kernel.jobs.turns import Ticket
from ..plan.spec import PoolSpec
from ..session import CellOptions, CellResult, Session
from ..wire import snapshot as S
from .cell_listener import MagicListener
from .output import RankPrinter

ACTIONS = ("save", "load", "snapshots")
RETRY_S = 0.2  # a save asked for while the running cell starts or ends on some ranks: asked again this often
HOLDER_SETTLE_S = 30.0  # a --bg cell's job next in line with the pool free takes its turn within this (its thread: ms, loaded: s)


def command(session: Session, args: argparse.Namespace, request: Dict[str, Any]) -> None:
    """%ddp save / load / snapshots, parsed (magic_options.py ``SNAPSHOT_ARGUMENTS``); prints what the user reads."""
    if args.bg and args.action != "save":
        raise UsageError(f"%ddp {args.action}: --bg goes with save (write in the background), e.g. %ddp save ckpt/ --bg")
    if args.action not in ACTIONS:
        raise UsageError("%ddp: names and --into go with save and load, e.g. %ddp save ckpt/ model opt")
    if not args.target:
        raise UsageError(f"%ddp {args.action}: name the snapshots' folder, e.g. %ddp {args.action} ckpt/")
    if args.action == "snapshots":
        return print(snapshots.listing(args.target))
    listener = MagicListener(RankPrinter(), widget=False)
    done: Any = None  # snapshots.Saved or snapshots.Loaded
    if args.action == "save":
        if request or args.into:
            raise UsageError("%ddp save: pool options and --into go with load, e.g. %ddp load ckpt/ -n 2 --into model,opt")
        if during_a_cell(session, args.target, args.names, args.bg):
            return None
        result, done = save(session, args.target, args.names, listener, args.bg)
    else:
        if args.names:
            raise UsageError(f"%ddp load: one folder; the objects to fill go with --into, e.g. %ddp load {args.target} --into model,opt")
        into = [n.strip() for n in (args.into or "").split(",") if n.strip()]
        result, done = load(session, args.target, into, session.spec_for(**request) if request else None, listener)
    listener.finish(result.outcome)
    if done is None:
        refused = next((f.message for f in result.outcome.failures if f.type == S.Refused.__name__), None)
        if refused is not None:  # the ranks' words alone: the cell that carried them is ours, not the user's
            raise UsageError("\n".join([f"%ddp {args.action}: {refused}", *result.outcome.notes]))
        raise CellError(result.outcome.failures, result.outcome.notes)
    print(done.text())


def save(session: Session, parent: str, names: Sequence[str] = (), listener: Optional[MagicListener] = None,
         background: bool = False) -> Tuple[CellResult, Optional[snapshots.Saved]]:
    """The names the ranks own (or ``names``) as a new snapshot in ``parent``, at this cell boundary (``background``:
    the ranks go on once each has copied its share; %ddp stop waits for the write, procs/rank_snapshot_bg.py)."""
    if session.pool is None or not session.pool.alive:
        raise UsageError("%ddp save: no pool is running; there is nothing on the ranks to save")
    chosen = list(names) or sorted(session.owned)
    if not chosen:
        raise UsageError("%ddp save: the ranks own no names yet (what a %%ddp cell assigns lives there); name some, e.g. %ddp save ckpt/ model")
    step = session.metrics.last_step() if session.metrics else None  # ddp_magic.log's step, unless the ranks hold a `step`
    source, partial = snapshots.save_source(parent, chosen, step, background, user_named=bool(names))
    result = session.run(source, {}, CellOptions(internal=True), listener)
    if not result.ok and not _refused_first([f.type for f in result.outcome.failures], partial):
        result.outcome.notes.append(snapshots.unfinished(snapshots.shown(parent, partial)))
    if result.ok and session.pool is not None:
        _saved(session, result.outcome.values[0], parent)
        session.import_later()  # the next pool's ranks (or one started again) have what a load or a heal imports
    return result, (snapshots.Saved(result.outcome.values[0], parent) if result.ok else None)


def during_a_cell(session: Session, parent: str, names: Sequence[str], background: bool = False) -> bool:
    """%ddp save while a cell runs on the pool (a --bg job): taken at its next safe point, said here. False when the cell
    ended before one: the save then waits its turn, as a cell, at the boundary."""
    holder = session.turns.settled(HOLDER_SETTLE_S)  # a --bg cell run just before: its job's turn, once its thread took it
    if holder is None or session.pool is None or not session.pool.alive:
        return False
    waits = (f"%ddp save: {holder.name} runs on the pool: the save waits for its next safe point "
             f"(ddp_magic.log(step=…) or ddp_magic.safe_point() on every rank), or for its end")
    said: list = []  # the wait is said once, however often the save is asked again

    def say() -> None:
        if not said:
            said.append(print(waits, flush=True))

    out, saved = at_safe_point(session, holder, parent, names, say, " at a safe point (the job goes on)", background)
    if saved is not None:
        session.import_later()
        print(saved.text())
        return True
    if out.outcome == safe_save.Outcome.ENDED:
        print(f"{holder.name} ended before a safe point: saving at the cell boundary", flush=True)
        return False
    raise UsageError(f"%ddp save: {out.why}; nothing was saved; {holder.name} goes on")


def at_safe_point(session: Session, holder: Ticket, parent: str, names: Sequence[str], on_wait: Callable[[], None],
                  where: str, background: bool = False) -> Tuple[safe_save.SafeSave, Optional[snapshots.Saved]]:
    """The names the ranks own and the running cell assigns (or ``names``), saved at the cell's next safe point."""
    chosen = list(names) or sorted(session.owned | holder.assigns)
    if not chosen:
        raise UsageError("%ddp save: the ranks own no names yet; name some, e.g. %ddp save ckpt/ model")
    assert session.pool is not None
    args = snapshots.save_args(parent, chosen, None, background, user_named=bool(names))
    out = safe_save.save_at_safe_point(session.pool, session.turns, args, on_wait)
    while out.outcome == safe_save.Outcome.ENDED and session.turns.holder is holder and holder.ran_for is None and session.pool.alive:
        time.sleep(RETRY_S)  # its cell has not reached every rank yet, or is ending on some: ask again until it runs or has ended
        out = safe_save.save_at_safe_point(session.pool, session.turns, args, on_wait)
    if out.outcome == safe_save.Outcome.FAILED and _refused_first([e.get("type") for e in out.errors.values()], args["partial"]):
        out.why = out.errors[min(out.errors)].get("message") or out.why  # the ranks' words alone
    elif out.outcome == safe_save.Outcome.FAILED:
        out.why += "; " + snapshots.unfinished(snapshots.shown(parent, args["partial"]))
    if out.outcome != safe_save.Outcome.SAVED or out.report is None:
        return out, None
    _saved(session, out.report, parent)
    return out, snapshots.Saved(out.report, parent, where)


def _refused_first(kinds: Sequence[Any], partial: str) -> bool:
    """The ranks refused before any made the partial folder (a name typed wrong): no unfinished snapshot to name."""
    return bool(kinds) and all(k == S.Refused.__name__ for k in kinds) and not os.path.lexists(partial)


def _saved(session: Session, report: Dict[str, Any], parent: str) -> None:
    """The pool's last snapshot (a rank healed later takes its own names from it), and one still being written (its stop waits)."""
    assert session.pool is not None
    session.pool.recovery.snapshot = report["path"]
    session.pool.recovery.writing = parent if report.get("background") else session.pool.recovery.writing


def load(session: Session, path: str, into: Sequence[str] = (), spec: Optional[PoolSpec] = None,
         listener: Optional[MagicListener] = None) -> Tuple[CellResult, Optional[snapshots.Loaded]]:
    """The newest snapshot in ``path`` (or ``path`` itself) into this pool, or into a new one of its world size."""
    written = session.wait_for_writes()  # a background save still being written may be the newest: whole before it is chosen
    if written:
        print(written, flush=True)
    try:
        chosen = S.resolve(path)
        saved_world = S.Meta.read(chosen).world_size
    except (OSError, ValueError) as e:
        raise UsageError(f"%ddp load: {e}") from None
    if spec is None and (session.pool is None or not session.pool.alive):
        spec = session.spec_for(nproc=saved_world)
    session.import_later()  # a new pool's template imports DCP and DDP's torch._dynamo once, before it forks the ranks
    result = session.run(snapshots.load_source(chosen, into), {}, CellOptions(spec=spec, internal=True), listener)
    if not result.ok:
        return result, None
    loaded = snapshots.Loaded([v for v in result.outcome.values if v], len(result.outcome.values), saved_world, path)
    if session.pool is not None:
        session.pool.recovery.snapshot = chosen
    session.owned |= set(loaded.names)
    if session.pool is not None:  # a rank started again earlier has these names now
        session.pool.recovery.assigned(set(loaded.names), but={f.rank for f in result.outcome.failures})
    return result, loaded
