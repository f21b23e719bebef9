"""A real Slurm on this one machine: two fake nodes (n1, n2), for the tests and the benchmark.

Needs root and Debian's packages (slurmctld, slurmd, slurm-client, munge; scripts/setup.sh
installs them when root). ``start()`` writes /etc/slurm/slurm.conf for this host, starts
munged, slurmctld and one slurmd per node, and waits until ``sinfo`` shows both nodes idle;
``stop()`` stops what ``start()`` started, each daemon by its pid file. A cluster that
already runs with this configuration is used as it is (and left running). From a shell::

    python scripts/local_slurm.py start|stop|status

Facts this relies on (tried here): ../shared/TOOLCHAIN.md, "A real Slurm on one machine".
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import List, Optional, Tuple

CONF = "/etc/slurm/slurm.conf"
NODES = ("n1", "n2")
CPUS_PER_NODE = 4
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
BINARIES = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/srun", "/usr/bin/salloc", "/usr/sbin/munged")
MUNGE_PID = "/run/munge/munged.pid"
MARK = "# written by ddp_magic scripts/local_slurm.py"


STATE = "/var/lib/slurm/ddpmagic"  # ours alone: a Slurm that ran here before keeps /var/lib/slurm/slurmctld (and its clustername)
RUN = "/run/slurm/ddpmagic"
LOGS = "/var/log/slurm/ddpmagic"
CTLD_PID = f"{RUN}/slurmctld.pid"
LEGACY_PIDS = ("/run/slurm/slurmctld.pid", "/run/slurm/slurmd-n1.pid", "/run/slurm/slurmd-n2.pid")  # before the paths were ours


def slurmd_pid(node: str) -> str:
    return f"{RUN}/slurmd-{node}.pid"


def render_conf(cluster: str, ctld: str, state: str, run: str, logs: str, nodes: str, extra: str = "") -> str:
    """A slurm.conf whose state, spool, pid and log paths are the caller's own: the lines that work without systemd or
    cgroups, shared by this one-host Slurm and the cluster in a box (cluster_box.py). ``ctld``: ``host(addr)``."""
    return f"""{MARK}
ClusterName={cluster}
SlurmctldHost={ctld}
AuthType=auth/munge
StateSaveLocation={state}/slurmctld
SlurmdSpoolDir={state}/slurmd-%n
SlurmctldPidFile={run}/slurmctld.pid
SlurmdPidFile={run}/slurmd-%n.pid
SlurmctldLogFile={logs}/slurmctld.log
SlurmdLogFile={logs}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerParameters=sched_interval=1
MinJobAge=5
KillWait=2
InactiveLimit=0
SlurmdTimeout=30
{extra}{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def conf_text(host: str) -> str:
    """slurm.conf for two fake nodes on ``host`` (``hostname -s``), every path under ours (STATE, RUN, LOGS)."""
    nodes = "\n".join(
        f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={17001 + i} CPUs={CPUS_PER_NODE} RealMemory=4000 State=UNKNOWN"
        for i, n in enumerate(NODES)
    )
    return render_conf("ddpmagic", f"{host}(127.0.0.1)", STATE, RUN, LOGS, nodes, "SlurmUser=slurm\nSlurmctldPort=16817\n")


def private_state(state: str, cluster: str) -> None:
    """A ``clustername`` in our own state folder that names another cluster (ours renamed) goes: slurmctld would stop
    with CLUSTER NAME MISMATCH. Nobody else writes there."""
    path = os.path.join(state, "slurmctld", "clustername")
    try:
        with open(path) as f:
            stale = f.read().strip() != cluster
    except OSError:
        return
    if stale:
        os.remove(path)


def missing() -> Optional[str]:
    """Why this machine cannot run the local Slurm (None: it can)."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return "the local Slurm needs Linux"
    if os.geteuid() != 0:
        return "the local Slurm needs root (it writes /etc/slurm and starts slurmctld/slurmd); CI runs as root"
    absent = [b for b in BINARIES if not os.path.exists(b)]
    if absent:
        return f"Slurm is not installed ({', '.join(absent)} missing): apt-get install -y {' '.join(PACKAGES)} (scripts/setup.sh does it as root)"
    return None


def install() -> Optional[str]:
    """apt-get install the packages when root and they are missing; returns why not, or None."""
    why = missing()
    if why is None or not why.startswith("Slurm is not installed"):
        return why
    if not shutil.which("apt-get"):
        return why + "; no apt-get here"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            return f"apt-get install {' '.join(PACKAGES)} failed: {done.stderr.strip()[-300:]}"
    return missing()


def alive(pidfile: str) -> Optional[int]:
    """The pid a pid file names when that process runs, else None."""
    try:
        with open(pidfile) as f:
            pid = int(f.read().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def running() -> bool:
    """Whether our cluster's daemons are up (all of them, by their pid files)."""
    return all(alive(p) for p in (MUNGE_PID, CTLD_PID, *map(slurmd_pid, NODES)))


def _run(cmd: List[str], timeout: float = 20) -> Tuple[int, str]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return done.returncode, (done.stdout + done.stderr).strip()


def idle_nodes() -> List[str]:
    """The nodes sinfo shows idle (or allocated/mixed: up and usable)."""
    try:
        code, out = _run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if code:
        return []
    return [ln.split()[0] for ln in out.splitlines() if len(ln.split()) == 2 and ln.split()[1] in ("idle", "alloc", "mix")]


def _hosts_entry() -> None:
    """n1 and n2 resolve (to 127.0.0.1), as a cluster's node names do: a batch script's ``scontrol show hostnames`` works.
    ddp_magic itself never needs it (it takes NodeAddr)."""
    line = "127.0.0.1 " + " ".join(NODES) + "  " + MARK
    try:
        with open("/etc/hosts") as f:
            if line in f.read():
                return
        with open("/etc/hosts", "a") as f:
            f.write(line + "\n")
    except OSError:
        pass  # a read-only /etc/hosts: only batch scripts that resolve node names are affected


def _start_daemons(host: str) -> None:
    subprocess.run(["install", "-d", "-o", "munge", "-g", "munge", "-m", "0755", "/run/munge"], check=True)
    if not alive(MUNGE_PID):
        subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True)
    for folder in (f"{STATE}/slurmctld", LOGS, RUN):
        subprocess.run(["install", "-d", "-o", "slurm", "-g", "slurm", folder], check=True)
    for node in NODES:
        os.makedirs(f"{STATE}/slurmd-{node}", exist_ok=True)
    private_state(STATE, "ddpmagic")
    if not alive(CTLD_PID):
        subprocess.run(["/usr/sbin/slurmctld", "-c"], check=True)  # -c: no jobs of an earlier run come back
    for node in NODES:
        if not alive(slurmd_pid(node)):
            subprocess.run(["/usr/sbin/slurmd", "-N", node], check=True)


