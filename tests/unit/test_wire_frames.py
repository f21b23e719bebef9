"""Frames with out-of-band buffers (wire/protocol.py): a result from another host crosses the control channel as the
tensor's own memory, and the kernel reads it straight into the memory the tensor keeps. Cut anywhere, mixed with plain
frames, read by the hub's non-blocking reader or a rank's blocking one: the same messages come out."""
from __future__ import annotations

import ctypes
import mmap
import pickle
import select
import socket
import threading

import pytest

from ddp_magic.wire import protocol as P
from ddp_magic.wire import transfer


def _message(big: int = 3 << 20) -> dict:
    """A DONE carrying two buffers out of band: one past LAZY_BUFFER (a private map at the receiver), one small."""
    return P.message(P.DONE, rank=1, blobs=[pickle.PickleBuffer(bytearray(b"\x07" * big)), pickle.PickleBuffer(bytearray(b"ab"))])


def _check(msg: dict, big: int = 3 << 20) -> None:
    first, second = msg["blobs"]
    assert isinstance(first, mmap.mmap) and len(first) == big and first[:1] == b"\x07" and first[-1:] == b"\x07"
    assert isinstance(second, bytearray) and second == b"ab"
    first[0] = 9  # the receiver's own, writable memory


def test_a_frame_with_buffers_is_flagged_and_its_buffers_are_not_copied_into_it():
    parts = P.encode_parts(_message())
    (word,) = P.HEADER.unpack_from(parts[0])
    assert word & P.OOB and (word & ~P.OOB) == sum(len(memoryview(p)) for p in parts) - P.HEADER.size
    assert [memoryview(p).nbytes for p in parts[1:]] == [3 << 20, 2], "each buffer goes as its own part, uncopied"
    assert len(P.encode_parts(P.message(P.READY, rank=0))) == 1, "a plain message is one frame, as before"


@pytest.mark.parametrize("cut", [1, 7, 4096, 1 << 20])
def test_frames_with_buffers_round_trip_cut_anywhere_among_plain_ones(cut):
    stream = P.encode(P.message(P.READY, rank=0)) + P.encode(_message()) + P.encode(P.message(P.READY, rank=2))
    reader, got = P.FrameReader(), []
    for i in range(0, len(stream), cut):
        got += reader.feed(stream[i : i + cut])
    assert [m["op"] for m in got] == [P.READY, P.DONE, P.READY] and got[2]["rank"] == 2
    _check(got[1])


def test_the_hubs_reader_fills_a_big_buffer_in_place_from_the_socket():
    a, b = socket.socketpair()
    b.setblocking(False)
    sender = threading.Thread(target=lambda: (P.send(a, _message(8 << 20)), P.send(a, P.message(P.READY, rank=5))))
    sender.start()
    reader, scratch, got = P.FrameReader(), bytearray(4096), []
    while len(got) < 2:
        try:
            msgs = reader.recv(b, scratch)
        except BlockingIOError:  # nothing there yet
            select.select([b], [], [], 1.0)
            continue
        assert msgs is not None, "no EOF before both frames"
        got += msgs
    sender.join()
    _check(got[0], 8 << 20)
    assert got[1]["rank"] == 5
    a.close()
    assert reader.recv(b, scratch) is None, "EOF"
    b.close()


def test_a_ranks_blocking_recv_reads_a_frame_with_buffers():
    a, b = socket.socketpair()
    threading.Thread(target=P.send, args=(a, _message()), daemon=True).start()
    _check(P.recv(b))
    a.close()
    b.close()


def test_a_frame_whose_layout_does_not_add_up_is_refused():
    lie = P.COUNT.pack(1) + P.SIZE.pack(1 << 30) + b"xx"  # one buffer of 1 GiB in a body of 14 bytes
    with pytest.raises(ConnectionError, match="not credible"):
        P.FrameReader().feed(P.HEADER.pack(len(lie) | P.OOB) + lie)
    with pytest.raises(ConnectionError, match="not credible"):
        P.FrameReader().feed(P.HEADER.pack(12 | P.OOB) + P.COUNT.pack(P.MAX_BUFFERS + 1))


def test_a_result_from_another_host_lands_in_the_memory_the_reader_filled():
    torch = pytest.importorskip("torch")
    value = {"w": torch.arange(1 << 20, dtype=torch.float32), "b": torch.ones(3)}
    packed = transfer.pack(value, shm_dir=None)  # what a rank on another host sends
    assert all(isinstance(b, pickle.PickleBuffer) for b in packed["buffers"]), "the tensors' own memory, not copies"
    [msg] = P.FrameReader().feed(P.encode(P.message(P.DONE, result=packed)))
    filled = msg["result"]["buffers"][0]
    got = transfer.unpack(msg["result"])
    assert torch.equal(got["w"], value["w"]) and torch.equal(got["b"], value["b"])
    assert got["w"].data_ptr() == ctypes.addressof(ctypes.c_char.from_buffer(filled)), "no copy after the read"
    got["w"][0] = 5.0  # writable, and the sender's tensor is untouched
    assert value["w"][0].item() == 0.0


def test_unpacking_in_the_sending_process_copies_the_senders_memory():
    torch = pytest.importorskip("torch")
    t = torch.zeros(4)
    got = transfer.unpack(transfer.pack(t, shm_dir=None))  # nothing crossed a process: the value must not alias t
    got += 1
    assert t.sum().item() == 0.0 and got.sum().item() == 4.0
