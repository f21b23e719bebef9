"""PoolSpec: the pool's options validated once, built from keyword options, changed, compared."""
from __future__ import annotations

import dataclasses

import pytest

from ddp_magic.errors import PlanError
from ddp_magic.plan.spec import BACKENDS, START_METHODS, PoolSpec


def test_defaults():
    spec = PoolSpec(4)
    assert (spec.nproc, spec.backend, spec.master_addr, spec.master_port, spec.init) == (4, "auto", "127.0.0.1", None, True)
    assert (spec.start_method, spec.nnodes, spec.nproc_per_node, spec.env) == ("auto", 1, 4, {})
    assert spec.launcher_method == "auto" and spec.control_addr == "127.0.0.1"


def test_a_spec_is_frozen_and_hashable():
    spec = PoolSpec(2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.nproc = 3
    assert spec == PoolSpec(2) and hash(spec) == hash(PoolSpec(2))


@pytest.mark.parametrize(
    "options, words",
    [
        (dict(nproc=0), "-n must be a whole number of ranks, 1 or more (got 0)"),
        (dict(nproc=True), "-n must be a whole number"),
        (dict(nproc="2"), "-n must be a whole number"),
        (dict(nproc=2, nnodes=0), "--nnodes must be 1 or more (got 0)"),
        (dict(nproc=3, nnodes=2), "-n 3 ranks do not split evenly over 2 nodes; give a multiple of 2"),
        (dict(nproc=2, backend="tcp"), "unknown backend 'tcp'; use one of auto, nccl, gloo, mpi"),
        (dict(nproc=2, start_method="thread"), "unknown start method 'thread'; use auto, fork, spawn or torchrun"),
        (dict(nproc=2, master_port=70000), "--master-port 70000 is not a TCP port; give 1024-65535 or leave it out to get a free one"),
        (dict(nproc=2, master_port=0), "--master-port 0 is not a TCP port"),
        (dict(nproc=2, start_timeout=0), "start-timeout must be more than 0 seconds"),
        (dict(nproc=2, pg_timeout=-1.0), "pg-timeout must be more than 0 seconds"),
        (dict(nproc=2, grace=0), "grace must be more than 0 seconds"),
    ],
)
def test_invalid_options_name_the_fix(options, words):
    with pytest.raises(PlanError) as e:
        PoolSpec(**options)
    assert words in str(e.value)


def test_the_lists_of_choices():
    assert BACKENDS == ("auto", "nccl", "gloo", "mpi")
    assert START_METHODS == ("auto", "fork", "spawn", "torchrun")


def test_from_options_treats_none_as_the_default():
    spec = PoolSpec.from_options(2, backend=None, master_port=None, grace=None, init=False)
    assert spec == PoolSpec(2, init=False)


def test_from_options_sorts_extra_env_into_pairs():
    spec = PoolSpec.from_options(2, extra_env={"B": "2", "A": "1"})
    assert spec.extra_env == (("A", "1"), ("B", "2"))
    assert spec.env == {"A": "1", "B": "2"}
    assert spec == PoolSpec.from_options(2, extra_env={"A": "1", "B": "2"})


def test_from_options_refuses_unknown_names():
    with pytest.raises(PlanError, match="unknown pool options: colour, size"):
        PoolSpec.from_options(2, size=3, colour="red")


def test_from_options_validates():
    with pytest.raises(PlanError, match="split evenly"):
        PoolSpec.from_options(3, nnodes=2)


def test_with_options_changes_only_what_is_given():
    old = PoolSpec.from_options(2, backend="gloo", extra_env={"A": "1"})
    new = old.with_options(nproc=4, master_port=None, grace=2.0)
    assert (new.nproc, new.backend, new.grace, new.env) == (4, "gloo", 2.0, {"A": "1"})
    assert old.nproc == 2, "the old spec is unchanged"
    assert old.with_options(extra_env={}).env == {}
    assert old.with_options() == old


def test_with_options_validates_like_a_new_spec():
    with pytest.raises(PlanError, match="unknown backend"):
        PoolSpec(2).with_options(backend="tcp")
    with pytest.raises(PlanError, match="split evenly"):
        PoolSpec(4, nnodes=2).with_options(nproc=3)


def test_changes_from_says_what_a_restart_changes():
    old = PoolSpec(2, backend="gloo")
    assert old.changes_from(old) == []
    assert PoolSpec(4, backend="gloo").changes_from(old) == ["-n 2 → 4"]
    assert PoolSpec(2, backend="gloo", master_port=29500, grace=2.0).changes_from(old) == ["master-port None → 29500", "grace 1.0 → 2.0"]
    envs = PoolSpec.from_options(2, backend="gloo", extra_env={"A": "1"}).changes_from(old)
    assert envs == ["extra-env {} → {'A': '1'}"]


def test_auto_backend_is_no_change():
    """Asking for "auto" again keeps whatever backend the running pool has."""
    assert PoolSpec(2).changes_from(PoolSpec(2, backend="nccl")) == []
    assert PoolSpec(2, backend="gloo").changes_from(PoolSpec(2, backend="nccl")) == ["backend nccl → gloo"]


def test_several_nodes():
    spec = PoolSpec(8, nnodes=2, master_addr="10.0.0.1")
    assert spec.nproc_per_node == 4
    assert spec.launcher_method == "torchrun", "a pool over nodes always runs under torchrun"
    assert spec.control_addr == "10.0.0.1", "ranks on other nodes must reach the control channel"
    assert PoolSpec(8, nnodes=2, master_addr="10.0.0.1", listen_addr="10.0.0.2").control_addr == "10.0.0.2"
    assert PoolSpec(2, master_addr="10.0.0.1", start_method="spawn").control_addr == "127.0.0.1"
