"""``%ddp save``, ``%ddp load`` and ``%ddp snapshots`` in a notebook: each run as a cell on the session's pool, and what they print.

The ranks' work is procs/rank_snapshot.py, the cell and the words kernel/snapshots.py; here
the session runs that cell (it waits its turn like any cell, and a rank that fails it is a
CellError as a cell's would be), and a load's names become the workers' (``session.owned``).
"""
from __future__ import annotations

import argparse
from typing import Any, Dict, Optional, Sequence, Tuple

from ..errors import CellError, UsageError
from ..kernel import snapshots
from ..plan.spec import PoolSpec
from ..session import CellOptions, CellResult, Session
from ..wire import snapshot as S
from .cell_listener import MagicListener
from .output import RankPrinter

ACTIONS = ("save", "load", "snapshots")


def command(session: Session, args: argparse.Namespace, request: Dict[str, Any]) -> None:
    """%ddp save / load / snapshots, parsed (magic_options.py ``SNAPSHOT_ARGUMENTS``); prints what the user reads."""
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
        result, done = save(session, args.target, args.names, listener)
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


def save(session: Session, parent: str, names: Sequence[str] = (), listener: Optional[MagicListener] = None) -> Tuple[CellResult, Optional[snapshots.Saved]]:
    """The names the ranks own (or ``names``) as a new snapshot in ``parent``, at this cell boundary."""
    if session.pool is None or not session.pool.alive:
        raise UsageError("%ddp save: no pool is running; there is nothing on the ranks to save")
    chosen = list(names) or sorted(session.owned)
    if not chosen:
        raise UsageError("%ddp save: the ranks own no names yet (what a %%ddp cell assigns lives there); name some, e.g. %ddp save ckpt/ model")
    step = session.metrics.last_step() if session.metrics else None  # ddp_magic.log's step, unless the ranks hold a `step`
    source, partial = snapshots.save_source(parent, chosen, step)
    result = session.run(source, {}, CellOptions(internal=True), listener)
    if not result.ok:
        result.outcome.notes.append(snapshots.unfinished(snapshots.shown(parent, partial)))
    if result.ok and session.pool is not None:
        session.pool.recovery.snapshot = result.outcome.values[0]["path"]  # a rank healed later takes its own names from it
    return result, (snapshots.Saved(result.outcome.values[0], parent) if result.ok else None)


def load(session: Session, path: str, into: Sequence[str] = (), spec: Optional[PoolSpec] = None,
         listener: Optional[MagicListener] = None) -> Tuple[CellResult, Optional[snapshots.Loaded]]:
    """The newest snapshot in ``path`` (or ``path`` itself) into this pool, or into a new one of its world size."""
    try:
        chosen = S.resolve(path)
        saved_world = S.Meta.read(chosen).world_size
    except (OSError, ValueError) as e:
        raise UsageError(f"%ddp load: {e}") from None
    if spec is None and (session.pool is None or not session.pool.alive):
        spec = session.spec_for(nproc=saved_world)
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
