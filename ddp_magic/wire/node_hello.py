"""What a host's template says of itself before it runs anything, and the kernel's check of it: the same code, or refused by name.

An ssh template's first line (procs/ssh_template.py) is a ``hello``: its host name, python,
ddp_magic's and torch's versions and content hashes, its GPUs, its addresses, where the ssh
session came from and whether MASTER_PORT is free there. The kernel computes the same
identity for itself (``identity``) and refuses a host whose code differs (``mismatch``),
before any rank starts. ddp_magic's hash covers every ``.py`` file of the package; torch's
is its installed RECORD (pip's list of every file with its sha256), so neither import runs
torch: a hello costs milliseconds.
"""
from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import os
import re
import socket
import struct
import sys
from functools import lru_cache
from typing import Dict, List, Mapping, Optional, Tuple

from ..logs import log
from . import seal

GPU_ROOT = "/proc/driver/nvidia/gpus"
BEAT_S = 3.0  # the kernel beats every host template this often (kernel/launchers/hosts.py)
SILENCE_S = 4 * BEAT_S  # a template that hears no beat for this long ends its ranks: the kernel is unreachable
_SIOCGIFADDR, _SIOCGIFNETMASK = 0x8915, 0x891B


def _package_hash() -> str:
    """sha256 over every .py file of ddp_magic (relative path and bytes), in a fixed order; read anew each time, so the
    kernel and a host on one file system hash the same files."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(root)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and d != "labextension")
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            digest.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()[:16]


@lru_cache(maxsize=1)
def _torch_identity() -> Tuple[str, str]:
    """(torch's version, a hash of its RECORD) without importing torch; ("", "") when it is not installed."""
    try:
        from importlib import metadata

        dist = metadata.distribution("torch")
    except Exception:  # not installed (PackageNotFoundError), or metadata unreadable: the hello says so
        log.debug("torch's metadata could not be read", exc_info=True)
        return "", ""
    record = dist.read_text("RECORD") or ""
    return dist.version, hashlib.sha256(record.encode()).hexdigest()[:16]


def _version() -> str:
    """ddp_magic's version, read from _version.py (its one source) without importing outside this role."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_version.py")
    with open(path) as f:
        found = re.search(r"__version__\s*=\s*[\"']([^\"']+)", f.read())
    return found.group(1) if found else "?"


def identity() -> Dict[str, str]:
    """This interpreter's code: ddp_magic's version and hash, torch's version and hash."""
    torch_version, torch_hash = _torch_identity()
    return {"ddp_magic": _version(), "ddp_magic_hash": _package_hash(), "torch": torch_version, "torch_hash": torch_hash}


def mismatch(mine: Mapping[str, str], theirs: Mapping[str, object]) -> str:
    """How ``theirs`` differs from ``mine`` in words ("" when the same): versions first, then content."""
    out = []
    for name in ("ddp_magic", "torch"):
        a, b = mine.get(name, ""), str(theirs.get(name) or "")
        if not b:
            out.append(f"no {name} there")
        elif a != b:
            out.append(f"{name} {b} there, {a} here")
        elif mine.get(f"{name}_hash") != theirs.get(f"{name}_hash"):
            out.append(f"{name} {b} there differs from this kernel's (content hash {theirs.get(f'{name}_hash')} there, {mine.get(f'{name}_hash')} here)")
    return "; ".join(out)


def gpu_count(environ: Mapping[str, str] = os.environ, root: str = GPU_ROOT) -> int:
    """NVIDIA GPUs visible here (the driver's listing, then CUDA_VISIBLE_DEVICES), without CUDA or torch."""
    try:
        physical = len(os.listdir(root))
    except OSError:
        return 0
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return physical
    return min(physical, len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"]))


def addresses() -> List[str]:
    """This host's IPv4 addresses with their prefix, "198.51.100.11/24", loopback left out (the kernel picks MASTER_ADDR
    among them): each interface asked with SIOCGIFADDR and SIOCGIFNETMASK, no tool run."""
    out: List[str] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            req = struct.pack("256s", name.encode()[:15])
            try:
                ip = socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFADDR, req)[20:24])
                mask = socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFNETMASK, req)[20:24])
            except OSError:
                continue  # no IPv4 address on it
            if not ip.startswith("127."):
                out.append(f"{ip}/{ipaddress.ip_network(f'0.0.0.0/{mask}').prefixlen}")
    return out


