"""Every rank's whole output of the recent cells, on disk: what ``%ddp output --rank N`` and ``job.output(N)`` read back.

The notebook shows what folding and the cell's budget let through (ui/output.py);
this keeps everything the ranks wrote, hidden ranks (``--ranks``) and held-back lines
included, so nothing is lost. Each cell's output is one unnamed temporary file (0600,
unlinked as it is made, so it goes with the kernel however the kernel ends, SIGKILL
included), appended to as the hub reads it: memory holds a write buffer (``BUFFER``
bytes) per kept cell and a byte count per rank, disk what the ranks printed in the last
``KEEP_CELLS`` cells (an older cell's file is closed, and so freed). A record is
``rank stream length\n`` then the text's UTF-8. A crash's raw report (faulthandler's, as a
rank dies) is kept here and logged, but not passed on to the cell, which shows its clean form.
"""
from __future__ import annotations

import os
import tempfile
import threading
from collections import OrderedDict
from typing import IO, Any, Dict, List, Optional, Set, Tuple

from ...logs import log
from ..ranks import FAULT_HEAD, Listener

KEEP_CELLS = 20  # the cells whose output can be read back
BUFFER = 1 << 16  # bytes buffered before a write to the cell's file
_CODES = {"stdout": "o", "stderr": "e"}
_STREAMS = {v: k for k, v in _CODES.items()}


class _CellFile:
    """One cell's output file: appended to on the thread that drives the cell, read on any (the OutputLog's lock)."""

    def __init__(self) -> None:
        self.file: IO[bytes] = tempfile.TemporaryFile("w+b", buffering=BUFFER, prefix="ddp_magic-output-")
        self.bytes: Dict[int, int] = {}  # rank -> bytes it wrote in this cell

    def write(self, rank: int, stream: str, text: str) -> None:
        data = text.encode("utf-8", "replace")
        self.file.write(b"%d %s %d\n" % (rank, _CODES[stream].encode(), len(data)) + data)
        self.bytes[rank] = self.bytes.get(rank, 0) + len(data)

    def close(self) -> None:
        self.file.close()

    def pieces(self, rank: int) -> List[Tuple[str, str]]:
        """(stream, text) of one rank, in the order the kernel read them; the file is left at its end for the next write."""
        f = self.file
        out: List[Tuple[str, str]] = []
        f.seek(0)
        try:
            while True:
                head = f.readline()
                if not head:
                    return out
                who, code, size = head.split()
                if int(who) == rank:
                    out.append((_STREAMS[code.decode()], f.read(int(size)).decode("utf-8", "replace")))
                else:
                    f.seek(int(size), os.SEEK_CUR)
        finally:
            f.seek(0, os.SEEK_END)


class OutputLog:
    """The session's record of the ranks' output, cell by cell (keyed by the cell's name: its ``In [n]`` or label)."""

    def __init__(self, keep: int = KEEP_CELLS) -> None:
        self.keep = keep
        self._cells: "OrderedDict[str, _CellFile]" = OrderedDict()
        self._lock = threading.Lock()  # a background cell writes on its job's thread while the notebook reads

    def begin(self, key: str) -> "_CellFile":
        """A cell starts: a new file for its output (a cell run again under the same name replaces the old one)."""
        with self._lock:
            old = self._cells.pop(key, None)
            if old is not None:
                old.close()
            cell = self._cells[key] = _CellFile()
            while len(self._cells) > self.keep:
                self._cells.popitem(last=False)[1].close()
            return cell

    def tap(self, listener: Listener, key: str) -> Listener:
        """The listener a cell's run reports to, so that every rank's output is kept under ``key``."""
        return _Tap(listener, self, self.begin(key))

    def write(self, cell: "_CellFile", rank: int, stream: str, text: str) -> None:
        with self._lock:
            cell.write(rank, stream, text)

    def last(self) -> Optional[str]:
        return next(reversed(self._cells), None)

    def pieces(self, rank: int, key: Optional[str] = None) -> List[Tuple[str, str]]:
        """Rank ``rank``'s output in cell ``key`` (None: the last cell) as (stream, text), in the order it was read.

        KeyError names the cells there are when ``key`` is not one of them."""
        with self._lock:
            key = self.last() if key is None else key
            cell = self._cells.get(key) if key is not None else None
            if cell is None and key is None:
                raise KeyError("no %%ddp cell has run yet in this kernel")
            if cell is None:
                raise KeyError(f"no output kept for cell {key}: the cells kept are {', '.join(self._cells)} (the last {self.keep})")
            return cell.pieces(rank)

    def ranks(self, key: Optional[str] = None) -> Dict[int, int]:
        """rank -> bytes it wrote in cell ``key`` (None: the last)."""
        key = self.last() if key is None else key
        cell = self._cells.get(key) if key is not None else None
        return dict(cell.bytes) if cell is not None else {}


class _Tap(Listener):
    """Keeps every rank's output, then passes it on, but for a crash's report: what faulthandler writes to stderr as a
    rank dies (its own frames, every thread's, the extension modules) stays here and in the kernel's log; the cell
    shows the failure's clean form (kernel/failures/deaths.py), made from the same block (RankInfo.crash)."""

    def __init__(self, inner: Listener, log_: OutputLog, cell: _CellFile) -> None:
        self.inner = inner
        self._log = log_
        self._cell = cell
        self._crashed: Set[int] = set()  # ranks whose stderr is a crash's report from here on

    def on_output(self, rank: int, stream: str, text: str) -> None:
        self._log.write(self._cell, rank, stream, text)
        if stream == "stderr" and (rank in self._crashed or FAULT_HEAD in text):
            at, more = (0, ", continued") if rank in self._crashed else (text.index(FAULT_HEAD), "")
            self._crashed.add(rank)
            log.info("rank %d's crash report%s (faulthandler's; %%ddp output --rank %d shows it whole):\n%s", rank, more, rank, text[at:])
            text = text[:at]
        if text:
            self.inner.on_output(rank, stream, text)

    def on_state(self, info: Any) -> None:
        self.inner.on_state(info)

    def on_states(self, infos: Any) -> None:
        self.inner.on_states(infos)

    def on_notice(self, text: str) -> None:
        self.inner.on_notice(text)

    def on_metrics(self, rank: int, rows: Any) -> None:
        self.inner.on_metrics(rank, rows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
