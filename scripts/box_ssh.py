"""The cluster in a box's SSH: an sshd in each node (Debian's openssh-server, its own host key, port 2222), and what a
login user needs to reach them: a key, a known_hosts, and an ssh config naming the nodes by alias, n2 reached only
through a ProxyJump over n1.

Everything lives under the box's folder (``{dir}/ssh``) and ends with it (each sshd is a process in its host, which
``Box.down`` ends). Host-key checking is never turned off: known_hosts holds each node's real key. A test makes its own
login with ``Login.make(folder)`` (its own key, authorised on every node, its own config and known_hosts), and passes
``-F CONFIG`` to ssh (``DDP_MAGIC_SSH_ARGS`` for ddp_magic): ssh reads ~/.ssh from the passwd entry, not $HOME.

Facts this relies on (tried here): ../shared/TOOLCHAIN.md, "Ray and SSH on the cluster in a box".
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import TYPE_CHECKING, Dict, NamedTuple, Optional

if TYPE_CHECKING:
    from cluster_box import Box

SSHD = "/usr/sbin/sshd"
PORT = 2222
JUMPED = {"n2": "n1"}  # a node reached only through another (ProxyJump)


def missing() -> Optional[str]:
    """Why the box can have no sshd (None: it can)."""
    if not os.path.exists(SSHD) or not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        return "no sshd or ssh here: apt-get install -y openssh-server openssh-client (scripts/setup.sh does it as root)"
    return None


def _keygen(path: str) -> str:
    """A new ed25519 key at ``path`` (no passphrase); its public line."""
    for p in (path, path + ".pub"):
        if os.path.exists(p):
            os.remove(p)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", os.path.basename(path), "-f", path], check=True, capture_output=True)
    with open(path + ".pub") as f:
        return f.read().strip()


def folder(box: "Box") -> str:
    return f"{box.dir}/ssh"


def sshd_conf(box: "Box", node: str) -> str:
    d = folder(box)
    return "\n".join([
        f"Port {PORT}", "ListenAddress 0.0.0.0", f"HostKey {d}/host-{node}", f"AuthorizedKeysFile {d}/authorized_keys",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
        "PermitRootLogin prohibit-password", "AllowTcpForwarding yes", "PrintMotd no", "LogLevel ERROR",
        f"PidFile {d}/sshd-{node}.pid", "",
    ])


def up(box: "Box", nodes: tuple) -> Dict[str, str]:
    """Host keys, the authorised keys file and an sshd in every node; node -> its public host key."""
    d = folder(box)
    os.makedirs(d, exist_ok=True)
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    open(f"{d}/authorized_keys", "a").close()
    keys = {}
    for node in nodes:
        keys[node] = _keygen(f"{d}/host-{node}").rsplit(" ", 1)[0]  # "ssh-ed25519 AAAA..."
        with open(f"{d}/sshd-{node}.conf", "w") as f:
            f.write(sshd_conf(box, node))
        box.run(node, [SSHD, "-f", f"{d}/sshd-{node}.conf"], check=True)
    with open(f"{d}/host_keys", "w") as f:
        f.write("".join(f"{node} {key}\n" for node, key in keys.items()))
    return keys


def host_keys(box: "Box") -> Dict[str, str]:
    with open(f"{folder(box)}/host_keys") as f:
        return dict(line.strip().split(" ", 1) for line in f if line.strip())


def sshd_pid(box: "Box", node: str) -> int:
    with open(f"{folder(box)}/sshd-{node}.pid") as f:
        return int(f.read())


class Login(NamedTuple):
    """One test's login: its key, known_hosts and ssh config (``-F config``)."""

    config: str
    known_hosts: str
    key: str

    @classmethod
    def make(cls, box: "Box", where: str) -> "Login":
        """A key of its own (authorised on every node), known_hosts with every node's real key, and a config naming the
        nodes by alias, n2 through a ProxyJump over n1."""
        os.makedirs(where, exist_ok=True)
        key = f"{where}/id_login"
        public = _keygen(key)
        with open(f"{folder(box)}/authorized_keys", "a") as f:
            f.write(public + "\n")
        known = f"{where}/known_hosts"
        with open(known, "w") as f:
            f.write("".join(f"[{box.host(node).mgmt}]:{PORT} {k}\n" for node, k in host_keys(box).items()))
        config = f"{where}/ssh_config"
        blocks = []
        for node in host_keys(box):
            jump = f"\n  ProxyJump {JUMPED[node]}" if node in JUMPED else ""
            blocks.append(f"Host {node}\n  HostName {box.host(node).mgmt}\n  Port {PORT}{jump}")
        blocks.append(f"Host *\n  User root\n  IdentityFile {key}\n  IdentitiesOnly yes\n  UserKnownHostsFile {known}\n"
                      "  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n  BatchMode yes\n  LogLevel ERROR")
        with open(config, "w") as f:
            f.write("\n".join(blocks) + "\n")
        return cls(config, known, key)

    def forget(self, box: "Box") -> None:
        """This login's key is no more authorised (the test is over)."""
        path = f"{folder(box)}/authorized_keys"
        with open(self.key + ".pub") as f:
            mine = f.read().strip()
        with open(path) as f:
            kept = [line for line in f if line.strip() and line.strip() != mine]
        with open(path, "w") as f:
            f.writelines(kept)
