"""A kept rank's output log keeps at most its cap (procs/rank_keep.py ``Spool``): the oldest half goes, from a line's
start, and an attach from before what is kept learns how much it lost. A real pipe, thread and file, as on a rank."""
from __future__ import annotations

import os
import socket
import time

from ddp_magic.procs.rank_keep import Spool

LINES = "".join(f"line {i:04d}\n" for i in range(500))  # 5,000 bytes, 10 a line


def _read_all(sock: socket.socket, n: int) -> bytes:
    sock.settimeout(10)
    out = b""
    while len(out) < n:
        out += sock.recv(65536)
    return out


def test_the_cap_drops_the_oldest_lines_and_says_how_much(tmp_path) -> None:
    path = str(tmp_path / "r0.out")
    kernel, notebook = socket.socketpair()
    fd = os.dup(kernel.fileno())  # the rank's fd 1: the spool puts its pipe there
    kernel.close()
    spool = Spool(fd, path, cap=1024)
    for i in range(0, len(LINES), 100):
        os.write(fd, LINES[i:i + 100].encode())
    deadline = time.monotonic() + 10
    while spool.written < len(LINES) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert spool.written == len(LINES)
    assert _read_all(notebook, len(LINES)).decode() == LINES  # the attached kernel got every byte as it came
    kept = open(path).read()
    assert 0 < len(kept) <= 1024 and spool.base % 10 == 0 and kept == LINES[spool.base:]  # from a line's start
    assert int(open(path + ".base").read()) == spool.base
    assert spool.dropped(0) == spool.base and spool.dropped(spool.base + 10) == 0 and spool.dropped(10**9) == 0
    later, reader = socket.socketpair()
    spool.attach_sink(later, 0)  # a kernel that showed nothing: from the oldest byte kept
    assert _read_all(reader, len(kept)).decode() == kept
    again_fd = os.dup(fd)
    again = Spool(again_fd, path)  # a rank started again on the same file: its offsets go on from the kept base
    assert (again.base, again.written) == (spool.base, len(LINES))
    os.close(fd)
    os.close(again_fd)
    for s in (notebook, reader):
        s.close()
