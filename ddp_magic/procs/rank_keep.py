"""A rank's part in a kept pool: its output spooled to disk, its wait for the next kernel, and the re-dial.

``%ddp keep`` (KEEP on the control channel) turns it on. From then on:

- fds 1 and 2 are pipes; one thread per stream copies every byte to the rank's spool file (0600, in the
  pool's 0700 directory; a byte's offset there is its sequence number) and, while a kernel is attached,
  to that kernel's output socket. The kernel counts what it has shown (wire/kept.py ``ShownOffsets``);
  the next kernel asks for the spool from there on: no gap, no duplicate.
- the rank holds a connection to its template's lease socket (procs/lease.py). While no kernel is
  attached it says there whether it runs a cell (the lease's idle timer), and waits there for a
  ``dial``: the next kernel's address. It then dials it with the pool's secret as at start, sends
  what it queued meanwhile (its DONE, metrics rows), and replays its spools.

Cells never pass through here: while attached, the control channel is the kernel's socket as before.
"""
from __future__ import annotations

import collections
import json
import os
import queue
import shutil
import socket
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from ..logs import log
from ..wire import kept
from ..wire.capture import spool_marker


CONNECT_S = 60.0  # how long a rank tries to reach the lease socket
STAMPS = 16384  # a spool remembers when its newest reads came, at most this many (older lines replay first, unstamped)
STAMPS_SENT = 4096  # at most this many go in a HELLO (neighbours merged: the replay's order is this fine)
Stamp = Tuple[int, int, float, int]  # a read of the pipe: its first byte's offset, its end's, when (time.monotonic()), its lines


