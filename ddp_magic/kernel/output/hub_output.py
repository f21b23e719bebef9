"""The hub's reading of the ranks' raw output sockets (fd 1 and 2): text to the listener, and the sync markers a DONE waits for.

A mixin of kernel/hub.py's ``Hub`` (it reads the hub's registry), kept apart so that
each file says one thing: hub.py the control messages, this file the output streams.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

from ...logs import log
from ..conns import OutConn, ReadBuffer, wait_ready
from ..ranks import Listener, RankInfo
from .kept_output import KeptOutput

STREAMS = ("stdout", "stderr")


class OutputStreams:
    """What a ``Hub`` does with its ranks' output sockets."""

    ranks: Dict[int, RankInfo]
    outs: Dict[Tuple[int, str], OutConn]
    listener: Listener
    _rbuf: ReadBuffer
    shown: Optional[KeptOutput]
    _unsynced: Dict[int, dict]

    _unwatch: Callable[[Any], None]  # the Hub's: stop polling a socket before it closes
    _finish_rank: Callable[[int, dict], None]  # the Hub's: a rank's DONE, once its output is synced

    def _read_out(self, out: OutConn) -> bool:
        """Forward what a rank wrote to fd 1/2; returns False at EOF or when nothing was there."""
        try:
            data = self._rbuf.recv(out.source)
        except BlockingIOError:
            return False
        except OSError:
            log.debug("rank %s's %s socket failed on read", out.rank, out.stream, exc_info=True)
            data = b""
        if not data:
            out.eof = True
            self._unwatch(out.sock)
            self._emit_text(out, out.scanner.rest(), final=True)
            self._release_done(out.rank)
            return False
        text, tokens = out.scanner.feed(data)
        if self.shown is None:
            self._emit_text(out, text)
        else:  # a kept pool: its lines and how far they go reach the notebook together (kernel/output/kept_output.py)
            with self.shown.capture() as staged:
                self._emit_text(out, text)
            self.shown.commit(staged, out.rank, out.stream, self._counted(out, data))
        if tokens:
            out.synced = max(out.synced, *tokens)
            self._release_done(out.rank)
        return True

    def expect_spools(self, ranks: Iterable[int]) -> None:
        """KEEP goes to ``ranks``: each starts its spools and says where on its output sockets (wire/capture.py
        ``spool_marker``). What is read before that went straight to the socket: no byte of the spool."""
        wanted = set(ranks)
        for (rank, _), out in self.outs.items():
            out.awaiting_spool = out.awaiting_spool or rank in wanted

    def _counted(self, out: OutConn, data: bytes) -> int:
        """How far ``data`` takes the rank's spool, to whole lines: from the spool's marker on, if it came in ``data``
        (the spool's offsets start there), nothing while it is awaited (a rank's last direct writes before KEEP)."""
        assert self.shown is not None
        spool, out.scanner.spool = out.scanner.spool, None
        if spool is not None:
            offset, after = spool
            out.awaiting_spool, out.unshown = False, 0
            self.shown.start(out.rank, {out.stream: offset})
            data = data[len(data) - after:]
        elif out.awaiting_spool:
            return 0
        return self._whole_lines(out, data)

    def _whole_lines(self, out: OutConn, data: bytes) -> int:
        """How far a kept pool's output is read, to its last whole line: a line not yet ended is not shown yet (the
        printer holds it), and the next kernel replays it."""
        cut = data.rfind(b"\n")
        if cut < 0:
            out.unshown += len(data)
            return 0
        n, out.unshown = out.unshown + cut + 1, len(data) - cut - 1
        return n

    def _emit_text(self, out: OutConn, data: bytes, final: bool = False) -> None:
        text = out.decoder.decode(data, final=final)
        if not text:
            return
        info = self.ranks.get(out.rank)
        if info is not None:
            info.note_output(text)
        self.listener.on_output(out.rank, out.stream, text)

    def _release_done(self, rank: int) -> None:
        """A DONE counts once both streams have shown everything printed before it: the markers it names
        ("sync"; a quiet stream's is one already read, so a quiet cell's DONE counts at once), else its cell's."""
        msg = self._unsynced.get(rank)
        if msg is None:
            return
        marks = msg.get("sync") or {}
        for stream in STREAMS:
            out = self.outs.get((rank, stream))
            if out is not None and not out.eof and out.synced < marks.get(stream, msg["cell"]):
                return
        del self._unsynced[rank]
        self._finish_rank(rank, msg)

    def drain_outs(self, rank: int, timeout: float = 0.5) -> None:
        """Read what a (dead) rank left in its output sockets, until EOF or a quiet moment."""
        deadline = time.monotonic() + timeout
        for stream in STREAMS:
            out = self.outs.get((rank, stream))
            while out is not None and not out.eof and time.monotonic() < deadline:
                if not wait_ready(out.sock, min(0.05, deadline - time.monotonic()), also=out.pull_fd) or not self._read_out(out):
                    break
