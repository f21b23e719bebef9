"""What the session remembers of a notebook for %ddp_export: every cell in execution order, and what each %%ddp cell did.

The export needs more than IPython's history (which nbval and other front ends
that run cells with ``store_history=False`` leave empty): which cells were
``%%ddp`` cells, the pool's options when they ran, which notebook names were
shipped to the ranks, what each rank printed and what the cell returned. The
magics feed ``History.cell`` from IPython's ``post_run_cell`` event; the session
feeds ``tap`` and ``ran`` while a ``%%ddp`` cell runs. Everything here is a
small copy (the last lines, cheap reprs) or a weak reference to a returned value,
whose repr is made only when an export asks for it.

A background cell (``%%ddp --bg``) ends after its own ``post_run_cell``, while other
cells run: ``begin_late`` (called while it starts) keeps a place for its run, the cell's
own record takes that place, and ``ran(..., late=...)`` puts the run there whenever it ends.
"""
from __future__ import annotations

import threading
import types
import weakref
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..kernel.ranks import Listener
from ..logs import log

KEEP_LINES = 50  # the last lines of stdout kept per rank and cell: what --check compares
KEEP_REPR = 20_000  # characters of a returned value's repr kept per rank
KEEP_CELLS = 5_000  # cells remembered; the oldest go first


@dataclass(frozen=True)
class Shipped:
    """One notebook name a %%ddp cell received: what it was and how big its pickle was."""

    name: str
    kind: str  # "function", "class", "module" or "value"
    size: int  # bytes of its data: a tensor's or array's own (they travel through shared memory), else its pickle


def _slurm_fields(request: Any) -> Dict[str, Any]:
    """A --slurm pool's job options and GPUs per node, as the sbatch file repeats them (nothing for other pools)."""
    return {"slurm_options": tuple(request.job_options()), "gpus_per_node": request.gpus_per_node} if request is not None else {}


@dataclass(frozen=True)
class DdpRun:
    """One run of a %%ddp cell's body on the pool, with the pool's options as they were."""

    body: str
    nproc: int
    nnodes: int = 1
    backend: str = "gloo"  # what the pool used
    backend_asked: str = "auto"  # what the user asked for ("auto": nccl with a GPU per rank, else gloo)
    pg_timeout: float = 300.0
    init: bool = True
    slurm_options: Tuple[str, ...] = ()  # a --slurm pool's job options (partition, time, account, --slurm-args), for the sbatch file
    gpus_per_node: Optional[int] = None  # a --slurm pool's --gpus-per-node
    shipped: Tuple[Shipped, ...] = ()
    ok: bool = True
    values: Optional[Tuple[str, ...]] = None  # repr of each rank's value; None: the cell returned nothing
    stdout: Tuple[Tuple[str, ...], ...] = ()  # per rank, the last lines it printed
    mesh: Optional[str] = None  # the pool's --mesh, which made `mesh` on every rank
    held: Optional["HeldValues"] = field(default=None, compare=False)  # values whose repr is made only if an export asks

    def value_reprs(self) -> Optional[Tuple[str, ...]]:
        """Each rank's value as text (None: nothing returned, or the values are gone from the notebook)."""
        return self.values if self.held is None else self.held.reprs()


@dataclass(frozen=True)
class CellRecord:
    """One executed notebook cell: its number (In [n]), its text as typed, whether it succeeded, its %%ddp runs."""

    number: int
    source: str
    ok: bool = True
    runs: Tuple[DdpRun, ...] = ()

    @property
    def is_ddp(self) -> bool:
        return bool(self.runs)


class _Tap(Listener):
    """Passes everything on to the front end's listener, keeping each rank's stdout lines."""

    def __init__(self, inner: Listener, out: Dict[int, List[str]]) -> None:
        self.inner = inner
        self.out = out
        self.partial: Dict[int, str] = {}

    def on_output(self, rank: int, stream: str, text: str) -> None:
        if stream == "stdout":
            lines = (self.partial.pop(rank, "") + text).split("\n")
            self.partial[rank] = lines.pop()
            kept = self.out.setdefault(rank, [])
            kept.extend(lines)
            del kept[:-KEEP_LINES]
        self.inner.on_output(rank, stream, text)

    def on_state(self, info: Any) -> None:
        self.inner.on_state(info)

    def on_states(self, infos: Any) -> None:
        self.inner.on_states(infos)

    def on_notice(self, text: str) -> None:
        self.inner.on_notice(text)

    def finish(self) -> None:
        for rank, rest in self.partial.items():
            if rest:
                self.out.setdefault(rank, []).append(rest)
        self.partial.clear()


def _kind(value: Any) -> str:
    if isinstance(value, types.ModuleType):
        return "module"
    if isinstance(value, type):
        return "class"
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return "function"
    return "value"


def _size(value: Any, blob: bytes) -> int:
    """A tensor's or array's data size: its pickle is only a reference to the shared-memory copy (wire/notebook_data.py)."""
    nbytes = getattr(value, "nbytes", None)
    return max(nbytes, len(blob)) if isinstance(nbytes, int) else len(blob)


