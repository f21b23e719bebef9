"""A cluster in a box: hosts made of network namespaces on this machine, two bridges, and a Slurm of their own.

Hosts: ``login`` (where a test's kernel runs), nodes ``n1`` ``n2`` ``n3`` and an ``intruder``, each a network
namespace with its own hostname (a UTS namespace), its own /etc/hosts and /dev/shm (a mount namespace) and a
``mgmt0`` on the management bridge (198.51.100.0/24); the nodes also have a ``fast0`` on the fast bridge
(203.0.113.0/24). Both ranges are RFC 5737's documentation ones; no host has a default route, the bridges have no
address on the machine's side, nothing is NATed or forwarded: no packet leaves the machine. Each host is one
``sleep`` (its anchor) holding the namespaces; a process enters a host with ``nsenter -t ANCHOR --net --uts --mount``
(``Box.enter``), never ``ip netns exec`` (it remounts /sys: slurmd then finds no cgroup mounts).

SSH (scripts/box_ssh.py): an sshd in each node on port 2222 with its own host key, when openssh-server is installed
(``Box.ssh_missing`` says why not); a test's login (its key, known_hosts, an ssh config naming the nodes, n2 through a
ProxyJump over n1) comes from ``box_ssh.Login.make``.

The Slurm: a munged of its own (its socket in the box's folder), slurmctld on login, one slurmd per node in its
host (port 6818 on every host), conf, state, pid and log paths all under the box's folder, reached with
``SLURM_CONF`` (``Box.env``): it coexists with the one-host Slurm (local_slurm.py), whose conf and paths it never
touches. Names (namespaces, bridges, the folder) start with ``$DDP_MAGIC_BOX_PREFIX`` (default ``ddpb``), so two
boxes never collide; ``up`` first removes whatever a box of that prefix left behind. Users are serialised by
``flock /tmp/ddp_box.lock`` (``up`` takes it, or uses the one an enclosing ``flock`` holds).

Both styles of /etc/hosts (``Box.hosts_style``): ``resolve`` (every host's name maps to its management address) and
``debian`` (a host's own name maps to 127.0.1.1, as Debian and Ubuntu install it). From a shell (as root)::

    python scripts/cluster_box.py up|down|status
    python scripts/cluster_box.py run HOST COMMAND...   # e.g. run n1 ip -br addr

Facts this relies on (tried here): ../shared/TOOLCHAIN.md, "A cluster in a box".
"""
from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Dict, List, NamedTuple, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import box_ssh  # noqa: E402
import local_slurm  # noqa: E402

PREFIX_ENV = "DDP_MAGIC_BOX_PREFIX"
LOCK = "/tmp/ddp_box.lock"
MGMT, FAST = "198.51.100", "203.0.113"  # RFC 5737 TEST-NET-2 and TEST-NET-3
NODES = ("n1", "n2", "n3")
SRUN_PORTS = "60001-60100"  # srun's own listening ports (SrunPortRange), reserved from every host's ephemeral ports
PACKAGES = ("iproute2", "util-linux", "iptables", "tcpdump")
TOOLS = ("/usr/sbin/ip", "/usr/bin/nsenter", "/usr/bin/unshare", "/usr/sbin/iptables", "/usr/bin/tcpdump")
STYLES = ("resolve", "debian")


class Host(NamedTuple):
    name: str
    mgmt: str  # its address on the management network
    fast: Optional[str]  # on the fast network (nodes only)


HOSTS = (
    Host("login", f"{MGMT}.10", None),
    *(Host(n, f"{MGMT}.{11 + i}", f"{FAST}.{11 + i}") for i, n in enumerate(NODES)),
    Host("intruder", f"{MGMT}.66", None),
)


def missing() -> Optional[str]:
    """Why this machine cannot make a box (None: it can)."""
    if not sys.platform.startswith("linux"):
        return "a cluster in a box needs Linux network namespaces"
    if os.geteuid() != 0:
        return "a cluster in a box needs root (it makes network namespaces and bridges); CI runs as root"
    absent = [t for t in TOOLS if not os.path.exists(t)]
    if absent:
        return f"{', '.join(absent)} missing: apt-get install -y {' '.join(PACKAGES)} (scripts/setup.sh does it as root)"
    why = local_slurm.missing()
    if why:
        return why
    probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode:
        return f"namespaces cannot be made here (unshare --net --uts --mount: {probe.stderr.strip()[-200:]})"
    return None


def install() -> Optional[str]:
    """apt-get install the box's tools and Slurm when root and they are missing; returns why a box cannot be had, or None."""
    if os.geteuid() == 0 and any(not os.path.exists(t) for t in TOOLS) and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
        if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
            subprocess.run(cmd, env=env, capture_output=True)
    return local_slurm.install() or missing()


