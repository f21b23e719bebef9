#!/usr/bin/env python
"""Moving 256 MiB from one host of the box to another: the floors, and ddp_magic's control channel alone.

One receiver (on login) and one sender (on n2), each a process of its own, started by bench_cluster.py inside
its host (``Box.enter``)::

    python bench/cluster_wire.py recv WAY MIB          # prints "PORT FINGERPRINT", then "SECONDS" once it has them all
    python bench/cluster_wire.py send WAY MIB HOST PORT FINGERPRINT   # waits for a line on stdin, then sends

WAY is one of:

- ``tcp``: the plain floor: ``sendall`` of a warm buffer, ``recv_into`` one fresh buffer (a private map, whose
  pages the reads fault in: a result lands in fresh memory too);
- ``ssl``: the same through Python's ``ssl`` in one thread each side (TLS 1.3, a key like the pool's);
- ``channel``, ``channel-tls``: what a rank on another host and the kernel do with a result: the rank's
  ``transfer.pack`` (no /dev/shm) and ``Channel.send``, the hub's ``FrameReader.recv`` and ``transfer.unpack``;
  plain TCP, or through wire/tls.py (its relay thread at each end).

The time runs from the sender's start (before any pickling) to the receiver holding every byte (the tensor
rebuilt, for the channel); both hosts share the machine's clock. The receiver checks the bytes. Each side also
says the CPU time its process spent (every thread: the relay's too), which a loaded machine skews far less.
"""
from __future__ import annotations

import mmap
import socket
import ssl
import sys
import time

WAYS = ("tcp", "ssl", "channel", "channel-tls")


def _listen(way: str, mib: int) -> None:
    from ddp_magic.wire import tls

    ls = socket.socket()
    ls.bind(("0.0.0.0", 0))
    ls.listen()
    key = tls.ServerKey() if way in ("ssl", "channel-tls") else None
    if way.startswith("channel"):  # what the kernel has imported by the time a tensor result comes
        import torch  # noqa: F401

        from ddp_magic.kernel.results import gather as results  # noqa: F401
    print(ls.getsockname()[1], key.fingerprint if key else "-", flush=True)
    sock, _ = ls.accept()
    cpu = time.process_time()
    ls.close()
    if way == "ssl":
        assert key is not None
        sock = key.context.wrap_socket(sock, server_side=True)
    elif way == "channel-tls":
        assert key is not None
        sock = tls.wrap_server(sock, key, 30)
    n = mib << 20
    if way in ("tcp", "ssl"):
        buf = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE)
        view, got = memoryview(buf), 0
        while got < n:
            k = sock.recv_into(view[got:])
            if not k:
                raise ConnectionError("the sender went early")
            got += k
        t = time.time()
        assert buf[n - 1 : n] == b"\x01"
    else:
        t = _channel_recv(sock, n)
    print(repr(t), time.process_time() - cpu, flush=True)


def _channel_recv(sock: socket.socket, n: int) -> float:
    """The hub's way: a non-blocking FrameReader over the socket (over TLS the relay may fill a big buffer in place and
    say so on its note), then the result unpacked; the time it is in hand. Older trees' readers are fed instead."""
    import os
    import select

    from ddp_magic.kernel.results.gather import unpack_value
    from ddp_magic.wire import protocol as P
    from ddp_magic.wire import tls

    sock.setblocking(False)
    reader, scratch, msgs = P.FrameReader(), bytearray(1 << 20), []
    handover = getattr(tls, "filler", lambda s: None)(sock)
    note = getattr(tls, "note_fd", lambda: None)()
    source = getattr(tls, "source", lambda s: s)(sock)  # over TLS the hub decrypts what comes itself (older trees: the relay)
    direct = getattr(source, "fd", None)
    while not msgs:
        waits = [sock] + ([note] if note is not None else []) + ([direct] if direct is not None and not reader.relayed else [])
        ready, _, _ = select.select(waits, [], [])
        if note in ready:
            os.read(note, 4096)
        try:
            got = reader.recv(source, scratch, handover) if hasattr(reader, "recv") else reader.feed(sock.recv(1 << 20) or b"\0")
        except BlockingIOError:
            continue
        if got is None:
            raise ConnectionError("the sender went early")
        msgs = got
    value = unpack_value(1, msgs[0]["result"], [])
    t = time.time()
    assert value.numel() * value.element_size() == n and float(value[-1]) == 1.0, value
    return t


def _send(way: str, mib: int, host: str, port: int, fingerprint: str) -> None:
    n = mib << 20
    if way.startswith("channel"):  # what a rank has imported
        import torch

        from ddp_magic.procs.worker import Channel
        from ddp_magic.wire import protocol as P
        from ddp_magic.wire import transfer

        value = torch.ones(n // 4)
    else:
        value = bytearray(b"\x01") * n
    if way == "channel-tls":
        from ddp_magic.wire import tls

        sock = tls.connect((host, port), fingerprint)
    else:
        sock = socket.create_connection((host, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if way == "ssl":
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        sock = ctx.wrap_socket(sock)
    sys.stdin.readline()
    cpu = time.process_time()
    print(repr(time.time()), flush=True)
    if way.startswith("channel"):
        Channel(sock).send(P.DONE, result=transfer.pack(value, shm_dir=None))
    else:
        sock.sendall(value)
    sys.stdin.readline()  # the receiver has it all: only now may the relay's thread go
    print(time.process_time() - cpu, flush=True)
    sock.close()


if __name__ == "__main__":
    role, way, mib = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if way not in WAYS:
        raise SystemExit(f"way {way!r}: one of {', '.join(WAYS)}")
    if role == "recv":
        _listen(way, mib)
    else:
        _send(way, mib, sys.argv[4], int(sys.argv[5]), sys.argv[6])
