"""``%ddp autoreload`` in the kernel: which modules the ranks run, whether a file changed, and the ranks' agreement on it.

The ranks tell the kernel the user modules they import (DONE's ``reload_new``: name,
file, the version they loaded; procs/rank_reload.py), with autoreload off too, so that
turning it on after the import still sees the edit saved meanwhile; a kept pool this
kernel attached is asked for all of them at its first cell. Before each cell with autoreload on the kernel
``stat``s those files (and the modules under the notebook's directory it imported
itself): the warm path, nothing read, nothing asked. Only when a file changed does it
read and compile it (a syntax error stops the cell here, once, naming the file and
line), then ask every rank for its version of the modules concerned (VERSIONS, one
round trip). One rank whose file differs, and the cell is refused before it runs,
naming the file, the rank and its node; otherwise the RUN tells every rank to reload
them (``apply``). A module the kernel imported from under the notebook's directory
travels with the RUN by value (``ship``: its source) for the ranks that cannot import
it, and is reloaded there the same way.
"""
from __future__ import annotations

import ast
import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Set, Tuple

from ..errors import UsageError
from ..logs import log
from ..wire import protocol as P
from ..wire import reload as R
from ..wire.execution import syntax_error_text
from ..words import ranks_phrase

if TYPE_CHECKING:
    from .pool import Pool
    from .ranks import Listener

VERSIONS_TIMEOUT_S = 10.0
SHIPPED = "<shipped>"  # procs/rank_reload.py's path of a module it got by value
OFF_HINT = "%ddp autoreload off runs cells without reloading"
FOLLOWS = "the kernel's %autoreload 2 is on: the ranks reload edited modules before each %%ddp cell too (%ddp autoreload off opts out)"


@dataclass
class FileVersion:
    """A file as the kernel last read it: its stat then, its version, its text (for what changed in it)."""

    key: Optional[R.StatKey]
    sha: str
    source: Optional[str]


