"""Why a rank died (kernel/failures/deaths.py): the OOM killer only with a counter's evidence, a crash's stack, CUDA out of memory."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest

from ddp_magic.errors import RankFailure
from ddp_magic.kernel.failures import deaths
from ddp_magic.kernel.failures.deaths import crash_traceback, cuda_oom_notes, why_killed
from ddp_magic.kernel.memory import Memory
from ddp_magic.states import FailureKind

KILL = -signal.SIGKILL


def v1(tmp_path: Path, kills: int, limit: int = 12 << 30, peak: int = 0) -> Path:
    """A cgroup v1 memory directory as the kernel reads one (the real one is tested in tests/kernel/test_inside.py)."""
    (tmp_path / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n")
    (tmp_path / "memory.limit_in_bytes").write_text(str(limit))
    (tmp_path / "memory.max_usage_in_bytes").write_text(str(peak))
    return tmp_path


def test_the_oom_killer_is_named_when_the_ranks_cgroup_counted_a_kill(tmp_path: Path) -> None:
    d = v1(tmp_path, kills=1, peak=int(11.3 * (1 << 30)))
    mem = Memory(rss=5 << 30, peak=6 << 30, cgroup=str(d), limit=12 << 30, oom_kills=0)
    assert why_killed(KILL, mem) == "was killed by the kernel's OOM killer (its cgroup peaked at 11.3 GiB; its memory limit is 12.0 GiB)"
    assert why_killed(KILL, mem, local=False) == ""  # a rank on another host: its counters are not this kernel's to read


def test_a_sigkill_neither_counter_counted_is_not_the_oom_killer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deaths.memcg, "system_oom_kills", lambda: 7)
    mem = Memory(rss=5 << 30, cgroup=str(v1(tmp_path, kills=3)), oom_kills=3, system_oom_kills=7)
    assert why_killed(KILL, mem) == "was killed by SIGKILL (not the OOM killer)"


def test_a_kill_the_machine_counted_and_the_sampled_cgroup_did_not_is_probably_the_oom_killer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rank was moved into another cgroup after its last sample and killed there: the cgroup it
    was sampled in counts nothing (v1 counts a kill in the victim's own cgroup only), the machine's count moved."""
    monkeypatch.setattr(deaths.memcg, "system_oom_kills", lambda: 8)
    mem = Memory(rss=160 << 20, cgroup=str(v1(tmp_path, kills=3)), oom_kills=3, system_oom_kills=7, at=1000.0)
    assert why_killed(KILL, mem, now=1002.0) == (
        "was probably killed by the kernel's OOM killer (the machine counted an OOM kill, the cgroup it was last sampled in did not: "
        "it may have moved; it held 160.0 MiB at its last sample, 2.00 s before)")


