#!/usr/bin/env python
"""A small message's round trip over the control channel, plain TCP and TLS, as the hub and a rank do it (one host).

    .venv/bin/python bench/tls_roundtrip.py                       # this tree: 5 alternations of 2,000 round trips
    .venv/bin/python bench/tls_roundtrip.py --before main         # and ddp_magic as committed at main, alternating

The kernel's side is the hub's: its epoll (kernel/conns.py's ``Poller``, ``watch``), ``ReadBuffer.frames`` and a RUN
sent as ``Hub.broadcast`` sends it; the rank's is procs/worker.py's reader (``tls.reading``, ``protocol.recv``) and
``Channel.send`` for the DONE, in a child process. The figures are the median round trip per alternation, and the CPU both processes spent per round trip
(every thread: steadier than the wall time on a shared machine), in µs. It
isolates what TLS adds per message from the warm cell's other costs (bench_cluster.py measures the cell).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

RANK = r"""
import sys
from ddp_magic.procs.rank_channel import Channel
from ddp_magic.wire import protocol as P, tls
import socket
port, fingerprint, secret = int(sys.argv[1]), sys.argv[2], bytes.fromhex(sys.argv[3])
sock = tls.connect(("127.0.0.1", port), fingerprint) if fingerprint != "-" else socket.create_connection(("127.0.0.1", port))
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1) if fingerprint == "-" else None
P.client_handshake(sock, secret)
P.send(sock, P.message(P.HELLO, rank=0))
source, chan = tls.reading(sock), Channel(sock)
import time
while True:
    msg = P.recv(source)
    if msg.get("cell") == 50:
        cpu = time.process_time()
    if msg["op"] == P.SHUTDOWN:
        print("rank_cpu", time.process_time() - cpu, flush=True)
        break
    chan.send(P.DONE, rank=0, cell=msg["cell"], status="ok")
"""

KERNEL = r"""
import select, subprocess, sys, time, statistics
from ddp_magic.kernel.admission import Admission
from ddp_magic.kernel.conns import Conn, Poller, ReadBuffer, send_all_nonblocking, watch
from ddp_magic.wire import protocol as P, tls
n, use_tls = int(sys.argv[1]), sys.argv[2] == "tls"
key = tls.ServerKey() if use_tls else None
secret = P.new_secret()
admission = Admission("127.0.0.1", secret, 8, lambda: None, key)
rank = subprocess.Popen([sys.executable, "-c", sys.argv[3], str(admission.port), key.fingerprint if key else "-", secret.hex()])
joined = []
while not joined:
    select.select([admission.fileno()], [], [], 0.5)
    joined = admission.take()
[(sock, hello)] = joined
sock.setblocking(False)
conn, poller, by_fd, rbuf = Conn(0, sock), Poller(), {}, ReadBuffer()
watch(poller, by_fd, sock, conn)
times = []
for i in range(n + 50):
    frame = P.encode(P.message(P.RUN, cell=i, source="x = 1", silent=False))
    t0 = time.perf_counter()
    if not tls.send_direct(sock, frame):
        send_all_nonblocking(sock, frame)
    got = []
    while not got:
        for fd in poller.wait(5.0):
            try:
                got += rbuf.frames(by_fd[fd]) or []
            except BlockingIOError:
                pass
    if i >= 50:
        times.append(time.perf_counter() - t0)
    elif i == 49:
        cpu = time.process_time()
cpu = time.process_time() - cpu
sock.setblocking(True)
tls.send(sock, P.encode(P.message(P.SHUTDOWN)))
rank.wait(10)
admission.close()
print("kernel_cpu", cpu, flush=True)
print(statistics.median(times) * 1e6)
"""


def once(src: str, way: str, n: int) -> Tuple[float, float]:
    """The median round trip, and the CPU both processes spent per round trip (every thread), in µs."""
    env = dict(os.environ, PYTHONPATH=src)
    out = subprocess.run([sys.executable, "-c", KERNEL, str(n), way, RANK], env=env, capture_output=True, text=True, timeout=600,
                         cwd=src)  # ``-c`` puts the current directory first on the path: run in the tree measured
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    words = out.stdout.split()
    cpu = sum(float(words[i + 1]) for i, w in enumerate(words) if w in ("rank_cpu", "kernel_cpu"))
    return float(words[-1]), cpu / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", metavar="REV", help="also ddp_magic as committed at REV (git archive), alternating")
    p.add_argument("--alternations", type=int, default=5)
    p.add_argument("-n", type=int, default=2000, help="round trips per alternation")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = [("this tree", REPO)]
        if a.before:
            tar = subprocess.run(["git", "-C", REPO, "archive", a.before, "ddp_magic"], capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=tar, check=True)
            trees.append((a.before, tmp))
        got: dict = {}
        load0 = os.getloadavg()[0]
        for _ in range(a.alternations):
            for name, src in trees:
                for way in ("tcp", "tls"):
                    got.setdefault((name, way), []).append(once(src, way, a.n))
        print(f"load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; {a.alternations} x {a.n} round trips")
        print("| tree | plain TCP, µs | TLS, µs | TLS − TCP, µs | CPU, plain TCP, µs | CPU, TLS, µs | CPU, TLS − TCP, µs |\n"
              "|---|---|---|---|---|---|---|")
        for name, _ in trees:
            cols = []
            for k in (0, 1):  # wall, then CPU (both processes)
                tcp, tls_ = [v[k] for v in got[(name, "tcp")]], [v[k] for v in got[(name, "tls")]]
                diff = [b - c for b, c in zip(tls_, tcp)]
                cols += [f"{statistics.median(v):.0f} ({min(v):.0f}–{max(v):.0f})" for v in (tcp, tls_, diff)]
            print(f"| {name} | " + " | ".join(cols) + " |")


if __name__ == "__main__":
    main()
