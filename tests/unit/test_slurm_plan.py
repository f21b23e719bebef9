"""%%ddp --slurm without a Slurm: the request's command lines (gres and --gpus-per-node cannot run here, so the lines are
checked), the options as a spec, Slurm's job states, the task's env, and what the launcher reads of Slurm's output."""
from __future__ import annotations

import pytest

from ddp_magic.errors import PlanError
from ddp_magic.kernel.launchers import slurm_cli as cli
from ddp_magic.kernel.launchers.slurm_alloc import queued_text
from ddp_magic.plan import plan_checks
from ddp_magic.plan.checks_slurm import check_task_vars
from ddp_magic.plan.plan import make_plan
from ddp_magic.plan.slurm import TASK_VARS, SlurmRequest, resolve
from ddp_magic.plan.spec import PoolSpec
from ddp_magic.states import SchedulerState
from ddp_magic.wire import slurm_env

WORKER = ["python", "-m", "ddp_magic.procs.slurm_template"]
HOLD = ["python", "-m", "ddp_magic.procs.slurm_hold"]
INSIDE = {"SLURM_JOB_ID": "1234", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS_PER_NODE": "4", "SLURM_JOB_NODELIST": "n[1-2]"}


def test_a_new_allocation_is_salloc_running_the_holder_then_one_step():
    request = SlurmRequest(nodes=2, ntasks_per_node=4, partition="gpu", time="2:00:00", gpus_per_node=4, account="A",
                           extra="--qos=high --constraint='a100 80g'")
    salloc, srun = request.materialize(WORKER, HOLD, job_id="77")
    assert salloc == ["salloc", "--nodes=2", "--ntasks-per-node=4", "--job-name=ddp_magic", "--partition=gpu", "--time=2:00:00",
                      "--gpus-per-node=4", "--account=A", "--qos=high", "--constraint=a100 80g", *HOLD]
    # one task a node (its template forks the node's 4 ranks), with the 4 ranks' CPUs and the node's GPUs
    assert srun == ["srun", "--jobid=77", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--cpus-per-task=4", "--gpus-per-node=4",
                    "--overlap", "--kill-on-bad-exit=0", "--mpi=none", "--input=all", "--export=ALL", "--job-name=ddp_magic", *WORKER]
    assert not any("SECRET" in word or "secret" in word for word in salloc + srun), "the secret is never in argv"


def test_inside_an_allocation_there_is_no_salloc_and_the_step_takes_the_extra_options():
    world, request = resolve(8, None, None, INSIDE, extra=("--cpus-per-task=2",))
    assert (world, request.nodes, request.ntasks_per_node, request.job_id) == (8, 2, 4, "1234")
    salloc, srun = request.materialize(WORKER, HOLD)
    assert salloc is None
    assert srun[:2] == ["srun", "--jobid=1234"] and srun[-len(WORKER):] == WORKER
    assert "--cpus-per-task=8" in srun and "--cpus-per-task=2" not in srun, "the template asks for its 4 ranks' 2 CPUs each"
    assert "never cancels it" in request.describe()


def test_a_template_started_again_is_a_one_task_step_on_its_node():
    request = SlurmRequest(nodes=2, ntasks_per_node=2, gpus_per_node=2)
    srun = request.srun_argv("9", WORKER, node="n2")
    assert srun[:7] == ["srun", "--jobid=9", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--cpus-per-task=2", "--nodelist=n2"]
    assert "--gpus-per-node=2" in srun and "--overlap" in srun


@pytest.mark.parametrize("words, want", [
    ((), (1, [])), (("--cpus-per-task=3", "--qos=high"), (3, ["--qos=high"])), (("-c", "2"), (2, [])), (("-c4",), (4, [])),
    (("--cpus-per-task", "5", "--constraint=a100"), (5, ["--constraint=a100"])),
])
def test_a_ranks_cpus_in_slurm_args_are_multiplied_for_its_template(words, want):
    from ddp_magic.plan.slurm import _cpus_per_task

    assert _cpus_per_task(words) == want


def test_the_test_only_lines_submit_nothing():
    request = SlurmRequest(nodes=2, ntasks_per_node=2, partition="debug")
    assert request.test_argv() == ["sbatch", "--test-only", "--nodes=2", "--ntasks-per-node=2", "--job-name=ddp_magic", "--partition=debug",
                                   "--wrap", "true"]
    assert request.step_test_argv("5")[:3] == ["srun", "--test-only", "--jobid=5"]


@pytest.mark.parametrize("nproc, nodes, per_node, environ, want", [
    (4, None, None, {}, (4, 1, 4)),  # outside an allocation: one node
    (None, 2, 3, {}, (6, 2, 3)),
    (6, 2, None, {}, (6, 2, 3)),
    (8, None, None, INSIDE, (8, 2, 4)),  # -n spreads over the allocation's nodes
    (3, None, None, INSIDE, (3, 1, 3)),  # ... unless it does not divide
    (None, None, None, INSIDE, (8, 2, 4)),  # the allocation's own shape
])
def test_resolve_fills_what_was_not_given(nproc, nodes, per_node, environ, want):
    world, request = resolve(nproc, nodes, per_node, environ)
    assert (world, request.nodes, request.ntasks_per_node) == want


@pytest.mark.parametrize("kwargs, message", [
    (dict(nproc=5, nodes=2, ntasks_per_node=None), "do not split evenly over 2 nodes"),
    (dict(nproc=4, nodes=2, ntasks_per_node=3), "is not --nodes 2 × --ntasks-per-node 3"),
    (dict(nproc=None, nodes=0, ntasks_per_node=None), "--nodes must be a whole number"),
])
def test_resolve_refuses_what_cannot_be(kwargs, message):
    with pytest.raises(PlanError, match=message):
        resolve(environ={}, **kwargs)


@pytest.mark.parametrize("extra, message", [("--nodes=3", "--nodes=3 is the pool's to set"), ("-w n1", "-w is the pool's"),
                                            ("--comment 'open", "No closing quotation")])
def test_slurm_args_that_cannot_work_are_refused_before_slurm_is_asked(extra, message):
    with pytest.raises(PlanError, match=message):
        SlurmRequest(extra=extra)


def test_the_spec_of_slurm_options_and_a_new_n_inside_it():
    spec = PoolSpec.from_options(None, slurm=dict(nodes=2, ntasks_per_node=2, partition="debug", queue_timeout=30.0), environ={})
    assert (spec.nproc, spec.nnodes, spec.launcher_method, spec.slurm.queue_timeout) == (4, 2, "slurm", 30.0)
    smaller = spec.with_options(2, environ={})
    assert (smaller.nproc, smaller.slurm.nodes, smaller.slurm.ntasks_per_node, smaller.slurm.partition) == (2, 2, 1, "debug")
    assert smaller.changes_from(spec) == ["-n 4 → 2", "slurm 2 nodes × 2 tasks (partition debug) → 2 nodes × 1 task (partition debug)"]
    assert spec.with_options(None, environ={}) == spec, "a cell without options keeps the pool"
    again = spec.with_options(None, slurm=dict(nodes=2, ntasks_per_node=2), environ={})
    assert again.slurm.partition is None, "Slurm options given are the whole new request"
    with pytest.raises(PlanError, match="not the Slurm request's"):
        PoolSpec(nproc=4, nnodes=1, slurm=SlurmRequest(nodes=2, ntasks_per_node=2))


def test_a_slurm_plan_numbers_every_node_and_its_checks_pass():
    spec = PoolSpec.from_options(None, slurm=dict(nodes=2, ntasks_per_node=2), environ={})
    plan = make_plan(spec, environ={})
    envs = plan.all_envs()
    assert [(e["RANK"], e["LOCAL_RANK"], e["NODE_RANK"], e["GROUP_RANK"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"]) for e in envs] == [
        ("0", "0", "0", "0", "4", "2"), ("1", "1", "0", "0", "4", "2"), ("2", "0", "1", "1", "4", "2"), ("3", "1", "1", "1", "4", "2")]
    checks = {c.name: c for c in plan_checks(plan, {})}
    assert all(c.ok for c in checks.values()), [c for c in checks.values() if not c.ok]
    assert "salloc --nodes=2 --ntasks-per-node=2" in checks["Slurm commands"].detail
    assert plan.backend == "gloo"
    nccl = make_plan(PoolSpec.from_options(None, slurm=dict(nodes=1, ntasks_per_node=4, gpus_per_node=4), environ={}), environ={})
    assert nccl.backend == "nccl", "a login node has no GPU; the nodes' --gpus-per-node decides"


def test_a_kernel_inside_slurm_never_passes_its_task_ids_to_local_ranks(monkeypatch):
    from ddp_magic.kernel.launchers.base import worker_env

    for name in TASK_VARS:
        monkeypatch.setenv(name, "0")
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "8")
    env = worker_env()
    assert not [k for k in TASK_VARS if k in env] and env["SLURM_CPUS_ON_NODE"] == "8"
    check = check_task_vars({"SLURM_JOB_ID": "12", "SLURM_PROCID": "0"}, slurm=False)
    assert check.ok and "removed from the local ranks' env" in check.detail and "Slurm job 12" in check.detail
    assert check_task_vars({}, slurm=False).detail == "none in the kernel's env"


@pytest.mark.parametrize("name, state", [
    ("PENDING", SchedulerState.QUEUED), ("CONFIGURING", SchedulerState.QUEUED), ("REQUEUE_HOLD", SchedulerState.QUEUED), ("RUNNING", SchedulerState.RUNNING),
    ("SUSPENDED", SchedulerState.SUSPENDED), ("COMPLETING", SchedulerState.ENDING), ("STAGE_OUT", SchedulerState.ENDING),
    ("COMPLETED", SchedulerState.COMPLETED),
    ("CANCELLED by 0", SchedulerState.CANCELLED), ("PREEMPTED", SchedulerState.CANCELLED), ("NODE_FAIL", SchedulerState.FAILED),
    ("OUT_OF_MEMORY", SchedulerState.FAILED), ("TIMEOUT", SchedulerState.TIMEOUT), ("", SchedulerState.GONE), ("SOME_NEW_STATE", SchedulerState.QUEUED),
])
def test_slurm_job_states_map_once_onto_ours(name, state):
    assert SchedulerState.from_slurm(name) is state
    assert state.ended == (state in (SchedulerState.COMPLETED, SchedulerState.CANCELLED, SchedulerState.FAILED, SchedulerState.TIMEOUT, SchedulerState.GONE))


def test_a_task_gets_torchruns_names_from_slurms():
    env = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "2", "SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "2"}
    assert slurm_env.torch_env(env) == {"RANK": "5", "LOCAL_RANK": "1", "NODE_RANK": "2", "GROUP_RANK": "2", "ROLE_RANK": "5",
                                        "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "2"}
    alone = dict(env, SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0", SLURM_NTASKS="1", WORLD_SIZE="8", LOCAL_WORLD_SIZE="2",
                 DDP_MAGIC_RANK="3", DDP_MAGIC_LOCAL_RANK="1", DDP_MAGIC_NODE_RANK="1")
    assert slurm_env.torch_env(alone)["RANK"] == "3" and slurm_env.torch_env(alone)["WORLD_SIZE"] == "8", "a rank started again alone"
    with pytest.raises(RuntimeError, match="SLURM_PROCID is not set"):
        slurm_env.torch_env({})


def test_the_secret_comes_in_the_env_and_leaves_it():
    env = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NTASKS": "2", slurm_env.SECRET_ENV: "ab" * 32,
           slurm_env.CONNECT_ENV: "10.0.0.5:4000", slurm_env.TLS_ENV: "f" * 64}
    config, secret = slurm_env.config(env)
    assert secret == bytes.fromhex("ab" * 32) and slurm_env.SECRET_ENV not in env and slurm_env.SECRET_ENV not in config["env"]
    assert (config["kernel_addr"], config["kernel_port"], config["tls"], config["env"]["RANK"]) == ("10.0.0.5", 4000, "f" * 64, "0")
    with pytest.raises(RuntimeError, match="not started by ddp_magic's Slurm launcher"):
        slurm_env.config({})


@pytest.mark.parametrize("line, want", [
    ("salloc: Granted job allocation 12", ("granted", "12")), ("salloc: Pending job allocation 13", ("pending", "13")),
    ("salloc: job 13 queued and waiting for resources", ("pending", "13")), ("salloc: Job allocation 13 has been revoked.", ("revoked", "13")),
    ("salloc: Nodes n[1-2] are ready for job", ("other", None)),
])
def test_what_salloc_prints(line, want):
    assert cli.parse_salloc(line) == want


def test_squeue_scontrol_and_slurms_errors_read_short():
    assert cli.parse_squeue("PENDING|Resources|") == cli.JobInfo(SchedulerState.QUEUED, "Resources", "")
    assert cli.parse_squeue("RUNNING|None|n[1-2]") == cli.JobInfo(SchedulerState.RUNNING, "", "n[1-2]")
    assert cli.parse_squeue("") == cli.JobInfo(SchedulerState.GONE)
    assert cli.parse_node_addr("NodeName=n1 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.1.2.3 NodeHostName=vm") == "10.1.2.3"
    said = ("salloc: error: invalid partition specified: nope\nsalloc: error: Job submit/allocate failed: Invalid partition name specified\n"
            "salloc: error: invalid partition specified: nope\nTry \"salloc --help\" for more information")
    assert cli.short_error(said) == "invalid partition specified: nope; Job submit/allocate failed: Invalid partition name specified"
    assert queued_text("12", "Resources") == "queued: job 12 pending (Resources)"


def test_the_status_view_says_queued_with_slurms_reason_and_the_time_waited():
    from ddp_magic.kernel import RankInfo
    from ddp_magic.states import RankState
    from ddp_magic.ui import status_render as R

    line = queued_text("1234", "Resources")
    ranks = {r: RankInfo(rank=r, state=RankState.QUEUED, last_line=line, started=1000.0) for r in range(4)}
    s = R.Snapshot(nproc=4, infos=ranks, now=1012.5, elapsed=0.0, backend="gloo", starting_for=12.5)
    assert R.summary(s) == "4 ranks · queued: job 1234 pending (Resources) · waited 12.50 s · gloo"
    assert "queued: job 1234 pending (Resources)" in R.header_html(s) and R.tone_of(s.label(0)) == "warn"
    ranks[0].state = RankState.STARTING  # the job started: the counts again
    assert "queued" not in R.summary(R.Snapshot(nproc=1, infos={0: ranks[0]}, now=1013.0, elapsed=0.0, starting_for=13.0))


def test_the_sbatch_file_carries_the_pools_job_options():
    from ddp_magic.export.script import Launch, sbatch_text

    text = sbatch_text("train.py", Launch(nproc=8, nodes=2, gpus_per_node=4, backend="nccl",
                                          job_options=tuple(SlurmRequest(partition="gpu", time="2:00:00", extra="--qos=high").job_options())),
                       "train.sbatch")
    for line in ("#SBATCH --nodes=2", "#SBATCH --gpus-per-node=4", "#SBATCH --partition=gpu", "#SBATCH --time=2:00:00", "#SBATCH --qos=high"):
        assert line in text.splitlines()


def test_a_forked_rank_gets_the_slurm_task_variables_it_would_have_as_a_task():
    got = slurm_env.task_vars(rank=5, local_rank=1, node=2, world=8, per_node=2)
    assert (got["SLURM_PROCID"], got["SLURM_LOCALID"], got["SLURM_NODEID"], got["SLURM_NTASKS"], got["SLURM_NTASKS_PER_NODE"]) == (
        "5", "1", "2", "8", "2")
    assert slurm_env.torch_env(got)["RANK"] == "5" and slurm_env.torch_env(got)["NODE_RANK"] == "2", "the --slurm worker reads them alike"


def test_a_ranks_env_travels_as_changes_to_its_templates():
    from ddp_magic.kernel.launchers.slurm_steps import env_changes

    base = {"PATH": "/bin", "OLD": "1", "RANK": "0"}
    assert env_changes(base, {"PATH": "/bin", "RANK": "3", "NEW": "x"}) == ({"RANK": "3", "NEW": "x"}, ["OLD"])
    assert env_changes(base, dict(base)) == ({}, [])


@pytest.mark.parametrize("line, event, lost", [
    ('{"event": "spawned", "rank": 3, "pid": 77}', {"event": "spawned", "rank": 3, "pid": 77}, None),
    ("srun: error: n2: task 1: Killed", None, "n2"),
    ("srun: error: n1: tasks 0-1: Exited with exit code 1", None, "n1"),
    ('{"event": broken', None, None),
    ("a rank's own line before it captured its output", None, None),
])
def test_what_an_srun_step_of_templates_prints_is_read(line, event, lost):
    from ddp_magic.kernel.launchers.slurm_steps import _TASK_ENDED, _event

    assert _event(line) == event
    match = _TASK_ENDED.match(line)
    assert (match.group(1) if match else None) == lost
