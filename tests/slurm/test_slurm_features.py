"""What works on one machine works on Slurm ranks: input(), breakpoint() and %ddp_debug, --profile, --mesh, FSDP2 results,
the last words of a rank that exits at once, a raise re-formed in place, --timeout's forensics and ddp_magic.log's rows,
on the local two-node Slurm (n1, n2), the control channel through TLS.

The local counterparts: tests/kernel/test_debugging.py, test_profile.py, test_sharded.py, test_recovery.py,
test_metrics.py. One kernel, one allocation (a new -n or --mesh inside it is a new pool forked from the same node templates). Every cell runs twice.
"""
from __future__ import annotations

import json
import subprocess
import re

import pytest

import slurm_fixtures
from slurm_fixtures import our_jobs, wait_no_jobs
from format_patterns import SECONDS
from conftest import wait_until
from slurm_helpers import Kernel

pytestmark = [pytest.mark.kernel, pytest.mark.slow, pytest.mark.slurm]
slurm_cluster = slurm_fixtures.slurm_cluster  # the fixtures, by name in this module

START = "%%ddp --slurm --nodes 2 --ntasks-per-node 2\nimport os, torch, torch.distributed as dist\n"
NODES = ["n1", "n1", "n2", "n2"]


@pytest.fixture(scope="module")
def fk(slurm_cluster):
    """The module's kernel (TLS forced) with a pool of 2 nodes × 2 ranks; the allocation ends with the module."""
    slurm_fixtures.cancel_our_jobs()
    k = Kernel(extra_env={"DDP_MAGIC_FORCE_TLS": "1"})
    k.run("%load_ext ddp_magic\nimport torch, ddp_magic").ok()
    k.run(START, timeout=180).ok()
    yield k
    k.run("%ddp stop", timeout=60)
    k.shutdown()
    assert wait_no_jobs(10) == [], "%ddp stop released the allocation"


def script(*replies: str):
    left = list(replies)
    return lambda prompt, password: left.pop(0)


def test_input_on_a_rank_of_n2_asks_the_notebook(fk):
    for _attempt in range(2):
        ex = fk.run("%%ddp\nname = input('name? ') if dist.get_rank() == 3 else os.environ['SLURMD_NODENAME']\nname",
                    answer=script("Ada"), timeout=60).ok()
        assert len(ex.prompts) == 1 and re.fullmatch(r"\[rank 3 n2\] name\? ", ex.prompts[0][0]), ex.prompts
        assert fk.value("list(_)") == ["n1", "n1", "n2", "Ada"]


def test_breakpoint_on_a_rank_of_n2_steps_and_continues(fk):
    sent = []

    def answer(prompt: str, password: bool) -> str:
        assert re.fullmatch(r"\[rank 2 n2\] \(Pdb\) ", prompt), prompt
        sent.append(["p x", "n", "p y", "c"][len(sent)])
        return sent[-1]

    cell = "%%ddp\nx = 40 + dist.get_rank()\nif dist.get_rank() == 2:\n    breakpoint()\ny = x + 1\nt = torch.ones(1)\ndist.all_reduce(t)\n(y, t.item())"
    for _attempt in range(2):
        sent.clear()
        ex = fk.run(cell, answer=answer, timeout=120).ok()
        assert sent == ["p x", "n", "p y", "c"]
        assert re.search(r"\[rank 2 n2\] 42\b", ex.stdout) and re.search(r"\[rank 2 n2\] 43\b", ex.stdout), ex.stdout
        assert fk.value("[tuple(v) for v in _]") == [(41 + r, 4.0) for r in range(4)]


def test_ddp_debug_after_a_failure_on_n2(fk):
    cell = ("%%ddp\ndef step():\n    width = 3 + dist.get_rank()\n    if dist.get_rank() == 3:\n        raise ValueError(f'width {width}')\n"
            "    return width\nstep()")
    for _attempt in range(2):
        ex = fk.run(cell, timeout=60)
        assert ex.error is not None and "width 6" in str(ex.error)
        ex = fk.run("%ddp_debug 3", answer=script("p width", "q"), timeout=60).ok()
        assert re.fullmatch(r"\[rank 3 n2\] \(Pdb\) ", ex.prompts[0][0]), ex.prompts
        assert re.search(r"\[rank 3 n2\] 6\b", ex.stdout) and "post-mortem of rank 3" in ex.stdout, ex.stdout


