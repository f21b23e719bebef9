"""Which notebook names a cell needs, and who owns each name.

The rule (also in the README): a name assigned by a ``%%ddp`` cell lives on the
workers from then on; any other name a cell uses is taken fresh from the
notebook each time, pickled with cloudpickle (by value for what the notebook
defined, by reference for importable modules and their contents). The newest
definition wins (``Definitions``): a name an ordinary cell defines after the
workers got theirs is sent again and replaces the workers' copy.
"""
from __future__ import annotations

import builtins
import symtable
import types
from typing import Callable, Dict, Iterable, Optional, Set

# Names IPython puts in every user namespace; never shipped.
IPYTHON_NAMES = frozenset({"In", "Out", "get_ipython", "exit", "quit", "_ih", "_oh", "_dh", "_", "__", "___", "_i", "_ii", "_iii"})
BUILTIN_NAMES = frozenset(dir(builtins))


def _nested(table: symtable.SymbolTable) -> Iterable[symtable.SymbolTable]:
    for child in table.get_children():
        yield child
        yield from _nested(child)


def _global_names(source: str, filename: str, at_top: Callable[[symtable.Symbol], bool], nested: Callable[[symtable.Symbol], bool]) -> Set[str]:
    """Names of the cell's module scope that pass at_top, plus those of nested scopes that pass nested."""
    top = symtable.symtable(source, filename, "exec")
    names = {s.get_name() for s in top.get_symbols() if at_top(s)}
    for table in _nested(top):
        names.update(s.get_name() for s in table.get_symbols() if nested(s))
    return names


def used_globals(source: str, filename: str) -> Set[str]:
    """Global names the cell reads anywhere, nested functions and classes included."""
    return _global_names(source, filename, lambda s: s.is_referenced(), lambda s: s.is_referenced() and s.is_global())


def assigned_globals(source: str, filename: str) -> Set[str]:
    """Global names the cell binds (assignments, defs, classes, imports, `global` in functions)."""
    return _global_names(
        source, filename,
        lambda s: s.is_assigned() or s.is_imported() or s.is_namespace(),
        lambda s: s.is_declared_global() and s.is_assigned(),
    )


def names_to_ship(source: str, filename: str, user_ns: Dict[str, object], worker_owned: Set[str]) -> Dict[str, object]:
    """The notebook values this cell needs from the kernel, by the ownership rule."""
    return shippable(used_globals(source, filename) - worker_owned, user_ns)


def shippable(wanted: Iterable[str], user_ns: Dict[str, object]) -> Dict[str, object]:
    """Of ``wanted``, the notebook's own values (not IPython's, builtins', or modules named __main__)."""
    wanted = set(wanted) - IPYTHON_NAMES
    out = {}
    for name in sorted(wanted):
        if name not in user_ns:
            continue
        if name.startswith("__") or (name in BUILTIN_NAMES and user_ns[name] is getattr(builtins, name, None)):
            continue
        value = user_ns[name]
        if isinstance(value, types.ModuleType) and value.__name__ == "__main__":
            continue
        out[name] = value
    return out


def adopt(value: object, ns: Dict[str, object], owned: Set[str], _memo: Optional[Dict[int, object]] = None) -> object:
    """Worker side: make a function or class from the notebook look names up in the worker's globals.

    cloudpickle gives a notebook function a private globals dict holding only the
    notebook values it referenced. On a rank it must see the rank's own names
    too (``dist``, ``model`` defined by an earlier %%ddp cell), as if it had been
    defined there. So its code is rebound to the worker namespace, and the
    notebook values it carried are put there, except names the workers own.
    """
    memo = _memo if _memo is not None else {}
    if id(value) in memo:
        return memo[id(value)]
    if isinstance(value, types.FunctionType) and value.__module__ == "__main__" and value.__globals__ is not ns:
        new = types.FunctionType(value.__code__, ns, value.__name__, value.__defaults__, value.__closure__)
        new.__kwdefaults__ = value.__kwdefaults__
        new.__qualname__ = value.__qualname__
        new.__doc__ = value.__doc__
        new.__annotations__ = dict(getattr(value, "__annotations__", {}) or {})
        new.__dict__.update(value.__dict__)
        memo[id(value)] = new
        for name, carried in list(value.__globals__.items()):
            if name.startswith("__") or name in owned:
                continue
            ns[name] = adopt(carried, ns, owned, memo)
        return new
    if isinstance(value, type) and value.__module__ == "__main__":
        memo[id(value)] = value
        for attr, member in list(vars(value).items()):
            raw = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
            if isinstance(raw, types.FunctionType):
                adopted = adopt(raw, ns, owned, memo)
                if adopted is not raw:
                    setattr(value, attr, type(member)(adopted) if raw is not member else adopted)
        return value
    return value


class Definitions:
    """Where each name was defined last: an ordinary notebook cell or a ``%%ddp`` cell; the newest wins.

    Times are a counter bumped per cell, in the order the kernel ran them (the
    execution count's order, also for a session driven without IPython).
    """

    def __init__(self) -> None:
        self._now = 0
        self.notebook: Dict[str, int] = {}  # name -> when an ordinary cell last defined it
        self.workers: Dict[str, int] = {}  # name -> when the workers' copy was last set (a %%ddp cell, or sent by this rule)
        self.replaced: Set[str] = set()  # names this rule sent: the workers' own code may call them, so they stay watched
        self.noticed = False  # the rule's one-line notice is shown once

    def _tick(self) -> int:
        self._now += 1
        return self._now

    def notebook_cell(self, names: Iterable[str]) -> None:
        now = self._tick()
        self.notebook.update(dict.fromkeys(names, now))

    def stale(self, owned: Set[str]) -> Set[str]:
        """Of the names the workers own (or got from this rule), those an ordinary cell defined since.

        They are sent with the next %%ddp cell, used there or not, so that the workers'
        own functions calling them see the new definition too. A plain notebook value
        (never defined on the workers) is sent only when a cell uses it, as before.
        """
        return {n for n in owned | self.replaced if self.notebook.get(n, -1) > self.workers.get(n, -1)}

    def ddp_cell(self, owned: Iterable[str], sent: Iterable[str]) -> None:
        """A %%ddp cell ran: the workers hold ``owned`` (their own) and ``sent`` (the stale names it carried)."""
        now = self._tick()
        sent = set(sent)
        self.replaced |= sent
        self.workers.update(dict.fromkeys(set(owned) | sent, now))


def by_reference(value: object) -> bool:
    """A module, or a function or class of one: the same object on the workers, so replacing it there is no news."""
    if isinstance(value, types.ModuleType):
        return True
    module = getattr(value, "__module__", None) if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)) else None
    return module is not None and module != "__main__"


def newer_notice(names: Iterable[str]) -> str:
    """The rule, said the first time it applies."""
    shown = ", ".join(sorted(names))
    return (
        f"{shown}: defined in the notebook after the workers' definition; the newest definition wins, "
        "so the notebook's is sent and replaces the workers' copy (said once)"
    )