def hosts_text(host: Host, style: str) -> str:
    """/etc/hosts of ``host``: every host's name at its management address; ``debian`` maps its own to 127.0.1.1."""
    lines = ["127.0.0.1\tlocalhost"]
    if style == "debian":
        lines.append(f"127.0.1.1\t{host.name}")
    lines += [f"{h.mgmt}\t{h.name}" for h in HOSTS if not (style == "debian" and h.name == host.name)]
    return "\n".join(lines) + "\n"


def take_lock(path: str = LOCK) -> int:
    """flock ``path`` for this process's life (the fd is returned); an enclosing ``flock path CMD`` already holds it on
    a descriptor we inherited: that one is used, not waited for."""
    for fd in map(int, os.listdir("/proc/self/fd")):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == path:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
        except OSError:
            continue
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        if _held_by_an_ancestor(fd):  # ``flock path pytest -n 2``: xdist's workers do not inherit its descriptor
            return fd
        print(f"cluster box: waiting for {path} (another box is up)", file=sys.stderr, flush=True)
        fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _held_by_an_ancestor(fd: int) -> bool:
    """Whether the flock on ``fd``'s file is held by a process this one descends from (/proc/locks names the taker)."""
    st = os.fstat(fd)
    holders = set()
    try:
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 5 and parts[1] == "FLOCK" and parts[5].rsplit(":", 1)[-1] == str(st.st_ino):
                    holders.add(int(parts[4]))
    except (OSError, ValueError):
        return False
    pid = os.getppid()
    while pid > 1:
        if pid in holders:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check and done.returncode:
        raise RuntimeError(f"{' '.join(argv)}: {(done.stderr or done.stdout).strip()[-400:]}")
    return done


