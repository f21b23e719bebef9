"""What the ranks of a running pool report about themselves: their process group and the settings they see."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

from .check import Check
from ..words import ranks_phrase

Live = Mapping[int, Mapping[str, Any]]


def check_process_group(live: Live, nproc: int, backend: str) -> Check:
    """The process group as each live rank reports it: initialised everywhere, one backend, the right size and ranks."""
    name = "process group"
    pgs: Dict[int, Dict[str, Any]] = {r: dict(live[r].get("process_group") or {}) for r in live}
    init = sorted(r for r, pg in pgs.items() if pg.get("initialised"))
    if not init:
        errors = sorted({str(pg["error"]) for pg in pgs.values() if pg.get("error")})
        detail = "not initialised on any rank (started with --no-init, or destroyed by the cell)"
        return Check(name, True, detail + (f"; ranks report: {', '.join(errors)}" if errors else ""), level="info")
    problems = []
    if len(init) < len(pgs):
        problems.append(f"initialised on {len(init)}/{len(pgs)} ranks only (not on {ranks_phrase(set(pgs) - set(init))})")
    sizes = sorted({pg.get("world_size") for pg in pgs.values() if pg.get("initialised")}, key=str)
    backends = sorted({str(pg.get("backend")) for pg in pgs.values() if pg.get("initialised")})
    if sizes != [nproc]:
        problems.append(f"world size {', '.join(map(str, sizes))} where the pool has {nproc} ranks")
    if len(backends) > 1:
        problems.append(f"ranks use different backends: {', '.join(backends)}")
    elif backends and backends[0] != backend:
        problems.append(f"backend {backends[0]}, the pool planned {backend}")
    wrong = [r for r, pg in pgs.items() if pg.get("initialised") and pg.get("rank") is not None and pg.get("rank") != r]
    if wrong:
        has, its = ("has", "its") if len(wrong) == 1 else ("have", "their")
        problems.append(f"{ranks_phrase(wrong)} {has} another process-group rank than {its} RANK")
    if problems:
        return Check(name, False, "; ".join(problems))
    return Check(name, True, f"initialised on {len(init)}/{len(pgs)} ranks: backend {backends[0]}, world size {nproc}")


def check_seen_settings(envs: Sequence[Mapping[str, str]]) -> List[Check]:
    """OMP_NUM_THREADS and NCCL_* as the ranks actually see them: the same on every rank."""
    omp = sorted({e.get("OMP_NUM_THREADS", "<unset>") for e in envs})
    if len(omp) <= 1:
        checks = [Check("OMP_NUM_THREADS", True, f"{omp[0]} on every rank" if omp else "no rank answered", level="info")]
    else:
        checks = [Check("OMP_NUM_THREADS", False, f"ranks see different values: {', '.join(omp)}", level="warning")]
    keys = sorted({k for e in envs for k in e if k.startswith(("NCCL_", "TORCH_NCCL_"))})
    differ = [k for k in keys if len({e.get(k) for e in envs}) > 1]
    if differ:
        checks.append(Check("NCCL settings", False, f"ranks see different {', '.join(differ)}", level="warning"))
    elif keys:
        checks.append(Check("NCCL settings", True, "every rank sees " + ", ".join(f"{k}={envs[0].get(k)}" for k in keys), level="info"))
    else:
        checks.append(Check("NCCL settings", True, "none set on the ranks", level="info"))
    return checks


def check_interfaces(live: Live) -> List[Check]:
    """A pool across hosts: the interface each host's ranks chose for the collectives (procs/rank_net.py), and a
    warning for each host whose own name resolves to loopback (Debian's ``127.0.1.1 <name>`` line in /etc/hosts)."""
    hosts: Dict[str, Mapping[str, Any]] = {}
    for r in sorted(live):
        net = live[r].get("net") or {}
        if net.get("how"):
            hosts.setdefault(str(net.get("host") or f"rank {r}"), net)
    if not hosts:
        return []
    checks = [Check("collectives' interface", True, "; ".join(f"{h}: {n['how']}" for h, n in hosts.items()), level="info")]
    for host, net in hosts.items():
        addr = str(net.get("name_resolves_to") or "")
        if addr.startswith("127.") or addr == "::1":
            fix = (f"GLOO_SOCKET_IFNAME={net['iface']} was set there, so gloo does not bind it" if net.get("iface")
                   else "set GLOO_SOCKET_IFNAME to the interface the nodes reach each other on")
            checks.append(Check("host name", False, f"{host}'s own name resolves to {addr} (loopback: a `{addr} {host}` line in its "
                                f"/etc/hosts, as Debian and Ubuntu install it); {fix}", level="warning"))
    return checks
