"""A kept rank's output log keeps at most its cap (procs/rank_keep.py ``Spool``): the oldest half goes, from a line's
start, and an attach from before what is kept learns how much it lost. A real pipe, thread and file, as on a rank."""
from __future__ import annotations

import os
import socket
import time
from typing import Callable, List

import pytest

from ddp_magic.procs import rank_keep
from ddp_magic.procs.rank_keep import Spool, _read_base
from ddp_magic.wire.capture import spool_marker

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
    marker = spool_marker(0)  # where on the socket the spool's bytes begin (the kernel counts from there)
    assert _read_all(notebook, len(marker) + len(LINES)) == marker + LINES.encode()  # every byte as it came
    kept = open(path).read()
    assert 0 < len(kept) <= 1024 and spool.base % 10 == 0 and kept == LINES[spool.base:]  # from a line's start
    assert _read_base(path) == spool.base
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


class Crash(Exception):
    """The rank dies here (SIGKILL, the OOM killer): nothing after this step ran."""


def _dying_at(step: int, real: Callable[[str, str], None]) -> Callable[[str, str], None]:
    """os.replace, but the rank dies before the rename number ``step`` (0: the first)."""
    done: List[str] = []

    def replace(src: str, dst: str) -> None:
        if len(done) == step:
            raise Crash(f"the rank died before renaming {os.path.basename(src)}")
        done.append(dst)
        real(src, dst)

    return replace


@pytest.mark.parametrize("step", [0, 1, 2])
def test_a_trim_cut_short_at_any_step_leaves_a_file_and_base_that_agree(tmp_path, monkeypatch, step: int) -> None:
    """``_trim`` writes the new file, then ``.base`` (its rename), then renames the file: the rank dying after ``step``
    of those renames (0: before either, 1: between them, 2: after both) leaves a pair that a rank started again on the
    file reads right: every byte it holds at the offset the rank wrote it at. Twice over: a second trim on top."""
    path = str(tmp_path / "r0.out")
    sent = ""
    for trim in range(2):
        fd = os.open(os.devnull, os.O_WRONLY)  # the rank's fd 1 (the kernel's socket: none here)
        spool = Spool(fd, path)
        chunk = "".join(f"trim {trim} line {i:04d}\n" for i in range(300))
        os.write(fd, chunk.encode())
        sent += chunk
        deadline = time.monotonic() + 10
        while spool.written < len(sent) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert spool.written == len(sent)
        real = os.replace
        with spool.lock:
            spool.cap = 2048
            monkeypatch.setattr(rank_keep.os, "replace", _dying_at(step, real))
            try:
                if step < 2:
                    with pytest.raises(Crash):
                        spool._trim()
                else:
                    spool._trim()
            finally:
                monkeypatch.setattr(rank_keep.os, "replace", real)
        again_fd = os.open(os.devnull, os.O_WRONLY)
        again = Spool(again_fd, path)  # the rank, started again on the same file
        held = open(path).read()
        assert again.written == len(sent) and again.base == len(sent) - len(held), (step, again.base, again.written)
        assert held == sent[again.base:], "each byte at the offset the rank wrote it at"
        assert (again.base > 0) == (step == 2), "the trim counts once its file is in place"
        for f in (fd, again_fd):
            os.close(f)
