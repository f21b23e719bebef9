"""The GPU path (nccl, device pinning, GPU memory). Runs where NVIDIA GPUs are visible;
skipped with the reason elsewhere. The decisions behind it (backend, device mapping) are plain
Python, tested everywhere with fake device counts in tests/unit/test_plan.py and test_gpu_logic below."""
from __future__ import annotations

import time

import pytest

from ddp_magic.errors import PlanError
from ddp_magic.plan.gpus import GPUInfo, detect_gpus, device_map
from ddp_magic.plan.plan import choose_backend

GPUS = detect_gpus()
needs_gpu = pytest.mark.skipif(GPUS.count == 0, reason=f"no NVIDIA GPU visible here ({GPUS.source})")
needs_2_gpus = pytest.mark.skipif(GPUS.count < 2, reason=f"needs 2 GPUs, {GPUS.count} visible")


# ------------------------------------------------------------------ logic, everywhere
def test_gpu_logic_auto_prefers_nccl_only_with_a_gpu_per_rank():
    assert choose_backend("auto", 4, GPUInfo(count=8, cuda_built=True))[0] == "nccl"
    backend, why = choose_backend("auto", 4, GPUInfo(count=2, cuda_built=True))
    assert backend == "gloo" and "NCCL needs one GPU per rank" in why
    with pytest.raises(PlanError, match="-n 4 with nccl needs 4 GPUs but 2 are visible"):
        choose_backend("nccl", 4, GPUInfo(count=2, cuda_built=True))


def test_gpu_logic_visible_devices_map_onto_local_ranks():
    assert device_map(3, {"CUDA_VISIBLE_DEVICES": "4,6,7"}) == {0: "cuda:0 (physical GPU 4)", 1: "cuda:1 (physical GPU 6)", 2: "cuda:2 (physical GPU 7)"}
    assert device_map(2, {}) == {0: "cuda:0", 1: "cuda:1"}


def test_gpu_logic_detect_respects_cuda_visible_devices(tmp_path):
    for i in range(4):
        (tmp_path / f"0000:0{i}:00.0").mkdir()
    info = detect_gpus({"CUDA_VISIBLE_DEVICES": "1,3"}, proc_root=str(tmp_path))
    assert info.count == (2 if info.cuda_built else 0)
    info = detect_gpus({"CUDA_VISIBLE_DEVICES": ""}, proc_root=str(tmp_path))
    assert info.count == 0


# ------------------------------------------------------------------ real GPUs
@pytest.fixture(scope="module")
def gpu_kernel():
    from kernel_helper import Kernel

    k = Kernel()
    k.run("%load_ext ddp_magic").ok()
    yield k
    k.shutdown()


@needs_gpu
@pytest.mark.gpu
def test_cuda_in_kernel_first_then_nccl_pool_pins_devices(gpu_kernel):
    gpu_kernel.run("import torch\nkernel_tensor = torch.ones(1, device='cuda')").ok()  # CUDA initialised in the kernel
    n = min(GPUS.count, 2)
    gpu_kernel.run(f"%%ddp -n {n}\nimport torch, torch.distributed as dist\n(dist.get_backend(), torch.cuda.current_device())", timeout=240).ok()
    assert gpu_kernel.value("[tuple(v) for v in _]") == [("nccl", r) for r in range(n)]


@needs_gpu
@pytest.mark.gpu
def test_gpu_tensors_come_back_as_cpu_tensors_via_all_gather(gpu_kernel):
    gpu_kernel.run("%%ddp\nt = torch.full((1024, 1024), float(dist.get_rank()), device='cuda')\nt").ok()
    got = gpu_kernel.value("[(str(v.device), v.mean().item()) for v in _]")
    assert got == [("cpu", float(r)) for r in range(len(got))]


@needs_gpu
@pytest.mark.gpu
def test_gpu_memory_is_reported(gpu_kernel):
    gpu_kernel.run("%%ddp\nbig = torch.empty(256 * 2**20, dtype=torch.uint8, device='cuda')").ok()
    mem = gpu_kernel.value("[i.memory for i in get_ipython().magics_manager.registry['DDPMagics'].pool.ranks.values()]")
    assert all(m is not None and m >= 256 * 2**20 for m in mem)


