"""What a Ray pool says of a lost node placed again and of a packed request's preview: pure functions of what its driver reported.

A lost node's bundles wait for Ray to place them again. While the placement group is
``RESCHEDULING`` the cluster has no room for them: one line says which node, its ranks, what
they asked for, what each node has free, and the two ways out (a node joins, or a smaller
pool). Before that (Ray has not yet counted the node out, or the new actor is starting) it is
a plain wait. ``%ddp_env --ray -n N`` says where Ray would pack the ranks with what is free now.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

from ...words import fmt_seconds, ranks_phrase

KINDS = ("CPU", "GPU")


def amounts(res: Mapping[str, Any], kinds: Sequence[str]) -> str:
    """'2 CPUs, 2 GPUs' for ``kinds``."""
    return ", ".join(f"{float(res.get(kind) or 0):g} {kind}s" for kind in kinds)


def asked_kinds(asked: Mapping[str, Any]) -> List[str]:
    """The kinds a node's ranks asked for: CPUs always, GPUs when any."""
    return [k for k in KINDS if k == "CPU" or float(asked.get(k) or 0)]


def no_room_text(node: str, ranks: Sequence[int], said: Mapping[str, Any], address: str, hint: str) -> str:
    """'n2 is lost and the cluster has no room for its ranks (ranks 2-3): 2 CPUs, 2 GPUs asked, free: n1 0 CPUs, 0 GPUs; start
    a node (ray start --address 198.51.100.10:6379) or %ddp restart -n 2' (``said``: the driver's asked and free a node)."""
    asked = said.get("asked") or {}
    kinds = asked_kinds(asked)
    free = "; ".join(f"{n.get('name')} {amounts(n, kinds)}" for n in said.get("free") or []) or "no node has any"
    return (f"{node} is lost and the cluster has no room for its ranks ({ranks_phrase(ranks)}): {amounts(asked, kinds)} asked, "
            f"free: {free}; start a node (ray start --address {address or '<the head>:6379'}) or {hint}")


def again_text(node: str, ranks: Sequence[int], said: Mapping[str, Any], address: str, hint: str) -> str:
    """What a lost node's placing again is waiting for, in one line: no room (the group is RESCHEDULING), or Ray."""
    if said.get("state") == "RESCHEDULING":
        return no_room_text(node, ranks, said, address, hint)
    return f"waiting for Ray to place {node}'s ranks again ({ranks_phrase(ranks)}; Ray counts a lost node out within about 30 s)"


def not_placed_text(node: str, ranks: Sequence[int], said: Mapping[str, Any], address: str, hint: str, timeout: float) -> str:
    """Why a lost node's ranks were not placed again: --start-timeout passed (with what was missing), or Ray's words."""
    why = str(said.get("why") or "")
    if why == "timeout":
        return f"{again_text(node, ranks, said, address, hint)} (still so after --start-timeout {timeout:g}s)"
    if why == "cancelled":
        return f"{node}'s ranks were not placed again (interrupted after {fmt_seconds(float(said.get('waited') or 0))})"
    return f"{node}'s ranks ({ranks_phrase(ranks)}) could not be placed again: {why}; the next cell tries again, or {hint}"


def pack_text(would: Sequence[Sequence[Any]]) -> str:
    """'with what is free now, Ray would pack them 2 on n1, 2 on n2' (the driver's preview), or that they would wait."""
    if not would:
        return "not all free now: the placement group would wait (QUEUED) for room"
    return "with what is free now, " + ", ".join(f"{int(k)} on {name}" for name, k in would) + " (Ray decides at placement)"


def placed_again_text(old: str, new: Dict[str, Any], seconds: float) -> str:
    """'n2's ranks placed again on n2 (198.51.100.12) in 3.1 s'."""
    return f"{old}'s ranks placed again on {new.get('name')} ({new.get('ip')}) in {fmt_seconds(seconds)}"
