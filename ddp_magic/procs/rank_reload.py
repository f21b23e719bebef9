"""A rank's side of ``%ddp autoreload``: the user's modules it has imported, their versions, and IPython's reload of them.

The kernel decides (kernel/reload.py); a rank never reloads on its own. Whether
autoreload is on or not, a rank notes each user module's version once it was imported (at
the end of the cell that imported it) and its DONE names the new ones (``new``: name,
file, version): the version in memory, so an edit saved before autoreload was turned on
is still seen as one (IPython's ModuleReloader records the mtimes of what was loaded
when it is created). A RUN with a ``reload`` field means autoreload is on: before the cell
the rank takes in modules the kernel ships by value (``ship``: a module under the
notebook's directory that this rank cannot import from a file of its own), reloads the
modules the kernel names (``apply``: every rank agreed on their versions first, through
VERSIONS), then runs the cell. Its DONE then also says which modules it reloaded and the
files it saw change that the kernel did not name (``pending``: the kernel checks them
before the next cell). The warm cost is one ``stat`` a watched file (none while off).

The reload itself is IPython's (``IPython.extensions.autoreload``): DeduperReloader's
partial reload where it applies (IPython 9), else ``superreload``, which updates
functions' code and classes' methods in place and moves live instances to the new
class, so a model keeps its ``id()``, parameters and optimizer state.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import traceback
from dataclasses import dataclass
from importlib import reload as _reload
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..logs import log
from ..wire import reload as R
from ..wire.execution import error_data

SHIPPED = "<shipped>"  # the path a module shipped by value reports: it has no file on this rank


@dataclass
class Watched:
    """One user module as this rank has it: its file, the stat it was last read at, that read's version, and the version loaded."""

    path: str
    key: Optional[R.StatKey]
    sha: str
    loaded: str  # the version its code in memory came from

    def look(self) -> None:
        """Read the file again if its stat changed (the warm path: one stat)."""
        if self.path == SHIPPED:
            return
        key = R.stat_key(self.path)
        if key == self.key:
            return
        data, key = R.read(self.path)
        if data is None:  # deleted or unreadable (a save in progress, a rename): nothing to reload, as IPython skips it
            return
        self.key, self.sha = key, R.digest(data)


class ShippedFinder(importlib.abc.SourceLoader):
    """Modules the kernel shipped by value: found after every real finder, loaded from the source the kernel sent."""

    def __init__(self) -> None:
        self.sources: Dict[str, Tuple[str, str]] = {}  # name -> (source, the kernel's path)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.sources:
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=self.sources[fullname][1])

    def get_filename(self, fullname: str) -> str:
        return self.sources[fullname][1]

    def get_data(self, path: str) -> bytes:
        for source, origin in self.sources.values():
            if origin == path:
                return source.encode()
        raise OSError(path)

    def path_stats(self, path: str) -> Any:
        raise OSError("shipped modules are never cached")  # no .pyc next to a file this rank does not have


