"""Which notebook names a cell needs, who owns each name, and how a notebook function is
rebound to a rank's globals."""
from __future__ import annotations

import types

from ddp_magic.wire import namespace


def test_used_and_assigned_globals():
    src = "import numpy as np\nfrom os import path\ndef f(a):\n    return helper(a) + k\nclass C: pass\nx = f(y)\nfor i in range(n): pass\n"
    used = namespace.used_globals(src, "<c>")
    assert {"helper", "k", "y", "n", "f", "range"} <= used
    assert namespace.assigned_globals(src, "<c>") >= {"np", "path", "f", "C", "x", "i"}


def test_global_declared_in_function_counts_as_assigned():
    assert "total" in namespace.assigned_globals("def g():\n    global total\n    total = 1\n", "<c>")


def test_names_to_ship_follows_ownership():
    ns = {"helper": len, "k": 3, "model": object(), "In": [], "print": print}
    ship = namespace.names_to_ship("helper(model) + k\nprint(In)", "<c>", ns, worker_owned={"model"})
    assert ship == {"helper": len, "k": 3}


def test_adopted_function_sees_the_ranks_names_but_not_the_notebooks_owned_ones():
    carried = {"__name__": "__main__", "scale": 2, "model": "notebook's"}
    code = compile("def f(x):\n    return x * scale, model\n", "<nb>", "exec")
    exec(code, carried)
    f = carried["f"]
    assert isinstance(f, types.FunctionType) and f.__module__ == "__main__"
    rank_ns: dict = {"model": "rank's"}
    g = namespace.adopt(f, rank_ns, owned={"model"})
    assert g is not f and g.__globals__ is rank_ns
    assert g(3) == (6, "rank's") and rank_ns["scale"] == 2


def test_newest_definition_wins():
    defs = namespace.Definitions()
    owned = {"run", "model"}
    defs.ddp_cell(owned, ())  # a %%ddp cell defined run and model
    assert defs.stale(owned) == set()
    defs.notebook_cell({"run", "lr"})  # an ordinary cell redefines run (and defines lr)
    assert defs.stale(owned) == {"run"}  # lr never lived on the workers: sent only when used
    owned -= {"run"}
    defs.ddp_cell(owned, {"run"})  # the next %%ddp cell carried it
    assert defs.stale(owned) == set()
    defs.notebook_cell({"run"})  # redefined again: the workers' functions calling it must see it too
    assert defs.stale(owned) == {"run"}
    defs.ddp_cell(owned, {"run"})
    defs.ddp_cell(owned | {"lr"}, ())  # the reverse stays as it was: a %%ddp cell defined lr after the notebook
    assert defs.stale(owned | {"lr"}) == set()
    assert "run" in namespace.newer_notice({"run"}) and "newest definition wins" in namespace.newer_notice({"run"})


def test_importable_values_are_by_reference():
    import os.path

    assert namespace.by_reference(os) and namespace.by_reference(os.path.join) and namespace.by_reference(types.SimpleNamespace)
    ns: dict = {}
    exec("def f(): pass\nclass C: pass\nx = 1", {"__name__": "__main__"}, ns)
    assert not any(namespace.by_reference(ns[n]) for n in ("f", "C", "x"))
