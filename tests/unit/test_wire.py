"""The control channel and the value transport: framing, the HMAC handshake, tensors out of
band (inline and through /dev/shm), notebook names, and the output streams' sync markers."""
from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import threading

import pytest

from ddp_magic.wire import protocol as P
from ddp_magic.wire import transfer
from ddp_magic.wire.capture import SYNC_END, SYNC_PREFIX, MarkerScanner


# ---------------------------------------------------------------- capture markers
_CAPTURE_CHILD = r"""
import json, os, socket, sys
from ddp_magic.wire.capture import FdCapture
kind, port = sys.argv[1], int(sys.argv[2])
if kind == "tcp":
    streams = {name: socket.create_connection(("127.0.0.1", port)) for name in ("stdout", "stderr")}
else:  # a TLS relay's socketpair: no byte count to read
    streams = {name: socket.fromfd(int(fd), socket.AF_UNIX, socket.SOCK_STREAM) for name, fd in zip(("stdout", "stderr"), sys.argv[3:5])}
report = os.fdopen(os.dup(1), "w")
cap = FdCapture(streams)
marks = [cap.sync(1, True), cap.sync(2, True)]
os.write(1, b"raw\n")  # below Python: only the socket knows
marks.append(cap.sync(3, True))
print("err", file=sys.stderr)
marks.append(cap.sync(4, True))
marks.append(cap.sync(5, True))
marks.append(cap.sync(6))  # a kernel that does not read named markers (its RUN did not say so): both, always
report.write(json.dumps(marks))
"""


def _stream_bytes(socks):
    out = {}
    for name, s in socks.items():
        s.settimeout(10)
        chunks = []
        while True:
            b = s.recv(65536)
            if not b:
                break
            chunks.append(b)
        out[name] = b"".join(chunks)
    return out


def test_capture_marks_only_streams_written_since_their_last_marker():
    """A quiet stream's DONE names its last marker (the kernel read it already); any write, even below Python, a new one."""
    srv = socket.create_server(("127.0.0.1", 0))
    child = subprocess.Popen([sys.executable, "-c", _CAPTURE_CHILD, "tcp", str(srv.getsockname()[1])], stdout=subprocess.PIPE)
    socks = {name: srv.accept()[0] for name in ("stdout", "stderr")}
    data = _stream_bytes(socks)
    marks = __import__("json").loads(child.communicate(timeout=30)[0])
    srv.close()
    assert marks == [{"stdout": 1, "stderr": 1}, {"stdout": 1, "stderr": 1}, {"stdout": 3, "stderr": 1},
                     {"stdout": 3, "stderr": 4}, {"stdout": 3, "stderr": 4}, {"stdout": 6, "stderr": 6}]
    m = lambda t: SYNC_PREFIX + str(t).encode() + SYNC_END  # noqa: E731
    assert data == {"stdout": m(1) + b"raw\n" + m(3) + m(6), "stderr": m(1) + b"err\n" + m(4) + m(6)}


def test_capture_without_a_byte_count_marks_every_cell():
    pairs = {name: socket.socketpair() for name in ("stdout", "stderr")}
    fds = [str(pairs[name][1].fileno()) for name in ("stdout", "stderr")]
    child = subprocess.Popen([sys.executable, "-c", _CAPTURE_CHILD, "unix", "0", *fds], stdout=subprocess.PIPE, pass_fds=[int(f) for f in fds])
    for name in pairs:
        pairs[name][1].close()
    data = _stream_bytes({name: p[0] for name, p in pairs.items()})
    marks = __import__("json").loads(child.communicate(timeout=30)[0])
    assert marks == [{"stdout": t, "stderr": t} for t in (1, 2, 3, 4, 5, 6)]
    assert data["stdout"].count(SYNC_PREFIX) == 6 and data["stderr"].count(SYNC_PREFIX) == 6


def test_marker_scanner_handles_markers_cut_anywhere():
    stream = b"abc" + SYNC_PREFIX + b"12" + SYNC_END + b"def" + SYNC_PREFIX + b"13" + SYNC_END
    for cut in range(1, len(stream)):
        sc = MarkerScanner()
        t1, k1 = sc.feed(stream[:cut])
        t2, k2 = sc.feed(stream[cut:])
        assert t1 + t2 == b"abcdef" and k1 + k2 == [12, 13], cut


def test_marker_scanner_keeps_a_broken_marker_as_text():
    sc = MarkerScanner()
    text, tokens = sc.feed(b"a" + SYNC_PREFIX + b"xy" + SYNC_END + b"b" + SYNC_PREFIX[:3])
    assert tokens == [] and text.startswith(b"a" + SYNC_PREFIX) and text.endswith(b"b")
    assert sc.rest() == SYNC_PREFIX[:3]  # a marker that never completed is plain text at EOF


# ---------------------------------------------------------------- protocol
def test_frames_round_trip_in_pieces():
    frames = P.encode({"op": "x", "n": 1}) + P.encode({"op": "y", "data": b"z" * 1000})
    r = P.FrameReader()
    got = []
    for i in range(0, len(frames), 7):
        got += r.feed(frames[i : i + 7])
    assert got == [{"op": "x", "n": 1}, {"op": "y", "data": b"z" * 1000}]