@needs_gpu
@pytest.mark.gpu
def test_nccl_debug_output_is_attributed(gpu_kernel):
    ex = gpu_kernel.run(
        "%%ddp --nccl-debug INFO\nimport torch, torch.distributed as dist\nx = torch.ones(1, device='cuda')\ndist.all_reduce(x)\nx.item()", timeout=240
    ).ok()
    assert "NCCL INFO" in ex.stdout + ex.stderr and "[rank 0]" in ex.stdout + ex.stderr


@needs_2_gpus
@pytest.mark.gpu
def test_dead_rank_mid_nccl_all_reduce_ends_promptly(gpu_kernel):
    gpu_kernel.run("%%ddp -n 2 --pg-timeout 30\nimport torch, torch.distributed as dist", timeout=240).ok()
    t0 = time.monotonic()
    ex = gpu_kernel.run(
        "%%ddp\nimport os\nx = torch.ones(1, device='cuda')\nif dist.get_rank() == 1:\n    os._exit(9)\ndist.all_reduce(x)\ntorch.cuda.synchronize()",
        timeout=120,
    )
    took = time.monotonic() - t0
    print(f"nccl: dead rank mid all_reduce reported in {took:.1f}s")
    assert ex.error is not None and "rank 1" in ex.error[1] and took < 30  # promise: named before --pg-timeout (30 s) ends the collective


@needs_gpu
@pytest.mark.gpu
def test_too_many_ranks_for_nccl_is_refused(gpu_kernel):
    ex = gpu_kernel.run(f"%%ddp -n {GPUS.count + 1} --backend nccl\n1")
    assert ex.error is not None and "NCCL allows one rank per GPU" in ex.error[1]


def test_gpu_logic_ddp_env_shows_the_device_of_each_rank():
    from ddp_magic.plan.plan import make_plan
    from ddp_magic.plan.spec import PoolSpec
    from ddp_magic.ui.report import plan_report

    plan = make_plan(PoolSpec(2, backend="nccl"), gpus=GPUInfo(count=4, cuda_built=True), environ={}, strict=False)
    report = plan_report(plan, environ={"CUDA_VISIBLE_DEVICES": "2,3"})
    assert "rank 0 → cuda:0 (physical GPU 2), rank 1 → cuda:1 (physical GPU 3)" in repr(report)
    assert report.to_dict()["devices"] == {0: "cuda:0 (physical GPU 2)", 1: "cuda:1 (physical GPU 3)"}


@needs_gpu
@pytest.mark.gpu
def test_a_background_save_of_a_cuda_model_stages_it_in_pinned_memory_and_loads_back(gpu_kernel, tmp_path):
    """%ddp save --bg copies a GPU model's share to pinned host memory (one wait for every asynchronous copy), the
    threads write it, and %ddp load puts the same weights back on each rank's GPU."""
    n = min(GPUS.count, 2)
    gpu_kernel.run("%ddp stop").ok()
    gpu_kernel.run(f"%%ddp -n {n}\nimport torch, torch.distributed as dist\ntorch.manual_seed(0)\n"
                   "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1024, 1024).cuda())\n"
                   "opt = torch.optim.Adam(model.parameters())\nmodel(torch.ones(4, 1024, device='cuda')).sum().backward()\nopt.step()",
                   timeout=240).ok()
    gpu_kernel.run(f"%ddp save {tmp_path} --bg", timeout=240).ok()
    gpu_kernel.run("%%ddp --out staged\nimport ddp_magic.procs.rank_snapshot_bg as _bg\n_bg.WRITER.pinned", timeout=60).ok()
    assert sum(gpu_kernel.value("list(staged)")) >= 1024 * 1024 * 4, "the weights went through pinned memory"
    gpu_kernel.run("%%ddp --out before\nmodel.module.weight.sum().item()", timeout=60).ok()
    gpu_kernel.run("%ddp stop", timeout=120).ok()
    gpu_kernel.run(f"%ddp load {tmp_path} -n {n}", timeout=240).ok()
    gpu_kernel.run("%%ddp --out after\n(model.module.weight.device.type, model.module.weight.sum().item())", timeout=60).ok()
    assert gpu_kernel.value("[tuple(v) for v in after]") == [("cuda", v) for v in gpu_kernel.value("list(before)")]