def port_free(port: int) -> bool:
    """Whether TCP ``port`` can be bound on every address here (MASTER_PORT on the first host)."""
    if not port:
        return True
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def dial(target: str, seconds: float = 3.0) -> str:
    """Whether this host reaches the kernel's ``HOST:PORT`` (a firewall between them?): "" when it does, else why."""
    host, _, port = target.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=seconds).close()
        return ""
    except (OSError, ValueError) as e:
        return f"{type(e).__name__}: {e}"


def hello(node: str, port: int = 0, kernel: str = "", environ: Mapping[str, str] = os.environ) -> Dict[str, object]:
    """The template's first line: who and what it is, before anything runs (``kernel``: HOST:PORT it tries to reach)."""
    server = (environ.get("SSH_CONNECTION", "").split() + ["", "", ""])[2]
    out: Dict[str, object] = {"event": "hello", "node": node}  # "event" first: a line the kernel reads as an event
    out.update(identity(), node=node, hostname=socket.gethostname(), python=sys.executable, pid=os.getpid(),
               gpus=gpu_count(environ), addrs=addresses(), ssh_server=server, port=port, port_free=port_free(port))
    if kernel:
        out.update(kernel=kernel, dial=dial(kernel))
    return out


def sealed_refusal(hello: Mapping[str, object]) -> str:
    """Why a template whose secret comes sealed (a Ray node's) may not run ranks ("" when it may): other code than this
    process's, or no key in its hello. The kernel's check and a kept pool's driver's (procs/ray_keep.py) alike."""
    differs = mismatch(identity(), hello)
    if differs:
        return f"other code: {differs}"
    return "" if hello.get("key") else "its template offered no key to seal the pool's secret to"


def first_line(secret: bytes, env: Dict[str, str], keys: Optional[Dict[str, str]] = None) -> Dict[str, object]:
    """The kernel's first line to a host's template: the pool's secret, the env its ranks share, how long it waits for a
    beat. ``keys`` (node -> the public key its hello said): the secret sealed to each (wire/seal.py), never as it is:
    a Ray template's line crosses Ray's RPC (procs/ssh_template.py ``init_secret`` reads either form)."""
    line: Dict[str, object] = {"env": env, "silence": SILENCE_S}
    if keys is None:
        line["secret"] = secret.hex()
    else:
        line["sealed_to"] = {node: seal.sealed_for(key, secret) for node, key in keys.items()}
    return line


def _addrs(hello: Mapping[str, object]) -> List[str]:
    value = hello.get("addrs")
    return [str(a) for a in value] if isinstance(value, list) else []


def master_addr(first: Mapping[str, object], others: List[Mapping[str, object]]) -> Optional[str]:
    """MASTER_ADDR: the first host's address on the route to the others (one on a network each of them is on), the
    address the kernel reached it at when that is one; else that address; None when the hello says neither."""
    reached = str(first.get("ssh_server") or "")
    own = _addrs(first)
    nets = {a: ipaddress.ip_network(a, strict=False) for a in own}

    def shared(addr: str) -> bool:
        net = nets[addr]
        return all(any(ipaddress.ip_address(b.split("/")[0]) in net for b in _addrs(o)) for o in others)

    if reached and not ipaddress.ip_address(reached).is_loopback:
        mine = [a for a in own if a.split("/")[0] == reached]
        if not others or (mine and shared(mine[0])):
            return reached
    on_route = [a.split("/")[0] for a in own if shared(a)]
    return on_route[0] if on_route else (reached or None)
