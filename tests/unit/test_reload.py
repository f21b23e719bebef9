"""Autoreload's pieces without processes: the IPython versions supported, which modules are the user's, what changed in
a class's __init__, %ddp autoreload's answers, and a rank's reloader on real files (reload, ship by value, refuse)."""
from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

import IPython
import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from ddp_magic.errors import UsageError
from ddp_magic.kernel.reload import Autoreload, init_changes, kernel_follows
from ddp_magic.procs.rank_reload import SHIPPED, Reloader
from ddp_magic.wire import reload as R

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("version, ok", [
    ("8.0.0", True), ("8.16.1", True), ("8.17.0", False), ("8.17.1", False), ("8.17.2", True), ("8.18.1", True),
    ("9.0.0", False), ("9.0.1", True), ("9.18.1", True), ("7.34.0", False), ("9.1.0rc1", True),
])
def test_the_ipython_versions_whose_autoreload_works(version, ok):
    problem = R.ipython_problem(version)
    assert (problem is None) == ok, problem
    if not ok:
        assert problem == (f"autoreload on the ranks needs ipython>=8.0,!=8.17.0,!=8.17.1,!=9.0.0 (8.17.0, 8.17.1 and 9.0.0 have a broken "
                           f"autoreload: ipython#14230, #14808); the ranks have IPython {version}. Run pip install -U ipython, or %ddp autoreload off")


def test_pyproject_declares_the_same_range_and_the_installed_ipython_is_in_it():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (ipython,) = [Requirement(d) for d in deps if d.startswith("ipython")]
    assert ipython.specifier == Requirement(R.IPYTHON_REQUIREMENT).specifier
    for broken in R.BROKEN_IPYTHON:
        assert Version(broken) not in ipython.specifier
    assert Version(IPython.__version__) in ipython.specifier and R.ipython_problem(IPython.__version__) is None


