"""Which notebook names a cell needs, and who owns each name.

The rule (also in the README): a name assigned by a ``%%ddp`` cell lives on the
workers from then on; any other name a cell uses is taken fresh from the
notebook each time, pickled with cloudpickle (by value for what the notebook
defined, by reference for importable modules and their contents).
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
    wanted = used_globals(source, filename) - worker_owned - IPYTHON_NAMES
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