def _repr(value: Any) -> str:
    try:
        return repr(value)[:KEEP_REPR]
    except Exception as e:  # a broken __repr__ must not fail the cell that returned it
        log.debug("could not repr a cell's value for %%ddp_export", exc_info=True)
        return f"<unrepresentable {type(value).__name__}: {e}>"


CHEAP = (type(None), bool, int, float, complex, str)  # their repr costs nothing: made at once


class HeldValues:
    """A cell's values, their reprs made only when an export asks (a big tensor's repr takes milliseconds per rank).

    Tensors and other objects are held weakly: the notebook keeps them (Out, ``_``, ``--out``) as long as
    it wants; once they are gone the export compares printed lines only. A value that can be neither
    held weakly nor repr'd cheaply (a list, a dict) is repr'd at once, as before.
    """

    def __init__(self, values: Sequence[Any]) -> None:
        self._items: List[Any] = [self._hold(v) for v in values]

    @staticmethod
    def _hold(value: Any) -> Any:
        if isinstance(value, CHEAP):
            return _repr(value)
        try:
            return weakref.ref(value)
        except TypeError:  # not weakly referable (list, dict, tuple): the repr now
            return _repr(value)

    def reprs(self) -> Optional[Tuple[str, ...]]:
        out = []
        for item in self._items:
            if isinstance(item, weakref.ref):
                value = item()
                if value is None:
                    return None
                item = _repr(value)
            out.append(item)
        return tuple(out)


class History:
    """The notebook's cells in execution order, as the export reads them."""

    def __init__(self) -> None:
        self.cells: List[CellRecord] = []
        self._pending: List[DdpRun] = []
        self._out: Dict[int, List[str]] = {}
        self._tap: Optional[_Tap] = None
        self._next = 1
        self._late: Dict[int, List[Any]] = {}  # id(key) of a background cell -> [its record (None until its cell ended), its runs, key]
        self._unplaced: List[int] = []  # background cells started whose own record is not made yet
        self._lock = threading.Lock()  # a background cell's run is recorded on its job's thread

    def tap(self, listener: Listener) -> Listener:
        """The listener a %%ddp run should report to, so that its stdout is remembered."""
        self._out = {}
        self._tap = _Tap(listener, self._out)
        return self._tap

    def begin_late(self, key: Any) -> None:
        """A background cell starts (on the main thread, before its own ``post_run_cell``): its run, ``ran(late=key)``, goes to its record."""
        with self._lock:
            self._late[id(key)] = [None, [], key]  # the key held: its id names no other while the slot lives
            self._unplaced.append(id(key))

    def ran(self, body: str, blobs: Mapping[str, bytes], user_ns: Mapping[str, Any], pool: Any, outcome: Any, late: Any = None) -> None:
        """A %%ddp cell's body ran on ``pool``: remember the options, the names shipped, the output and the values
        (``late``: the key a background cell's ``begin_late`` was given; its record gets the run)."""
        if self._tap is not None:
            self._tap.finish()
        spec = pool.spec
        values, held = None, None
        if outcome.values and any(v is not None for v in outcome.values):
            if all(isinstance(v, CHEAP) for v in outcome.values):
                values = tuple(_repr(v) for v in outcome.values)
            else:
                held = HeldValues(outcome.values)
        run = DdpRun(
            body=body, nproc=pool.nproc, nnodes=spec.nnodes, backend=pool.backend, backend_asked=spec.backend,
            pg_timeout=spec.pg_timeout, init=spec.init, ok=outcome.ok, values=values, held=held,
            **_slurm_fields(getattr(spec, "slurm", None)),
            shipped=tuple(Shipped(n, _kind(user_ns.get(n)), _size(user_ns.get(n), b)) for n, b in sorted(blobs.items())),
            stdout=tuple(tuple(self._out.get(r, ())) for r in range(pool.nproc)), mesh=getattr(spec, "mesh", None) or None,
        )
        self._tap = None
        with self._lock:
            slot = self._late.get(id(late)) if late is not None else None
            if slot is None:
                self._pending.append(run)
            elif slot[0] is None:  # the cell's own record is not made yet: it takes the run with it
                slot[1].append(run)
            else:
                self._replace(slot[0], dataclasses.replace(slot[0], runs=slot[0].runs + (run,)))
                del self._late[id(late)]

    def _replace(self, old: "CellRecord", new: "CellRecord") -> None:
        for i, record in enumerate(self.cells):
            if record is old:
                self.cells[i] = new

    def cell(self, number: Optional[int], source: str, ok: bool) -> None:
        """A notebook cell finished (``number`` None: the front end keeps no history, so we count)."""
        if not source.strip():
            return  # an empty cell has no number in the notebook either
        if number is None:
            number = self._next
        self._next = number + 1
        with self._lock:
            late = self._late.get(self._unplaced.pop(0)) if self._unplaced else None
            record = CellRecord(number, source, ok, tuple(self._pending) + tuple(late[1] if late else ()))
            self.cells.append(record)
            self._pending = []
            del self.cells[:-KEEP_CELLS]
            if late is not None:
                if late[1]:  # it ended before its own cell did: nothing more to come
                    self._late = {k: v for k, v in self._late.items() if v is not late}
                else:
                    late[0] = record

    def start_at(self, number: int) -> None:
        """Where our own count starts when the front end keeps no history (the cell that loaded us)."""
        self._next = number
