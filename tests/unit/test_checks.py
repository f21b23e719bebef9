"""Every env check of plan/checks*.py, case by case: a case that makes it pass and one that makes it fail.

The table CASES maps each check's name to a passing and a failing situation;
test_every_check_is_covered makes sure no check produced by plan_checks or
live_checks is missing from it. Pure unit tests: no kernel, no worker, no torch import.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import types
from typing import Callable, Dict, List, Tuple

import pytest

from ddp_magic.errors import PlanError
from ddp_magic.plan import checks_host as host
from ddp_magic.plan import checks_live as livec
from ddp_magic.plan import checks_net as netc
from ddp_magic.plan import checks_ranks as ranks
from ddp_magic.plan import net
from ddp_magic.plan.check import Check, checks_verdict
from ddp_magic.plan.checks import live_checks, plan_checks
from ddp_magic.plan.gpus import BackendInfo, GPUInfo
from ddp_magic.plan.plan import Plan, make_plan
from ddp_magic.plan.spec import PoolSpec
from ddp_magic.ui.report import live_report, plan_report

NO_GPU = GPUInfo(count=0, cuda_built=False, source="test: no GPU", physical=0)
FOUR_GPUS = GPUInfo(count=4, cuda_built=True, source="test: 4 GPUs", physical=4)
TWO_GPUS = GPUInfo(count=2, cuda_built=True, source="test: 2 GPUs", physical=2)
GLOO_ONLY = BackendInfo({"nccl": False, "gloo": True, "mpi": False}, "test")


def plan(n: int = 2, strict: bool = True, **options) -> Plan:
    return make_plan(PoolSpec(n, **options), gpus=NO_GPU, environ={}, strict=strict)


def envs(n: int = 2) -> List[Dict[str, str]]:
    return plan(n).all_envs()


def edit(es: List[Dict[str, str]], rank: int, **changes: str) -> List[Dict[str, str]]:
    es = [dict(e) for e in es]
    for k, v in changes.items():
        if v is None:
            es[rank].pop(k, None)
        else:
            es[rank][k] = v
    return es


def by_name(checks: List[Check], name: str) -> Check:
    found = [c for c in checks if c.name == name]
    assert found, f"no check named {name!r} in {[c.name for c in checks]}"
    return found[0]


def listening_socket() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s


def live(n: int = 2, **pg_overrides) -> Dict[int, dict]:
    out = {}
    for r, e in enumerate(envs(n)):
        pg = {"initialised": True, "backend": "gloo", "world_size": n, "rank": r}
        pg.update(pg_overrides.get(str(r), {}))
        out[r] = {"env": dict(e, OMP_NUM_THREADS="1"), "process_group": pg, "pid": 1000 + r, "device": "cpu"}
    return out


def _port_taken() -> List[Check]:
    s = listening_socket()
    try:
        return [netc.check_port("127.0.0.1", s.getsockname()[1])]
    finally:
        s.close()


# name -> (passing situation, failing situation); each returns the checks to look in
CASES: Dict[str, Tuple[Callable[[], List[Check]], Callable[[], List[Check]]]] = {
    "variables set": (lambda: ranks.check_rank_envs(envs()), lambda: ranks.check_rank_envs(edit(envs(), 1, RANK=None))),
    "same MASTER_ADDR": (lambda: ranks.check_rank_envs(envs()), lambda: ranks.check_rank_envs(edit(envs(), 1, MASTER_ADDR="10.0.0.9"))),
    "same MASTER_PORT": (lambda: ranks.check_rank_envs(envs()), lambda: ranks.check_rank_envs(edit(envs(), 0, MASTER_PORT="1234"))),
    "same WORLD_SIZE": (lambda: ranks.check_rank_envs(envs()), lambda: ranks.check_rank_envs(edit(envs(), 1, WORLD_SIZE="3"))),
    "WORLD_SIZE matches the ranks": (
        lambda: ranks.check_rank_envs(envs()),
        lambda: ranks.check_rank_envs(edit(edit(envs(), 0, WORLD_SIZE="3"), 1, WORLD_SIZE="3")),
    ),
    "ranks unique and complete": (lambda: ranks.check_rank_envs(envs(4)), lambda: ranks.check_rank_envs(edit(envs(4), 3, RANK="1", LOCAL_RANK="1"))),
    "LOCAL_RANK consistent": (lambda: ranks.check_rank_envs(envs(4)), lambda: ranks.check_rank_envs(edit(envs(4), 2, LOCAL_RANK="7"))),
    "MASTER_PORT valid": (
        lambda: ranks.check_rank_envs(envs()),
        lambda: ranks.check_rank_envs([dict(e, MASTER_PORT="70000") for e in envs()]),
    ),
    "master port free": (lambda: [netc.check_port("127.0.0.1", net.free_port())], _port_taken),
    "master address resolves": (lambda: [netc.check_master_addr_resolves("localhost")], lambda: [netc.check_master_addr_resolves("no-such-host.invalid")]),
    "master address is local": (lambda: [netc.check_master_addr_local("127.0.0.1")], lambda: [netc.check_master_addr_local("192.0.2.1")]),
    "GPUs for the backend": (lambda: [host.check_gpus("nccl", 4, FOUR_GPUS)], lambda: [host.check_gpus("nccl", 4, TWO_GPUS)]),
    "backend available": (lambda: [host.check_backend_available("gloo", GLOO_ONLY)], lambda: [host.check_backend_available("mpi", GLOO_ONLY)]),
    "no stale dist variables in the kernel": (
        lambda: host.check_kernel_env({}, NO_GPU),
        lambda: host.check_kernel_env({"RANK": "3", "WORLD_SIZE": "8"}, NO_GPU),
    ),
    "CUDA_VISIBLE_DEVICES": (
        lambda: [host.check_visible_devices({"CUDA_VISIBLE_DEVICES": "0,1"}, FOUR_GPUS)],
        lambda: [host.check_visible_devices({"CUDA_VISIBLE_DEVICES": "0,5"}, FOUR_GPUS)],
    ),
    "OMP_NUM_THREADS": (
        lambda: [host.check_omp(None, 2, {"OMP_NUM_THREADS": "2"}, cpus=8)],
        lambda: [host.check_omp(None, 2, {"OMP_NUM_THREADS": "many"}, cpus=8)],
    ),
    "NCCL settings": (
        lambda: [host.check_nccl_env({"NCCL_DEBUG": "INFO"}, "nccl")],
        lambda: [host.check_nccl_env({"NCCL_ASYNC_ERROR_HANDLING": "1"}, "nccl")],
    ),
    "socket interface": (
        lambda: [host.check_socket_ifname({"GLOO_SOCKET_IFNAME": "lo"}, "gloo", ["lo", "eth0"])],
        lambda: [host.check_socket_ifname({"GLOO_SOCKET_IFNAME": "ib7"}, "gloo", ["lo", "eth0"])],
    ),
    "every rank answered": (lambda: live_checks(live(), 2, "gloo"), lambda: live_checks({0: live()[0]}, 2, "gloo")),
    "process group": (lambda: live_checks(live(), 2, "gloo"), lambda: live_checks(live(**{"1": {"initialised": False}}), 2, "gloo")),
}
# Checks that inform and cannot fail, by design (both of their states are tested below).
INFORM_ONLY = {"CUDA in the kernel", "Slurm task variables"}  # the latter only informs (tests/unit/test_slurm_plan.py)


@pytest.mark.parametrize("name", sorted(CASES))
def test_check_passes(name):
    check = by_name(CASES[name][0](), name)
    assert check.ok, check
    assert check.mark == "✓"


@pytest.mark.parametrize("name", sorted(CASES))
def test_check_fails_with_a_reason(name):
    check = by_name(CASES[name][1](), name)
    assert not check.ok, check
    assert check.mark in ("✗", "!")
    assert len(check.detail) > 15, "a failure says why in words"


def test_every_check_is_covered():
    names = {c.name for c in plan_checks(plan(2), {}, NO_GPU, backends=GLOO_ONLY)}
    names |= {c.name for c in live_checks(live(), 2, "gloo")}
    missing = names - set(CASES) - INFORM_ONLY
    assert not missing, f"checks without a pass/fail case: {missing}"


# ---------------------------------------------------------------- details of single checks
def test_rank_env_failures_name_the_problem():
    dup = by_name(ranks.check_rank_envs(edit(envs(4), 3, RANK="1", LOCAL_RANK="1")), "ranks unique and complete")
    assert dup.detail == "rank 1 appears more than once (two processes would claim one rank); rank 3 missing (the others would wait for it)"
    two = by_name(ranks.check_rank_envs(edit(edit(envs(4), 2, RANK="0", LOCAL_RANK="0"), 3, RANK="1", LOCAL_RANK="1")), "ranks unique and complete")
    assert two.detail.startswith("ranks 0-1 appear more than once") and "ranks 2-3 missing (the others would wait for them)" in two.detail
    out = by_name(ranks.check_rank_envs(edit(envs(2), 1, RANK="5")), "ranks unique and complete")
    assert "outside 0..1" in out.detail
    bad = by_name(ranks.check_rank_envs(edit(envs(2), 1, RANK="one")), "ranks unique and complete")
    assert not bad.ok and "as numbers" in bad.detail
    missing = by_name(ranks.check_rank_envs(edit(envs(2), 1, RANK=None, MASTER_ADDR=None)), "variables set")
    assert "MASTER_ADDR" in missing.detail and "RANK" in missing.detail
    port = by_name(ranks.check_rank_envs([dict(e, MASTER_PORT="http") for e in envs()]), "MASTER_PORT valid")
    assert not port.ok and "'http'" in port.detail
    assert not by_name(ranks.check_rank_envs([]), "variables set").ok


def test_local_rank_problems():
    shifted = by_name(ranks.check_rank_envs(edit(envs(4), 1, RANK="1", LOCAL_RANK="2")), "LOCAL_RANK consistent")
    assert "means RANK 2" in shifted.detail
    dup = ranks.check_local_ranks(edit(edit(envs(2), 1, LOCAL_RANK="0"), 1, RANK="1"))
    assert not dup.ok and "share a GPU" in dup.detail
    sizes = ranks.check_local_ranks(edit(envs(2), 1, LOCAL_WORLD_SIZE="4"))
    assert not sizes.ok and "LOCAL_WORLD_SIZE" in sizes.detail


def test_port_holder_is_named():
    s = listening_socket()
    try:
        port = s.getsockname()[1]
        check = netc.check_port("127.0.0.1", port)
        assert not check.ok
        assert f"pid {os.getpid()}" in check.detail, check.detail
        assert "in use" in check.detail
        chosen = netc.check_port("127.0.0.1", port, given=False)
        assert "chosen port" in chosen.detail
        running = netc.check_port("127.0.0.1", port, started=True)
        assert running.ok and "running pool" in running.detail
    finally:
        s.close()


def test_master_address_reachability_for_several_nodes(monkeypatch):
    assert netc.check_master_addr_local("127.0.0.1", nnodes=2).ok
    monkeypatch.setattr(netc, "route_source", lambda family, ip: "10.1.2.3")
    ok = netc.check_master_addr_local("192.0.2.1", nnodes=2)
    assert ok.ok and ok.name == "master address reachable" and "10.1.2.3" in ok.detail
    monkeypatch.setattr(netc, "route_source", lambda family, ip: None)
    bad = netc.check_master_addr_local("192.0.2.1", nnodes=2)
    assert not bad.ok and "no route" in bad.detail
    unresolved = netc.check_master_addr_local("no-such-host.invalid")
    assert not unresolved.ok and "does not resolve" in unresolved.detail


def test_gpu_checks():
    assert not host.check_gpus("nccl", 2, NO_GPU).ok
    assert "--backend gloo" in host.check_gpus("nccl", 2, NO_GPU).detail
    assert "-n 2" in host.check_gpus("nccl", 4, TWO_GPUS).detail
    gloo = host.check_gpus("gloo", 4, TWO_GPUS)
    assert gloo.ok and gloo.level == "info" and "fewer" in gloo.detail


def test_this_torch_reports_gloo_without_importing_torch():
    code = (
        "import sys\n"
        "from ddp_magic.plan import PoolSpec, backend_availability, plan_checks, make_plan\n"
        "info = backend_availability()\n"
        "checks = plan_checks(make_plan(PoolSpec(2)))\n"
        "assert 'torch' not in sys.modules, 'the checks imported torch'\n"
        "print(info.available['gloo'], all(c.ok or c.level != 'error' for c in checks))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]


def test_cuda_in_the_kernel_informs_in_both_states():
    cold = host.check_cuda_in_kernel({"torch": types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: False))})
    hot = host.check_cuda_in_kernel({"torch": types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: True))})
    absent = host.check_cuda_in_kernel({})
    assert cold.ok and hot.ok and absent.ok
    assert "harmless" in hot.detail and "never forked" in hot.detail
    assert "not initialised" in cold.detail and "not imported" in absent.detail


def test_stale_variables_are_listed():
    check = host.check_kernel_env({"RANK": "3", "LOCAL_RANK": "1"}, NO_GPU)[0]
    assert check.level == "warning" and "RANK=3" in check.detail and "LOCAL_RANK=1" in check.detail


@pytest.mark.parametrize(
    "value,gpus,ok,words",
    [
        (None, FOUR_GPUS, True, "all 4"),
        ("0,1", FOUR_GPUS, True, "inherits"),
        ("", FOUR_GPUS, False, "hides all 4"),
        ("-1", NO_GPU, True, "no GPU"),
        ("0,5", FOUR_GPUS, False, "names device 5, but this machine has 4 GPUs"),
        ("0,5,7", FOUR_GPUS, False, "names devices 5, 7"),
        ("0,0", FOUR_GPUS, False, "twice"),
        ("gpu0", FOUR_GPUS, False, "not a device index"),
        ("GPU-8f2c", FOUR_GPUS, True, "inherits"),
    ],
)
def test_cuda_visible_devices(value, gpus, ok, words):
    environ = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    check = host.check_visible_devices(environ, gpus)
    assert check.ok is ok, check
    assert words in check.detail


@pytest.mark.parametrize(
    "planned,value,nproc,ok,words",
    [
        (1, None, 2, True, "cores / ranks"),
        (None, "1", 2, True, "from the kernel"),
        (None, "0", 2, False, "not a positive"),
        (None, "abc", 2, False, "not a positive"),
        (None, "4", 4, False, "oversubscribed"),
    ],
)
def test_omp_num_threads(planned, value, nproc, ok, words):
    environ = {} if value is None else {"OMP_NUM_THREADS": value}
    check = host.check_omp(planned, nproc, environ, cpus=4)
    assert check.ok is ok, check
    assert words in check.detail


def test_nccl_settings():
    none = host.check_nccl_env({}, "gloo")
    assert none.ok and "unused" in none.detail
    bad_level = host.check_nccl_env({"NCCL_DEBUG": "LOUD"}, "nccl")
    assert not bad_level.ok and "NCCL_DEBUG" in bad_level.detail
    renamed = host.check_nccl_env({"NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_TRACE_BUFFER_SIZE": "10"}, "nccl")
    assert not renamed.ok and "TORCH_NCCL_BLOCKING_WAIT" in renamed.detail and "TORCH_NCCL_TRACE_BUFFER_SIZE=10" in renamed.detail


def test_socket_interfaces():
    have = ["lo", "eth0", "ib0"]
    assert host.check_socket_ifname({}, "gloo", have).ok
    assert host.check_socket_ifname({"NCCL_SOCKET_IFNAME": "eth"}, "nccl", have).ok  # a prefix
    assert host.check_socket_ifname({"NCCL_SOCKET_IFNAME": "^docker,lo"}, "nccl", have).ok  # an exclusion
    exact = host.check_socket_ifname({"NCCL_SOCKET_IFNAME": "=eth"}, "nccl", have)
    assert not exact.ok and exact.level == "error"
    other = host.check_socket_ifname({"NCCL_SOCKET_IFNAME": "wlan"}, "gloo", have)
    assert not other.ok and other.level == "warning"  # not fatal: gloo does not read it
    gloo = host.check_socket_ifname({"GLOO_SOCKET_IFNAME": "ib7"}, "gloo", have)
    assert gloo.failed and "init_process_group fails" in gloo.detail


def test_process_group_problems():
    size = livec.check_process_group(live(**{"0": {"world_size": 3}, "1": {"world_size": 3}}), 2, "gloo")
    assert not size.ok and "world size 3" in size.detail
    mixed = livec.check_process_group(live(**{"1": {"backend": "nccl"}}), 2, "gloo")
    assert not mixed.ok and "different backends" in mixed.detail
    planned = livec.check_process_group(live(), 2, "nccl")
    assert not planned.ok and "planned nccl" in planned.detail
    swapped = livec.check_process_group(live(**{"0": {"rank": 1}, "1": {"rank": 0}}), 2, "gloo")
    assert not swapped.ok
    none = livec.check_process_group(live(**{"0": {"initialised": False}, "1": {"initialised": False}}), 2, "gloo")
    assert none.ok and none.level == "info" and "not initialised" in none.detail


def test_seen_settings_are_compared_across_ranks():
    same = livec.check_seen_settings([{"OMP_NUM_THREADS": "2", "NCCL_DEBUG": "WARN"}] * 2)
    assert all(c.ok for c in same)
    differ = livec.check_seen_settings([{"OMP_NUM_THREADS": "2", "NCCL_DEBUG": "WARN"}, {"OMP_NUM_THREADS": "1"}])
    assert [c.ok for c in differ] == [False, False]


def test_verdict():
    """One wording of the verdict (the cell's view, %ddp_env, the panel's tooltip): counts and singular/plural from the list."""
    assert checks_verdict([Check("a", True, "x")]) == "✓ 1 check passed"
    assert checks_verdict([Check("a", True, "x")] * 19) == "✓ 19 checks passed"
    assert checks_verdict([Check("a", True, "x"), Check("b", False, "y", level="warning")]) == "! 1 warning, 1 check passed"
    assert checks_verdict([Check("a", True, "x")] * 3 + [Check("b", False, "y", level="warning")] * 2) == "! 2 warnings, 3 checks passed"
    assert checks_verdict([Check("a", False, "x"), Check("b", False, "y", level="warning")]) == "✗ 1 of 2 checks failed"


# ---------------------------------------------------------------- the cache
def test_plan_checks_are_cached_by_what_they_read(monkeypatch):
    from ddp_magic.plan import checks as C

    calls = []
    real = C._plan_checks
    monkeypatch.setattr(C, "_plan_checks", lambda *a: calls.append(a) or real(*a))
    C.clear_cache()
    p, env = plan(2), {"NCCL_DEBUG": "WARN"}
    first = plan_checks(p, env)
    again = plan_checks(p, dict(env))
    assert again == first and again is not first and len(calls) == 1, "the same question is answered from the cache"
    again.append(Check("extra", True, "a caller's own"))
    assert plan_checks(p, env) == first, "a caller's list is its own"
    plan_checks(p, env, started=True)
    plan_checks(p, {"NCCL_DEBUG": "INFO"})
    plan_checks(plan(2), env)
    assert len(calls) == 4, "another start state, env or plan is another question"
    plan_checks(p, env, NO_GPU)
    plan_checks(p, env, backends=GLOO_ONLY)
    assert len(calls) == 6, "injected facts bypass the cache"
    C.clear_cache()
    plan_checks(p, env)
    assert len(calls) == 7


def test_plan_checks_notice_cuda_in_the_kernel():
    cold = {"torch": types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: False))}
    hot = {"torch": types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: True))}
    p = plan(2)
    assert "not initialised" in by_name(plan_checks(p, {}, modules=cold), "CUDA in the kernel").detail
    assert "harmless" in by_name(plan_checks(p, {}, modules=hot), "CUDA in the kernel").detail


# ---------------------------------------------------------------- plans and reports
def test_lenient_plan_reports_what_a_strict_plan_refuses():
    with pytest.raises(PlanError):
        plan(4, backend="nccl")
    lenient = plan(4, backend="nccl", strict=False)
    assert lenient.backend == "nccl"
    checks = plan_checks(lenient, {}, NO_GPU, backends=GLOO_ONLY)
    assert not by_name(checks, "GPUs for the backend").ok
    assert not by_name(checks, "backend available").ok
    s = listening_socket()
    try:
        port = s.getsockname()[1]
        with pytest.raises(PlanError, match="in use"):
            plan(2, master_port=port)
        taken = plan(2, master_port=port, strict=False)
        assert not by_name(plan_checks(taken, {}, NO_GPU, backends=GLOO_ONLY), "master port free").ok
    finally:
        s.close()
    with pytest.raises(PlanError, match="does not resolve"):
        plan(2, master_addr="no-such-host.invalid")
    far = plan(2, master_addr="192.0.2.1", strict=False)
    assert not by_name(plan_checks(far, {}, NO_GPU, backends=GLOO_ONLY), "master address is local").ok


def test_plan_report_text_html_and_json():
    p = plan(2)
    report = plan_report(p, environ={"NCCL_DEBUG": "WARN", "RANK": "7", "MY_TOKEN": "s3cret"})
    text = repr(report)
    assert "planned env for 2 ranks" in text and "! 1 warning" in text  # the stale RANK warns
    assert "✓ ranks unique and complete" not in text and "✓ ranks unique and complete" in report.full_text()  # passes: one click away
    assert "! no stale dist variables in the kernel" in text
    html = report._repr_html_()
    assert "<table" in html and "NCCL_DEBUG" in html and "s3cret" not in html
    data = json.loads(report.to_json())
    assert data["ok"] is True and data["state"] == "planned"
    assert [r["RANK"] for r in data["ranks"]] == ["0", "1"]  # the plan's own values, not the kernel's stale RANK
    assert data["ranks"][0]["NCCL_DEBUG"] == "WARN"
    assert {c["name"] for c in data["checks"]} >= {"master port free", "backend available", "GPUs for the backend"}


def test_live_report_checks_consistency():
    good = live_report(live(), 2, "gloo")
    assert good.ok and good.to_dict()["state"] == "live"
    bad = live(3)
    bad[2]["env"]["MASTER_PORT"] = "1"
    report = live_report(bad, 3, "gloo")
    assert not report.ok
    assert "ranks disagree on MASTER_PORT" in repr(report)
    missing = live_report({0: live()[0]}, 2, "gloo")
    assert not missing.ok and "no answer from rank 1 within the timeout" in repr(missing)


# ---------------------------------------------------------------- one plan, one count (the cell's view and %ddp_env)
def _count(line: str) -> int:
    """The number of checks a verdict line counts: '✓ 19 checks passed', '! 1 warning, 18 checks passed', '✗ 2 of 19 checks failed'."""
    import re

    m = re.search(r"✓ (\d+) checks? passed|! (\d+) warnings?, (\d+) checks? passed|✗ \d+ of (\d+) checks? failed", line)
    assert m, line
    a, w, p, total = m.groups()
    return int(a) if a else int(w) + int(p) if w else int(total)


@pytest.mark.parametrize("options", [{}, {"backend": "nccl"}, {"mesh": "dp=2,tp=1"}])
def test_the_cell_and_ddp_env_count_the_same_checks_for_one_plan(options):
    from ddp_magic.ui.status_view import StatusView

    p = make_plan(PoolSpec.from_options(2, **options), gpus=NO_GPU, environ={}, strict=False)
    for started in (False, True):
        view = StatusView(2, plan=p, mode="off", ticker=False)
        view._pool = types.SimpleNamespace(plan=p, started=started)
        report = plan_report(p, started=started) if not started else live_report(live(), 2, p.backend, p)
        assert [c.name for c in view.checks] == [c.name for c in report.checks], "the same list, in the same order"
        assert _count(view.summary()) == _count(report.verdict.split(";")[0]) == len(report.checks)
    facts = {c.name for c in plan_checks(p, {})}
    assert ("GPU per rank" in facts) == (p.backend == "nccl") and ("device mesh" in facts) == ("mesh" in options)


def test_a_live_report_counts_what_the_ranks_report_apart():
    p = plan(2)
    report = live_report(live(), 2, "gloo", p)
    assert report.verdict == f"✓ {len(plan_checks(p, started=True))} checks passed; from the ranks: ✓ {len(live_checks(live(), 2, 'gloo'))} checks passed"
    data = report.to_dict()
    assert {c["source"] for c in data["checks"]} == {"plan", "ranks"} and len(data["checks"]) == len(report.all_checks)
    bad = live(2)
    bad[1]["process_group"]["initialised"] = False
    assert not live_report(bad, 2, "gloo", p).ok and "; from the ranks: ✗ 1 of " in live_report(bad, 2, "gloo", p).verdict


def test_the_env_every_rank_shares_is_said_once():
    report = plan_report(plan(4), environ={})
    text = report.full_text().split("\n\n")[0]  # the env, before the checks
    shared = [ln for ln in text.splitlines() if ln.startswith("every rank: ")]
    assert len(shared) == 1 and text.count("MASTER_ADDR=") == 1 and text.count(" WORLD_SIZE=4") == 1
    values = dict(kv.split("=", 1) for kv in shared[0].removeprefix("every rank: ").split())
    assert values["WORLD_SIZE"] == "4" and values["LOCAL_WORLD_SIZE"] == "4" and "RANK" not in values and "LOCAL_RANK" not in values
    header, *rows = [ln.split() for ln in text.splitlines()[2:7]]
    assert header == ["RANK", "LOCAL_RANK"] and rows == [[str(r), str(r)] for r in range(4)], "per rank: only what differs"
    page = report._repr_html_()
    assert page.count(">MASTER_ADDR<") == 0 and "every rank: MASTER_ADDR=" in page
    one = plan_report(plan(1), environ={}).full_text()
    assert "every rank:" not in one and "MASTER_ADDR" in one.splitlines()[1], "one rank: its one row says it all"
    assert report.to_dict()["ranks"][3]["MASTER_ADDR"] == "127.0.0.1", "programs still get every variable per rank"


def test_the_env_of_1024_ranks_is_its_pattern_and_its_exceptions():
    from ddp_magic.ui.report import env_runs

    slurm = make_plan(PoolSpec.from_options(None, slurm=dict(nodes=4, ntasks_per_node=256), environ={}), environ={})
    report = plan_report(slurm, environ={})
    text = report.full_text().split("\n\n")[0].splitlines()
    assert text[1].startswith("every rank: ") and " WORLD_SIZE=1024 LOCAL_WORLD_SIZE=256" in text[1]
    assert [ln.split() for ln in text[2:]] == [["RANK", "LOCAL_RANK", "NODE_RANK"], ["0-255", "0-255", "0"], ["256-511", "0-255", "1"],
                                               ["512-767", "0-255", "2"], ["768-1023", "0-255", "3"]]  # a row per node, not 1,024
    page = report._repr_html_()
    assert page.count("<tr>") == 5 and ">768-1023<" in page and len(page) < 10_000
    assert len(report.to_dict()["ranks"]) == 1024, "programs still get every rank"
    one_node = plan_report(plan(1024), environ={}).full_text().split("\n\n")[0].splitlines()
    assert [ln.split() for ln in one_node[2:]] == [["RANK", "LOCAL_RANK"], ["0-1023", "0-1023"]]
    odd = [{"RANK": str(r), "LOCAL_RANK": str(r % 256), "CUDA_VISIBLE_DEVICES": "7" if r == 300 else str(r % 256)} for r in range(1024)]
    cols = ["RANK", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES"]
    assert [row["RANK"] for row in env_runs(odd, cols)] == ["0-255", "256-299", "300", "301-511", "512-767", "768-1023"]  # the exception alone
    assert env_runs(odd, cols)[2] == {"RANK": "300", "LOCAL_RANK": "44", "CUDA_VISIBLE_DEVICES": "7"}


def test_every_rank_different_is_capped_and_counted():
    from ddp_magic.ui.report import RUNS_SHOWN, env_rows

    noisy = [{"RANK": str(r), "SEED": str(r * 7)} for r in range(1024)]  # no two neighbours follow a pattern
    rows, left = env_rows(noisy, ["RANK", "SEED"])
    assert len(rows) == RUNS_SHOWN and left == f"… and {1024 - RUNS_SHOWN} more runs of ranks (every rank: .to_dict()['ranks'])"
    small, none = env_rows(noisy[:32], ["RANK", "SEED"])
    assert small == noisy[:32] and none == "", "32 ranks keep a row each"
