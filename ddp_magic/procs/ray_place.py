"""Where a Ray pool's bundles go and what the cluster has, as pure functions of what Ray said (procs/ray_driver.py's, unit-tested without Ray).

A pool's placement group is one bundle a node (``--nodes K``: STRICT_SPREAD) or one bundle a
rank (``-n N`` alone: PACK, as few nodes as fit). Once Ray placed it, ``by_node`` groups the
bundles by the node each landed on: one template a node, the nodes in the order of their
first bundle, the ranks numbered node by node. ``never_fits`` says before anything is placed
why a request can never fit, ``pack_preview`` where a packed one would go with what is free
now (``%ddp_env --ray``), ``free_nodes`` what each node has free (the words of a lost node
that cannot be placed again).
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence, Tuple

KINDS = ("GPU", "CPU")  # the resources a pool asks for, the scarce one first


def by_node(bundle_nodes: Mapping[int, str]) -> List[List[int]]:
    """Bundle indices grouped by the node each was placed on ({bundle index: node id}), a group a node, in the order of
    each node's first bundle, each group in bundle order: [[0, 1], [2, 3]] for two bundles on each of two nodes."""
    groups: Dict[str, List[int]] = {}
    for index in sorted(bundle_nodes):
        groups.setdefault(bundle_nodes[index], []).append(index)
    return list(groups.values())


def unique(hosts: Sequence[str]) -> List[str]:
    """Each node's name: its hostname, with -2, -3 on a second and third node of the same host."""
    out: List[str] = []
    for h in hosts:
        name, i = h, 1
        while name in out:
            i += 1
            name = f"{h}-{i}"
        out.append(name)
    return out


def _capacity(bundle: Mapping[str, float], have: Mapping[str, Any]) -> int:
    """How many ``bundle``s fit into ``have`` ({"CPU": 2, "GPU": 2})."""
    counts = [int(float(have.get(kind) or 0) // need + 1e-9) for kind, need in bundle.items() if need]
    return min(counts) if counts else 0


def never_fits(bundles: List[Dict[str, float]], per_node: int, nodes: List[Dict[str, Any]], packed: bool = False) -> str:
    """Why ``bundles`` (all alike: one a node, or one a rank when ``packed``) can never be placed on a cluster of ``nodes``
    ({"name", "CPU", "GPU"} totals), "" when they can: "8 GPUs asked, the cluster has 4: 2 on n1, 2 on n2"."""
    bundle, count = bundles[0], len(bundles)
    for kind in KINDS:
        asked = bundle.get(kind, 0) * count
        if not asked:
            continue
        have = [(str(n.get("name")), float(n.get(kind) or 0)) for n in nodes]
        total = sum(v for _, v in have)
        each = ", ".join(f"{v:g} on {name}" for name, v in have if v) or "none on any node"
        if asked > total:
            return f"{asked:g} {kind}s asked, the cluster has {total:g}: {each}"
        if packed:
            continue
        fit = [name for name, v in have if v >= bundle[kind]]
        if len(fit) < count:
            return (f"{count} nodes with {bundle[kind]:g} {kind}s each asked ({per_node} ranks a node), "
                    f"{len(fit)} such in the cluster: {each}")
    if packed:
        holds = [(str(n.get("name")), _capacity(bundle, n)) for n in nodes]
        if sum(k for _, k in holds) < count:
            each = ", ".join(f"{k} on {name}" for name, k in holds if k) or "none on any node"
            return f"{count} ranks of {resources_text(bundle)} each asked, the cluster's nodes hold {sum(k for _, k in holds)}: {each}"
    return ""


def pack_preview(bundle: Mapping[str, float], count: int, free: List[Dict[str, Any]]) -> List[Tuple[str, int]]:
    """Where ``count`` packed bundles would go with what is ``free`` now ([{"name", "CPU", "GPU"}]): the node that holds the
    most first, as few nodes as fit; [] when they do not fit now (they wait). Ray decides at placement; this is a preview."""
    holds = sorted(((str(n.get("name")), _capacity(bundle, n)) for n in free), key=lambda nk: -nk[1])
    out, left = [], count
    for name, k in holds:
        if left <= 0 or k <= 0:
            break
        out.append((name, min(k, left)))
        left -= min(k, left)
    return out if left <= 0 else []


def resources_text(res: Mapping[str, Any]) -> str:
    """'2 CPUs, 2 GPUs' (the kinds a pool asks for; a kind at 0 said only for CPUs)."""
    parts = [f"{float(res.get(kind) or 0):g} {kind}s" for kind in ("CPU", "GPU") if kind == "CPU" or res.get(kind)]
    return ", ".join(parts)


def free_nodes(totals: List[Dict[str, Any]], available: Mapping[str, Mapping[str, float]], kinds: Sequence[str]) -> List[Dict[str, Any]]:
    """What each live node that has any of ``kinds`` has free: [{"name", "CPU", "GPU"}] from the nodes' totals
    ([{"name", "node_id", "CPU", "GPU"}]) and Ray's free resources a node ({node id: {"CPU": 1.0, ...}})."""
    out = []
    for n in totals:
        if not any(float(n.get(kind) or 0) for kind in kinds):
            continue  # a head started with --num-cpus 0: never a rank's
        there = available.get(str(n.get("node_id")), {})
        out.append({"name": n.get("name"), **{kind: float(there.get(kind) or 0) for kind in kinds}})
    return out
