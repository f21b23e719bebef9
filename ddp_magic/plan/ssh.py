"""What ``--hosts`` / ``--hostfile`` asked for: a frozen SshRequest whose ``ssh_argv()`` is the command that starts a host's template, pure and unit-tested.

Nothing here runs ssh. The hosts come in Horovod's form (``gpu1:8,gpu2:4``), as names with
``--ntasks-per-node``, or from a DeepSpeed hostfile (``gpu1 slots=8``, ``#`` comments, blank
lines). The command is the user's own ``ssh`` (their ~/.ssh/config, ProxyJump, agent and
ControlMaster apply) with ``BatchMode=yes`` (a password or passphrase prompt fails at once,
never hangs) and host-key checking left as the user has it; ``DDP_MAGIC_SSH_ARGS`` in the
kernel's env adds options (``-F CONFIG``, ``-i KEY``). The remote command carries no secret:
the pool's secret goes over the session's stdin (procs/ssh_template.py).
"""
from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence, Tuple

from ..errors import PlanError
from ..words import plural

ARGS_ENV = "DDP_MAGIC_SSH_ARGS"  # more ssh options, split like a shell: -F ~/box/ssh_config -i ~/.ssh/id_lab
TEMPLATE = ["-m", "ddp_magic.procs.ssh_template"]  # what each host runs: its template, which forks its ranks
CONNECT_TIMEOUT_S = 10  # ssh's ConnectTimeout: a host that does not answer is named within this
ALIVE_S = 3  # ssh's ServerAliveInterval; ServerAliveCountMax 3: a dead link ends the session in ~10 s
AUTO_REASON = "gloo until the hosts say how many GPUs they have (nccl when each has one a slot)"
_HOST = re.compile(r"^[A-Za-z0-9_.@%\[\]:-]+$")


def _host(word: str, where: str) -> str:
    if not word or not _HOST.match(word) or word.startswith("-"):
        raise PlanError(f"{where}: {word!r} is not a host name (an ssh alias, user@host or an address)")
    return word


def parse_hosts(text: str, per_node: Optional[int]) -> Tuple[Tuple[str, int], ...]:
    """``gpu1,gpu2`` (each ``per_node`` slots, 1 when not given) or Horovod's ``gpu1:8,gpu2:4``; a host once."""
    out: List[Tuple[str, int]] = []
    for word in (w.strip() for w in text.split(",")):
        if not word:
            continue
        name, slots = word, per_node or 1
        if re.search(r":\d+$", word) and not word.startswith("["):
            name, _, count = word.rpartition(":")
            slots = int(count)
            if per_node is not None and slots != per_node:
                raise PlanError(f"--hosts {word}: {slots} slots there, but --ntasks-per-node {per_node}; give one or the other")
        out.append((_host(name, "--hosts"), slots))
    return _checked(out, "--hosts")


