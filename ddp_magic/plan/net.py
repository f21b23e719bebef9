"""Addresses and ports as this machine sees them: the one home of the IPv4/IPv6 choice.

The plan (a free master port, a given one that must bind), the checks (is the
address local, who holds the port) and the kernel's control channel all ask
these functions; none sends a packet or keeps a socket open.
"""
from __future__ import annotations

import errno
import os
import random
import socket
from typing import List, Optional, Set, Tuple

from ..errors import PlanError


def address_family(addr: str) -> socket.AddressFamily:
    """IPv6 for an address written as one (it has a colon), IPv4 otherwise (host names too)."""
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


def any_address(family: int) -> str:
    """Every interface, in the family's notation: where a store that listens everywhere binds."""
    return "::" if family == socket.AF_INET6 else "0.0.0.0"


def resolve(addr: str) -> List[Tuple[int, str]]:
    """(family, ip) pairs a name resolves to for TCP, first answer first, no repeats; raises socket.gaierror."""
    infos = socket.getaddrinfo(addr, None, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys((family, str(sa[0])) for family, _, _, _, sa in infos))


def is_local_ip(family: int, ip: str) -> bool:
    """An address is this machine's when a socket can bind to it."""
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


def route_source(family: int, ip: str) -> Optional[str]:
    """The local address the kernel would use to reach ip, or None when there is no route (no packet is sent)."""
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((ip, 9))
            return str(s.getsockname()[0])
    except OSError:
        return None


def interfaces() -> List[str]:
    """The names of this machine's network interfaces (what *_SOCKET_IFNAME may name)."""
    try:
        return [name for _, name in socket.if_nameindex()]
    except OSError:
        try:
            return os.listdir("/sys/class/net")
        except OSError:
            return []


def free_port(addr: str = "127.0.0.1") -> int:
    """A port the OS says is free on addr (bind to 0 and read it back)."""
    with socket.socket(address_family(addr), socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


MASTER_PORTS = (20000, 32767)  # below Linux's ephemeral range (32768-60999), where connections take their source ports


def port_free(addr: str, port: int) -> bool:
    """Whether ``port`` binds on ``addr`` now (this machine's address only)."""
    try:
        with socket.socket(address_family(addr), socket.SOCK_STREAM) as s:
            s.bind((addr, port))
        return True
    except OSError:
        return False


def master_port(addr: str, avoid: int = 0, local: bool = True) -> int:
    """A MASTER_PORT nobody gave: drawn from MASTER_PORTS, not ``avoid``, free now where ``addr`` is this machine's.
    Not ``free_port``: a port bind(0) returns is an ephemeral one, and between the plan and the store's bind (seconds:
    a process starts, torch imports) any connection on the host may take it as its source port (EADDRINUSE)."""
    for _ in range(100):
        port = random.randint(*MASTER_PORTS)
        if port != avoid and (not local or port_free(addr, port)):
            return port
    return free_port(addr)  # that range all taken (or addr not this machine's: OSError, as the caller expects)


def _listening_inodes(port: int) -> Set[str]:
    """The socket inodes that listen on a TCP port, IPv4 and IPv6, from /proc/net."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    local, state, inode = parts[1], parts[3], parts[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        inodes.add(inode)
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    return inodes


def _command_line(pid: str) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmd = " ".join(f.read().replace(b"\0", b" ").decode(errors="replace").split())
    return cmd if len(cmd) <= 80 else cmd[:79] + "…"


def port_holder(port: int) -> Optional[str]:
    """Who listens on a TCP port, from /proc (Linux); None when it cannot tell."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    for pid in os.listdir("/proc"):
        if pid.isdigit() and _holds_socket(pid, inodes):
            try:
                return f"pid {pid} ({_command_line(pid)})"
            except OSError:
                return f"pid {pid}"
    return "another user's process"


def _holds_socket(pid: str, inodes: Set[str]) -> bool:
    """Whether pid has one of the socket inodes open. Each descriptor is read on its own: one that closes during the
    scan (a busy process opens and closes them all the time) must not hide the others."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            return True
    return False


def validate_master_addr(addr: str) -> None:
    """Raise PlanError unless addr resolves."""
    try:
        socket.getaddrinfo(addr, None)
    except socket.gaierror as e:
        raise PlanError(f"--master-addr {addr!r} does not resolve ({e.strerror}); use 127.0.0.1 on one machine") from None


def validate_master_port(addr: str, port: int) -> None:
    """Raise PlanError, naming the fix, unless a listening socket could bind addr:port right now."""
    if not 0 < port < 65536:
        raise PlanError(f"--master-port {port} is not a TCP port; give 1024-65535 or leave it out to get a free one")
    with socket.socket(address_family(addr), socket.SOCK_STREAM) as s:
        try:
            s.bind((addr, port))
        except OSError as e:
            if e.errno == errno.EACCES:
                raise PlanError(
                    f"--master-port {port} is privileged (below 1024) and this user may not bind it; "
                    "give a port of 1024 or more, or leave it out to get a free one"
                ) from None
            if e.errno == errno.EADDRINUSE:
                who = port_holder(port)
                held = f" by {who}" if who else ""
                raise PlanError(
                    f"--master-port {port} is already in use{held}; leave --master-port out to get a free port, or pick another"
                ) from None
            raise PlanError(f"--master-port {port} cannot be bound on {addr}: {e.strerror}") from None