class Reloader:
    """The rank's watched modules and IPython's reloader; the reader thread reads versions, the main thread reloads."""

    def __init__(self) -> None:
        self.on = False
        self.watched: Dict[str, Watched] = {}
        self._seen = 0  # len(sys.modules) at the last scan: a warm cell that imported nothing skips the scan
        self._reported: set = set()
        self._lock = threading.Lock()
        self._ipython: Any = None  # IPython.extensions.autoreload, imported at the first reload
        self._old_objects: Dict[Any, Any] = {}
        self._deduper: Any = None
        self.sources: Dict[str, str] = {}  # module -> its source as loaded: the deduper's "before" (it diffs the file against it)
        self.finder = ShippedFinder()
        self.shipped_now: List[str] = []  # this cell's: modules this rank got by value
        self.reloaded: List[str] = []  # this cell's
        self._told: set = set()  # modules the kernel heard of (DONE's reload_new)

    # ------------------------------------------------------------ bookkeeping
    def scan(self) -> None:
        """Watch the user modules imported since the last scan (nothing to do when sys.modules did not grow)."""
        if len(sys.modules) == self._seen:
            return
        with self._lock:
            for name in set(list(sys.modules)) - self._reported:  # only the modules imported since (a peek may import meanwhile)
                self._reported.add(name)
                module = sys.modules.get(name)
                if name in self.finder.sources:
                    sha = R.digest(self.finder.sources[name][0].encode())
                    self.watched[name] = Watched(SHIPPED, None, sha, sha)
                    continue
                path = R.user_file(module)
                if path is None:
                    continue
                data, key = R.read(path)
                if data is not None:
                    sha = R.digest(data)
                    self.watched[name] = Watched(path, key, sha, sha)
                    self.sources[name] = data.decode("utf-8", "replace")
            self._seen = len(sys.modules)

    def versions(self, names: Optional[Sequence[str]]) -> Dict[str, List[str]]:
        """VERSIONS (the reader thread, between cells): name -> [file, version] for the named modules this rank has.
        ``names`` None: every module it watches, as [file, version, the version it runs], all taken as told (a kernel that
        attached a kept pool learns what the ranks told the kernel before it)."""
        self.scan()
        out = {}
        with self._lock:
            for name in list(self.watched) if names is None else names:
                w = self.watched.get(name)
                if w is not None:
                    w.look()
                    out[name] = [w.path, w.sha] + ([w.loaded] if names is None else [])
            if names is None:
                self._told.update(out)
        return out

    # ------------------------------------------------------------ a cell
    def begin_cell(self, field: Optional[dict]) -> Optional[dict]:
        """Before the cell: take in shipped modules, reload the agreed ones; error data if one fails (the cell does not run)."""
        self.shipped_now, self.reloaded = [], []
        self.on = field is not None
        if field is None:
            return None
        problem = self._load_ipython()
        if problem is not None:
            return {"type": "ImportError", "message": problem, "traceback": problem + "\n"}
        self.scan()
        self._ship(field.get("ship") or {})
        for name in self._in_import_order(field.get("apply") or {}):
            error = self._reload_one(name, field["apply"][name])
            if error is not None:
                return error
        return None

    def done_fields(self) -> dict:
        """What the kernel hears in DONE: new modules (autoreload on or off: their versions then are the baseline of a later
        edit), and while on, the modules reloaded and shipped and the files changed that it did not name."""
        self.scan()
        fields: dict = {}
        with self._lock:
            new = {n: [w.path, w.loaded] for n, w in self.watched.items() if n not in self._told}
            self._told.update(new)
        if new:
            fields["reload_new"] = new
        if not self.on:
            return fields
        with self._lock:
            pending = []
            for name, w in self.watched.items():
                w.look()
                if w.sha != w.loaded:
                    pending.append(name)
        if pending:
            fields["reload_pending"] = pending
        if self.reloaded:
            fields["reloaded"] = self.reloaded
        if self.shipped_now:
            fields["reload_shipped"] = self.shipped_now
        return fields

    # ------------------------------------------------------------ the reload
    def _load_ipython(self) -> Optional[str]:
        """IPython's autoreload, once; why it cannot be used on this rank (an unsupported IPython), or None."""
        if self._ipython is not None:
            return None
        import IPython

        problem = R.ipython_problem(IPython.__version__)
        if problem is not None:
            return problem
        from IPython.extensions import autoreload

        self._ipython = autoreload
        try:
            from IPython.extensions.deduperreload.deduperreload import DeduperReloader  # IPython 9: partial reloads

            self._deduper = DeduperReloader()
            self._deduper.source_by_modname = self.sources  # what was loaded, not the file now: an edit saved before this is one too
        except ImportError:
            self._deduper = None
        sys.meta_path.append(self.finder)
        return None

    def _ship(self, ship: Dict[str, List[str]]) -> None:
        """Modules the kernel sent by value (name -> [version, source, the kernel's path]): kept for the ranks that cannot import them."""
        for name, (sha, source, origin) in ship.items():
            w = self.watched.get(name)
            if w is not None and w.path != SHIPPED:
                continue  # this rank imported it from a file of its own: its version is checked like any other
            if w is None and name not in self.finder.sources and (name in sys.modules or _importable(name)):
                continue
            if name not in self.finder.sources:
                self.shipped_now.append(name)
            self.finder.sources[name] = (source, origin)
            if w is not None:
                w.sha = sha  # the new version waits in the finder; apply reloads it

    def _in_import_order(self, apply: Dict[str, str]) -> List[str]:
        """The modules to reload, in the order they were imported (a module's dependencies before it, as IPython does)."""
        return [name for name in sys.modules if name in apply and name in self.watched]

    def _reload_one(self, name: str, sha: str) -> Optional[dict]:
        w, module = self.watched[name], sys.modules[name]
        with self._lock:
            w.look()
        if w.sha != sha:
            text = f"{w.path} changed again while the ranks reloaded it (version {R.short(w.sha)}, the ranks agreed on {R.short(sha)}); run the cell again"
            return {"type": "RuntimeError", "message": text, "traceback": text + "\n"}
        sources = self._deduper.source_by_modname if self._deduper is not None else {}
        before = sources.get(name)
        try:
            deduped = w.path != SHIPPED and self._deduper is not None and self._deduper.maybe_reload_module(module)
            if not deduped:
                self._ipython.superreload(module, _reload, self._old_objects)
        except BaseException as e:
            log.debug("reloading %s failed", name, exc_info=True)
            if before is not None:  # the deduper took the new source as loaded: the next try must see the change again
                sources[name] = before
            text = f"autoreload: reloading {name} ({w.path}) failed; the cell did not run, the rank keeps its state:\n"
            return error_data(e, text + "".join(traceback.format_exception_only(type(e), e)))
        w.loaded = sha
        self.reloaded.append(name)
        return None


def _importable(name: str) -> bool:
    """Whether this rank finds the module as a file of its own (a real finder, not the shipped one)."""
    try:
        parent = name.rpartition(".")[0]
        path = getattr(sys.modules.get(parent), "__path__", None) if parent else None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin not in (None, "built-in")


RELOADER = Reloader()
