"""The rank env's consistency, planned or read live from the workers: every variable set, the ranks complete.

These checks read only the env dicts, so the plan's envs and the ones each
rank reports about itself go through the same code.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from .check import Check, few
from .plan import DIST_VARS
from ..words import plural, ranks_phrase

Env = Mapping[str, str]


def check_rank_envs(envs: Sequence[Env], nnodes: int = 1, count: Optional[int] = None) -> List[Check]:
    """Consistency of the env the ranks see (planned, or read live from the workers).

    ``count`` is how many ranks the pool has on this node (default: len(envs));
    with one node, WORLD_SIZE must equal it and the ranks must be 0..N-1 exactly once.
    """
    if not envs:
        return [Check("variables set", False, "no rank env to check (no rank answered)")]
    checks = [_variables_set(envs)] + [_same(envs, var) for var in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE")]
    try:
        world = int(envs[0]["WORLD_SIZE"])
        ranks = [int(e["RANK"]) for e in envs]
    except (KeyError, ValueError) as e:
        checks.append(Check("ranks unique and complete", False, f"cannot read RANK and WORLD_SIZE as numbers ({type(e).__name__}: {e})"))
        return checks
    n = count if count is not None else len(envs)
    checks.append(_world_size(world, n, nnodes))
    checks.append(_ranks_complete(world, ranks, nnodes))
    checks.append(check_local_ranks(envs))
    checks.append(_master_port_valid(envs[0]))
    return checks


def _variables_set(envs: Sequence[Env]) -> Check:
    missing = {i: [v for v in DIST_VARS if v not in e] for i, e in enumerate(envs)}
    bad = {i: m for i, m in missing.items() if m}
    if not bad:
        return Check("variables set", True, "all of " + ", ".join(DIST_VARS) + " set on every rank")
    return Check("variables set", False, few([f"rank {envs[i].get('RANK', i)} lacks {', '.join(m)}" for i, m in bad.items()]))


def _same(envs: Sequence[Env], var: str) -> Check:
    values = sorted({e.get(var, "<unset>") for e in envs})
    if len(values) == 1:
        return Check(f"same {var}", True, f"{var}={values[0]} on every rank")
    return Check(f"same {var}", False, f"ranks disagree on {var}: {', '.join(values)}; every rank must use the same value")


def _world_size(world: int, n: int, nnodes: int) -> Check:
    name = "WORLD_SIZE matches the ranks"
    if world == n * nnodes:
        return Check(name, True, f"WORLD_SIZE={world}: {plural(n, 'rank')}" + (f" × {nnodes} nodes" if nnodes > 1 else ""))
    return Check(name, False, f"WORLD_SIZE={world} but the pool has {plural(n * nnodes, 'rank')}: init_process_group would wait forever for the missing ones")


def _ranks_complete(world: int, ranks: List[int], nnodes: int) -> Check:
    """Each rank once; with one node also 0..WORLD_SIZE-1 all present (other nodes hold the rest)."""
    dupes = sorted({r for r in ranks if ranks.count(r) > 1})
    want = set(range(world)) if nnodes == 1 else set(ranks)
    missing = sorted(want - set(ranks))
    out_of_range = sorted(r for r in ranks if not 0 <= r < world)
    problems = []
    if dupes:
        problems.append(f"{ranks_phrase(dupes)} {_verb(dupes, 'appears', 'appear')} more than once (two processes would claim one rank)")
    if missing:
        problems.append(f"{ranks_phrase(missing)} missing (the others would wait for {_verb(missing, 'it', 'them')})")
    if out_of_range:
        problems.append(f"{ranks_phrase(out_of_range)} outside 0..{world - 1}")
    return Check("ranks unique and complete", not problems, f"ranks 0..{world - 1} exactly once" if not problems else "; ".join(problems))


def _verb(ranks: Sequence[int], one: str, many: str) -> str:
    return one if len(ranks) == 1 else many


def _master_port_valid(env: Env) -> Check:
    try:
        port = int(env["MASTER_PORT"])
    except (KeyError, ValueError):
        return Check("MASTER_PORT valid", False, f"not a port number: {env.get('MASTER_PORT')!r}")
    return Check("MASTER_PORT valid", 0 < port < 65536, f"port {port}" if 0 < port < 65536 else f"{port} is not a TCP port (1-65535)")


def check_local_ranks(envs: Sequence[Env]) -> Check:
    """LOCAL_RANK in 0..LOCAL_WORLD_SIZE-1, once per node, and RANK = NODE_RANK × LOCAL_WORLD_SIZE + LOCAL_RANK."""
    name = "LOCAL_RANK consistent"
    try:
        rows = [(int(e["RANK"]), int(e["LOCAL_RANK"]), int(e["LOCAL_WORLD_SIZE"]), int(e.get("NODE_RANK", "0"))) for e in envs]
    except (KeyError, ValueError) as e:
        return Check(name, False, f"cannot read RANK, LOCAL_RANK, LOCAL_WORLD_SIZE and NODE_RANK as numbers ({type(e).__name__}: {e})")
    problems: List[str] = []
    sizes = sorted({lw for _, _, lw, _ in rows})
    if len(sizes) > 1:
        problems.append(f"ranks disagree on LOCAL_WORLD_SIZE: {', '.join(map(str, sizes))}")
    seen: Dict[Tuple[int, int], int] = {}
    for rank, local, lw, node in rows:
        if not 0 <= local < lw:
            problems.append(f"rank {rank}: LOCAL_RANK {local} outside 0..{lw - 1}")
        elif rank != node * lw + local:
            problems.append(f"rank {rank}: LOCAL_RANK {local} on node {node} means RANK {node * lw + local}")
        if (node, local) in seen:
            problems.append(f"ranks {seen[(node, local)]} and {rank} both have LOCAL_RANK {local} on node {node} (they would share a GPU)")
        seen[(node, local)] = rank
    if problems:
        return Check(name, False, few(problems))
    return Check(name, True, f"LOCAL_RANK 0..{sizes[0] - 1} once per node, matching RANK")
