"""The master address and port as this machine sees them: resolves, is local (or reachable), the port is free."""
from __future__ import annotations

import socket

from ..errors import PlanError
from .net import address_family, any_address, is_local_ip, resolve, route_source, validate_master_port
from .check import Check


def check_port(addr: str, port: int, given: bool = True, started: bool = False) -> Check:
    """MASTER_PORT can be bound on MASTER_ADDR; when not, who holds it (Linux /proc) where we can tell."""
    name = "master port free"
    if started:
        return Check(name, True, f"{addr}:{port} is held by the running pool (rank 0 hosts the store there)", level="info")
    try:
        local = any(is_local_ip(f, ip) for f, ip in resolve(addr))
    except (socket.gaierror, UnicodeError):
        local = False
    bind_addr = addr if local else any_address(address_family(addr))  # the store listens on every interface
    try:
        validate_master_port(bind_addr, port)
    except PlanError as e:
        said = f"{addr}:" if given else f"the chosen port {addr}:"
        return Check(name, False, str(e).replace("--master-port ", said, 1))
    except OSError as e:
        return Check(name, False, f"cannot bind {addr}:{port}: {e.strerror}")
    return Check(name, True, f"{addr}:{port} is free" + ("" if given else " (chosen for you)"))


def _addr_ip(addr: str, ip: str) -> str:
    return addr if addr == ip else f"{addr} ({ip})"


def check_master_addr_resolves(addr: str) -> Check:
    name = "master address resolves"
    try:
        ips = resolve(addr)
    except (socket.gaierror, UnicodeError) as e:
        why = getattr(e, "strerror", None) or str(e)
        return Check(name, False, f"{addr!r} does not resolve ({why}); on one machine use 127.0.0.1")
    return Check(name, True, f"{addr} → {', '.join(ip for _, ip in ips[:3])}")


def check_master_addr_local(addr: str, nnodes: int = 1) -> Check:
    """One node: MASTER_ADDR must be this machine (rank 0 hosts the store there). More nodes: a route must exist."""
    name = "master address is local" if nnodes == 1 else "master address reachable"
    try:
        ips = resolve(addr)
    except (socket.gaierror, UnicodeError):
        return Check(name, False, f"cannot tell: {addr!r} does not resolve")
    for family, ip in ips:
        if is_local_ip(family, ip):
            loopback = " (loopback: ranks on this machine only)" if ip in ("127.0.0.1", "::1") and nnodes > 1 else ""
            return Check(name, True, f"{_addr_ip(addr, ip)} is this machine{loopback}")
    family, ip = ips[0]
    if nnodes == 1:
        return Check(
            name,
            False,
            f"{_addr_ip(addr, ip)} is not an address of this machine: rank 0 runs here and hosts the rendezvous store, "
            "but every rank would look for it there; use 127.0.0.1 or this machine's own address",
        )
    src = route_source(family, ip)
    if src is None:
        return Check(name, False, f"no route from this machine to {_addr_ip(addr, ip)}")
    return Check(name, True, f"{_addr_ip(addr, ip)} is reachable from here via {src}")