def test_profile_is_one_trace_with_lanes_per_node_and_rank(fk, tmp_path):
    cell = "import ddp_magic, time\nx = torch.ones(1000)\nfor i in range(4):\n    dist.all_reduce(x)\n    ddp_magic.log(step=i, x=float(x[0]))\n"
    for attempt in range(2):
        path = tmp_path / f"trace{attempt}.json"
        ex = fk.run(f"%%ddp --profile {path}\n{cell}", timeout=180).ok()
        assert "https://ui.perfetto.dev" in ex.stdout
        events = json.loads(path.read_text())["traceEvents"]
        lanes = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
        for rank, node in enumerate(NODES):
            assert lanes.get(rank * 100) == f"rank {rank} {node}", lanes
            mine = [e for e in events if e.get("ph") == "X" and rank * 100 <= e["pid"] < rank * 100 + 100]
            assert any(e["name"].startswith("gloo:all_reduce") or e["name"] == "c10d::allreduce_" for e in mine), f"rank {rank}: no collective"
            steps = [e["name"] for e in events if e.get("cat") == "ddp_magic" and e["pid"] == rank * 100]
            assert steps == [f"step {i}" for i in range(4)]


def test_a_rank_that_exits_at_once_keeps_its_last_words(fk):
    for _attempt in range(2):
        ex = fk.run("%%ddp\nimport sys\nif dist.get_rank() == 3:\n    print('last words', flush=True)\n"
                    "    sys.stderr.write('and an error\\n'); sys.stderr.flush()\n    os._exit(3)\n1", timeout=120)
        assert ex.error is not None
        assert "[rank 3 n2] last words" in ex.stdout + ex.stderr and "and an error" in ex.stderr, (ex.stdout, ex.stderr)
        fk.run("%%ddp\nimport os, torch, torch.distributed as dist\nx = torch.ones(1)\ndist.all_reduce(x)\nx.item()", timeout=120).ok()
        assert fk.value("list(_)") == [4.0] * 4, "the rank came back (forked by n2's template) and the group is whole"


def test_mesh_and_fsdp2_results_across_the_nodes(fk):
    setup = ("%%ddp --slurm --nodes 2 --ntasks-per-node 2 --mesh dp=2,tp=2\nimport os, torch, torch.nn as nn, torch.distributed as dist\n"
             "from torch.distributed.fsdp import fully_shard\nfrom torch.distributed.tensor import Shard, distribute_tensor\n"
             "torch.manual_seed(0)\nmodel = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))\n"
             "for layer in (model[0], model[2]):\n    fully_shard(layer, mesh=mesh['dp'])\nfully_shard(model, mesh=mesh['dp'])\n")
    ex = fk.run(setup, timeout=240).ok()
    assert "in the same Slurm allocation: no new queue wait" in ex.stdout and len(our_jobs()) == 1
    for _attempt in range(2):
        fk.run("%%ddp --out names\n(mesh.mesh_dim_names, tuple(mesh.mesh.shape), os.environ['SLURMD_NODENAME'])").ok()
        assert fk.value("[tuple(v) for v in names]") == [(("dp", "tp"), (2, 2), node) for node in NODES]
        ex = fk.run("%%ddp --out g\ndistribute_tensor(torch.arange(48.).reshape(6, 8), mesh, [Shard(0), Shard(1)])").ok()
        assert ex.result.splitlines()[0] == "ShardedResult (6, 8) float32 — Shard(0), Shard(1) on mesh dp=2 × tp=2 (cpu)"
        assert fk.value("torch.equal(g.full(), torch.arange(48.).reshape(6, 8))") is True
        ex = fk.run("%%ddp --out w\nmodel[0].weight").ok()
        assert ex.result.startswith("ShardedResult (7, 5) float32 — Shard(0) on mesh")
        fk.run("%%ddp --out ft\nmodel[0].weight.full_tensor()").ok()
        assert fk.value("torch.equal(w.full(), ft[0]), all(torch.equal(ft[0], t) for t in ft)") == (True, True)


