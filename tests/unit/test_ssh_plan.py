"""An SSH pool's request without ssh: the hosts' forms, the hostfile, the command line (BatchMode, host keys checked, no
secret), MASTER_ADDR from the hosts' hellos, the code check, and ssh's words read into a host's problem and its fix."""
from __future__ import annotations

import pytest

from ddp_magic.errors import PlanError
from ddp_magic.kernel.launchers.ssh import SshLauncher
from ddp_magic.kernel.launchers.ssh_words import failed_text, gpu_problem, ssh_problem
from ddp_magic.plan.plan import make_plan
from ddp_magic.plan.spec import PoolSpec
from ddp_magic.plan.ssh import ARGS_ENV, SshRequest, parse_hostfile, parse_hosts, resolve
from ddp_magic.wire import node_hello


def test_hosts_in_both_forms() -> None:
    assert parse_hosts("gpu1,gpu2", 8) == (("gpu1", 8), ("gpu2", 8))
    assert parse_hosts("gpu1:4, gpu2:4", None) == (("gpu1", 4), ("gpu2", 4))
    assert parse_hosts("me@10.0.0.5", None) == (("me@10.0.0.5", 1),)
    with pytest.raises(PlanError, match="given twice"):
        parse_hosts("a,a", 2)
    with pytest.raises(PlanError, match="--ntasks-per-node 2"):
        parse_hosts("a:4", 2)
    with pytest.raises(PlanError, match="not a host name"):
        parse_hosts("-oProxyCommand=x", 1)


def test_deepspeed_hostfile() -> None:
    text = "# our boxes\n\ngpu1 slots=8\n  gpu2 slots=8   # the second\nworker-3\n"
    assert parse_hostfile(text, "hosts", None) == (("gpu1", 8), ("gpu2", 8), ("worker-3", 1))
    with pytest.raises(PlanError, match="hosts line 1: 'gpus=8'"):
        parse_hostfile("gpu1 gpus=8\n", "hosts", None)
    with pytest.raises(PlanError, match="no host in it"):
        parse_hostfile("# nothing\n\n", "hosts", None)


def test_resolve_splits_n_and_refuses_what_does_not_fit(tmp_path) -> None:
    world, req = resolve(4, {"hosts": "n1,n2"}, {})
    assert world == 4 and req.hosts == (("n1", 2), ("n2", 2))
    path = tmp_path / "hosts"
    path.write_text("n1 slots=2\nn2 slots=2\n")
    assert resolve(None, {"hostfile": str(path)}, {})[1].hosts == (("n1", 2), ("n2", 2))
    with pytest.raises(PlanError, match="do not split evenly"):
        resolve(3, {"hosts": "n1,n2"}, {})
    assert resolve(None, {"hosts": "n1:8,n2:4"}, {})[1].slots == (8, 4)
    with pytest.raises(PlanError, match="No such file"):
        resolve(None, {"hostfile": str(tmp_path / "none")}, {})
    assert resolve(None, {"hosts": "n1"}, {ARGS_ENV: "-F '/my dir/config'"})[1].ssh_args == ("-F", "/my dir/config")


def test_the_command_is_the_users_ssh_in_batch_mode_with_host_keys_checked_and_no_secret() -> None:
    req = SshRequest((("n1", 2), ("n2", 2)), remote_python="/opt/py/bin/python", ssh_args=("-F", "cfg"))
    argv = req.template_argv("n2", "/home/me/nb", "/home/me/src", port=29600)
    assert argv[0] == "ssh" and "BatchMode=yes" in argv and argv[argv.index("n2") - 2:argv.index("n2")] == ["-F", "cfg"]
    assert not any("StrictHostKeyChecking" in a or "UserKnownHostsFile" in a for a in argv), "host keys are the user's to check"
    remote = argv[-1]
    assert "exec env PYTHONPATH=/home/me/src /opt/py/bin/python -m ddp_magic.procs.ssh_template --node n2 --port 29600" in remote
    assert "DDP_MAGIC_SECRET" not in " ".join(argv)


def test_a_spec_over_hosts_plans_every_hosts_ranks() -> None:
    spec = PoolSpec.from_options(None, ssh={"hosts": "n1,n2", "ntasks_per_node": 2})
    assert (spec.nproc, spec.nnodes, spec.launcher_method) == (4, 2, "ssh")
    plan = make_plan(spec)
    assert plan.backend == "gloo" and [e["RANK"] for e in plan.all_envs()] == ["0", "1", "2", "3"]
    assert spec.with_options(8).ssh.hosts == (("n1", 4), ("n2", 4))
    assert spec.with_options(None, slurm={"nodes": 2}).ssh is None
    assert spec.changes_from(PoolSpec(nproc=4)) and "ssh none → n1:2,n2:2" in spec.changes_from(PoolSpec(nproc=4, nnodes=2))


