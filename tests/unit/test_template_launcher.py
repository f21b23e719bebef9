"""The template's keys and texts (kernel/templates.py, launchers/forkserver.py), without processes."""
from __future__ import annotations

import pytest

from ddp_magic.kernel import templates
from ddp_magic.kernel.launchers import worker_env
from ddp_magic.kernel.launchers.forkserver import ForkServerLauncher, import_env
from ddp_magic.kernel.pool import Pool


def test_import_env_is_what_torch_reads_at_import() -> None:
    env = {"OMP_NUM_THREADS": "2", "LD_LIBRARY_PATH": "/x", "PYTHONPATH": "/src", "HOME": "/root", "RANK": "3", "PYTHONUNBUFFERED": "1"}
    assert dict(import_env(env)) == {"OMP_NUM_THREADS": "2", "LD_LIBRARY_PATH": "/x", "PYTHONPATH": "/src"}


def test_a_template_is_stale_when_an_import_variable_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    launcher = ForkServerLauncher(b"s")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    launcher.import_env = import_env(worker_env())  # the env a template gets, PYTHONPATH from sys.path included
    monkeypatch.setenv("DDP_TEST_OTHER", "x")  # read per rank at fork: no new template
    assert launcher.stale() == []
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert launcher.stale() == ["OMP_NUM_THREADS"]


def test_a_pool_takes_only_a_running_fork_server_template() -> None:
    pool = Pool(2, start_method="fork")
    never_started = ForkServerLauncher(b"s")
    assert templates.adopt(pool, never_started) is False and pool.launcher is not never_started
    assert templates.adopt(Pool(2, start_method="spawn"), never_started) is False


def test_the_restart_notice_says_what_was_kept() -> None:
    text = templates.restart_notice(["-n 2 → 4"], 0.06, 0.081, kept=True)
    # fmt_seconds, as the cell says it; the new pool's start is the view's "pool started in", the old ranks' stop apart
    assert text.startswith("restarting the pool (-n 2 → 4): old ranks stopped in 60 ms, pool started in 81 ms, from the same template")
    assert "pool started in 1.50 s, " in templates.restart_notice(["-n 2 → 4"], 0.2, 1.5, kept=True)
    assert "variables defined in earlier %%ddp cells are gone" in text
    assert "new template" in templates.restart_notice(["start-method fork → spawn"], 0.2, 1.5, kept=False)


def test_no_warm_template_when_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(templates.WARM_ENV, "0")
    warm = templates.WarmTemplate()
    warm.begin()
    assert warm.launcher is None and warm.pid is None and warm.close() is False


class _Template:
    """The template process as the launcher sees it: its event lines on a pipe, a stdin that takes commands."""

    def __init__(self) -> None:
        import os

        self.r, self.w = os.pipe()
        self.stdout = os.fdopen(self.r, "rb", buffering=0)
        self.stdin = open(os.devnull, "wb")

    def say(self, *events: dict) -> None:
        import json
        import os

        os.write(self.w, b"".join(json.dumps(e).encode() + b"\n" for e in events))

    def poll(self) -> None:
        return None


def test_an_exit_of_the_pool_before_read_late_is_not_the_new_pools() -> None:
    """fc24: the 2-rank pool before was stopped, its rank 0's exit (code 0) read only once a 3-rank pool had started on
    the same template: "rank 0 (pid 1213) exited with code 0" failed the new pool's start. Its exit is dropped now; the
    new rank 0's own exit still counts, and so does a rank started again by the recovery (spawn, not a new pool)."""
    from ddp_magic.plan.plan import make_plan
    from ddp_magic.plan.spec import PoolSpec

    launcher = ForkServerLauncher(b"s")
    fake = _Template()
    launcher.proc = fake  # type: ignore[assignment]
    fake.say({"event": "spawned", "rank": 0, "pid": 1213}, {"event": "spawned", "rank": 1, "pid": 1214},
             {"event": "exited", "rank": 1, "pid": 1214, "code": 0})
    assert launcher.poll(0.2) == [(1, 1214, 0)]
    launcher.launch(make_plan(PoolSpec(nproc=3)), {}, "127.0.0.1", 1)  # the new pool
    fake.say({"event": "spawned", "rank": 0, "pid": 2000}, {"event": "exited", "rank": 0, "pid": 1213, "code": 0})
    assert launcher.poll(0.2) == [] and launcher.live_pids() == {2000: 0}
    launcher.spawn(0, {"env": {}, "kernel_addr": "127.0.0.1", "kernel_port": 1})
    fake.say({"event": "exited", "rank": 0, "pid": 2000, "code": -9})
    assert launcher.poll(0.2) == [(0, 2000, -9)]
