"""A cell's return values in the kernel: the one home of result unpacking and of the gather decision.

A rank's value arrives in its DONE message, or, for a tensor result, later in a
RESULT message once the kernel has decided how it travels (``gather_mode``):
gathered to rank 0 in one collective when every rank returned the same shape,
or rank by rank. Either way it is unpacked here, and a value that cannot be
unpickled in the kernel becomes a ``transfer.Unpicklable`` with a note, never
an exception that would lose the other ranks' results. A DTensor is never
gathered: each rank sends its local shard (wire/sharded.py), and the outcome
(``CellOutcome.combined``) puts the ranks' shards together (kernel/results/combine.py).
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Mapping, Sequence

from ...errors import RankFailure
from ...logs import log
from ...states import RankState
from ...wire import protocol as P
from ...wire import transfer
from ..hub import Hub

SHAREABLE = (int, float, bool, complex, str, bytes, type(None))  # immutable: ranks that sent the same bytes may share the one value


def gather_mode(pending: Mapping[int, Any], failures: Sequence[RankFailure], nproc: int) -> str:
    """"gather" when every rank has a pending tensor result of the same shape and none failed; else "send"."""
    metas = list(pending.values())
    same = bool(metas) and all(m == metas[0] for m in metas)
    return "gather" if not failures and len(pending) == nproc and same else "send"


def pending_results(done: Mapping[int, dict]) -> Dict[int, Any]:
    """rank -> tensor metadata of the results that wait for the kernel's decision."""
    return {r: m["pending"] for r, m in done.items() if m.get("pending")}


def fetch_pending(hub: Hub, failures: List[RankFailure], wait_s: float) -> Dict[int, dict]:
    """Tell the ranks with a pending tensor result how to send it; wait for each RESULT (or the rank's death).

    A rank that died first is added to ``failures``; returns rank -> its RESULT message.
    """
    pending = pending_results(hub.done)
    if not pending:
        return {}
    hub.broadcast(P.message(P.DECIDE, mode=gather_mode(pending, failures, len(hub.ranks))), list(pending))
    # The full check only once a rank died (hub.deaths counts them): O(1) a wake until then. A hub that does not count is checked every wake.
    deaths = lambda: getattr(hub, "deaths", 0)  # noqa: E731
    before = -1 if not hasattr(hub, "deaths") or any(hub.ranks[r].state == RankState.DEAD for r in pending) else deaths()
    gone = lambda: all(r in hub.results or hub.ranks[r].state == RankState.DEAD for r in pending)  # noqa: E731
    arrived = lambda: len(hub.results) >= len(pending) or (deaths() > before and gone())  # noqa: E731
    hub.pump(arrived, time.monotonic() + wait_s)
    failures += [hub.death_failure(r) for r in pending if r not in hub.results]
    return {r: hub.results[r] for r in pending if r in hub.results}


def unpack_value(rank: int, packed: dict, notes: List[str]) -> Any:
    """A rank's packed value, or an ``Unpicklable`` (with a note) when the kernel cannot load it."""
    try:
        return transfer.unpack(packed)
    except Exception as e:  # unpickling runs the value's own code: anything can raise
        log.debug("the result of rank %s could not be unpickled", rank, exc_info=True)
        notes.append(f"the result of rank {rank} could not be unpickled in the kernel: {type(e).__name__}: {e}")
        return transfer.Unpicklable(rank, "result", f"{type(e).__name__}: {e}")


def _unsent_value(rank: int, err: dict, notes: List[str]) -> transfer.Unpicklable:
    notes.append(f"rank {rank}'s result ({err['type']}) could not be pickled: {err['reason']}; the other ranks' results are returned")
    return transfer.Unpicklable(rank, err["type"], err["reason"])


def _place(values: List[Any], rank: int, msg: dict, notes: List[str], same: Dict[bytes, Any]) -> None:
    """Put what one rank's message carries into ``values``: its own value, or rank 0's gathered list."""
    if msg.get("result") is not None:
        if not msg.get("gathered"):
            values[rank] = _own_value(rank, msg["result"], notes, same)
            return
        gathered = unpack_value(rank, msg["result"], notes)
        if isinstance(gathered, transfer.Unpicklable):  # the list as a whole: no rank's value survives
            values[:] = [transfer.Unpicklable(r, gathered.type_name, gathered.reason) for r in range(len(values))]
        else:
            values[:] = list(gathered)
    elif msg.get("result_error"):
        values[rank] = _unsent_value(rank, msg["result_error"], notes)


def _own_value(rank: int, packed: dict, notes: List[str], same: Dict[bytes, Any]) -> Any:
    """``unpack_value``, once per cell for a plain value many ranks sent as the same bytes (``1`` from 1,024 ranks: one
    unpickle, not 1,024). Only for a value of an immutable type, so no rank's value is another's object to change."""
    key = packed.get("pickle") if not packed.get("buffers") and "shm" not in packed else None
    key = key if isinstance(key, bytes) else None
    if key is not None and key in same:
        return same[key]
    value = unpack_value(rank, packed, notes)
    if key is not None and type(value) in SHAREABLE:
        same[key] = value
    return value


def cell_values(nproc: int, done: Mapping[int, dict], fetched: Mapping[int, dict], notes: List[str]) -> List[Any]:
    """Every rank's value (None where there is none), from its DONE message or the RESULT fetched after it."""
    values: List[Any] = [None] * nproc
    for rank, msg in fetched.items():
        if msg.get("gather_failed"):
            notes.append(f"all_gather of the results failed on rank {rank} ({msg['gather_failed']}); results were sent rank by rank")
    same: Dict[bytes, Any] = {}  # a plain value's pickle -> the value (_own_value)
    for rank, msg in done.items():
        _place(values, rank, fetched.get(rank, msg), notes, same)
    return values