def test_master_addr_is_the_first_hosts_address_on_the_route_to_the_others() -> None:
    first = {"ssh_server": "10.1.0.1", "addrs": ["10.1.0.1/24", "192.168.5.1/24"]}
    same_net = {"addrs": ["192.168.5.2/24", "10.1.0.2/24"]}
    assert node_hello.master_addr(first, [same_net]) == "10.1.0.1", "the address the kernel reached, when the others share it"
    only_fast = {"addrs": ["192.168.5.2/24"]}
    assert node_hello.master_addr(first, [only_fast]) == "192.168.5.1", "the network the others are on"
    assert node_hello.master_addr(first, [{"addrs": ["172.16.0.2/16"]}]) == "10.1.0.1"
    assert node_hello.master_addr({"ssh_server": "10.1.0.1", "addrs": ["10.1.0.1/24"]}, []) == "10.1.0.1"


def test_other_code_is_named() -> None:
    mine = node_hello.identity()
    assert node_hello.mismatch(mine, dict(mine)) == ""
    assert "torch 2.0.0 there" in node_hello.mismatch(mine, dict(mine, torch="2.0.0"))
    assert "content hash" in node_hello.mismatch(mine, dict(mine, ddp_magic_hash="0" * 16))
    assert "no ddp_magic there" in node_hello.mismatch(mine, dict(mine, ddp_magic=""))


@pytest.mark.parametrize("said, fix", [
    ("@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@\nHost key verification failed.", "ssh-keygen -R n1"),
    ("No ED25519 host key is known for [10.0.0.1]:22 and you have requested strict checking.\nHost key verification failed.",
     "not in your known_hosts"),
    ("root@10.0.0.1: Permission denied (publickey).", "ssh-copy-id n1"),
    ("ssh: Could not resolve hostname n1: Name or service not known", "does not resolve"),
    ("ssh: connect to host 10.0.0.1 port 22: Connection refused", "does not answer on ssh"),
    ("/usr/bin/python3: Error while finding module specification for 'ddp_magic.procs.ssh_template' "
     "(ModuleNotFoundError: No module named 'ddp_magic')", "no ddp_magic for /p there"),
    ("sh: 1: exec: /p: not found", "no python at /p there: --remote-python"),
    ("bash: line 1: /p: Permission denied", "no python at /p there: --remote-python"),  # a shell's, not ssh's own refusal
])
def test_ssh_words_name_the_fix(said: str, fix: str) -> None:
    assert fix in ssh_problem("n1", said, "/p")
    assert "n1: " in failed_text({"n1": ssh_problem("n1", said, "/p")})


def test_fewer_gpus_than_slots_under_nccl_is_a_problem() -> None:
    spec = PoolSpec.from_options(None, ssh={"hosts": "n1,n2", "ntasks_per_node": 4}, backend="nccl")
    plan = make_plan(spec)
    assert "2 GPUs there for 4 slots: nccl needs one GPU a rank" in gpu_problem(plan, 2, 4)
    assert gpu_problem(plan, 4, 4) == "" and gpu_problem(make_plan(spec.with_options(backend="gloo")), 0, 4) == ""


def test_hosts_of_different_sizes_number_their_ranks_in_blocks() -> None:
    spec = PoolSpec.from_options(None, ssh={"hosts": "gpu1:3,gpu2:1"})
    plan = make_plan(spec)
    assert (spec.nproc, spec.nnodes, plan.world_size, plan.slots) == (4, 2, 4, (3, 1))
    envs = plan.all_envs()
    assert [(e["RANK"], e["NODE_RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["WORLD_SIZE"]) for e in envs] == [
        ("0", "0", "0", "3", "4"), ("1", "0", "1", "3", "4"), ("2", "0", "2", "3", "4"), ("3", "1", "0", "1", "4")]
    assert [plan.node_local(r) for r in range(4)] == [(0, 0), (0, 1), (0, 2), (1, 0)]


def test_a_host_still_unreachable_says_how_to_start_without_it_in_ssh_words() -> None:
    from ddp_magic.kernel.failures.unreachable import still_silent_text
    from ddp_magic.kernel.launchers import SshLauncher

    text = still_silent_text({"n2": [2, 3]}, {}, [0, 1], SshLauncher(b"s" * 32).without)
    assert text.endswith("or %ddp stop and start a pool without it (--hosts without n2)."), text
    assert "--slurm-args" not in text


def test_stop_says_what_ends_a_host_it_could_not_reach() -> None:
    """%ddp stop on a silent host: Slurm ends a step once the node answers; an SSH (or Ray) host's template ends unbeaten."""
    ssh = SshLauncher(b"0" * 32)
    assert ssh.left_there(["n2"]) == "its template ends on its own, hearing no beat for 12s"
    assert ssh.left_there(["n2", "n3"]) == "their templates end on their own, hearing no beat for 12s"
