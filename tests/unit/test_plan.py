"""The plan: a PoolSpec turned into each rank's env (backend, master port, thread count), and the
machine facts it rests on (addresses and ports, GPUs, torch's backends). No kernel, no worker, no torch import."""
from __future__ import annotations

import os
import socket
import threading
import types

import pytest

from ddp_magic.errors import PlanError
from ddp_magic.plan import gpus, net
from ddp_magic.plan.gpus import GPUInfo, backend_availability
from ddp_magic.plan.plan import DIST_VARS, choose_backend, make_plan, threads_per_rank, usable_cpus
from ddp_magic.plan.spec import PoolSpec

NO_GPU = GPUInfo(count=0, cuda_built=False, source="test: no GPU", physical=0)


def listening_socket() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s


# ---------------------------------------------------------------- make_plan
def test_plan_envs_are_complete_and_distinct():
    plan = make_plan(PoolSpec(3), gpus=NO_GPU, environ={})
    envs = plan.all_envs()
    assert [e["RANK"] for e in envs] == ["0", "1", "2"]
    assert {e["MASTER_PORT"] for e in envs} == {str(plan.master_port)}
    assert all(e["WORLD_SIZE"] == "3" and e["LOCAL_WORLD_SIZE"] == "3" and e["NODE_RANK"] == "0" for e in envs)
    assert all(set(DIST_VARS) <= set(e) for e in envs)
    assert envs[0]["OMP_NUM_THREADS"] == str(max(1, len(os.sched_getaffinity(0)) // 3))
    assert not plan.port_was_given and plan.backend == "gloo"


def test_the_plan_carries_the_whole_spec():
    spec = PoolSpec.from_options(8, nnodes=2, pg_timeout=30.0, init=False, extra_env={"A": "1"}, backend="gloo")
    plan = make_plan(spec, gpus=NO_GPU, environ={})
    assert (plan.nproc, plan.nnodes, plan.world_size) == (4, 2, 8), "nproc counts the ranks of one node"
    assert (plan.pg_timeout, plan.init, plan.extra_env) == (30.0, False, {"A": "1"})
    env = plan.rank_env(3)
    assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["GROUP_WORLD_SIZE"], env["RANK"]) == ("8", "4", "2", "3")
    assert (env["DDP_MAGIC_PG_TIMEOUT"], env["DDP_MAGIC_INIT"], env["A"]) == ("30.0", "0", "1")
    assert env["OMP_NUM_THREADS"] == str(threads_per_rank(4))


def test_kernel_omp_setting_is_respected():
    plan = make_plan(PoolSpec(2), gpus=NO_GPU, environ={"OMP_NUM_THREADS": "7"})
    assert plan.omp_threads is None and "OMP_NUM_THREADS" not in plan.rank_env(0)


def test_a_given_port_is_kept():
    port = net.free_port()
    plan = make_plan(PoolSpec(2, master_port=port), gpus=NO_GPU, environ={})
    assert plan.master_port == port and plan.port_was_given


def test_a_fresh_plan_each_time():
    a, b = make_plan(PoolSpec(2), gpus=NO_GPU, environ={}), make_plan(PoolSpec(2), gpus=NO_GPU, environ={})
    assert a.run_id != b.run_id and a.rank_env(0)["TORCHELASTIC_RUN_ID"] == a.run_id


def test_strict_plans_refuse_with_the_fix():
    with pytest.raises(PlanError, match="needs NVIDIA GPUs and none is visible; use --backend gloo"):
        make_plan(PoolSpec(2, backend="nccl"), gpus=NO_GPU, environ={})
    s = listening_socket()
    try:
        with pytest.raises(PlanError, match=f"--master-port {s.getsockname()[1]} is already in use by pid {os.getpid()}"):
            make_plan(PoolSpec(2, master_port=s.getsockname()[1]), gpus=NO_GPU, environ={})
    finally:
        s.close()
    with pytest.raises(PlanError, match="does not resolve"):
        make_plan(PoolSpec(2, master_addr="no-such-host.invalid"), gpus=NO_GPU, environ={})
    with pytest.raises(PlanError, match="is not an address of this machine"):
        make_plan(PoolSpec(2, master_addr="192.0.2.1"), gpus=NO_GPU, environ={})


def test_lenient_plans_keep_the_request_and_say_why():
    plan = make_plan(PoolSpec(2, backend="nccl", master_addr="192.0.2.1"), gpus=NO_GPU, environ={}, strict=False)
    assert plan.backend == "nccl" and "none is visible" in plan.backend_reason
    assert plan.master_addr == "192.0.2.1" and 0 < plan.master_port < 65536


@pytest.mark.parametrize(
    "requested, n, gpus, want",
    [("auto", 2, 2, "nccl"), ("auto", 4, 2, "gloo"), ("auto", 2, 0, "gloo"), ("gloo", 2, 2, "gloo"), ("nccl", 2, 4, "nccl"), ("mpi", 2, 0, "mpi")],
)
def test_backend_choice(requested, n, gpus, want):
    assert choose_backend(requested, n, GPUInfo(count=gpus, cuda_built=True))[0] == want


def test_nccl_needs_a_gpu_per_rank():
    with pytest.raises(PlanError, match="one rank per GPU"):
        choose_backend("nccl", 4, GPUInfo(count=2, cuda_built=True))
    with pytest.raises(PlanError, match="unknown backend"):
        choose_backend("tcp", 2, NO_GPU)


# ---------------------------------------------------------------- threads per rank
@pytest.mark.parametrize("nproc, cpus, want", [(1, 8, 8), (3, 8, 2), (8, 8, 1), (16, 4, 1), (0, 4, 4)])
def test_threads_per_rank_share_the_cores(nproc, cpus, want):
    assert threads_per_rank(nproc, cpus) == want


def test_usable_cpus_is_the_affinity_mask():
    assert usable_cpus() == len(os.sched_getaffinity(0))
    assert threads_per_rank(1) == usable_cpus()


# ---------------------------------------------------------------- addresses and ports
@pytest.mark.parametrize(
    "addr, family",
    [("127.0.0.1", socket.AF_INET), ("10.1.2.3", socket.AF_INET), ("localhost", socket.AF_INET), ("::1", socket.AF_INET6), ("fe80::1%eth0", socket.AF_INET6)],
)
def test_address_family(addr, family):
    assert net.address_family(addr) == family


def test_any_address():
    assert net.any_address(socket.AF_INET) == "0.0.0.0" and net.any_address(socket.AF_INET6) == "::"


def test_free_port_binds_in_the_address_family():
    assert 0 < net.free_port() < 65536
    if not net.is_local_ip(socket.AF_INET6, "::1"):
        pytest.skip("no IPv6 loopback here")
    assert 0 < net.free_port("::1") < 65536


def test_a_master_port_nobody_gave_is_below_the_ephemeral_range_and_free():
    """bind(0) hands out ephemeral ports, the ones every outgoing connection takes its source port from: by the time a
    store binds such a MASTER_PORT, a connection on the host may hold it (EADDRINUSE, seen in a box torchrun run)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = map(int, f.read().split())
    held = listening_socket()
    try:
        for _ in range(20):
            port = make_plan(PoolSpec(2), gpus=NO_GPU, environ={}).master_port
            assert net.MASTER_PORTS[0] <= port <= net.MASTER_PORTS[1] and not low <= port <= high, port
            assert net.port_free("127.0.0.1", port)
            assert net.master_port("127.0.0.1", avoid=port) != port
        taken = held.getsockname()[1]
        assert not net.port_free("127.0.0.1", taken)
    finally:
        held.close()


def test_local_addresses_and_resolving():
    assert net.is_local_ip(socket.AF_INET, "127.0.0.1")
    assert not net.is_local_ip(socket.AF_INET, "192.0.2.1")
    assert (socket.AF_INET, "127.0.0.1") in net.resolve("127.0.0.1")
    with pytest.raises(socket.gaierror):
        net.resolve("no-such-host.invalid")


def test_port_holder_names_the_process():
    s = listening_socket()
    try:
        assert f"pid {os.getpid()}" in (net.port_holder(s.getsockname()[1]) or "")
    finally:
        s.close()
    assert net.port_holder(net.free_port()) is None


@pytest.mark.parametrize("port, words", [(0, "is not a TCP port"), (70000, "is not a TCP port")])
def test_validate_master_port_range(port, words):
    with pytest.raises(PlanError, match=words):
        net.validate_master_port("127.0.0.1", port)


def test_validate_master_addr():
    net.validate_master_addr("127.0.0.1")
    with pytest.raises(PlanError, match="use 127.0.0.1 on one machine"):
        net.validate_master_addr("no-such-host.invalid")


# ---------------------------------------------------------------- GPUs and torch's backends
def test_cuda_initialised_never_imports_torch():
    assert gpus.cuda_initialised({}) is False
    hot = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: True))
    assert gpus.cuda_initialised({"torch": hot}) is True
    broken = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: 1 / 0))
    assert gpus.cuda_initialised({"torch": broken}) is False


def test_backend_availability_from_an_imported_torch_distributed():
    fake = types.SimpleNamespace(is_available=lambda: True, is_nccl_available=lambda: True, is_gloo_available=lambda: True, is_mpi_available=lambda: False)
    info = backend_availability({"torch.distributed": fake})
    assert info.available == {"nccl": True, "gloo": True, "mpi": False}
    assert "already imported" in info.source
    off = types.SimpleNamespace(is_available=lambda: False)
    assert backend_availability({"torch.distributed": off}).available == {"nccl": False, "gloo": False, "mpi": False}


def _fake_torch(tmp_path, defs: str, cuda: str = "None", nccl_lib: bool = False) -> str:
    torch_dir = tmp_path / "site" / "torch"
    cmake = torch_dir / "share" / "cmake" / "Caffe2"
    cmake.mkdir(parents=True)
    (cmake / "Caffe2Targets.cmake").write_text(f'set_target_properties(torch_cpu PROPERTIES\n  INTERFACE_COMPILE_DEFINITIONS "{defs}"\n)\n')
    (torch_dir / "version.py").write_text(f"__version__ = '2.13.0'\ncuda = {cuda}\n")
    if nccl_lib:
        lib = tmp_path / "site" / "nvidia" / "nccl" / "lib"
        lib.mkdir(parents=True)
        (lib / "libnccl.so.2").write_bytes(b"")
    return str(torch_dir)


def test_backend_availability_from_torch_build_files(tmp_path):
    cpu = backend_availability({}, _fake_torch(tmp_path / "a", "USE_DISTRIBUTED;USE_C10D_GLOO"))
    assert cpu.available == {"nccl": False, "gloo": True, "mpi": False}
    assert "not imported" in cpu.source
    gpu = backend_availability({}, _fake_torch(tmp_path / "b", "USE_DISTRIBUTED;USE_C10D_GLOO;USE_C10D_MPI", cuda="'12.4'", nccl_lib=True))
    assert gpu.available == {"nccl": True, "gloo": True, "mpi": True}
    nodist = backend_availability({}, _fake_torch(tmp_path / "c", "USE_RPC"))
    assert not any(nodist.available.values())
    empty = tmp_path / "d" / "torch"
    empty.mkdir(parents=True)
    assert backend_availability({}, str(empty)).available == {"nccl": None, "gloo": None, "mpi": None}
    assert gpus.torch_built_with_cuda(_fake_torch(tmp_path / "e", "", cuda="'12.4'"))


def test_port_holder_names_the_process_while_it_opens_and_closes_descriptors():
    """A descriptor that closes during the scan must not hide the process (a CI run read "another user's process"
    for the test's own socket while its other threads opened and closed files)."""
    below = [open(os.devnull) for _ in range(100)]
    s = listening_socket()  # above the churned descriptors, so the scan meets them first
    for f in below:
        f.close()
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            for f in [open(os.devnull) for _ in range(50)]:
                f.close()

    threads = [threading.Thread(target=churn, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        seen = {net.port_holder(s.getsockname()[1]) for _ in range(20)}  # the old scan missed 15 of 20
    finally:
        stop.set()
        for t in threads:
            t.join()
        s.close()
    assert all(f"pid {os.getpid()}" in (who or "") for who in seen), seen