class Spool:
    """One stream (fd 1 or 2) through a pipe: every byte to the spool file, and to the kernel's socket when one is there.

    ``cap`` (bytes, 0: none) bounds the file: past it, the oldest half is dropped at a line's start. ``base`` is the
    offset of the file's first byte (kept beside it in ``<spool>.base``, for a rank started again on the same file:
    ``_trim`` says how the two change together); an attach from before it says how much it lost (``dropped``)."""

    def __init__(self, fd: int, path: str, cap: int = 0) -> None:
        self.fd = fd
        self.lock = threading.Lock()
        self.file = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
        self.path, self.cap = path, cap
        self.base = _read_base(path)
        self.written = self.base + os.fstat(self.file).st_size
        self.sink = os.dup(fd)  # the kernel's output socket, as FdCapture left it on fd 1/2
        self.stamps: Deque[Stamp] = collections.deque(maxlen=STAMPS)  # when each read came: a replay's lines merge in time order
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        self.read_end = read_end
        self._send(spool_marker(self.written))  # before the pump's first byte, after the last one written to the socket itself
        threading.Thread(target=self._pump, name=f"ddp-spool-{fd}", daemon=True).start()

    def _pump(self) -> None:
        while True:
            try:
                data = os.read(self.read_end, 1 << 16)
            except OSError:
                log.debug("spool %d: the pipe failed", self.fd, exc_info=True)
                return
            if not data:  # keep --off gave the fd back to the socket: everything before has been pumped
                with self.lock:
                    os.close(self.file)
                    os.close(self.read_end)
                    self.detach_sink()
                return
            with self.lock:
                _write_all(self.file, data)
                self.stamps.append((self.written, self.written + len(data), time.monotonic(), data.count(b"\n")))
                self.written += len(data)
                self._send(data)
                if self.cap and self.written - self.base > self.cap:
                    self._trim()

    def _trim(self) -> None:
        """Drop the oldest half of the file, from a line's start: the newest ``cap`` / 2 bytes stay.

        The file and its base change as a pair, whatever instant the rank dies at (a rank started again on the file
        then counts from the right base): the newest bytes go to a new file; then ``<spool>.base`` is replaced, whole,
        by one naming both files by inode (the old one's base, the new one's); then the new file replaces the old.
        Whichever file stands, its own line gives its base (``_read_base``)."""
        tmp = self.path + ".tmp"
        with open(self.path, "rb") as src, open(os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600), "wb") as dst:
            src.seek(self.written - self.base - self.cap // 2)
            head = src.read(1 << 16)
            cut = head.find(b"\n") + 1  # 0 when no line ends there: cut mid-line rather than keep it all
            skipped = self.written - self.base - self.cap // 2 + cut
            dst.write(head[cut:])
            shutil.copyfileobj(src, dst, 1 << 20)
            new_inode = os.fstat(dst.fileno()).st_ino
        _write_base(self.path, {os.fstat(self.file).st_ino: self.base, new_inode: self.base + skipped})
        os.replace(tmp, self.path)
        os.close(self.file)
        self.file = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self.base += skipped

    def dropped(self, offset: int) -> int:
        """How many bytes from ``offset`` on the cap has dropped (a kernel that attaches from there never sees them)."""
        return max(0, self.base - min(offset, self.written))

    def replay_stamps(self, offset: int) -> List[List[Any]]:
        """When the lines a replay from ``offset`` sends were printed, oldest first: ``[lines, seconds ago]`` per read of
        the pipe (``None``: before the oldest stamp kept). The next kernel merges the ranks' replays in that order, as
        the lines came while it was attached (kernel/keep/replay.py). Lines written after this are sent as they come."""
        with self.lock:
            start, now = max(min(offset, self.written), self.base), time.monotonic()
            stamps = [s for s in self.stamps if s[1] > start]
            if not stamps:  # none kept (a rank started again on this file): the lines go first
                return _coarse([o for o in [[self._lines(start, self.written), None]] if o[0]])
            begin, end, at, lines = stamps[0]
            if begin > start:  # older than the oldest stamp kept: first, unstamped
                out: List[List[Any]] = [[self._lines(start, begin), None], [lines, now - at]]
            else:  # the first read began before the replay's start: its lines from there
                out = [[self._lines(start, end), now - at]]
            out += [[n, now - t] for _, _, t, n in stamps[1:]]
        return _coarse([o for o in out if o[0]])

    def _lines(self, begin: int, end: int) -> int:
        """The line ends among the spool's bytes from ``begin`` to ``end`` (offsets), read from the file."""
        count = 0
        with open(self.path, "rb") as f:
            f.seek(begin - self.base)
            left = end - begin
            while left > 0:
                chunk = f.read(min(left, 1 << 20))
                if not chunk:
                    break
                count += chunk.count(b"\n")
                left -= len(chunk)
        return count

    def _send(self, data: bytes) -> None:
        if self.sink < 0:
            return
        try:
            _write_all(self.sink, data)
        except OSError:  # the kernel is gone: the spool keeps it for the next one
            self.detach_sink()

    def detach_sink(self) -> None:
        if self.sink >= 0:
            try:
                os.close(self.sink)
            except OSError:
                log.debug("closing a spool's socket failed", exc_info=True)
        self.sink = -1

    def attach_sink(self, sock: socket.socket, offset: int) -> None:
        """A new kernel's output socket: what it has not shown (the spool from ``offset``, or from the oldest byte kept),
        then everything as it comes."""
        with self.lock:
            self.detach_sink()
            self.sink = os.dup(sock.fileno())
            sock.close()
            with open(self.path, "rb") as f:
                f.seek(max(min(offset, self.written), self.base) - self.base)
                while True:
                    chunk = f.read(1 << 20)
                    if not chunk:
                        break
                    self._send(chunk)


    def unspool(self) -> None:
        """``%ddp keep --off``: the fd is the kernel's socket again, straight (what the pipe still holds is pumped first)."""
        with self.lock:
            if self.sink >= 0:
                os.dup2(self.sink, self.fd)  # the pipe's last writer goes: the pump sends what it holds, then EOF ends it
            else:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, self.fd)
                os.close(devnull)


