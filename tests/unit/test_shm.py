"""The pool's files in /dev/shm (wire/shm.py): names by pool, mode 0600, removal by prefix, orphans of dead kernels."""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from ddp_magic.wire import shm, transfer


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_prefix_names_the_pid_namespace_the_kernel_and_the_pool():
    prefix = shm.pool_prefix("abcd1234")
    assert prefix == f"ddp_magic-{shm.pid_namespace()}-{os.getpid()}-abcd1234-"
    assert shm.owner(prefix + "store-0123") == (shm.pid_namespace(), os.getpid())
    assert shm.owner(prefix + "r1-00ff") == (shm.pid_namespace(), os.getpid())
    assert shm.owner("ddp_magic-store-03cae83450e0-13534") is None  # the old names: not a pool's prefix
    assert shm.owner("someone-else") is None


def test_create_private_is_0600_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        path = tmp_path / "store"
        shm.create_private(str(path))
        assert _mode(path) == 0o600
        path.write_bytes(b"keys")
        shm.create_private(str(path))  # another rank: the file stays as it is
        assert path.read_bytes() == b"keys"
        shm.create_private(str(path), fresh=True)  # a new start on the same name: empty again
        assert path.read_bytes() == b"" and _mode(path) == 0o600
    finally:
        os.umask(old)


def test_torch_file_store_keeps_the_private_mode(tmp_path):
    torch_dist = pytest.importorskip("torch.distributed")
    path = str(tmp_path / "store")
    shm.create_private(path, fresh=True)
    store = torch_dist.FileStore(path, 1)
    store.set("k", "v")
    assert store.get("k") == b"v"
    assert _mode(path) == 0o600


def test_remove_pool_files_takes_only_that_pool(tmp_path):
    mine, other = shm.pool_prefix("aaaa"), shm.pool_prefix("bbbb")
    for name in (mine + "store-1", mine + "store-1.1", mine + "r0-ff", other + "store-2", "unrelated"):
        (tmp_path / name).write_text("")
    assert [os.path.basename(p) for p in shm.pool_files(mine, str(tmp_path))] == [mine + "r0-ff", mine + "store-1", mine + "store-1.1"]
    removed = shm.remove_pool_files(mine, str(tmp_path))
    assert len(removed) == 3
    assert sorted(os.listdir(tmp_path)) == sorted([other + "store-2", "unrelated"])
    assert shm.remove_pool_files(mine, str(tmp_path)) == []  # twice: nothing left, no error
    with pytest.raises(ValueError):
        shm.pool_files("../etc/", str(tmp_path))


def test_orphans_of_a_dead_kernel_go_and_a_live_ones_stay(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    orphan = tmp_path / (shm.pool_prefix("cccc", pid=int(dead)) + "store-1")
    live = tmp_path / (shm.pool_prefix("dddd") + "store-1")
    elsewhere = tmp_path / f"ddp_magic-{shm.pid_namespace() + 1}-{dead}-eeee-store-1"  # another pid namespace: not ours to judge
    for f in (orphan, live, elsewhere):
        f.write_text("")
    assert shm.remove_orphans(str(tmp_path)) == [str(orphan)]
    assert live.exists() and elsewhere.exists() and not orphan.exists()


def test_a_large_result_file_is_private_and_named_by_the_pool(tmp_path, monkeypatch):
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(transfer, "SHM_DIR", str(tmp_path))
    prefix = shm.pool_prefix("ffff")
    monkeypatch.setenv(shm.ENV, prefix)
    packed = transfer.pack(torch.ones(1 << 19), shm_dir=str(tmp_path), prefix=shm.result_prefix(2))
    path = packed["shm"]
    assert os.path.basename(path).startswith(prefix + "r2-")
    assert _mode(path) == 0o600
    assert np.asarray(transfer.unpack(packed)).sum() == 1 << 19
    assert not os.path.exists(path)  # mapped, then unlinked at once
