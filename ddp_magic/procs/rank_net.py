"""A rank's network across hosts: the interface its collectives use, chosen on its own node (the one on the route to MASTER_ADDR).

gloo takes a rank's own address from the host's name, and Debian and Ubuntu map that name to
127.0.1.1 in /etc/hosts: gloo then binds loopback and the peers on other hosts read
``Connection refused, remote=[127.0.1.1]``. So a rank whose MASTER_ADDR is not loopback (its
pool spans hosts) sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME, before its process group
forms, to ``--iface`` (DDP_MAGIC_IFACE) or else to the interface that carries its route to
MASTER_ADDR, found here on the node (the kernel's interfaces are not the node's). A variable
the user set wins and is left alone. What was chosen, why, and whether the host's own name
resolves to loopback go to %ddp_env (``report``). One host (MASTER_ADDR 127.0.0.1) is left as it was.
"""
from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import socket
import struct
from typing import Dict, MutableMapping, Optional

from ..logs import log
from ..wire import liveness, slurm_env

IFACE_ENV = "DDP_MAGIC_IFACE"  # --iface NAME: the interface the collectives use (the kernel sets it)
REPORT_ENV = "DDP_MAGIC_IFACE_HOW"  # what this rank chose and why, for %ddp_env
VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
_SIOCGIFADDR = 0x8915


def loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip.split("%")[0]).is_loopback
    except ValueError:
        return ip == "localhost"


def route_source(host: str) -> Optional[str]:
    """The local address this host would use to reach ``host`` (no packet is sent); None without a route."""
    try:
        family, _, _, _, sa = socket.getaddrinfo(host, 9, proto=socket.IPPROTO_UDP)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sa)
            return str(s.getsockname()[0])
    except OSError:
        return None


def interface_of(ip: str) -> Optional[str]:
    """The name of the interface that holds address ``ip`` on this host, or None."""
    if ":" in ip:
        want = ipaddress.ip_address(ip.split("%")[0]).exploded.replace(":", "")
        try:
            with open("/proc/net/if_inet6") as f:
                return next((ln.split()[5] for ln in f if ln.split()[0] == want), None)
        except OSError:
            return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # an interface without an IPv4 address
            if socket.inet_ntoa(raw[20:24]) == ip:
                return name
    return None


def own_name_address() -> Optional[str]:
    """What this host's own name resolves to first (None when it does not): gloo's choice when no interface is named."""
    try:
        return str(socket.getaddrinfo(socket.gethostname(), None, proto=socket.IPPROTO_TCP)[0][4][0])
    except OSError:
        return None


def choose(env: MutableMapping[str, str], kernel: str = "") -> str:
    """Set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME in ``env`` for a pool across hosts (each unless set); returns the
    line %ddp_env shows ("" on one host). Never raises: without a route, gloo's own choice stays, and the line says so.
    On the master's own host MASTER_ADDR may be its name, resolving to 127.0.1.1 there (torchrun's rendezvous names
    it so): the route to the kernel's control address (``kernel``, one the other hosts reach) decides instead."""
    master = env.get("MASTER_ADDR", "")
    if not master or loopback(master):
        return ""
    asked = env.get(IFACE_ENV, "")
    target, source = master, None if asked else route_source(master)
    if source and loopback(source) and kernel and not loopback(kernel):
        target, source = kernel, route_source(kernel)
    iface = asked or (interface_of(source) if source and not loopback(source) else None)
    name = "MASTER_ADDR" if target == master else "the kernel"
    why = "--iface" if asked else f"on the route to {name} {target}" + (f" (from {source})" if source else "")
    own = [v for v in VARS if env.get(v)]
    if iface is None:
        line = f"no interface found {why}: gloo binds what the host's name resolves to"
    else:
        for var in VARS:
            if not env.get(var):
                env[var] = iface
        line = f"{iface}, {why}"
    if own:
        line += "; the user's " + ", ".join(f"{v}={env[v]}" for v in own) + " kept"
    env[REPORT_ENV] = line
    log.debug("collectives' interface: %s", line)
    return line


def report(env: MutableMapping[str, str]) -> Dict[str, Optional[str]]:
    """This rank's network facts for %ddp_env: its host, the interface chosen and why, what its own name resolves to."""
    return {
        "host": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
        "iface": env.get("GLOO_SOCKET_IFNAME"),
        "how": env.get(REPORT_ENV),
        "name_resolves_to": own_name_address(),
    }


def report_unreachable(rank: int, host: str, port: int, e: OSError) -> None:
    """Tell whoever started us (a template reads our fd 1 before it is captured: srun's output for a Slurm node)
    that the kernel's port cannot be reached, so the kernel can name this node instead of waiting out its join."""
    why = "no answer" if liveness.is_silence(e) or isinstance(e, socket.timeout) else (e.strerror or type(e).__name__).lower()
    event = {"event": "unreachable", "rank": rank, "node": slurm_env.node_name() or socket.gethostname(),
             "addr": f"{host}:{port}", "why": why}
    text = (f"rank {rank} on {event['node']} cannot reach the kernel at {event['addr']} ({why}): a firewall between the nodes "
            "and the kernel's machine? --control-addr ADDR chooses another address")
    try:
        os.write(1, (json.dumps(event) + "\n").encode())  # the template's reader (srun's output): the kernel words it
        os.write(2, (text + "\n").encode())  # torchrun's terminal, or the launcher's log
    except OSError:
        log.debug("rank %d: nobody reads our start-up events", rank, exc_info=True)