@dataclass
class Autoreload:
    """The session's autoreload: the user's setting, the files the ranks run, and what the last cell reloaded."""

    setting: Optional[bool] = None  # %ddp autoreload (on) / off; None: follow the kernel's %autoreload 2
    kernel_on: bool = False  # the kernel's own autoreload, as the last cell saw it
    followed: bool = False  # the one-line notice was shown
    generation: Optional[Tuple[int, int]] = None  # the pool (id, generation) the table is about
    files: Dict[str, FileVersion] = field(default_factory=dict)  # the kernel's view of every file the ranks run
    paths: Dict[str, Set[str]] = field(default_factory=dict)  # module -> the files the ranks run it from
    reference: Dict[str, str] = field(default_factory=dict)  # module -> the file that is "the notebook's version"
    loaded: Dict[str, str] = field(default_factory=dict)  # module -> the version the ranks run
    pending: Set[str] = field(default_factory=set)  # modules a rank saw change that the kernel did not (checked next cell)
    notebook: Dict[str, str] = field(default_factory=dict)  # modules the kernel imported from under the notebook's directory
    offered: Dict[str, str] = field(default_factory=dict)  # module -> the version shipped by value
    reloaded: Tuple[str, ...] = ()  # the last cell's
    shipped: Tuple[str, ...] = ()  # modules some rank got by value (this pool)
    _adopted: Optional[int] = None  # the kept pool (id) whose ranks were asked for every module they run
    _seen: int = 0  # len(sys.modules) at the kernel's last scan
    _scanned: Set[str] = field(default_factory=set)  # the modules that scan looked at
    _expect: Dict[str, Set[int]] = field(default_factory=dict)  # this cell's reloads: module -> the ranks that have it
    _was: Dict[str, str] = field(default_factory=dict)  # this cell's reloads: module -> the version the ranks ran before

    @property
    def on(self) -> bool:
        return self.setting if self.setting is not None else self.kernel_on

    def describe(self) -> str:
        """One line for %ddp status and %ddp_env; "" while it was never asked for (what they showed before autoreload existed)."""
        if not self.on:
            return "autoreload: off (%ddp autoreload off)" if self.setting is False else ""
        why = "%ddp autoreload" if self.setting else "following the kernel's %autoreload 2"
        last = ", ".join(self.reloaded) if self.reloaded else "none"
        shipped = f"; shipped by value: {', '.join(self.shipped)}" if self.shipped else ""
        return f"autoreload: on ({why}); reloaded at the last cell: {last}{shipped}"

    def set(self, action: str, setting: Optional[str], ipython_version: str) -> str:
        """%ddp autoreload [on|off]; what it answers."""
        if action != "autoreload":
            raise UsageError(f"%ddp: {setting} goes with autoreload, e.g. %ddp autoreload {setting}")
        if setting not in (None, "on", "off"):
            raise UsageError(f"%ddp autoreload takes on or off, not {setting!r}: %ddp autoreload off")
        problem = R.ipython_problem(ipython_version)
        if setting != "off" and problem:
            raise UsageError(problem.replace("the ranks have", "this kernel has"))
        self.setting = setting != "off"
        return self.describe()

    # ------------------------------------------------------------ before a cell
    def before_cell(self, pool: "Pool", kernel_on: bool, listener: "Listener") -> Optional[dict]:
        """The RUN's ``reload`` field (None: off); raises UsageError (nothing ran) on a syntax error or a rank's other version."""
        self.kernel_on = kernel_on
        self.reloaded = ()
        if not self.on:
            return None
        if self.setting is None and not self.followed:
            self.followed = True
            listener.on_notice(FOLLOWS)
        if self.generation != (id(pool), pool.generation) or not pool.alive:
            self._reset((id(pool), pool.generation))
        if pool.alive and pool.kept is not None and self._adopted != id(pool):
            self._adopt(pool)
        self._scan_kernel()
        changed = self._changed()
        names = sorted({n for n in self.loaded if self._uses(n) & changed.keys()} | (self.pending & self.loaded.keys()))
        self._check_syntax(changed, names)
        apply: Dict[str, str] = {}
        if names and pool.alive:
            apply = self._agree(pool, names, changed)
        self._notice_inits(changed, apply, listener)
        self.files.update(changed)
        self.pending -= set(names)
        ship = {n: [self.files[p].sha, self.files[p].source or "", p] for n, p in self.notebook.items()
                if p in self.files and self.files[p].source is not None and self.offered.get(n) != self.files[p].sha}
        self.offered.update({n: v[0] for n, v in ship.items()})
        self._was = {name: self.loaded.get(name, "") for name in apply}
        self.loaded.update(apply)
        return {"apply": apply, "ship": ship}

    def _reset(self, generation: Tuple[int, int]) -> None:
        """A new pool: its ranks have imported nothing yet."""
        self.generation = generation
        self.files, self.paths, self.reference, self.loaded = {}, {}, {}, {}
        self.pending, self.offered, self.shipped, self.notebook, self._seen, self._scanned = set(), {}, (), {}, 0, set()

    def _adopt(self, pool: "Pool") -> None:
        """A kept pool (this kernel may have attached it): its ranks may have told the kernel before this one which modules
        they run; ask them all once, with the version each runs (an edit saved since is reloaded before this cell)."""
        self._adopted = id(pool)
        replies = pool.ask(P.VERSIONS, VERSIONS_TIMEOUT_S, fields={"names": None})
        if len(replies) < pool.nproc:
            log.warning("autoreload: %d of %d ranks said which modules they run", len(replies), pool.nproc)
        self._learn({name: [got[0], got[-1]] for _, msg in sorted(replies.items()) for name, got in (msg.get("modules") or {}).items()})
        self.pending.update(name for msg in replies.values() for name, got in (msg.get("modules") or {}).items() if got[1] != got[-1])

    def _learn(self, new: Dict[str, List[str]]) -> None:
        """Modules a rank runs (name -> [file, the version it loaded]): watched from that version on."""
        for name, (path, sha) in new.items():
            self.paths.setdefault(name, set()).add(path)
            if path != SHIPPED:
                self.reference.setdefault(name, path)
            self.loaded.setdefault(name, sha)
            self._track(path, sha)

    def _scan_kernel(self) -> None:
        """Modules the kernel imported from under the notebook's directory: what a rank that cannot import them gets by value."""
        if len(sys.modules) == self._seen:
            return
        here = os.path.realpath(os.getcwd()) + os.sep
        for name in sys.modules.keys() - self._scanned:  # only the modules imported since: the kernel imports some at every cell
            self._scanned.add(name)
            path = R.user_file(sys.modules.get(name))
            if path is not None and path.startswith(here):
                self.notebook[name] = path
                self.reference[name] = path
                self._track(path, None)
        self._seen = len(sys.modules)

    def _track(self, path: str, sha: Optional[str]) -> None:
        """Start watching a file; ``sha``: the version a rank loaded (a file edited since then shows as changed)."""
        if path in self.files or path == SHIPPED:
            return
        data, key = R.read(path)
        if data is None:
            return  # not on this machine: the ranks' own look at it (pending) still counts
        now = R.digest(data)
        if sha is not None and sha != now:
            self.files[path] = FileVersion(None, sha, None)  # changed since the rank loaded it: the next cell sees it change
        else:
            self.files[path] = FileVersion(key, now, data.decode("utf-8", "replace"))

    def _changed(self) -> Dict[str, FileVersion]:
        """The watched files whose content changed since the ranks' version (a stat each; a read only where it changed)."""
        changed = {}
        for path, old in self.files.items():
            key = R.stat_key(path)
            if key == old.key:
                continue
            data, key = R.read(path)
            if data is None:
                continue
            sha = R.digest(data)
            if sha == old.sha:
                old.key, old.source = key, old.source or data.decode("utf-8", "replace")
                continue
            changed[path] = FileVersion(key, sha, data.decode("utf-8", "replace"))
        return changed

    def _uses(self, name: str) -> Set[str]:
        """The files a module is run from: the ranks' and the notebook's own."""
        ref = self.reference.get(name)
        return self.paths.get(name, set()) | ({ref} if ref else set())

    def _check_syntax(self, changed: Dict[str, FileVersion], names: Iterable[str]) -> None:
        """A changed file that does not compile: one error, here, before any rank reloads it."""
        used = {p for n in names for p in self._uses(n)}
        for path, version in changed.items():
            if path not in used:
                continue
            try:
                compile(version.source or "", path, "exec", dont_inherit=True)
            except SyntaxError as e:
                raise UsageError(
                    f"autoreload: SyntaxError in {path}, line {e.lineno}; nothing ran, every rank keeps its state and the version it has:\n"
                    + syntax_error_text(e) + f"\nFix the file and run the cell again ({OFF_HINT})."
                ) from None

    def _agree(self, pool: "Pool", names: List[str], changed: Dict[str, FileVersion]) -> Dict[str, str]:
        """Every rank's version of these modules against the notebook's; the ones to reload, or UsageError naming who differs."""
        replies = pool.ask(P.VERSIONS, VERSIONS_TIMEOUT_S, fields={"names": names})
        silent = [r for r in range(pool.nproc) if r not in replies]
        if silent:
            raise UsageError(f"autoreload: {ranks_phrase(silent)} did not say which version of {', '.join(names)} they have within "
                             f"{VERSIONS_TIMEOUT_S:.0f} s; nothing ran. Run the cell again ({OFF_HINT}).")
        apply, problems = {}, []
        self._expect = {}
        for name in names:
            want = self._want(name, changed, replies)
            if want is None:
                continue
            wrong: Dict[Tuple[str, str], List[int]] = {}
            for rank, msg in sorted(replies.items()):
                got = (msg.get("modules") or {}).get(name)
                if got is not None and got[0] != SHIPPED and got[1] != want[1]:
                    wrong.setdefault((got[0], got[1]), []).append(rank)
            if wrong:
                problems.append(_mismatch_text(name, want, wrong, pool))
            elif want[1] != self.loaded.get(name):
                apply[name] = want[1]
                self._expect[name] = {r for r, msg in replies.items() if name in (msg.get("modules") or {})}
        if problems:
            raise UsageError("autoreload: the ranks do not all have the notebook's version of a module; nothing ran, every rank "
                             "keeps its state.\n" + "\n".join(problems) + "\nMake the file the same for every rank (a node with a stale "
                             f"copy, a file still being written, a rank's own sys.path entry), then run the cell again; {OFF_HINT}.")
        return apply

    def _want(self, name: str, changed: Dict[str, FileVersion], replies: Dict[int, dict]) -> Optional[Tuple[str, str]]:
        """The notebook's version of a module: (file, version) of its reference file as read now, else the lowest rank's."""
        ref = self.reference.get(name)
        if ref is not None and (ref in changed or ref in self.files):
            return ref, (changed.get(ref) or self.files[ref]).sha
        for _, msg in sorted(replies.items()):
            got = (msg.get("modules") or {}).get(name)
            if got is not None and got[0] != SHIPPED:
                return got[0], got[1]
        return None

    def _notice_inits(self, changed: Dict[str, FileVersion], apply: Dict[str, str], listener: "Listener") -> None:
        """A class whose ``__init__`` changed: its live instances keep what the old one made; said once, here."""
        for name in apply:
            path = self.reference.get(name) or ""
            old = self.files.get(path)
            if path not in changed or old is None or old.source is None:
                continue
            for cls in init_changes(old.source, changed[path].source or ""):
                listener.on_notice(
                    f"autoreload: {name}.{cls}.__init__ changed: objects made before keep what their old __init__ made (a model: its "
                    f"parameters and buffers, the same on every rank); rebuild the model and its DDP wrapper (net = DDP({name}.{cls}())) to get the new ones"
                )

    # ------------------------------------------------------------ after a cell
    def after_cell(self, pool: "Pool", listener: "Listener") -> None:
        """Take in what the ranks said in DONE: new modules and their files (autoreload off too: the baseline of a later
        edit), and while on, changes the kernel did not see, what was reloaded or shipped."""
        if self.generation != (id(pool), pool.generation):  # the pool (re)started for this cell
            self._reset((id(pool), pool.generation))
        reloaded: Dict[str, List[int]] = {}
        shipped: Dict[str, List[int]] = {}
        for rank in range(pool.nproc):
            msg = pool.done_message(rank)
            if not msg or "reload_new" not in msg and "reloaded" not in msg and "reload_pending" not in msg and "reload_shipped" not in msg:
                continue
            self._learn(msg.get("reload_new") or {})
            if not self.on:
                continue
            self.pending.update(msg.get("reload_pending") or ())
            for name in msg.get("reloaded") or ():
                reloaded.setdefault(name, []).append(rank)
            for name in msg.get("reload_shipped") or ():
                shipped.setdefault(name, []).append(rank)
        if not self.on:
            return
        self.reloaded = tuple(sorted(reloaded))
        if reloaded:
            listener.on_notice(self._reloaded_text(reloaded, pool.nproc))
        self._failed_reloads(pool)
        if shipped:
            self.shipped = tuple(sorted(set(self.shipped) | set(shipped)))
            for name, ranks in sorted(shipped.items()):
                listener.on_notice(f"autoreload: {name} ({self.notebook.get(name, '?')}) is not importable on {ranks_phrase(ranks)}: "
                                   "shipped by value from the notebook's machine; edits to it reach them the same way")
        log.debug("autoreload after the cell: %d files watched, reloaded %s", len(self.files), self.reloaded)


    def _reloaded_text(self, reloaded: Dict[str, List[int]], nproc: int) -> str:
        """The cell's one line: ``autoreload: reloaded model (model.py) on 4 ranks`` (IPython's own autoreload logs as much)."""
        here = os.path.realpath(os.getcwd()) + os.sep
        groups: Dict[Tuple[int, ...], List[str]] = {}
        for name, ranks in sorted(reloaded.items()):
            path = self.reference.get(name) or self.notebook.get(name) or "?"
            groups.setdefault(tuple(sorted(ranks)), []).append(f"{name} ({path[len(here):] if path.startswith(here) else path})")
        return "autoreload: reloaded " + "; ".join(
            f"{', '.join(names)} on {ranks_phrase(list(ranks)) if len(ranks) < nproc else f'{nproc} rank' + ('s' if nproc > 1 else '')}"
            for ranks, names in groups.items())

    def _failed_reloads(self, pool: "Pool") -> None:
        """A module some rank did not reload (its reload raised, the cell was stopped): the ranks still run the old version,
        so it is reloaded again at the next cell (its rank reports it pending); until then it stays an error, not old code."""
        for name, ranks in self._expect.items():
            if any(name not in ((pool.done_message(r) or {}).get("reloaded") or ()) for r in ranks):
                self.loaded[name] = self._was.get(name, "")
        self._expect, self._was = {}, {}