def test_a_rank_on_n2_raises_while_the_others_wait_and_the_group_re_forms_in_place(fk):
    """Recovery on Slurm ranks: the raise is named, the waiting ranks released, the group re-formed across both nodes."""
    fk.run("%%ddp\nkept = dist.get_rank() * 10\nos.getpid()", timeout=120).ok()
    pids = fk.value("list(_)")
    cell = "%%ddp\nx = torch.ones(3)\nif dist.get_rank() == 2:\n    raise ValueError('rank 2 cannot go on')\ndist.all_reduce(x)\nx"
    for _attempt in range(2):  # the second failure re-forms the re-formed group
        msg = fk.run(cell, timeout=120).error[1]
        assert msg.startswith("rank 2 raised ValueError: rank 2 cannot go on"), msg
        assert re.search(r"ranks 0-1, 3 were in all_reduce #\d+ \(at cell line 5: dist\.all_reduce\(x\)\) and were released", msg), msg
        assert re.search(r"the process group was re-formed in " + SECONDS + r"; your variables are intact", msg), msg
        fk.run("%%ddp\ny = torch.ones(1)\ndist.all_reduce(y)\n(y.item(), kept, os.getpid(), os.environ['SLURMD_NODENAME'])", timeout=120).ok()
        assert fk.value("[tuple(v) for v in _]") == [(4.0, 10 * r, pid, node) for r, (pid, node) in enumerate(zip(pids, NODES))]


def test_a_timeout_names_the_rank_on_n2_that_never_arrived(fk):
    """Hang forensics on Slurm ranks: --timeout asks every rank over the control channel where it is."""
    cell = "%%ddp --timeout 3\nimport time\nif dist.get_rank() == 3:\n    time.sleep(60)\ndist.barrier()"
    for _attempt in range(2):
        msg = fk.run(cell, timeout=120).error[1]
        assert msg.startswith("the cell ran past --timeout 3s, waiting for rank 3\n"), msg
        assert re.search(r"rank 3 never arrived at barrier #\d+ \(rank 3 at cell line 4: time\.sleep\(60\)\)", msg), msg
        assert re.search(r"ranks 0-2 were in barrier #\d+", msg), msg
        fk.run("%%ddp\nz = torch.ones(1)\ndist.all_reduce(z)\nz.item()", timeout=120).ok()
        assert fk.value("list(_)") == [4.0] * 4, "every rank, n2's too, is back and the group is whole"


def test_stacks_of_a_job_on_both_nodes_group_the_rank_on_n2_that_sleeps(fk, tmp_path):
    """%ddp stacks on Slurm ranks while a --bg job runs: rank 3 (n2) in slow_part, the others in barrier."""
    gate, shown = tmp_path / "gate", [""]
    for _attempt in range(2):
        gate.touch()
        fk.run(f"%%ddp --bg --out job\nimport time\ndef slow_part():\n    while os.path.exists({str(gate)!r}):\n        time.sleep(0.05)\n"
               "if dist.get_rank() == 3:\n    slow_part()\ndist.barrier()\n1", timeout=60).ok()

        def two_groups() -> bool:
            shown[:] = [fk.run("%ddp stacks", timeout=60).ok().stdout]
            return "--- rank 3 ---" in shown[0] and "--- ranks 0-2 (3) ---" in shown[0]

        assert wait_until(two_groups, 60, 0.3), shown
        assert "in slow_part" in shown[0].split("--- ranks 0-2 (3) ---")[0] and " in barrier" in shown[0], shown
        gate.unlink()
        fk.run("job.wait(120)", timeout=150).ok()
        assert fk.value("list(job.result())") == [1, 1, 1, 1]