class Box:
    """One cluster in a box, named by its prefix. ``up()`` builds it, ``down()`` removes every trace."""

    def __init__(self, prefix: Optional[str] = None) -> None:
        self.prefix = prefix or os.environ.get(PREFIX_ENV) or "ddpb"
        if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", self.prefix):
            raise ValueError(f"{PREFIX_ENV}={self.prefix!r}: 1 to 8 lowercase letters and digits (interface names are short)")
        self.dir = f"/run/ddp_box-{self.prefix}"
        self.conf = f"{self.dir}/slurm.conf"
        self.munge_socket = f"{self.dir}/munge/munge.socket"
        self.style = "resolve"
        self._lock: Optional[int] = None
        self.ssh_missing: Optional[str] = "the box is not up"  # why its nodes run no sshd (None: they do, box_ssh.py)

    # names
    def netns(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def bridge(self, net: str) -> str:
        """The bridge of ``mgmt`` or ``fast`` (on the machine's side)."""
        return f"{self.prefix}-{net}"

    def port(self, host: str, net: str) -> str:
        """The machine's end of ``host``'s link to ``net``: its byte counters are that host's traffic there."""
        return f"{self.prefix}{net[0]}-{host}"

    def host(self, name: str) -> Host:
        return next(h for h in HOSTS if h.name == name)

    # entering a host
    def anchor(self, host: str) -> int:
        with open(f"{self.dir}/{host}.anchor") as f:
            return int(f.read())

    def enter(self, host: str, cwd: Optional[str] = None) -> List[str]:
        """The command prefix that runs a program in ``host`` (its network, hostname, /etc/hosts, /dev/shm)."""
        return ["nsenter", "-t", str(self.anchor(host)), "--net", "--uts", "--mount", f"--wd={cwd or os.getcwd()}"]

    def env(self) -> Dict[str, str]:
        """What a process in the box needs in its env to use the box's Slurm."""
        return {"SLURM_CONF": self.conf}

    def run(self, host: str, argv: Sequence[str], timeout: float = 60, check: bool = False) -> subprocess.CompletedProcess:
        """Run ``argv`` in ``host`` with the box's Slurm env; its output as text."""
        done = subprocess.run([*self.enter(host), *argv], capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, **self.env()))
        if check and done.returncode:
            raise RuntimeError(f"{host}: {' '.join(argv)}: {(done.stderr or done.stdout).strip()[-400:]}")
        return done

    def counters(self, host: str, net: str) -> int:
        """Bytes through ``host``'s port on ``net`` so far, both ways (read on the machine's side)."""
        base = f"/sys/class/net/{self.port(host, net)}/statistics"
        return sum(int(open(f"{base}/{d}_bytes").read()) for d in ("rx", "tx"))

    def hosts_style(self, style: str) -> None:
        """Rewrite every host's /etc/hosts in place (its bind mount sees the change at once)."""
        if style not in STYLES:
            raise ValueError(f"hosts style {style!r}: one of {', '.join(STYLES)}")
        for h in HOSTS:
            with open(f"{self.dir}/hosts-{h.name}", "w") as f:  # truncate, same inode: the bind mount follows
                f.write(hosts_text(h, style))
        self.style = style

    # building
    def up(self, timeout: float = 90.0, lock: bool = True) -> str:
        """Build the box (after removing what a box of this prefix left) and wait for its Slurm; a line describing it.
        ``lock=False``: the caller already holds /tmp/ddp_box.lock (a second box beside its first)."""
        why = install()
        if why:
            raise RuntimeError(why)
        if lock and self._lock is None:
            self._lock = take_lock()
        self.down(unlock=False)
        t0 = time.monotonic()
        os.makedirs(self.dir, mode=0o755)
        for net in ("mgmt", "fast"):
            _sh("ip", "link", "add", self.bridge(net), "type", "bridge")
            _no_ipv6(self.bridge(net))
            _sh("ip", "link", "set", self.bridge(net), "up")
        self.hosts_style(self.style)
        for h in HOSTS:
            self._host(h)
        self._slurm()
        self.ssh_missing = box_ssh.missing()
        if self.ssh_missing is None:
            box_ssh.up(self, NODES)
        self._wait_nodes(timeout)
        return f"cluster box {self.prefix} up in {time.monotonic() - t0:.1f}s: login {self.host('login').mgmt}, nodes {', '.join(NODES)}"

    def _host(self, h: Host) -> None:
        ns = self.netns(h.name)
        _sh("ip", "netns", "add", ns)
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        # srun's own ports (SrunPortRange) are never an ephemeral port here: the tests tell ours from srun's by them
        _sh("nsenter", f"--net=/run/netns/{ns}", "sh", "-c", f"echo {SRUN_PORTS} > /proc/sys/net/ipv4/ip_local_reserved_ports")
        for net, addr, ifname in (("mgmt", h.mgmt, "mgmt0"), ("fast", h.fast, "fast0")):
            if addr is None:
                continue
            port = self.port(h.name, net)
            _sh("ip", "link", "add", port, "type", "veth", "peer", "name", ifname, "netns", ns)
            _no_ipv6(port)
            _sh("ip", "link", "set", port, "master", self.bridge(net), "up")
            _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", ifname)
            _sh("ip", "-n", ns, "link", "set", ifname, "up")
        script = (f"mount --bind {self.dir}/hosts-{h.name} /etc/hosts && mount -t tmpfs -o size=1g,mode=1777 box-shm /dev/shm"
                  f" && hostname {h.name} && exec sleep infinity")
        anchor = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c", script],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while _comm(anchor.pid) != "sleep":
            if anchor.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"host {h.name} did not start: {anchor.stderr.read().decode() if anchor.stderr else ''}")
            time.sleep(0.02)
        with open(f"{self.dir}/{h.name}.anchor", "w") as f:
            f.write(str(anchor.pid))

    def _conf(self) -> str:
        login = self.host("login")
        nodes = "\n".join(f"NodeName={n} NodeHostname={n} NodeAddr={self.host(n).mgmt} CPUs=4 RealMemory=4000 State=UNKNOWN"
                          for n in NODES)
        extra = f"SlurmUser=root\nAuthInfo=socket={self.munge_socket}\nSrunPortRange={SRUN_PORTS}\n"
        return local_slurm.render_conf(f"{self.prefix}box", f"login({login.mgmt})", self.dir, self.dir, f"{self.dir}/log", nodes, extra)

    def _slurm(self) -> None:
        munge = f"{self.dir}/munge"
        _sh("install", "-d", "-o", "munge", "-g", "munge", "-m", "0755", munge)
        _sh("runuser", "-u", "munge", "--", "/usr/sbin/munged", f"--socket={self.munge_socket}", f"--pid-file={munge}/munged.pid",
            f"--seed-file={munge}/munged.seed", f"--log-file={munge}/munged.log")
        for sub in ("slurmctld", "log", *(f"slurmd-{n}" for n in NODES)):
            os.makedirs(f"{self.dir}/{sub}", exist_ok=True)
        with open(self.conf, "w") as f:
            f.write(self._conf())
        self.run("login", ["/usr/sbin/slurmctld", "-c"], check=True)
        for n in NODES:
            self.run(n, ["/usr/sbin/slurmd", "-N", n], check=True)

    def idle_nodes(self) -> List[str]:
        done = self.run("login", ["sinfo", "-h", "-N", "-o", "%N %t"], timeout=15)
        return [ln.split()[0] for ln in done.stdout.splitlines() if len(ln.split()) == 2 and ln.split()[1] in ("idle", "alloc", "mix")]

    def _wait_nodes(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sorted(self.idle_nodes()) == sorted(NODES):
                return
            time.sleep(0.3)
        logs = _sh("sh", "-c", f"tail -n 5 {self.dir}/log/*.log", check=False).stdout
        raise RuntimeError(f"the box's Slurm nodes did not come up within {timeout:.0f}s:\n{self.run('login', ['sinfo']).stdout}\n{logs}")

    # removing
    def _namespaces(self) -> Dict[str, str]:
        """Our hosts' network namespaces that exist: name -> the namespace's identity (net:[inode])."""
        out = {}
        for h in HOSTS:
            path = f"/run/netns/{self.netns(h.name)}"
            if os.path.exists(path):
                out[h.name] = f"net:[{os.stat(path).st_ino}]"
        return out

    def processes(self) -> List[int]:
        """Every process in one of the box's hosts (its anchors, daemons, kernels, ranks, srun, tcpdump ...)."""
        ours = set(self._namespaces().values())
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.readlink(f"/proc/{entry}/ns/net") in ours:
                        pids.append(int(entry))
                except OSError:
                    continue
        return pids

    def down(self, unlock: bool = True) -> None:
        """Remove the box: its jobs, every process in its hosts (SIGTERM, then SIGKILL), munged, namespaces, bridges."""
        if os.path.exists(self.conf) and "login" in self._namespaces():
            try:
                self.run("login", ["scancel", "--full", "--user", "root"], timeout=10)
            except (OSError, subprocess.SubprocessError):
                pass  # the controller is gone: killing the processes below is all there is to do
        for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
            pids = self.processes()
            for pid in pids:
                _kill(pid, sig)
            deadline = time.monotonic() + wait
            while pids and time.monotonic() < deadline:
                pids = [p for p in pids if _comm(p) not in ("", "<zombie>")]
                time.sleep(0.05)
        local_slurm.stop_pid(f"{self.dir}/munge/munged.pid")
        for h in HOSTS:
            _sh("ip", "netns", "del", self.netns(h.name), check=False)
            for net in ("mgmt", "fast"):  # gone with the namespace, unless another's mount namespace still pins it
                if os.path.exists(f"/sys/class/net/{self.port(h.name, net)}"):
                    _sh("ip", "link", "del", self.port(h.name, net), check=False)
        for net in ("mgmt", "fast"):
            _sh("ip", "link", "del", self.bridge(net), check=False)
        if os.path.isdir(f"{self.dir}/log"):  # the daemons' logs outlive the box, for a failed test's reader
            shutil.rmtree(f"/tmp/ddp_box-{self.prefix}-logs", ignore_errors=True)
            shutil.copytree(f"{self.dir}/log", f"/tmp/ddp_box-{self.prefix}-logs", dirs_exist_ok=True)
        shutil.rmtree(self.dir, ignore_errors=True)
        if unlock and self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def leftovers(self) -> List[str]:
        """What of a box of this prefix exists (empty after ``down``)."""
        left = [f"netns {self.netns(h)}" for h in self._namespaces()]
        left += [f"bridge {self.bridge(n)}" for n in ("mgmt", "fast") if os.path.exists(f"/sys/class/net/{self.bridge(n)}")]
        left += [f"link {self.port(h.name, n)}" for h in HOSTS for n in ("mgmt", "fast") if os.path.exists(f"/sys/class/net/{self.port(h.name, n)}")]
        left += [f"process {p}" for p in self.processes()]
        return left + ([self.dir] if os.path.exists(self.dir) else [])


def _no_ipv6(ifname: str) -> None:
    """No address at all on the machine's side of the box (not even IPv6 link-local): no host reaches the machine."""
    with open(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6", "w") as f:
        f.write("1")


def _comm(pid: int) -> str:
    """A process's name; "<zombie>" for one that ended, "" for none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return ""
    return "<zombie>" if stat.rsplit(")", 1)[1].split()[0] == "Z" else stat[stat.index("(") + 1:stat.rindex(")")]


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, os.WNOHANG)  # our own child (an anchor): reaped, not left a zombie
    except ChildProcessError:
        pass


def main(argv: List[str]) -> int:
    box = Box()
    action = argv[0] if argv else "status"
    if action == "up":
        print(box.up())
    elif action == "down":
        box.down()
        print(f"cluster box {box.prefix} removed")
    elif action == "run" and len(argv) > 2:
        return subprocess.call([*box.enter(argv[1]), *argv[2:]], env=dict(os.environ, **box.env()))
    else:
        left = box.leftovers()
        print(f"cluster box {box.prefix}: " + ("; ".join(left) if left else f"not up ({missing() or 'nothing of it exists'})"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
