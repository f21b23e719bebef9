"""The cluster in a box itself: hosts that are hosts (own name, own /etc/hosts, own /dev/shm), two networks, nothing
leaving the machine, a Slurm of its own beside the one-host one, and nothing left once it is down."""
from __future__ import annotations

import os
import subprocess
import sys

import box_fixtures
import cluster_box
import pytest

box = box_fixtures.box  # the fixtures, by name in this module
box_kernel = box_fixtures.box_kernel
debian_hosts = box_fixtures.debian_hosts


def test_each_host_has_its_name_addresses_and_hosts_file(box: cluster_box.Box) -> None:
    for h in cluster_box.HOSTS:
        assert box.run(h.name, ["hostname"]).stdout.strip() == h.name
        addrs = box.run(h.name, ["hostname", "-I"]).stdout.split()
        assert addrs == [a for a in (h.mgmt, h.fast) if a], f"{h.name}: {addrs}"
        assert box.run(h.name, ["getent", "hosts", h.name]).stdout.split()[0] == h.mgmt
        # an ephemeral port (the kernel's control port, a MASTER_PORT) is never one of srun's: the fault and intruder tests tell them apart by it
        assert box.run(h.name, ["cat", "/proc/sys/net/ipv4/ip_local_reserved_ports"]).stdout.strip() == cluster_box.SRUN_PORTS
    assert box.run("n1", ["getent", "hosts", "n2"]).stdout.split()[0] == box.host("n2").mgmt
    marker = f"/dev/shm/box-{os.getpid()}"
    box.run("n1", ["touch", marker], check=True)
    try:
        assert box.run("n2", ["ls", marker]).returncode != 0, "each host has its own /dev/shm, as real hosts do"
        assert not os.path.exists(marker)
    finally:
        box.run("n1", ["rm", "-f", marker])


def test_debian_hosts_style_maps_the_own_name_to_loopback(box: cluster_box.Box, debian_hosts: str) -> None:
    for name in ("login", "n1", "n2"):
        assert box.run(name, ["getent", "hosts", name]).stdout.split()[0] == "127.0.1.1"
    assert box.run("n1", ["getent", "hosts", "n2"]).stdout.split()[0] == box.host("n2").mgmt


def test_fast_network_joins_the_nodes_only(box: cluster_box.Box) -> None:
    ping = ["ping", "-c", "1", "-W", "2"]
    if not os.path.exists("/usr/bin/ping") and not os.path.exists("/bin/ping"):
        ping = ["python3", "-c", "import socket,sys; s=socket.socket(); s.settimeout(2); s.connect_ex((sys.argv[1], 6818)) == 0 or sys.exit(1)"]
    assert box.run("n1", [*ping, box.host("n2").fast]).returncode == 0
    assert box.run("login", [*ping, box.host("n2").mgmt]).returncode == 0
    assert box.run("login", ["ip", "-br", "link"]).stdout.count("fast0") == 0


def test_nothing_leaves_the_machine(box: cluster_box.Box) -> None:
    """No default route in any host, no address on the bridges (the machine cannot be reached from a host), no
    forwarding, no NAT rule naming the box."""
    for h in cluster_box.HOSTS:
        routes = box.run(h.name, ["ip", "route"]).stdout
        assert "default" not in routes and "via" not in routes, f"{h.name}: {routes}"
        probe = box.run(h.name, ["python3", "-c", "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                                 "try:\n s.connect(('192.0.2.1', 9)); print('routed')\nexcept OSError as e: print(e.errno)"])
        assert probe.stdout.strip() != "routed", f"{h.name} has a route off the box"
        assert box.run(h.name, ["cat", "/proc/sys/net/ipv4/ip_forward"]).stdout.strip() == "0"
    for net in ("mgmt", "fast"):
        out = subprocess.run(["ip", "-br", "addr", "show", "dev", box.bridge(net)], capture_output=True, text=True).stdout
        assert len(out.split()) == 2, f"the bridge {box.bridge(net)} has an address on the machine's side: {out}"
    nat = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True).stdout
    assert box.prefix not in nat and "198.51.100" not in nat and "203.0.113" not in nat


def test_slurm_of_its_own_runs_a_task_on_each_node(box: cluster_box.Box) -> None:
    done = box.run("login", ["srun", "-N3", "sh", "-c", "echo $SLURMD_NODENAME $(hostname) $(hostname -I)"], check=True)
    lines = sorted(done.stdout.splitlines())
    assert [ln.split()[:3] for ln in lines] == [[n, n, box.host(n).mgmt] for n in cluster_box.NODES]
    conf = open(box.conf).read()
    assert f"ClusterName={box.prefix}box" in conf and f"StateSaveLocation={box.dir}/" in conf
    assert "/var/lib/slurm" not in conf and "/etc/slurm" not in box.conf, "every path of the box's Slurm is its own"


def test_the_kernel_runs_on_login(box: cluster_box.Box, box_kernel) -> None:
    for _ in range(2):
        out = box_kernel.run("import socket, os; print(socket.gethostname(), os.environ['SLURM_CONF'])").ok().stdout.split()
        assert out == ["login", box.conf]


def test_a_second_box_beside_it_and_nothing_left_after(box: cluster_box.Box) -> None:
    """Another prefix makes another box (same addresses, other bridges), and ``down`` leaves nothing of it."""
    other = cluster_box.Box(prefix=box.prefix + "x")
    try:
        other.up(lock=False)  # the session's box holds the lock: this one is its guest
        assert other.run("n1", ["hostname"]).stdout.strip() == "n1"
        assert sorted(other.idle_nodes()) == list(cluster_box.NODES)
        assert sorted(box.idle_nodes()) == list(cluster_box.NODES), "the first box's Slurm is untouched"
    finally:
        other.down(unlock=False)
    assert other.leftovers() == []


def test_prefix_is_checked() -> None:
    with pytest.raises(ValueError, match="DDP_MAGIC_BOX_PREFIX"):
        cluster_box.Box(prefix="Has-Dash-And-Too-Long")


def test_a_secret_sealed_by_munge_opens_once_on_each_node(box: cluster_box.Box) -> None:
    """The pool's secret crosses srun's clear wire as MUNGE credentials (wire/slurm_munge.py): each node's munged
    opens one once; the same credential again is refused."""
    code = ("import os, sys; from ddp_magic.wire import slurm_env as s; "
            "print(s.secret_env(bytes.fromhex('ab' * 32), 2, os.environ)[s.MUNGED_ENV])")
    env = ["env", f"PYTHONPATH={box_fixtures.ROOT}", f"SLURM_CONF={box.conf}"]
    sealed = box.run("login", [*env, sys.executable, "-c", code], check=True).stdout.strip()
    assert sealed.count("MUNGE:") == 2 and "ab" * 32 not in sealed
    read = ("import os; from ddp_magic.wire import slurm_env as s; "
            "print(s.step_secret({s.MUNGED_ENV: os.environ['CREDS'], 'SLURM_NODEID': os.environ['NODE'], 'SLURM_CONF': os.environ['SLURM_CONF']}).hex())")
    for node, index in (("n1", "0"), ("n2", "1")):
        out = box.run(node, [*env, f"CREDS={sealed}", f"NODE={index}", sys.executable, "-c", read], check=True).stdout.strip()
        assert out == "ab" * 32
    again = box.run("n1", [*env, f"CREDS={sealed}", "NODE=0", sys.executable, "-c", read])
    assert again.returncode != 0 and "unmunge could not read the pool's secret" in again.stderr