def test_ddp_magic_log_rows_come_from_every_node_complete(fk):
    cell = ("%%ddp\nimport ddp_magic\nfor step in range(50):\n"
            "    ddp_magic.log(step=step, loss=float(dist.get_rank() * 1000 + step))")
    for _attempt in range(2):
        fk.run(cell, timeout=120).ok()
        fk.run("m = %ddp metrics").ok()
        m = fk.value("{k: v for k, v in m.items() if k != 'time'}")
        for rank in range(4):
            rows = [(s, v) for r, s, v in zip(m["rank"], m["step"], m["loss"]) if r == rank]
            assert rows == [(s, float(rank * 1000 + s)) for s in range(50)], (rank, rows[:3])


TRAIN_ON = ("import time, ddp_magic\nseen = {}\nwhile True:\n    step += 1\n    opt.zero_grad()\n"
            "    model(torch.randn(8, 4)).pow(2).mean().backward()\n    opt.step()\n    seen[step] = model.module.weight.sum().item()\n"
            "    ddp_magic.log(step=step, w=seen[step])\n    time.sleep(0.01)\n")


def _preempted_then_loaded(fk, folder, scancel) -> None:
    """A --bg training armed with --save-on-preempt ``folder``; ``scancel *scancel`` of its allocation; the step the
    cell says is saved, nothing of the allocation is left, and a new allocation loads that step's weights."""
    fk.run(START + "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))\n"
           "opt = torch.optim.SGD(model.parameters(), lr=0.01)\nstep = 0", timeout=240).ok()
    fk.elsewhere.clear()
    fk.run(f"%%ddp --bg --out job --save-on-preempt {folder}\n" + TRAIN_ON, timeout=60).ok()
    running = wait_until(lambda: len(fk.value("job.metrics['step']")) > 40, timeout=120)
    assert running, (fk.value("repr(job)"), "".join(m["content"].get("text", "") for m in fk.elsewhere if m["msg_type"] == "stream")[-3000:])
    assert fk.armed(), "the ranks heard the arming (a signal before it ends the pool unsaved)"
    (job_id,) = [line.split()[0] for line in our_jobs()]
    subprocess.run(["scancel", *scancel, job_id], check=True, timeout=20)
    fk.run("job.wait()", timeout=300).ok()
    said = "".join(m["content"].get("text", "") for m in fk.elsewhere if m["msg_type"] == "stream")
    where = re.escape(str(folder))
    preempted = re.search(rf"preempted: saved step (\d+) to {where}/step-\S+ \([\d.]+ s\); %ddp load {where} on the next allocation", said)
    assert preempted, said[-3000:]
    assert wait_no_jobs(10) == [], "nothing of the preempted allocation is left"
    k = int(preempted.group(1))
    loaded = fk.run(f"%ddp load {folder} --slurm --nodes 2 --ntasks-per-node 2", timeout=240).ok()
    assert f"(step {k}, saved by 4 ranks) into 4 ranks" in loaded.stdout, loaded.stdout
    fk.run("%%ddp --out after\n(step, max(seen), model.module.weight.sum().item() == seen[step])", timeout=120).ok()
    assert fk.value("list(after)") == [(k, k, True)] * 4


def test_a_slurm_warning_saves_at_a_safe_point_and_the_next_allocation_goes_on(fk, tmp_path):
    """--save-on-preempt: scancel --signal=USR1 (what --signal=USR1@120 sends before the time limit) reaches the node
    templates, which pass it to their ranks; the job is saved at its next safe point, its allocation released, and a new
    allocation goes on from the snapshot with one %ddp load."""
    _preempted_then_loaded(fk, tmp_path / "ckpt", ["--signal=USR1"])


def test_a_slurm_cancel_is_saved_between_its_sigterm_and_the_sigkill_after_killwait(fk, tmp_path):
    """What a preemption or the time limit does to a job's steps: SIGCONT and SIGTERM, then SIGKILL after KillWait
    (2 s on this Slurm: scripts/local_slurm.py). A plain scancel does the same. The armed pool's templates pass the
    SIGTERM on, the job is saved at its next safe point inside those 2 s, and a new allocation goes on from it."""
    _preempted_then_loaded(fk, tmp_path / "ckpt", [])  # no --signal: the cancel itself
