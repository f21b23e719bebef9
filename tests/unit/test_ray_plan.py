"""A Ray pool's request without Ray: -n alone is a bundle a rank that Ray packs (PACK), grouped by node once placed and
numbered node by node; --nodes spreads (STRICT_SPREAD of per-node bundles); ray:// is refused naming the supported places;
the fit check's words; Ray's errors read into one line; the magic's options; a lost node's words when there is no room."""
from __future__ import annotations

import argparse
from dataclasses import replace

import pytest

from ddp_magic.errors import PlanError
from ddp_magic.magic_options import where_request
from ddp_magic.plan.plan import make_plan
from ddp_magic.plan.ray import RayRequest, Strategy, resolve
from ddp_magic.kernel.launchers.ray_words import again_text, no_room_text, not_placed_text, pack_text
from ddp_magic.plan.spec import PoolSpec
from ddp_magic.procs.ray_driver import said
from ddp_magic.procs.ray_place import by_node, free_nodes, never_fits, pack_preview, unique


def test_n_alone_is_a_bundle_a_rank_packed_and_nodes_spread() -> None:
    world, req = resolve(4, {}, {})
    assert world == 4 and (req.nodes, req.ntasks_per_node, req.strategy, req.packed) == (1, 4, Strategy.PACK, True)
    assert req.bundles() == [{"CPU": 1.0}] * 4 and req.shape_text() == "Ray 4 ranks" and "--pack" in req.driver_argv()
    world, req = resolve(None, {"nodes": 1, "ntasks_per_node": 4}, {})
    assert (req.packed, req.bundles()) == (False, [{"CPU": 4.0}]), "--nodes 1 --ntasks-per-node 4: one node's bundle, as asked"
    world, req = resolve(None, {"nodes": 2, "ntasks_per_node": 4, "gpus_per_rank": 1}, {})
    assert world == 8 and req.strategy == Strategy.STRICT_SPREAD and req.bundles() == [{"CPU": 4.0, "GPU": 4.0}] * 2
    assert not req.packed and "--pack" not in req.driver_argv()
    world, req = resolve(8, {"nodes": 2}, {"RAY_ADDRESS": "10.0.0.1:6379"})
    assert (req.ntasks_per_node, req.address) == (4, "10.0.0.1:6379")
    assert "--address 10.0.0.1:6379 --nodes 2 --per-node 4" in " ".join(req.driver_argv())
    with pytest.raises(PlanError, match="is not --nodes 2 × --ntasks-per-node 4"):
        resolve(6, {"nodes": 2, "ntasks_per_node": 4}, {})
    with pytest.raises(PlanError, match="split evenly"):
        resolve(5, {"nodes": 2}, {})


def test_packed_bundles_grouped_by_node_and_ranks_numbered_node_by_node() -> None:
    """Ray's bundles_to_node_id: each node's bundles one template, the nodes in the order of their first bundle."""
    assert by_node({0: "a", 1: "a", 2: "b", 3: "b"}) == [[0, 1], [2, 3]]
    assert by_node({3: "a", 0: "b", 2: "b", 1: "a"}) == [[0, 2], [1, 3]], "bundle 0's node first, bundles in order"
    assert by_node({0: "x", 1: "y"}) == [[0], [1]], "--nodes: a bundle a node"
    spec = PoolSpec.from_options(4, environ={}, ray={"gpus_per_rank": 1})
    plan = make_plan(spec, environ={})
    placed = replace(plan, nnodes=2, slots=(3, 1))  # what kernel/launchers/ray.py placed() makes of 3 bundles on n1, 1 on n2
    envs = placed.all_envs()
    assert [(e["RANK"], e["NODE_RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in envs] == [
        ("0", "0", "0", "3"), ("1", "0", "1", "3"), ("2", "0", "2", "3"), ("3", "1", "0", "1")]
    assert [placed.node_local(r) for r in range(4)] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert spec.with_options(nproc=2, environ={}).ray == RayRequest(nodes=1, ntasks_per_node=2, gpus_per_rank=1, packed=True), \
        "a new -n alone packs again"


def test_where_a_packed_request_would_go_and_never_fits() -> None:
    free = [{"name": "n1", "CPU": 2, "GPU": 2}, {"name": "n2", "CPU": 2, "GPU": 2}]
    assert pack_preview({"CPU": 1, "GPU": 1}, 4, free) == [("n1", 2), ("n2", 2)]
    assert pack_preview({"CPU": 1}, 2, [{"name": "n1", "CPU": 1}, {"name": "n2", "CPU": 3}]) == [("n2", 2)], "the fullest node first"
    assert pack_preview({"CPU": 1}, 5, free) == [], "not free now: it would wait"
    assert pack_text([("n1", 2), ("n2", 2)]) == "with what is free now, 2 on n1, 2 on n2 (Ray decides at placement)"
    nodes = [{"name": "login", "CPU": 0, "GPU": 0}, *free]
    assert never_fits([{"CPU": 1.0, "GPU": 1.0}] * 4, 1, nodes, packed=True) == ""
    assert never_fits([{"CPU": 1.0, "GPU": 1.0}] * 5, 1, nodes, packed=True) == "5 GPUs asked, the cluster has 4: 2 on n1, 2 on n2"
    assert never_fits([{"CPU": 1.2}] * 3, 1, nodes, packed=True) == "3 ranks of 1.2 CPUs each asked, the cluster's nodes hold 2: 1 on n1, 1 on n2"


def test_a_lost_node_with_no_room_says_what_is_missing_in_one_line() -> None:
    totals = [{"name": "login", "node_id": "h", "CPU": 0, "GPU": 0}, {"name": "n1", "node_id": "a", "CPU": 2, "GPU": 2}]
    free = free_nodes(totals, {"a": {"CPU": 0.0}, "h": {}}, ["CPU", "GPU"])
    assert free == [{"name": "n1", "CPU": 0.0, "GPU": 0.0}], "the head with no CPU is never a rank's: not listed"
    said_ = {"state": "RESCHEDULING", "asked": {"CPU": 2.0, "GPU": 2.0}, "free": free}
    hint = RayRequest(nodes=1, ntasks_per_node=4, packed=True).restart_hint(2)
    line = no_room_text("n2", [2, 3], said_, "198.51.100.10:6379", hint)
    assert line == ("n2 is lost and the cluster has no room for its ranks (ranks 2-3): 2 CPUs, 2 GPUs asked, free: n1 0 CPUs, 0 GPUs; "
                    "start a node (ray start --address 198.51.100.10:6379) or %ddp restart -n 2")
    assert again_text("n2", [2, 3], said_, "198.51.100.10:6379", hint) == line
    assert again_text("n2", [2, 3], dict(said_, state="CREATED"), "", hint).startswith("waiting for Ray to place n2's ranks again (ranks 2-3;")
    timed_out = not_placed_text("n2", [2, 3], dict(said_, why="timeout"), "198.51.100.10:6379", hint, 8)
    assert timed_out == line + " (still so after --start-timeout 8s)" and "\n" not in timed_out
    spread = RayRequest(nodes=2, ntasks_per_node=2, gpus_per_rank=1, address="h:6379")
    assert spread.restart_hint(2) == "%ddp restart --ray --nodes 1 --ntasks-per-node 2 --gpus-per-rank 1 --address h:6379"


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