def start(timeout: float = 60.0) -> str:
    """Start the local cluster (or find it running); returns a line describing it. Raises RuntimeError with the cause."""
    why = install()
    if why:
        raise RuntimeError(why)
    host = socket.gethostname().split(".")[0]
    text = conf_text(host)
    old = open(CONF).read() if os.path.exists(CONF) else ""
    if old != text:
        if running():
            stop()
        if MARK in old:  # ours, from before the paths were ours: its daemons hold the ports
            for pidfile in LEGACY_PIDS:
                stop_pid(pidfile)
        os.makedirs(os.path.dirname(CONF), exist_ok=True)
        with open(CONF, "w") as f:
            f.write(text)
    _hosts_entry()
    _start_daemons(host)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sorted(idle_nodes()) == sorted(NODES):
            return f"local Slurm up: nodes {', '.join(NODES)} on {host}, {CPUS_PER_NODE} CPUs each"
        for node in NODES:  # a node left DOWN by an earlier run comes back
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True)
        time.sleep(0.5)
    logs = _run(["sh", "-c", f"tail -n 5 {LOGS}/slurmctld.log {LOGS}/slurmd-*.log"])[1]
    raise RuntimeError(f"the local Slurm's nodes did not come up within {timeout:.0f}s:\n{_run(['sinfo'])[1]}\n{logs}")


def stop_pid(pidfile: str, wait: float = 10.0) -> None:
    """SIGTERM the daemon a pid file names, SIGKILL after ``wait`` seconds; nothing when it is not running."""
    pid = alive(pidfile)
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


def _wait_queue_empty(seconds: float) -> None:
    """Until squeue lists no job (the cancelled ones released their nodes), or ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=10)
        if out.returncode != 0 or not out.stdout.strip():
            return
        time.sleep(0.2)


def _stop_holders() -> None:
    """SIGTERM, then SIGKILL, every ``salloc ... ddp_magic.procs.slurm_hold`` still running (a test's leftovers) in this
    network namespace (a cluster in a box's holders run in its login host and are its own to stop)."""
    pids = []
    here = os.readlink("/proc/self/ns/net")
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if os.readlink(f"/proc/{entry}/ns/net") != here:
                continue
        except (OSError, ValueError):
            continue
        if argv and argv[0].endswith(b"salloc") and b"ddp_magic.procs.slurm_hold" in argv:
            pids.append(int(entry))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(0.5)


def stop() -> None:
    """Cancel every job, then stop the slurmds, slurmctld and munged (each by its pid file)."""
    if alive(CTLD_PID):
        subprocess.run(["scancel", "--full", "--user", "root"], capture_output=True, timeout=10)
        _wait_queue_empty(10.0)
    _stop_holders()  # an salloc whose controller is gone retries for ever (at full CPU): never leave one behind
    for node in NODES:
        stop_pid(slurmd_pid(node))
    stop_pid(CTLD_PID)
    stop_pid(MUNGE_PID)


def main(argv: List[str]) -> int:
    action = argv[0] if argv else "status"
    if action == "start":
        print(start())
    elif action == "stop":
        stop()
        print("local Slurm stopped")
    else:
        print("running" if running() else f"not running ({missing() or 'daemons down'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
