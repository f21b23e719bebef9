"""A Ray pool's request without Ray: -n alone is one node (PACK), --nodes spreads (STRICT_SPREAD of per-node bundles),
ray:// is refused naming the supported places, the fit check's words, Ray's errors read into one line, the magic's options."""
from __future__ import annotations

import argparse

import pytest

from ddp_magic.errors import PlanError
from ddp_magic.magic_options import where_request
from ddp_magic.plan.plan import make_plan
from ddp_magic.plan.ray import RayRequest, Strategy, resolve
from ddp_magic.plan.spec import PoolSpec
from ddp_magic.procs.ray_driver import never_fits, said, unique


def test_n_alone_is_one_node_and_nodes_spread() -> None:
    world, req = resolve(4, {}, {})
    assert world == 4 and (req.nodes, req.ntasks_per_node, req.strategy) == (1, 4, Strategy.PACK)
    assert req.bundles() == [{"CPU": 4.0}]
    world, req = resolve(None, {"nodes": 2, "ntasks_per_node": 4, "gpus_per_rank": 1}, {})
    assert world == 8 and req.strategy == Strategy.STRICT_SPREAD and req.bundles() == [{"CPU": 4.0, "GPU": 4.0}] * 2
    world, req = resolve(8, {"nodes": 2}, {"RAY_ADDRESS": "10.0.0.1:6379"})
    assert (req.ntasks_per_node, req.address) == (4, "10.0.0.1:6379")
    assert "--address 10.0.0.1:6379 --nodes 2 --per-node 4" in " ".join(req.driver_argv())
    with pytest.raises(PlanError, match="is not --nodes 2 × --ntasks-per-node 4"):
        resolve(6, {"nodes": 2, "ntasks_per_node": 4}, {})
    with pytest.raises(PlanError, match="split evenly"):
        resolve(5, {"nodes": 2}, {})


def test_ray_client_is_refused_naming_the_places() -> None:
    with pytest.raises(PlanError, match=r"ray:// \(Ray Client\).*head node.*notebook pod.*ray start --head"):
        resolve(2, {"address": "ray://head:10001"}, {})
    with pytest.raises(PlanError, match="Ray Client"):
        resolve(2, {}, {"RAY_ADDRESS": "ray://head:10001"})


def test_never_fits_says_what_the_cluster_has() -> None:
    nodes = [{"name": "login", "CPU": 0, "GPU": 0}, {"name": "n1", "CPU": 2, "GPU": 2}, {"name": "n2", "CPU": 2, "GPU": 2}]
    eight = RayRequest(nodes=8, ntasks_per_node=1, gpus_per_rank=1, cpus_per_rank=0.5)
    assert never_fits(eight.bundles(), 1, nodes) == "8 GPUs asked, the cluster has 4: 2 on n1, 2 on n2"
    one_node = RayRequest(nodes=1, ntasks_per_node=4, cpus_per_rank=1)
    assert never_fits(one_node.bundles(), 4, nodes).startswith("1 nodes with 4 CPUs each asked (4 ranks a node), 0 such in the cluster")
    assert never_fits(RayRequest(nodes=2, ntasks_per_node=2).bundles(), 2, nodes) == ""


def test_rays_errors_in_one_line_with_the_fix() -> None:
    mismatch = RuntimeError("Version mismatch: The cluster was started with:\n    Ray: 2.59.0\n    Python: 3.10.12\n"
                            "This process on node 10.0.0.2 was started with:\n    Ray: 2.60.0\n    Python: 3.11.2\n")
    assert said(mismatch) == ("Ray or Python differ between the cluster (Ray: 2.59.0 Python: 3.10.12) and this kernel "
                              "(Ray: 2.60.0 Python: 3.11.2): install the cluster's versions here")
    assert "RAY_AUTH_TOKEN" in said(RuntimeError("Authentication failed: invalid token"))

    class AuthenticationError(Exception):
        pass

    wrong = ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")
    wrong.__cause__ = AuthenticationError("RPC error: InvalidAuthToken")
    assert said(wrong).startswith("Ray's token authentication refused this kernel (the token is missing or wrong)")
    assert unique(["n1", "n1", "n2"]) == ["n1", "n1-2", "n2"]


def test_spec_plan_and_options() -> None:
    spec = PoolSpec.from_options(None, environ={}, ray={"nodes": 2, "ntasks_per_node": 2})
    assert (spec.nproc, spec.nnodes, spec.launcher_method, spec.over_hosts) == (4, 2, "ray", True)
    plan = make_plan(spec, environ={})
    assert plan.ray == spec.ray and plan.backend == "gloo" and plan.over_hosts
    assert spec.with_options(nproc=8, environ={}).ray == RayRequest(nodes=2, ntasks_per_node=4)
    with pytest.raises(PlanError, match="give one"):
        PoolSpec.from_options(None, environ={}, ray={"nodes": 1, "ntasks_per_node": 2}, ssh={"hosts": "a,b", "ntasks_per_node": 1})
    args = argparse.Namespace(ray=True, nodes=2, ntasks_per_node=4, address="h:6379", gpus_per_rank=1.0, cpus_per_rank=None,
                              queue_timeout=None, slurm=False, hosts=None, hostfile=None, remote_python=None)
    assert where_request(args) == {"ray": {"nodes": 2, "ntasks_per_node": 4, "address": "h:6379", "gpus_per_rank": 1.0}}