def test_only_the_users_own_modules_are_watched(tmp_path, monkeypatch):
    (tmp_path / "mine.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import mine  # noqa: F401  (the test's own module)

    assert R.user_file(sys.modules["mine"]) == os.path.realpath(tmp_path / "mine.py")
    for name in ("os", "json", "pytest", "ddp_magic.wire.reload", "IPython", "__main__"):
        assert R.user_file(sys.modules[name]) is None, name
    sys.modules.pop("mine")


def test_a_changed_init_is_found_in_nested_classes_too():
    old = "class A:\n    def __init__(self):\n        self.x = 1\n    class B:\n        def __init__(self): pass\nclass C:\n    pass\n"
    new = old.replace("self.x = 1", "self.x = 1\n        self.y = 2").replace("def __init__(self): pass", "def __init__(self, k): pass")
    assert init_changes(old, new) == ["A", "A.B"]
    assert init_changes(old, old) == [] and init_changes(old, "def (") == []


def test_the_setting_and_what_it_says():
    a = Autoreload()
    assert a.describe() == ""  # never asked for: %ddp status and %ddp_env say nothing of it
    a.kernel_on = True
    assert a.describe() == "autoreload: on (following the kernel's %autoreload 2); reloaded at the last cell: none"
    assert a.set("autoreload", "off", IPython.__version__) == "autoreload: off (%ddp autoreload off)"
    assert a.set("autoreload", None, IPython.__version__) == "autoreload: on (%ddp autoreload); reloaded at the last cell: none"
    with pytest.raises(UsageError, match=r"^%ddp: off goes with autoreload, e.g. %ddp autoreload off$"):
        a.set("status", "off", IPython.__version__)
    with pytest.raises(UsageError, match="this kernel has IPython 8.17.0"):
        a.set("autoreload", "on", "8.17.0")
    assert a.set("autoreload", "off", "8.17.0").startswith("autoreload: off")  # off always works


def test_kernel_follows_only_autoreload_2_or_3():
    class Reloader:
        enabled, check_all = True, True

    class Shell:
        class magics_manager:
            registry = {"AutoreloadMagics": type("M", (), {"_reloader": Reloader()})()}

    assert kernel_follows(Shell()) and not kernel_follows(object())
    Reloader.check_all = False  # %autoreload 1: only the %aimport-ed modules
    assert not kernel_follows(Shell())


def test_a_ranks_reloader_reloads_in_place_and_takes_shipped_modules(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "rk_mod.py"
    path.write_text("def f():\n    return 1\nclass K:\n    def v(self):\n        return 1\n")
    import rk_mod  # noqa: F401

    r = Reloader()
    assert r.begin_cell({"apply": {}, "ship": {}}) is None
    obj, f = sys.modules["rk_mod"].K(), sys.modules["rk_mod"].f
    fields = r.done_fields()
    sha1 = R.digest(path.read_bytes())
    assert fields["reload_new"]["rk_mod"] == [os.path.realpath(path), sha1] and "reload_pending" not in fields
    path.write_text("def f():\n    return 2\nclass K:\n    def v(self):\n        return 2\n")
    os.utime(path, ns=(path.stat().st_mtime_ns + 10**6,) * 2)
    sha2 = R.digest(path.read_bytes())
    assert r.done_fields() == {"reload_pending": ["rk_mod"]}  # seen, not reloaded: the kernel decides
    assert r.versions(["rk_mod", "absent"]) == {"rk_mod": [os.path.realpath(path), sha2]}
    error = r.begin_cell({"apply": {"rk_mod": sha1}})  # a version other than the file's: refused, nothing reloaded
    assert error is not None and "changed again while the ranks reloaded it" in error["message"] and f() == 1
    moved = path.with_suffix(".moved")
    path.rename(moved)  # a file that is gone for a moment (an editor's save, a rename) is no change
    assert r.done_fields() == {"reload_pending": ["rk_mod"]} and r.versions(["rk_mod"]) == {"rk_mod": [os.path.realpath(path), sha2]}
    moved.rename(path)
    assert r.begin_cell({"apply": {"rk_mod": sha2}}) is None
    assert (f(), obj.v(), isinstance(obj, sys.modules["rk_mod"].K)) == (2, 2, True)
    assert r.done_fields() == {"reloaded": ["rk_mod"]}
    # a module this rank cannot import comes by value, and a later version reloads the same way
    assert r.begin_cell({"apply": {}, "ship": {"rk_shipped": ["s1", "def g():\n    return 'a'\n", "/elsewhere/rk_shipped.py"]}}) is None
    import rk_shipped  # noqa: F401

    g = sys.modules["rk_shipped"].g
    assert g() == "a" and r.done_fields()["reload_shipped"] == ["rk_shipped"]
    assert r.versions(["rk_shipped"]) == {"rk_shipped": [SHIPPED, R.digest(b"def g():\n    return 'a'\n")]}
    source = "def g():\n    return 'b'\n"
    assert r.begin_cell({"apply": {"rk_shipped": R.digest(source.encode())}, "ship": {"rk_shipped": [R.digest(source.encode()), source, "/x"]}}) is None
    assert g() == "b"
    sys.meta_path.remove(r.finder)
    for name in ("rk_mod", "rk_shipped"):
        sys.modules.pop(name)


def test_a_reload_that_raises_keeps_the_old_code(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "rk_bad.py"
    path.write_text("def f():\n    return 1\n")
    import rk_bad  # noqa: F401

    r = Reloader()
    r.begin_cell({})
    r.done_fields()
    path.write_text("def f():\n    return 2\nundefined_name\n")
    os.utime(path, ns=(path.stat().st_mtime_ns + 10**6,) * 2)
    error = r.begin_cell({"apply": {"rk_bad": R.digest(path.read_bytes())}})
    assert error is not None and error["type"] == "NameError", error
    assert error["message"] == "name 'undefined_name' is not defined"
    assert error["traceback"].startswith(f"autoreload: reloading rk_bad ({os.path.realpath(path)}) failed; the cell did not run, the rank keeps its state:\n")
    assert sys.modules["rk_bad"].f() == 1
    again = r.begin_cell({"apply": {"rk_bad": R.digest(path.read_bytes())}})  # tried again: the same error, not the old code
    assert again is not None and again["message"] == error["message"] and sys.modules["rk_bad"].f() == 1
    sys.meta_path.remove(r.finder)
    sys.modules.pop("rk_bad")


def test_a_rank_with_an_unsupported_ipython_fails_the_cell_saying_so(monkeypatch):
    monkeypatch.setattr(IPython, "__version__", "8.17.0")
    error = Reloader().begin_cell({"apply": {}, "ship": {}})
    assert error is not None and error["message"] == R.ipython_problem("8.17.0") and error["type"] == "ImportError"
    assert Reloader().begin_cell(None) is None  # autoreload off: nothing asked of IPython


def test_a_module_imported_while_off_is_reloaded_from_the_version_it_loaded(tmp_path, monkeypatch):
    """The user's order: import (autoreload off), edit, turn it on: the rank's version is the one in memory, and IPython's
    partial reload diffs the file against the source it loaded (not the file as read when autoreload came on)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "rk_late.py"
    path.write_text("def f():\n    return 1\n")
    import rk_late  # noqa: F401

    r = Reloader()
    assert r.begin_cell(None) is None  # a cell with autoreload off
    sha1 = R.digest(path.read_bytes())
    fields = r.done_fields()
    assert list(fields) == ["reload_new"] and fields["reload_new"]["rk_late"] == [os.path.realpath(path), sha1]  # told while off: the baseline
    assert r.done_fields() == {}  # once
    path.write_text("def f():\n    return 2\n")
    os.utime(path, ns=(path.stat().st_mtime_ns + 10**6,) * 2)
    sha2 = R.digest(path.read_bytes())
    assert r.versions(None)["rk_late"] == [os.path.realpath(path), sha2, sha1]  # all it runs: the file's version and the loaded one
    assert r.begin_cell({"apply": {"rk_late": sha2}, "ship": {}}) is None  # autoreload on now: IPython's reloader loads here
    assert sys.modules["rk_late"].f() == 2 and r.done_fields() == {"reloaded": ["rk_late"]}
    sys.meta_path.remove(r.finder)
    sys.modules.pop("rk_late")


def test_the_reloaded_line_names_modules_files_and_ranks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = Autoreload()
    here = os.path.realpath(tmp_path)
    a.reference = {"model": f"{here}/model.py", "util": f"{here}/lib/util.py", "shared": "/opt/team/shared.py"}
    assert a._reloaded_text({"model": [0, 1, 2, 3]}, 4) == "autoreload: reloaded model (model.py) on 4 ranks"
    assert a._reloaded_text({"model": [0]}, 1) == "autoreload: reloaded model (model.py) on 1 rank"
    assert (a._reloaded_text({"util": [1, 0], "model": [0, 1], "shared": [1]}, 2)
            == "autoreload: reloaded model (model.py), util (lib/util.py) on 2 ranks; shared (/opt/team/shared.py) on rank 1")


def test_real_path_is_os_realpath(tmp_path, monkeypatch):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "m.py").write_text("")
    (tmp_path / "linked").symlink_to(tmp_path / "real")  # a folder that is a link
    (tmp_path / "real" / "l.py").symlink_to(tmp_path / "real" / "m.py")  # a file that is a link
    monkeypatch.chdir(tmp_path)
    for path in (tmp_path / "real" / "m.py", tmp_path / "linked" / "m.py", tmp_path / "linked" / "l.py", Path("linked/m.py")):
        assert R.real_path(str(path)) == os.path.realpath(path), path