def kernel_follows(shell: object) -> bool:
    """Whether the kernel's own autoreload reloads every module (``%autoreload 2`` or 3): the ranks follow it."""
    magics = getattr(getattr(shell, "magics_manager", None), "registry", {}).get("AutoreloadMagics")
    reloader = getattr(magics, "_reloader", None)
    return bool(reloader is not None and reloader.enabled and reloader.check_all)


def _mismatch_text(name: str, want: Tuple[str, str], wrong: Dict[Tuple[str, str], List[int]], pool: "Pool") -> str:
    lines = [f"  {name}: the notebook's {want[0]} (version {R.short(want[1])})"]
    for (path, sha), ranks in sorted(wrong.items(), key=lambda kv: kv[1][0]):
        nodes = sorted({pool.ranks[r].node_name or pool.ranks[r].host or "?" for r in ranks if r in pool.ranks})
        lines.append(f"    {ranks_phrase(ranks)} (node {', '.join(nodes)}): {path} (version {R.short(sha)})")
    return "\n".join(lines)


def init_changes(old: str, new: str) -> List[str]:
    """The classes (dotted, nested ones too) whose ``__init__`` differs between two versions of a module's source."""
    def inits(source: str) -> Dict[str, str]:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            return {}
        found: Dict[str, str] = {}

        def walk(body: List[ast.stmt], prefix: str) -> None:
            for node in body:
                if isinstance(node, ast.ClassDef):
                    for item in node.body:
                        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                            found[prefix + node.name] = ast.dump(item)
                    walk(node.body, prefix + node.name + ".")
        walk(tree.body, "")
        return found

    before, after = inits(old), inits(new)
    return sorted(c for c in after if c in before and before[c] != after[c])
