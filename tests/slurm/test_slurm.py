"""%%ddp --slurm against a real Slurm: two nodes (n1, n2) on this machine (conftest.py starts it once per session).

One kernel (TLS forced, so the two-node case runs the encrypted control channel) carries
the training, status, recovery, queue and refusal cases in order; the allocation-found
case has a kernel whose process is salloc's command, as on a cluster. Every cell runs
twice: notebook users re-run cells. After each test squeue lists no job of ours.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest

import slurm_fixtures
from slurm_fixtures import our_jobs, wait_no_jobs
from slurm_helpers import Kernel, cmdline, env_of, job_state, kernel_inside_salloc, parent_of, run_interrupting, says, slurm_ranks

pytestmark = [pytest.mark.kernel, pytest.mark.slow, pytest.mark.slurm]
slurm_cluster = slurm_fixtures.slurm_cluster  # the fixtures, by name in this module
no_jobs_left = slurm_fixtures.no_jobs_left

TRAIN = """%%ddp --slurm --nodes 2 --ntasks-per-node 2
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(dist.get_rank())  # each rank its own data
for _ in range(5):
    opt.zero_grad()
    model(torch.randn(8, 4, generator=g)).pow(2).mean().backward()
    opt.step()
print("node", os.environ["SLURMD_NODENAME"], "rank", dist.get_rank(), flush=True)
(os.environ["SLURMD_NODENAME"], torch.cat([p.detach().flatten() for p in model.parameters()]).tolist())
"""


@pytest.fixture(scope="module")
def sk(slurm_cluster):
    """The module's kernel: the control channel forced through TLS (every rank is on this host, as the test nodes are).
    Its pools are kept here and their Slurm jobs cancelled: their records go to a runtime directory of the kernel's own
    (kernel_helper's, removed at its shutdown), never the user's."""
    k = Kernel(extra_env={"DDP_MAGIC_FORCE_TLS": "1"})
    assert k.runtime is not None
    k.run("%load_ext ddp_magic").ok()
    yield k
    k.run("%ddp stop", timeout=60)
    k.shutdown()


def test_two_nodes_train_ddp_over_tls(sk, no_jobs_left):
    for attempt in range(2):  # the second run: the same pool, the same allocation
        ex = sk.run(TRAIN, timeout=180).ok()
        values = sk.value("[(v[0], v[1]) for v in _]")
        assert [v[0] for v in values] == ["n1", "n1", "n2", "n2"], "block distribution: ranks 0-1 on n1, 2-3 on n2"
        first = values[0][1]
        assert all(v[1] == first for v in values), "DDP keeps the weights identical on every rank"
        for rank, node in enumerate(["n1", "n1", "n2", "n2"]):
            assert f"[rank {rank} {node}] node {node} rank {rank}" in ex.stdout, "each rank's output names its node"
        if attempt == 0:
            assert re.search(r"Slurm job \d+ on n1,n2: allocated for this kernel.*\(control channel: TLS\)", ex.stdout)
        else:
            assert "Slurm job" not in ex.stdout, "a warm cell says nothing about the allocation again"
    status = sk.run("%ddp status").ok().stdout
    job = re.search(r"Slurm job (\d+) \(running\) on n1,n2", status)
    assert job, status
    assert job_state(job.group(1)) == "RUNNING"
    assert re.findall(r"rank (\d): pid \d+ +\w+ +cpu +on (n\d)", status) == [("0", "n1"), ("1", "n1"), ("2", "n2"), ("3", "n2")]
    secret = sk.value("get_ipython().magics_manager.registry['DDPMagics'].pool.secret.hex()")
    pids = [int(p) for p in re.findall(r"pid (\d+)", status)]
    for pid in pids:  # the secret travels in the step's env sealed by MUNGE (srun's wire is clear), never in a command line
        assert secret not in cmdline(pid)
        env = env_of(pid) or {}
        assert b"DDP_MAGIC_SECRET" not in env and env.get(b"DDP_MAGIC_SECRET_MUNGE", b"").startswith(b"MUNGE:") and b"DDP_MAGIC_TLS" in env
        assert not any(secret.encode() in value for value in env.values())
    for pid in slurm_ranks():
        assert secret not in cmdline(pid)
    templates = {parent_of(pid) for pid in pids}
    assert len(templates) == 2, "one template a node"
    for n, nodes in ((2, ["n1", "n2"]), (4, ["n1", "n1", "n2", "n2"])):  # a new -n inside the same allocation: no queue, no import
        ex = sk.run(f"%%ddp -n {n}\nimport os, torch.distributed as dist\n"
                    "(dist.get_world_size(), os.environ['SLURM_JOB_ID'], os.environ['SLURMD_NODENAME'], os.getppid())", timeout=180).ok()
        values = sk.value("[tuple(v) for v in _]")
        assert [v[:3] for v in values] == [(n, job.group(1), node) for node in nodes]
        assert {v[3] for v in values} == templates, "the new pool's ranks are forks of the same node templates"
        new_secret = sk.value("get_ipython().magics_manager.registry['DDPMagics'].pool.secret.hex()")
        assert new_secret != secret
        for pid in slurm_ranks():  # the new pool's secret reached the templates sealed: in no command line, no env
            assert new_secret not in cmdline(pid) and new_secret.encode() not in b" ".join((env_of(pid) or {}).values())
        assert "in the same Slurm allocation: no new queue wait" in ex.stdout
        assert our_jobs() == [f"{job.group(1)} RUNNING"]
        kept = sk.run("%ddp keep").ok().stdout  # docs/keep.md, "Slurm": a TLS pool is kept too (an attach pins a new key)
        assert "kept pool" in kept, kept
        assert "no longer kept" in sk.run("%ddp keep --off").ok().stdout, "and is its kernel's again"
    stop = sk.run("%ddp stop").ok()
    assert stop.stdout.strip() == f"stopped the pool; its workers have exited; Slurm job {job.group(1)} released: its nodes are free", stop.stdout
    assert wait_no_jobs(10) == [], "%ddp stop releases the allocation we made, and says so"


def test_a_background_cell_s_pool_and_allocation_outlive_its_job(sk, no_jobs_left):
    """The job's thread starts salloc and the node templates; they ask for a parent-death signal, which Linux sends
    when that *thread* ends: started there, the allocation went with the job. They start on a lasting thread."""
    for _attempt in range(2):
        cell = "%%ddp --slurm --nodes 2 --ntasks-per-node 2 --bg --out job\nimport os\n(os.environ['SLURM_JOB_ID'], os.getpid())"
        sk.run(cell, timeout=60).ok()
        assert sk.value("job.wait(180)") is True, sk.run("repr(job)").result
        ran = [tuple(v) for v in sk.value("[list(v) for v in job.result()]")]
        time.sleep(2)  # the job's thread has ended
        assert our_jobs() == [f"{ran[0][0]} RUNNING"], "the allocation outlives the job"
        sk.run("%%ddp\nimport os\n(os.environ['SLURM_JOB_ID'], os.getpid())", timeout=120).ok()
        assert [tuple(v) for v in sk.value("[list(v) for v in _]")] == ran, "the same ranks answer the next cell"
    sk.run("%ddp stop").ok()
    assert wait_no_jobs(10) == []


def test_a_kept_pool_whose_job_slurm_ended_gives_way_to_the_next_cell(sk, no_jobs_left):
    """A kept pool's job cancelled from outside (scancel, its time limit): the next cell, with other options, starts a
    new pool in a new allocation, saying so; nothing of the old one is asked to undo the keep (its srun and salloc are
    gone: the kernel once raised ProcessLookupError, then 'the template did not answer')."""
    for _attempt in range(2):
        sk.run("%%ddp --slurm --nodes 2 --ntasks-per-node 1\nimport os\nos.environ['SLURM_JOB_ID']", timeout=180).ok()
        old = sk.value("_[0]")
        assert "kept pool" in sk.run("%ddp keep").ok().stdout
        slurm_fixtures.cancel_our_jobs()
        assert wait_no_jobs(30) == []
        sk.run("%%ddp --slurm --nodes 2 --ntasks-per-node 2 --bg --out job\nimport os\nos.environ['SLURM_JOB_ID']", timeout=180).ok()
        assert sk.value("job.wait(180)") is True, sk.run("repr(job)").result
        new = set(sk.value("list(job.result())"))
        assert len(new) == 1 and old not in new, (old, new)
        assert sk.run("%ddp stop", timeout=60).ok().stdout.startswith("stopped the pool")
        assert wait_no_jobs(10) == []


def test_rank_killed_on_n2_costs_only_that_rank(sk, no_jobs_left):
    sk.run("%%ddp --slurm --nodes 2 --ntasks-per-node 2\nimport os, torch, torch.distributed as dist\nkept = dist.get_rank() * 10\nos.getpid()",
           timeout=180).ok()
    for _attempt in range(2):  # kill a rank on n2 twice: each time only that rank is started again
        pids = sk.value("list(_)")
        victim = pids[3]
        template = parent_of(victim)
        assert "ddp_magic.procs.slurm_template" in cmdline(template), "a rank is a fork of its node's template"
        assert parent_of(pids[2]) == template and parent_of(pids[0]) != template, "one template a node"
        os.kill(victim, signal.SIGKILL)
        assert _wait(lambda: re.search(r"rank 3: pid \d+ +dead", sk.run("%ddp status").stdout), 20), "the kernel saw rank 3 go"
        ex = sk.run(
            "%%ddp\nimport os, torch, torch.distributed as dist\nx = torch.ones(1) * (dist.get_rank() + 1)\ndist.all_reduce(x)\n"
            "(os.environ['SLURMD_NODENAME'], globals().get('kept'), x.item(), os.getpid())", timeout=180,
        ).ok()
        values = sk.value("[tuple(v) for v in _]")
        assert [v[1] for v in values] == [0, 10, 20, None], "ranks 0-2 kept their variables; rank 3's are gone"
        assert all(v[2] == 10.0 for v in values), "all_reduce over the four ranks, the new one included: 1+2+3+4"
        assert values[3][0] == "n2", "the new rank runs on the node the dead one ran on"
        assert values[3][3] != victim and [v[3] for v in values[:3]] == pids[:3]
        assert parent_of(values[3][3]) == template, "n2's template forked the new rank: no new step, no new import of torch"
        assert "rank 3" in ex.stdout and "started it again" in ex.stdout
        sk.run("%%ddp\nkept = dist.get_rank() * 10\nos.getpid()", timeout=120).ok()
    sk.run("%ddp stop").ok()


def test_a_lost_template_comes_back_as_a_new_step_on_its_node(sk, no_jobs_left):
    sk.run("%%ddp --slurm --nodes 2 --ntasks-per-node 2\nimport os, torch, torch.distributed as dist\nkept = dist.get_rank() * 10\nos.getpid()",
           timeout=180).ok()
    for _attempt in range(2):  # n2's template SIGKILLed twice: each time its two ranks come back from a new one there
        pids = sk.value("list(_)")
        template = parent_of(pids[2])
        os.kill(template, signal.SIGKILL)
        assert _wait(lambda: len(re.findall(r"rank [23]: pid \d+ +dead", sk.run("%ddp status").stdout)) == 2, 20), "n2's ranks went with it"
        sk.run(
            "%%ddp\nimport os, torch, torch.distributed as dist\nx = torch.ones(1) * (dist.get_rank() + 1)\ndist.all_reduce(x)\n"
            "(os.environ['SLURMD_NODENAME'], globals().get('kept'), x.item(), os.getpid())", timeout=180,
        ).ok()
        values = sk.value("[tuple(v) for v in _]")
        assert [v[1] for v in values] == [0, 10, None, None], "n1's ranks kept their variables"
        assert all(v[2] == 10.0 for v in values) and [v[0] for v in values] == ["n1", "n1", "n2", "n2"]
        new = parent_of(values[2][3])
        assert new != template and new == parent_of(values[3][3]) and "ddp_magic.procs.slurm_template" in cmdline(new)
        assert [v[3] for v in values[:2]] == pids[:2]
        sk.run("%%ddp\nkept = dist.get_rank() * 10\nos.getpid()", timeout=120).ok()
    sk.run("%ddp stop").ok()


def test_queued_job_shows_queued_and_ctrl_c_cancels_it(sk, no_jobs_left):
    hold = subprocess.run(["sbatch", "--parsable", "--job-name=holder", "--output=/dev/null", "-N2", "--exclusive", "--wrap", "sleep 600"],
                          capture_output=True, text=True, check=True).stdout.strip()
    try:
        assert _wait(lambda: job_state(hold) == "RUNNING", 30), "the holder job did not start"
        for _attempt in range(2):
            t0 = time.monotonic()
            ex = run_interrupting(sk, "%%ddp --slurm --nodes 2 --ntasks-per-node 2\n1", lambda m: says(m, "queued: job") and _waited(m)[-1:] >= [3.0])
            assert ex.error is not None and ex.error[0] == "KeyboardInterrupt"
            shown = [m for m in ex.messages if says(m, "queued: job")]
            assert shown and re.search(r"queued: job \d+ pending \((Resources|Priority)\)", str(shown[-1]["content"])), "the view says why"
            clock = [w for m in shown for w in _waited(m)]
            assert clock and clock == sorted(clock), f"the start clock never goes back: {clock}"
            assert 3.0 <= clock[-1] <= time.monotonic() - t0, "it counts from the pool's start, within the cell's time"
            said = " ".join(str(m["content"]) for m in ex.messages)
            assert "the env each rank received" not in said and "MASTER_PORT=" not in said, "no rank exists: nothing received yet"
            assert "planned: the env each rank will receive; MASTER_ADDR/PORT are set when the ranks start" in said
            assert wait_no_jobs(10) == [], "Ctrl-C cancelled the queued job"
        for _attempt in range(2):
            ex = sk.run("%%ddp --slurm --nodes 2 --ntasks-per-node 2 --start-timeout 2\n1", timeout=60)
            assert ex.error is not None and ex.error[0] == "StartError"
            assert re.search(r"did not start within --start-timeout 2 s: it was still pending \((Resources|Priority)\); cancelled it", ex.error[1])
            assert job_state(hold) == "RUNNING", "it gave up at its --start-timeout, while the job it queued behind still ran"
            assert wait_no_jobs(10) == []
    finally:
        subprocess.run(["scancel", hold], check=False)


def test_bad_partition_and_bad_slurm_args_say_slurms_words(sk, no_jobs_left):
    for _attempt in range(2):
        ex = sk.run("%%ddp --slurm --nodes 2 --partition nosuchpart\nprint('ran')", timeout=60)
        assert ex.error is not None and ex.error[0] == "StartError" and "ran" not in ex.stdout
        assert "invalid partition specified: nosuchpart" in ex.error[1] and len(ex.error[1]) < 300
        ex = sk.run("%%ddp --slurm --nodes 2 --slurm-args '--no-such-option'\nprint('ran')", timeout=60)
        assert ex.error is not None and ex.error[0] == "StartError" and "ran" not in ex.stdout
        assert "unrecognized option '--no-such-option'" in ex.error[1] and len(ex.error[1]) < 300
        ex = sk.run("%%ddp --slurm --slurm-args '--nodes=3'\nprint('ran')", timeout=60)
        assert ex.error is not None and "--nodes=3 is the pool's to set" in ex.error[1]
        assert our_jobs() == []


def test_ddp_env_shows_the_plan_without_allocating(sk, no_jobs_left):
    for _attempt in range(2):
        full = sk.run("r = %ddp_env --slurm --nodes 2 --ntasks-per-node 2\nprint(r.full_text())").ok().stdout
        assert "planned env for 4 ranks on 2 Slurm nodes" in full
        assert "salloc --nodes=2 --ntasks-per-node=2 --job-name=ddp_magic" in full
        assert "srun '--jobid=$SLURM_JOB_ID' --nodes=2 --ntasks=2 --ntasks-per-node=1 --cpus-per-task=2" in full
        assert "-m ddp_magic.procs.slurm_template" in full, "one template a node, which forks the node's ranks"
        assert "✓ Slurm takes the request: sbatch --test-only: accepted" in full
        assert re.search(r"^every rank: .*WORLD_SIZE=4 LOCAL_WORLD_SIZE=2\b", full, re.M), full  # what every rank shares, once
        assert re.search(r"^RANK +LOCAL_RANK +NODE_RANK *$", full, re.M), full  # then only what differs, one row a rank
        rows = re.findall(r"^(\d) +(\d) +(\d) *$", full, re.M)
        assert rows == [("0", "0", "0"), ("1", "1", "0"), ("2", "0", "1"), ("3", "1", "1")], full
        bad = sk.run("r = %ddp_env --slurm --nodes 2 --partition nosuchpart\nprint(r.full_text())").ok().stdout
        assert "✗ Slurm takes the request: sbatch --test-only: invalid partition specified: nosuchpart" in bad
        assert our_jobs() == []


def test_kernel_inside_salloc_uses_that_allocation_and_leaves_it(slurm_cluster, no_jobs_left):
    k = kernel_inside_salloc(["--nodes=2", "--ntasks-per-node=2"])
    try:
        job = k.value("__import__('os').environ['SLURM_JOB_ID']")
        k.run("%load_ext ddp_magic").ok()
        for attempt in range(2):
            cell = "%%ddp -n 4 --slurm\nimport os, torch.distributed as dist\n"
            ex = k.run(cell + "(os.environ['SLURM_JOB_ID'], dist.get_world_size(), os.environ['SLURMD_NODENAME'])", timeout=180).ok()
            values = k.value("[tuple(v) for v in _]")
            assert values == [(job, 4, "n1"), (job, 4, "n1"), (job, 4, "n2"), (job, 4, "n2")]
            if attempt == 0:
                assert f"Slurm job {job} on n1,n2: the kernel runs inside it" in ex.stdout and "never cancels it" in ex.stdout
            refused = k.run("%ddp keep").error
            assert refused and f"this Slurm pool cannot be kept: it runs in the kernel's own Slurm job {job}, which ends with its kernel" in refused[1]
            stop = k.run("%ddp stop").ok()
            assert stop.stdout.strip().endswith(f"; Slurm job {job} kept: the kernel runs inside it"), stop.stdout
            time.sleep(1)
            assert job_state(job) == "RUNNING", "the allocation the kernel found is left allocated"
            assert _wait(lambda: not slurm_ranks(), 10), "but our ranks are gone"
        ids = "('SLURM_JOB_ID', 'SLURM_JOBID', 'SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_NODEID', 'SLURM_TASKS_PER_NODE')"
        assert len(k.value(f"[v for v in {ids} if v in __import__('os').environ]")) >= 4, "the kernel itself runs inside the job"
        k.run(f"%%ddp -n 2\nimport os\n[v for v in {ids} if v in os.environ]", timeout=180).ok()
        assert k.value("[list(v) for v in _]") == [[], []], "a local pool's ranks never see the kernel's Slurm task ids"
        k.run("%ddp stop").ok()
    finally:
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=False)  # the kernel exits; salloc, whose command it was, then releases its allocation
    assert _wait(lambda: job_state(job) == "", 20), "the kernel's own allocation ends with the kernel (salloc's command)"


def _waited(msg: dict) -> list:
    """The 'waited 3.62 s' figures a message of the queued cell's view says, in seconds, in the order they appear."""
    units = {"ms": 0.001, "s": 1.0}
    return [float(n) * units[u] for n, u in re.findall(r"waited (\d+(?:\.\d+)?) (ms|s)\b", str(msg["content"]))]


def _wait(pred, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return pred()