def test_a_frame_length_that_is_not_credible_is_refused():
    with pytest.raises(ConnectionError):
        P.FrameReader().feed(P.HEADER.pack(P.MAX_FRAME + 1))


def test_handshake_accepts_the_right_secret():
    a, b = socket.socketpair()
    secret = P.new_secret()
    t = threading.Thread(target=P.server_handshake, args=(a, secret))
    t.start()
    P.client_handshake(b, secret)
    t.join()
    P.send(b, P.message(P.HELLO, rank=3))
    assert P.recv(a) == {"op": P.HELLO, "rank": 3}
    a.close()
    b.close()


def test_handshake_refuses_a_wrong_secret_before_any_frame():
    a, b = socket.socketpair()
    failed = []

    def server() -> None:
        try:
            P.server_handshake(a, P.new_secret())
        except P.AuthenticationError as e:
            failed.append(e)
        a.close()

    t = threading.Thread(target=server)
    t.start()
    with pytest.raises(ConnectionError):  # the kernel hangs up instead of proving itself
        P.client_handshake(b, P.new_secret())
    t.join()
    b.close()
    assert failed, "the kernel accepted a peer that does not know the secret"


def test_cell_status_is_its_plain_value_on_the_wire():
    assert P.CellStatus.OK == "ok" and str(P.CellStatus.INTERRUPTED) == "interrupted"
    assert P.CellStatus.ERROR.value == "error"


# ---------------------------------------------------------------- transfer
def test_tensors_travel_out_of_band_inline_and_through_shm():
    torch = pytest.importorskip("torch")
    small = {"t": torch.arange(6, dtype=torch.float16).reshape(2, 3), "s": "text"}
    packed = transfer.pack(small)
    assert "buffers" in packed
    got = transfer.unpack(packed)
    assert torch.equal(got["t"], small["t"]) and got["s"] == "text"
    big = [torch.ones(1 << 19), torch.zeros(3, dtype=torch.bool), torch.tensor(7.5, dtype=torch.bfloat16)]
    packed = transfer.pack(big)
    assert "shm" in packed and os.path.exists(packed["shm"])
    got = transfer.unpack(packed)
    assert not os.path.exists(packed["shm"])  # unlinked as soon as mapped
    assert torch.equal(got[0], big[0]) and torch.equal(got[1], big[1]) and got[2].item() == 7.5
    got[0] += 1  # writable, private to the kernel
    assert got[0][0].item() == 2.0


def test_noncontiguous_cuda_free_views_and_parameters():
    torch = pytest.importorskip("torch")
    base = torch.arange(12.0).reshape(3, 4)
    p = torch.nn.Parameter(torch.ones(2))
    got = transfer.unpack(transfer.pack([base.t(), p, torch.empty(0, 5)]))
    assert torch.equal(got[0], base.t()) and torch.equal(got[1], p.detach()) and got[2].shape == (0, 5)


def test_results_from_another_host_travel_inline():
    torch = pytest.importorskip("torch")
    packed = transfer.pack(torch.ones(1 << 20), shm_dir=None)  # what a rank on another node does
    assert "shm" not in packed and torch.equal(transfer.unpack(packed), torch.ones(1 << 20))


def test_unpack_refuses_paths_outside_shm():
    with pytest.raises(ValueError):
        transfer.unpack({"pickle": pickle.dumps(1), "shm": "/etc/passwd", "sizes": [1]})


def test_dumps_names_names_the_culprit():
    blobs, failure = transfer.dumps_names({"ok": 1, "bad": threading.Lock()})
    assert failure is not None and failure[0] == "bad" and "lock" in failure[1]


def test_names_round_trip_one_by_one():
    blobs, failure = transfer.dumps_names({"k": 3, "f": lambda x: x + 1})
    assert failure is None and transfer.load_name(blobs["k"]) == 3 and transfer.load_name(blobs["f"])(1) == 2


def test_marker_scanner_finds_a_spool_start_cut_anywhere():
    """A kept rank's spool marker (wire/capture.py spool_marker): never text, and the scanner says the spool's offset and
    how many bytes of that feed follow it, wherever the reads cut the stream."""
    from ddp_magic.wire.capture import spool_marker

    stream = b"before\n" + spool_marker(1234) + b"after\n" + SYNC_PREFIX + b"7" + SYNC_END + b"x"
    for cut in range(len(stream) + 1):
        sc = MarkerScanner()
        t1, k1 = sc.feed(stream[:cut])
        first = sc.spool
        t2, k2 = sc.feed(stream[cut:])
        assert t1 + t2 == b"before\nafter\nx" and k1 + k2 == [7], cut
        marker_end = len(b"before\n" + spool_marker(1234))
        if cut >= marker_end:
            assert first == (1234, cut - marker_end), cut
        else:
            assert first is None and sc.spool == (1234, len(stream) - marker_end), cut
