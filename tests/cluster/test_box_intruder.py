"""An intruder host on the management network (the cluster in a box) knocks on the kernel's control port while a
Slurm pool's ranks join: garbage, then the bytes a real rank sent in an earlier session, replayed. No code runs, the
pool starts and works as if nobody had knocked, and ddp_magic's log names the intruder's address."""
from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Set, Tuple

import box_fixtures
import cluster_box
import pytest

box = box_fixtures.box  # the fixtures, by name in this module
box_kernel = box_fixtures.box_kernel

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

SLURM = "%%ddp --slurm --nodes 2 --ntasks-per-node 2"
CELL = SLURM + "\nimport os, torch, torch.distributed as dist\nx = torch.ones(1)\ndist.all_reduce(x)\n(os.environ['SLURMD_NODENAME'], x.item())"
NOT_OURS = {6817} | set(range(60001, 60101))  # slurmctld, srun's ports (SrunPortRange)
KNOCK = r"""
import socket, sys, time
host, port, replay = sys.argv[1], int(sys.argv[2]), bytes.fromhex(open(sys.argv[3]).read())
for payload in (b"\x00GET / HTTP/1.0\r\n\r\n" * 50, replay, replay[:37] + bytes(300)):
    try:
        with socket.create_connection((host, port), timeout=2) as s:
            s.settimeout(2)
            s.sendall(payload)
            try:
                print(len(s.recv(65536)), flush=True)
            except OSError as e:
                print(type(e).__name__, flush=True)
    except OSError as e:
        print("connect", type(e).__name__, flush=True)
"""


def _payloads(pcap: bytes, dst: str) -> Dict[Tuple[str, int, int], bytes]:
    """TCP payload bytes sent to ``dst`` in a pcap (Ethernet, IPv4), per (source, source port, destination port)."""
    streams: Dict[Tuple[str, int, int], bytes] = {}
    pos = 24
    while pos + 16 <= len(pcap):
        incl = struct.unpack_from("<I", pcap, pos + 8)[0]
        frame = pcap[pos + 16: pos + 16 + incl]
        pos += 16 + incl
        if len(frame) < 34 or frame[12:14] != b"\x08\x00" or frame[23] != 6:
            continue
        ihl = (frame[14] & 0x0F) * 4
        src, to = ".".join(map(str, frame[26:30])), ".".join(map(str, frame[30:34]))
        tcp = frame[14 + ihl:]
        sport, dport = struct.unpack_from(">HH", tcp)
        data = tcp[(tcp[12] >> 4) * 4:]
        total = struct.unpack_from(">H", frame, 16)[0]
        data = data[: max(0, total - ihl - (tcp[12] >> 4) * 4)]
        if to == dst and data:
            key = (src, sport, dport)
            streams[key] = streams.get(key, b"") + data
    return streams


def _listening(pid: int, addr: str) -> Set[int]:
    """The TCP ports process ``pid`` listens on at ``addr`` (IPv4, in its own network namespace)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    want = socket.inet_aton(addr)[::-1].hex().upper()  # /proc/net/tcp writes an address little-endian
    with open(f"/proc/{pid}/net/tcp") as f:
        for line in list(f)[1:]:
            parts = line.split()
            host, port = parts[1].split(":")
            if parts[3] == "0A" and parts[9] in inodes and host == want:
                ports.add(int(port, 16))
    return ports - NOT_OURS


def _captured_rank_bytes(b: cluster_box.Box, k, tmp: Path) -> bytes:
    """A real session's bytes, as a rank on n1 sent them to the kernel's control port (a capture on the bridge)."""
    pcap = tmp / "session.pcap"
    dump = subprocess.Popen(["tcpdump", "-i", b.bridge("mgmt"), "-U", "-s", "0", "-w", str(pcap)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        k.run(CELL, timeout=240).ok()
    finally:
        time.sleep(0.5)
        dump.terminate()
        dump.wait(10)
        k.run("%ddp stop", timeout=60).ok()
    streams = _payloads(pcap.read_bytes(), b.host("login").mgmt)
    ours = [data for (src, _, dport), data in streams.items() if src == b.host("n1").mgmt and dport not in NOT_OURS]
    assert ours, f"no rank's bytes to the control port in the capture: {sorted(streams)}"
    return max(ours, key=len)


def test_an_intruder_cannot_join_or_harm_the_pool(box: cluster_box.Box, box_kernel, tmp_path: Path) -> None:
    replay = tmp_path / "replay.hex"
    replay.write_text(_captured_rank_bytes(box, box_kernel, tmp_path).hex())
    login = box.host("login").mgmt
    knocked: List[str] = []
    stop = threading.Event()

    # n2's new connections to login wait (SYNs dropped) until the intruder has knocked: the control port stays open
    # while n2's ranks retry, and they join once the rule goes (TCP retries its SYN)
    hold = ["-p", "tcp", "--syn", "-d", login, "-m", "multiport", "!", "--dports", "6817,60001:60100", "-j", "DROP"]
    box.run("n2", ["iptables", "-I", "OUTPUT", *hold], check=True)

    def watch() -> None:  # the control port opens while the ranks join: knock then
        try:
            while not stop.is_set():
                ports = _listening(box_kernel.pid, login)
                if ports:
                    port = ports.pop()
                    done = box.run("intruder", [sys.executable, "-c", KNOCK, login, str(port), str(replay)], timeout=30)
                    knocked.append(f"{port}: {done.stdout.split()} {done.stderr[-300:]}")
                    return
                time.sleep(0.01)
        finally:
            box.run("n2", ["iptables", "-D", "OUTPUT", *hold])

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        for _attempt in range(2):
            ex = box_kernel.run(CELL, timeout=240)
            assert ex.error is None, f"{ex.error}\n{ex.stderr[-3000:]}"
            values = box_kernel.value("[tuple(v) for v in _]")
            assert values == [("n1", 4.0), ("n1", 4.0), ("n2", 4.0), ("n2", 4.0)], "the pool is whole: 4 ranks, no more"
        watcher.join(35)
        assert knocked, "the intruder found the control port open while the ranks joined"
        rejected = box_kernel.value("get_ipython().magics_manager.registry['DDPMagics'].pool.rejected_peers")
        assert rejected >= 3, (rejected, knocked)
        log = box_kernel.run("%ddp log", timeout=30).ok().stdout
        refused = [ln for ln in log.splitlines() if f"the control port refused a peer at {box.host('intruder').mgmt}:" in ln]
        assert len(refused) >= 3, f"{knocked}\n{log[-3000:]}"
        print("\n".join(refused[:3]))
    finally:
        stop.set()
        watcher.join(35)
        box_kernel.run("%ddp stop", timeout=60)
