"""The JupyterLab extension as it is built and shipped: versions, wheel contents, `jupyter labextension list`,
the TypeScript unit tests, and what git must ignore.

The extension is built by scripts/setup.sh (scripts/build_labextension.sh) into ddp_magic/labextension;
the wheel carries it as data under share/jupyter/labextensions/ddp-magic.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXT = os.path.join(ROOT, "labextension")
BUILT = os.path.join(ROOT, "ddp_magic", "labextension")
NAME = "ddp-magic"
VENV_BIN = os.path.dirname(sys.executable)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _semver(py_version: str) -> str:
    """The same mapping as labextension/scripts/sync-version.js."""
    m = re.fullmatch(r"(\d+\.\d+\.\d+)(?:\.?(a|b|rc|dev)(\d+))?", py_version)
    assert m, f"cannot map {py_version} to semver"
    if not m.group(2):
        return m.group(1)
    return f"{m.group(1)}-{dict(a='alpha', b='beta', rc='rc', dev='dev')[m.group(2)]}.{m.group(3)}"


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    return env


def _built() -> None:
    if not os.path.exists(os.path.join(BUILT, "package.json")):
        pytest.fail("the extension is not built: run scripts/setup.sh (or scripts/build_labextension.sh)")


def test_versions_have_one_source() -> None:
    from ddp_magic import __version__

    want = _semver(__version__)
    with open(os.path.join(EXT, "package.json")) as f:
        assert json.load(f)["version"] == want, "run `jlpm build:prod` (it copies ddp_magic/_version.py into package.json)"
    with open(os.path.join(EXT, "src", "version.ts")) as f:
        assert f"'{want}'" in f.read()
    _built()
    with open(os.path.join(BUILT, "package.json")) as f:
        built = json.load(f)
    assert built["name"] == NAME and built["version"] == want, "the built extension is stale: run scripts/build_labextension.sh"
    if shutil.which("node"):
        out = subprocess.run(["node", os.path.join(EXT, "scripts", "sync-version.js"), "--check"], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr


def test_semver_mapping() -> None:
    assert _semver("0.1.0") == "0.1.0"
    assert _semver("1.2.3rc1") == "1.2.3-rc.1"
    assert _semver("1.2.3.dev4") == "1.2.3-dev.4"
    assert _semver("2.0.0a2") == "2.0.0-alpha.2"


def test_labextension_paths_for_develop() -> None:
    import ddp_magic

    (entry,) = ddp_magic._jupyter_labextension_paths()
    assert entry["dest"] == NAME
    assert os.path.isdir(os.path.join(os.path.dirname(ddp_magic.__file__), entry["src"]))


@pytest.mark.slow
def test_wheel_ships_the_prebuilt_extension() -> None:
    _built()
    out_dir = tempfile.mkdtemp(prefix="ddp-wheel-")
    try:
        run = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q", "-w", out_dir],
            cwd=ROOT, capture_output=True, text=True, env=_env(), timeout=600,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        (wheel,) = [f for f in os.listdir(out_dir) if f.endswith(".whl")]
        names = zipfile.ZipFile(os.path.join(out_dir, wheel)).namelist()
        data = [n.split(".data/data/", 1)[1] for n in names if ".data/data/" in n]
        prefix = f"share/jupyter/labextensions/{NAME}/"
        assert prefix + "package.json" in data
        assert prefix + "install.json" in data
        assert any(re.fullmatch(re.escape(prefix) + r"static/remoteEntry\.[0-9a-f]+\.js", n) for n in data), data
        assert prefix + "static/style.js" in data
        install = json.loads(zipfile.ZipFile(os.path.join(out_dir, wheel)).read(next(n for n in names if n.endswith(prefix + "install.json"))))
        assert install["packageName"] == "ddp_magic" and install["packageManager"] == "python"
        assert "ddp_magic/ui/labcomm.py" in names
        assert not [n for n in names if n.startswith("ddp_magic/labextension/")], "the bundle ships once, as data"
        assert not [n for n in names if "node_modules" in n or n.endswith(".ts")]
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def test_jupyter_labextension_list_shows_it_enabled() -> None:
    exe = os.path.join(VENV_BIN, "jupyter-labextension")
    if not os.path.exists(exe):
        pytest.skip("jupyterlab is not installed in this environment")
    env = _env()
    env.pop("JUPYTER_PATH", None)
    out = subprocess.run([exe, "list"], capture_output=True, text=True, env=env, timeout=120)
    text = ANSI.sub("", out.stdout + out.stderr)
    line = next((ln.strip() for ln in text.splitlines() if ln.strip().startswith(NAME + " ")), None)
    assert line is not None, text
    from ddp_magic import __version__

    assert re.fullmatch(rf"{NAME} v{re.escape(_semver(__version__))} enabled OK \(python, ddp_magic\)", line), line


@pytest.mark.slow
def test_typescript_unit_tests() -> None:
    """labextension/src/__tests__: kernel messages -> what the status bar, the panel and the commands show."""
    if not shutil.which("node"):
        pytest.skip("node is not installed (the extension's build needs it too)")
    if not os.path.isdir(os.path.join(EXT, "node_modules")):
        pytest.fail("labextension/node_modules is missing: run scripts/setup.sh")
    jlpm = os.path.join(VENV_BIN, "jlpm")
    out = subprocess.run([jlpm if os.path.exists(jlpm) else "jlpm", "test"], cwd=EXT, capture_output=True, text=True, env=_env(), timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-6000:]
    counts = dict(re.findall(r"^ℹ (pass|fail) (\d+)$", text, re.M))
    assert int(counts.get("pass", 0)) >= 25 and counts.get("fail") == "0", text[-3000:]


def test_build_outputs_are_ignored_and_the_lockfile_is_not() -> None:
    if not shutil.which("git") or not os.path.isdir(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout")

    def ignored(path: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT).returncode == 0

    for path in ("ddp_magic/labextension/package.json", "labextension/node_modules/x", "labextension/lib/index.js", "labextension/build-test/x.js"):
        assert ignored(path), path
    for path in ("labextension/yarn.lock", "labextension/package.json", "labextension/src/index.ts", "labextension/.yarnrc.yml", "labextension/src/version.ts"):
        assert not ignored(path), path
    assert os.path.exists(os.path.join(EXT, "yarn.lock"))