def _coarse(stamps: List[List[Any]]) -> List[List[Any]]:
    """At most ``STAMPS_SENT`` of them: neighbours merged, each group at its first read's time."""
    k = -(-len(stamps) // STAMPS_SENT)
    if k <= 1:
        return stamps
    return [[sum(s[0] for s in stamps[i:i + k]), stamps[i][1]] for i in range(0, len(stamps), k)]


def _write_base(path: str, bases: Dict[int, int]) -> None:
    """``<spool>.base``, whole or not at all (a file renamed over it): a line ``INODE BASE`` per spool file it may stand for."""
    tmp = path + ".base.tmp"
    with open(os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600), "w") as f:
        f.write("".join(f"{inode} {base}\n" for inode, base in bases.items()))
    os.replace(tmp, path + ".base")


def _read_base(path: str) -> int:
    """The offset of the spool file's first byte: its own line of ``<spool>.base`` (by inode); 0 when it was never trimmed."""
    bases: Dict[int, int] = {}
    try:
        with open(path + ".base") as f:
            for line in f:
                inode, base = line.split()
                bases[int(inode)] = int(base)
        here = os.stat(path).st_ino
    except FileNotFoundError:
        return 0
    except (OSError, ValueError):
        log.warning("spool %s: its .base file is unreadable; offsets count from its first byte", path, exc_info=True)
        return 0
    if here not in bases:
        log.warning("spool %s: its .base file names other files; offsets count from its first byte", path)
    return bases.get(here, 0)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class Keeper:
    """The rank's side of a kept pool (see the module's docstring)."""

    def __init__(self, rank: int, secret: bytes) -> None:
        self.rank, self.secret = rank, secret
        self.on = False
        self.spooled = False  # ever kept: fds 1 and 2 have since gone through a spool to whichever kernel is attached
        self.spools: Dict[str, Spool] = {}
        self.lease: Optional[socket.socket] = None
        self.dials: "queue.Queue[Dict[str, Any]]" = queue.Queue()
        self.busy = False
        self.ran_at: Optional[float] = None  # when the last cell reached this rank (time.monotonic(): this process's clock)
        self.ended_at: Optional[float] = None  # when it ended here (None while it runs)
        self.attached = True  # a kernel holds our control channel (False between its death and the next one's dial)
        self.on_dial: Optional[Callable[[], None]] = None  # the worker's: drop the attached kernel's socket (a --force attach)

    def keep(self, msg: Dict[str, Any]) -> Dict[str, Any]:
        """KEEP from the kernel: spool and wait for a kernel from now on (``on``), or no more."""
        if not msg.get("on"):
            self.on = False
            for spool in self.spools.values():
                spool.unspool()
            self.spools.clear()
            if self.lease is not None:
                self.lease.close()
                self.lease = None
            return {"rank": self.rank, "on": False}
        self.spooled = True
        if not self.spools:
            os.makedirs(msg["dir"], mode=0o700, exist_ok=True)  # on a node other than the lease holder's, made here
            for fd, stream in ((1, "stdout"), (2, "stderr")):
                self.spools[stream] = Spool(fd, kept.spool_path(msg["dir"], self.rank, stream), int(msg.get("cap") or 0))
        for spool in self.spools.values():
            spool.cap = int(msg.get("cap") or 0)
        if self.lease is None:
            try:
                self.lease = self._connect(msg["lease"])
            except (OSError, EOFError) as e:  # the rank goes on as it was: the kernel's keep names it and fails
                log.debug("rank %d: could not join the lease", self.rank, exc_info=True)
                return {"rank": self.rank, "on": False, "error": f"{type(e).__name__}: {e}"}
            threading.Thread(target=self._read_lease, name="ddp-lease", daemon=True).start()
        self.on = True
        return {"rank": self.rank, "on": True, "written": {s: sp.written for s, sp in self.spools.items()}}

    def _connect(self, at: kept.LeaseAt) -> socket.socket:
        """The lease, the secret proved. A thousand ranks knock at once: a full backlog is tried again (EAGAIN)."""
        deadline = time.monotonic() + CONNECT_S
        while True:
            try:
                sock = kept.dial_lease(at, self.secret)
                break
            except (BlockingIOError, ConnectionError, socket.timeout):  # the lease gave up on a slow handshake: again
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        sock.settimeout(None)
        sock.sendall((json.dumps({"op": "rank", "rank": self.rank, "busy": self.busy, "pid": os.getpid()}) + "\n").encode())
        return sock

    def _read_lease(self) -> None:
        assert self.lease is not None
        buf = b""
        while True:
            try:
                data = self.lease.recv(65536)
            except OSError:
                data = b""
            if not data:  # the template is gone, or let us go (keep --off)
                log.debug("rank %d: the lease socket closed", self.rank)
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                msg = json.loads(line)
                if msg.get("op") == "dial":
                    self.dials.put(msg)
                    if self.on_dial is not None:
                        self.on_dial()

    def tell(self, **fields: Any) -> None:
        """A line to the lease (busy or not); best effort."""
        if self.lease is None:
            return
        try:
            self.lease.sendall((json.dumps(fields) + "\n").encode())
        except OSError:
            log.debug("rank %d: the lease did not hear us", self.rank, exc_info=True)

    def set_busy(self, busy: bool) -> None:
        """A cell starts or ends: the lease hears it only while no kernel is attached (its idle timer), never on a warm
        cell's path. When is kept for the next kernel's clocks (``clock``)."""
        self.busy = busy
        if busy:
            self.ran_at, self.ended_at = time.monotonic(), None
        else:
            self.ended_at = time.monotonic()
        if self.on and not self.attached:
            self.tell(op="busy", busy=busy)

    def detached(self) -> Dict[str, Any]:
        """The kernel is gone: the output only to the spools; wait for the next kernel's dial (the newest one)."""
        self.attached = False
        for spool in self.spools.values():
            with spool.lock:
                spool.detach_sink()
        self.tell(op="busy", busy=self.busy)
        dial = self.dials.get()
        while True:
            try:
                dial = self.dials.get_nowait()
            except queue.Empty:
                return dial

    def clock(self) -> Dict[str, Optional[float]]:
        """The last cell's times on this rank, as seconds before now (``ran``, ``ended``: None while it runs, or never
        ran): an attaching kernel subtracts them from when it hears them, so no two processes' clocks are compared
        (monotonic clocks differ between hosts, wall clocks drift): the job's clock is the ranks'."""
        now = time.monotonic()
        return {"ran": None if self.ran_at is None else now - self.ran_at, "ended": None if self.ended_at is None else now - self.ended_at}

    def replay_stamps(self, offsets: List[int]) -> Dict[str, List[List[Any]]]:
        """Per stream, when the lines of a replay from ``offsets`` were printed (``Spool.replay_stamps``)."""
        return {s: self.spools[s].replay_stamps(int(offsets[i]) if i < len(offsets) else 0) for i, s in enumerate(kept.STREAMS) if s in self.spools}

    def dropped(self, offsets: List[int]) -> Dict[str, int]:
        """Per stream, the bytes the spool's cap dropped that a kernel attaching from ``offsets`` had not shown."""
        lost = {s: self.spools[s].dropped(int(offsets[i]) if i < len(offsets) else 0) for i, s in enumerate(kept.STREAMS) if s in self.spools}
        return {s: n for s, n in lost.items() if n}

    def attach_outputs(self, streams: Dict[str, socket.socket], offsets: List[int]) -> None:
        for i, stream in enumerate(kept.STREAMS):
            self.spools[stream].attach_sink(streams[stream], int(offsets[i]) if i < len(offsets) else 0)
        self.attached = True