def test_v1s_root_cgroup_never_rules_the_oom_killer_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank sampled in v1's root memory cgroup: that count is no evidence either way, the machine's decides."""
    root = v1(tmp_path, kills=0)
    monkeypatch.setattr(deaths.memcg, "ROOT_V1", str(root))
    mem = Memory(rss=1 << 30, cgroup=str(root), oom_kills=0, system_oom_kills=4)
    monkeypatch.setattr(deaths.memcg, "system_oom_kills", lambda: 5)
    assert why_killed(KILL, mem).startswith("was probably killed by the kernel's OOM killer (the machine counted")
    monkeypatch.setattr(deaths.memcg, "system_oom_kills", lambda: 4)
    assert why_killed(KILL, mem) == "was killed by SIGKILL (not the OOM killer)"
    monkeypatch.setattr(deaths.memcg, "system_oom_kills", lambda: None)
    assert why_killed(KILL, mem).startswith("was killed by SIGKILL (could not tell whether the OOM killer sent it")
    (tmp_path / "child").mkdir()
    other = Memory(rss=1 << 30, cgroup=str(v1(tmp_path / "child", kills=0)), oom_kills=0)
    assert why_killed(KILL, other) == "was killed by SIGKILL (not the OOM killer)"  # a cgroup below the root: its count would have moved


def test_with_no_cgroup_known_the_machines_counter_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deaths.memcg, "system_oom_kills", lambda: 5)
    assert why_killed(KILL, Memory(rss=1 << 30, system_oom_kills=4)) == "was killed by the kernel's OOM killer (it held 1.0 GiB as its last cell ended)"
    assert why_killed(KILL, Memory(rss=1 << 30, system_oom_kills=4, at=10.0), now=12.5) == (
        "was killed by the kernel's OOM killer (it held 1.0 GiB at its last sample, 2.50 s before)")
    assert why_killed(KILL, Memory(rss=1 << 30, system_oom_kills=5)) == "was killed by SIGKILL (not the OOM killer)"
    monkeypatch.setattr(deaths.memcg, "system_oom_kills", lambda: None)
    assert "could not tell whether the OOM killer sent it" in why_killed(KILL, Memory(rss=1 << 30, system_oom_kills=5))
    assert "could not tell whether the OOM killer sent it" in why_killed(KILL, None)


def test_other_ends_are_left_to_describe_exit() -> None:
    assert why_killed(-signal.SIGSEGV, None) == "" and why_killed(1, None) == ""
    f = RankFailure(rank=2, kind=FailureKind.DIED, pid=7, exit_code=KILL, why="was killed by SIGKILL (not the OOM killer)")
    assert f.headline() == "rank 2 (pid 7) was killed by SIGKILL (not the OOM killer)"


def test_a_crash_block_becomes_a_traceback_from_the_cell_on_without_our_frames() -> None:
    block = [
        "Fatal Python error: Segmentation fault", "", "Current thread 0x00007f (most recent call first):",
        '  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at',
        '  File "<ddp-cell-5>", line 4 in <module>',
        f'  File "{deaths._PACKAGE_DIR}wire/execution.py", line 45 in run_source',
        '  File "<frozen runpy>", line 88 in _run_code', "", "Extension modules: torch._C (total: 1)",
    ]
    assert crash_traceback(block) == "\n".join([
        "Fatal Python error: Segmentation fault", "Python stack when it died (most recent call last):",
        '  File "<ddp-cell-5>", line 4, in <module>', '  File "/usr/lib/python3.11/ctypes/__init__.py", line 519, in string_at',
    ])


def test_cuda_oom_names_each_ranks_figures() -> None:
    err = {"type": "OutOfMemoryError", "cuda": {"allocated": 10 << 30, "reserved": 11 << 30, "peak": 23 << 29}}
    done = {1: {"error": err}, 3: {"error": dict(err, cuda=None)}, 0: {"error": None}, 2: {"error": {"type": "ValueError"}}}
    assert cuda_oom_notes(done) == [
        "ranks 1, 3 ran out of CUDA memory (rank 1: CUDA 10.0 GiB allocated, 11.0 GiB reserved, peak 11.5 GiB; rank 3: CUDA not in use, "
        "no figures); torch.cuda.empty_cache() ran on them, and every rank keeps its variables"
    ]
    assert cuda_oom_notes({0: {"error": None}}) == []


def test_a_dones_figures_keep_what_the_sampler_read_and_the_same_figures_are_the_same_value() -> None:
    """A DONE's ``mem`` has RSS and peak only: the cgroup and OOM counters come from the last MEMORY (deaths read them)."""
    sampled = Memory.of({"rss": 1 << 30, "peak": 2 << 30, "cgroup": {"dir": "/sys/fs/cgroup/x", "limit": 12 << 30, "oom_kill": 0},
                         "system_oom_kills": 4})
    moved = Memory.of({"rss": 3 << 30, "peak": 3 << 30}, sampled)
    assert moved == Memory(rss=3 << 30, peak=3 << 30, cgroup="/sys/fs/cgroup/x", limit=12 << 30, oom_kills=0, system_oom_kills=4)
    assert Memory.of({"rss": 3 << 30, "peak": 3 << 30}, moved) is moved  # a rank whose figures did not move: nothing new made
    gpu = Memory.of({"rss": 3 << 30, "peak": 3 << 30, "cuda": {"allocated": 1, "reserved": 2, "peak": 3}}, moved)
    assert Memory.of({"rss": 3 << 30, "peak": 3 << 30}, gpu).cuda_allocated is None  # a DONE without CUDA's figures has none
    assert Memory.of({"rss": 5}) == Memory(rss=5) and Memory.of({"rss": 5, "peak": None}) == Memory(rss=5)