def parse_hostfile(text: str, path: str, per_node: Optional[int]) -> Tuple[Tuple[str, int], ...]:
    """DeepSpeed's hostfile: ``host slots=N`` a line (``host`` alone: ``per_node`` or 1), ``#`` comments, blank lines."""
    out: List[Tuple[str, int]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        where = f"{path} line {number}"
        slots = per_node or 1
        for word in words[1:]:
            key, eq, value = word.partition("=")
            if key != "slots" or not eq or not value.isdigit():
                raise PlanError(f"{where}: {word!r}; a line is 'HOST slots=N' (DeepSpeed's hostfile)")
            slots = int(value)
        out.append((_host(words[0], where), slots))
    if not out:
        raise PlanError(f"{path}: no host in it; a line is 'HOST slots=N' (DeepSpeed's hostfile)")
    return _checked(out, path)


def _checked(hosts: List[Tuple[str, int]], where: str) -> Tuple[Tuple[str, int], ...]:
    if not hosts:
        raise PlanError(f"{where}: no host given; e.g. --hosts gpu1,gpu2 --ntasks-per-node 8")
    names = [h for h, _ in hosts]
    twice = sorted({h for h in names if names.count(h) > 1})
    if twice:
        raise PlanError(f"{where}: {', '.join(twice)} given twice; give each host once, with its slots")
    if any(s < 1 for _, s in hosts):
        raise PlanError(f"{where}: slots must be 1 or more")
    return tuple(hosts)


@dataclass(frozen=True)
class SshRequest:
    """The hosts a pool runs on over SSH, in rank order, with their slots; the remote python and ssh's extra options."""

    hosts: Tuple[Tuple[str, int], ...]
    remote_python: str = sys.executable  # --remote-python: the same path as the kernel's unless given
    ssh_args: Tuple[str, ...] = ()  # DDP_MAGIC_SSH_ARGS, split like a shell
    source: str = ""  # where the hosts came from (--hosts, or the hostfile's path), for what %ddp_env says

    @property
    def names(self) -> List[str]:
        return [h for h, _ in self.hosts]

    @property
    def ntasks_per_node(self) -> int:
        """The most ranks any host has (each host's own: ``slots``)."""
        return max(s for _, s in self.hosts)

    @property
    def slots(self) -> Tuple[int, ...]:
        """Each host's ranks when they differ (gpu1:8,gpu2:4); () when every host has the same."""
        counts = tuple(s for _, s in self.hosts)
        return counts if len(set(counts)) > 1 else ()

    @property
    def world_size(self) -> int:
        return sum(s for _, s in self.hosts)

    def ssh_argv(self, host: str, command: Sequence[str]) -> List[str]:
        """The user's ssh to ``host`` running ``command`` (one shell word each): BatchMode, no tty, a dead link noticed."""
        options = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}", "-o", f"ServerAliveInterval={ALIVE_S}",
                   "-o", "ServerAliveCountMax=3", "-T"]
        return ["ssh", *options, *self.ssh_args, host, "--", shlex.join(command)]

    def template_argv(self, host: str, cwd: str, pythonpath: str, port: int = 0, probe: Optional[str] = None) -> List[str]:
        """ssh running ``host``'s template: in the kernel's directory when the host has it, with the kernel's PYTHONPATH
        (a source checkout at the same path), the remote python. ``port``: MASTER_PORT, to say whether it is free there;
        ``probe`` (not None): only its hello, then it exits, having tried to reach the kernel at ``probe`` (HOST:PORT)."""
        env = ["env", f"PYTHONPATH={pythonpath}"] if pythonpath else []
        command = [*env, self.remote_python, *TEMPLATE, "--node", host] + (["--port", str(port)] if port else [])
        command += (["--probe"] if probe is not None else []) + (["--dial", probe] if probe else [])
        inner = f"cd {shlex.quote(cwd)} 2>/dev/null; exec {shlex.join(command)}"
        return self.ssh_argv(host, ["sh", "-c", inner])

    def shape_text(self) -> str:
        """'gpu1:2,gpu2:2': the hosts and their slots, as --hosts takes them."""
        return ",".join(f"{h}:{s}" for h, s in self.hosts)

    def describe(self) -> str:
        return f"{plural(len(self.hosts), 'host')} over SSH ({self.shape_text()}), python {self.remote_python}"


def resolve(nproc: Optional[int], options: Mapping[str, object], environ: Mapping[str, str]) -> Tuple[int, SshRequest]:
    """(world size, request) from the magic's options: hosts or hostfile, ntasks_per_node, remote_python."""
    per_node = options.get("ntasks_per_node")
    per = int(per_node) if isinstance(per_node, int) else None
    hosts_text, hostfile = options.get("hosts"), options.get("hostfile")
    if hosts_text and hostfile:
        raise PlanError("--hosts and --hostfile both given; give one")
    if hostfile:
        path = os.path.expanduser(str(hostfile))
        try:
            with open(path) as f:
                hosts = parse_hostfile(f.read(), str(hostfile), per)
        except OSError as e:
            raise PlanError(f"--hostfile {hostfile}: {e.strerror}") from None
        source = str(hostfile)
    else:
        words = [w.strip() for w in str(hosts_text or "").split(",") if w.strip()]
        if per is None and nproc is not None and words and not any(re.search(r":\d+$", w) for w in words):
            if nproc % len(words):
                raise PlanError(f"-n {nproc} ranks do not split evenly over {plural(len(words), 'host')}; give --ntasks-per-node")
            per = nproc // len(words)
        hosts = parse_hosts(str(hosts_text or ""), per)
        source = "--hosts"
    try:
        extra = tuple(shlex.split(environ.get(ARGS_ENV, "")))
    except ValueError as e:
        raise PlanError(f"{ARGS_ENV}={environ.get(ARGS_ENV)!r}: {e}") from None
    python = str(options.get("remote_python") or sys.executable)
    request = SshRequest(hosts=hosts, remote_python=python, ssh_args=extra, source=source)
    if nproc is not None and nproc != request.world_size:
        raise PlanError(f"-n {nproc} is not the {request.world_size} slots of {source} ({request.shape_text()}); leave -n out")
    return request.world_size, request
