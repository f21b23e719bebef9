"""%%ddp --slurm across real hosts (the cluster in a box): DDP trains with either style of /etc/hosts, each node's
collectives take the interface on its route to MASTER_ADDR (or --iface, or the user's GLOO_SOCKET_IFNAME), %ddp_env
says so, c10d's reverse-lookup warning shows once, and nothing readable crosses the wire (TLS). Each cell runs twice."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import box_fixtures
import cluster_box
import pytest

box = box_fixtures.box  # the fixtures, by name in this module
box_kernel = box_fixtures.box_kernel

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

SLURM = "%%ddp --slurm --nodes 2 --ntasks-per-node 2"
TRAIN = box_fixtures.DDP_TRAIN + """(socket.gethostname(), os.environ.get('GLOO_SOCKET_IFNAME'), w.tolist())
"""
C10D = "The hostname of the client socket cannot be retrieved"


def _values(k, ex) -> list:
    ex.ok()
    return k.value("[tuple(v) for v in _]") if ex.result else []


def _stop(k) -> None:
    k.run("%ddp stop", timeout=60).ok()


@pytest.mark.parametrize("style", cluster_box.STYLES)
def test_ddp_trains_across_hosts_with_either_hosts_file(box: cluster_box.Box, box_kernel, style: str) -> None:
    box.hosts_style(style)
    try:
        for _attempt in range(2):
            ex = box_kernel.run(SLURM + TRAIN, timeout=240)
            assert ex.error is None, f"{ex.error}\n{ex.stderr[-3000:]}"
            assert "connectFullMesh" not in ex.stderr and "127.0.1.1" not in ex.stderr
            assert ex.stderr.count(C10D) <= 1, f"c10d's warning once, not once per rank:\n{ex.stderr}"
            if C10D in ex.stderr:
                assert re.search(r"\[ranks [\d, -]+\] \[W socket\.cpp:\d+\] \[c10d\] " + C10D, ex.stderr), ex.stderr
            values = _values(box_kernel, ex)
            assert [v[0] for v in values] == ["n1", "n1", "n2", "n2"]
            assert {v[1] for v in values} == {"mgmt0"}, "each node chose the interface on its route to MASTER_ADDR"
            assert all(v[2] == values[0][2] for v in values), "identical weights on every rank"
        env = box_kernel.run("%ddp_env", timeout=60).ok().result or ""
        for node in ("n1", "n2"):
            assert f"{node}: mgmt0, on the route to MASTER_ADDR {box.host('n1').mgmt}" in env, env
        warned = [ln for ln in env.splitlines() if "own name resolves to 127.0.1.1" in ln]
        if style == "debian":
            assert len(warned) == 2 and all("GLOO_SOCKET_IFNAME=mgmt0 was set there" in ln for ln in warned), env
        else:
            assert warned == [], env
    finally:
        box.hosts_style("resolve")
        _stop(box_kernel)


ALL_REDUCE = """
import torch, torch.distributed as dist
x = torch.ones(4 << 20)  # 16 MiB a rank
for _ in range(4):
    dist.all_reduce(x)
(os.environ.get('GLOO_SOCKET_IFNAME'), os.environ.get('DDP_MAGIC_IFACE_HOW'), float(x[0]))
"""


def _bytes(box: cluster_box.Box, net: str) -> int:
    return sum(box.counters(n, net) for n in ("n1", "n2"))


@pytest.mark.parametrize("how", ["--iface", "GLOO_SOCKET_IFNAME"])
def test_collectives_move_to_the_fast_network_when_asked(box: cluster_box.Box, box_kernel, how: str) -> None:
    """--iface fast0 (or the user's GLOO_SOCKET_IFNAME=fast0): the all_reduce bytes cross the fast bridge's ports,
    the management network carries the control channel (login is on it alone) and little else."""
    head = SLURM + (" --iface fast0" if how == "--iface" else "")
    if how == "GLOO_SOCKET_IFNAME":
        box_kernel.run("import os; os.environ['GLOO_SOCKET_IFNAME'] = 'fast0'").ok()  # the step's env is the kernel's
    try:
        box_kernel.run(head + "\nimport os", timeout=240).ok()
        for _attempt in range(2):
            fast0, mgmt0, login0 = _bytes(box, "fast"), _bytes(box, "mgmt"), box.counters("login", "mgmt")
            ex = box_kernel.run(head + ALL_REDUCE, timeout=240)
            assert ex.error is None, f"{ex.error}\n{ex.stderr[-3000:]}"
            fast, mgmt, login = _bytes(box, "fast") - fast0, _bytes(box, "mgmt") - mgmt0, box.counters("login", "mgmt") - login0
            values = _values(box_kernel, ex)
            assert {v[0] for v in values} == {"fast0"} and {v[2] for v in values} == {4.0 ** 4}
            kept = "the user's GLOO_SOCKET_IFNAME=fast0 kept" if how == "GLOO_SOCKET_IFNAME" else "fast0, --iface"
            assert all(kept in v[1] for v in values), values
            assert fast > 4 * (16 << 20), f"the all_reduce went over the fast network: {fast:,} bytes there"
            assert mgmt < fast / 10, f"the management network carried {mgmt:,} bytes against {fast:,} on the fast one"
            assert login > 0, "the control channel (login is on the management network only) carried the cell"
    finally:
        box_kernel.run("import os; os.environ.pop('GLOO_SOCKET_IFNAME', None)").ok()
        _stop(box_kernel)


def test_nothing_readable_on_the_wire(box: cluster_box.Box, box_kernel, tmp_path) -> None:
    """A capture on the management bridge while a cell prints one marker and returns another holds neither marker,
    nor the pool's secret: the control channel across hosts is TLS."""
    printed, returned = "PRINTED-MARKER-6f1d2a", "RETURNED-MARKER-93be07"
    pcap = tmp_path / "mgmt.pcap"
    dump = subprocess.Popen(["tcpdump", "-i", box.bridge("mgmt"), "-U", "-s", "0", "-w", str(pcap)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(1.0)  # tcpdump listening
        for _attempt in range(2):
            cell = f"{SLURM}\nprint('{printed[:7]}' + '{printed[7:]}')\n'{returned[:8]}' + '{returned[8:]}'"
            ex = box_kernel.run(cell, timeout=240).ok()
            assert printed in ex.stdout and returned in (ex.result or "")
        secret = bytes.fromhex(box_kernel.value("get_ipython().magics_manager.registry['DDPMagics'].pool.secret.hex()"))
    finally:
        time.sleep(0.5)
        dump.send_signal(signal.SIGINT)
        dump.wait(10)
        _stop(box_kernel)
    data = pcap.read_bytes()
    assert len(data) > 20_000, "the capture saw the pool's traffic"
    for needle in (printed.encode(), returned.encode(), secret, secret.hex().encode()):
        assert needle not in data, f"{needle[:12]!r}... crossed the wire in the clear"
    assert os.path.getsize(pcap) == len(data)
