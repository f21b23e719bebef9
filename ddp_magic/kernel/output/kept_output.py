"""A kept pool's rank lines on their way to the notebook, each stream message carrying how far its lines go.

The next kernel of a kept pool replays each rank's spool from what the notebook holds (docs/keep.md). The kernel
can only count what it handed to ipykernel: ZeroMQ sends later, on its own thread, and a PUB socket never
acknowledges, so a SIGKILL in between leaves a window. The front end knows what it received. So every stream
message with a kept pool's rank lines carries in its metadata
``{"ddp_magic": {"pool": ID, "upto": {"0": [stdout, stderr], ...}}}``: per rank, the spool offsets (bytes; a
byte's offset is its sequence number) up to which that rank's lines have been sent, in this message or before it;
a front end keeps the highest and tells the next kernel (ui/labcomm.py, kernel/keep/front.py).

How a message never claims a line it does not hold: while the hub reads a kept pool's output
(kernel/output/hub_output.py), what the printer writes on that thread is staged here (``capture``, a context
variable the printer's streams look up: ui/output.py), and the hub then hands the staged text and how far it read
over in one step (``commit``). A flush takes text and marks together, under one lock, on ipykernel's IOPub thread,
after the kernel's own streams (what was printed before goes first); marks with no text of their own (lines held
back, a hidden rank) wait for the next message. Then it writes the marks to the pool's ``shown`` file: the count a
next kernel uses when no front end tells it what it holds (VS Code, nbclient).
"""
from __future__ import annotations

import contextvars
import sys
import threading
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, TextIO, Tuple, cast

from ...logs import log
from ...wire.kept import STREAMS, ShownOffsets

META = "ddp_magic"  # the key of a stream message's metadata: {"pool", "upto"}
Part = Tuple[str, Any, Any]  # (stream, parent header, text), or ("", None, (rank, [stdout, stderr])): a mark
Message = Tuple[str, Any, str, Dict[str, List[int]]]  # (stream, parent header, text, upto)
_SINK: "contextvars.ContextVar[Optional[_Staged]]" = contextvars.ContextVar("ddp_magic_kept_sink", default=None)


def stream(name: str) -> TextIO:
    """Where a rank's lines go: a kept pool's staging while its hub reads (or a timer it started then), else sys.stdout/err."""
    staged = _SINK.get()
    return cast(TextIO, staged.writers[name]) if staged is not None else getattr(sys, name)  # the printer only writes and flushes


class _Writer:
    """The printer's stdout or stderr while staged: a write is kept with the kernel's parent header of that moment."""

    def __init__(self, staged: "_Staged", name: str) -> None:
        self.staged, self.name = staged, name

    def write(self, text: str) -> int:
        self.staged.write(self.name, text)
        return len(text)

    def flush(self) -> None:
        self.staged.out.due()


class _Staged:
    """What the printer wrote during one read of the hub; once committed, later writes (a fold's timer) go straight on."""

    def __init__(self, out: "KeptOutput") -> None:
        self.out = out
        self.writers = {name: _Writer(self, name) for name in STREAMS}
        self.parts: List[Part] = []
        self.committed = False
        self.lock = threading.Lock()

    def write(self, name: str, text: str) -> None:
        part = (name, _parent(name), text)
        with self.lock:
            if not self.committed:
                self.parts.append(part)
                return
        self.out.add([part], None)


def _parent(name: str) -> Any:
    return getattr(getattr(sys, name), "parent_header", None)


class KeptOutput:
    """One kept pool's rank output towards the notebook: the text, the marks, and the ``shown`` file."""

    def __init__(self, pool_id: str, shown: ShownOffsets) -> None:
        self.pool_id, self.shown = pool_id, shown
        self.upto: Dict[Tuple[int, str], int] = {}  # the hub's: each rank's spool read up to its last whole line
        self.lock = threading.Lock()
        self._parts: List[Part] = []
        self._marks: Dict[str, List[int]] = {}  # rank -> [stdout, stderr], marks no text went with yet
        self._counts: Dict[int, List[int]] = {}  # rank -> [stdout, stderr], not yet in the shown file
        self._due = False

    def start(self, rank: int, written: Dict[str, int]) -> None:
        """Where a rank's spools start (kept now, or started again): nothing before is the next kernel's."""
        for name, n in written.items():
            self.upto[(rank, name)] = int(n)
        self.shown.set(rank, written)

    def skip(self, rank: int, dropped: Dict[str, int]) -> None:
        """The rank's spools replay from further on (their cap dropped ``dropped`` bytes no kernel showed): count from there."""
        for name, n in dropped.items():
            key = (rank, name)
            self.upto[key] = self.upto.get(key, self.shown.get(rank, name)) + int(n)
        self.add([], (rank, [self.upto.get((rank, s), self.shown.get(rank, s)) for s in STREAMS]))

    @contextmanager
    def capture(self) -> Iterator[_Staged]:
        """The printer's writes on this thread (and on timers it starts meanwhile) are staged until ``commit``."""
        staged = _Staged(self)
        token = _SINK.set(staged)
        try:
            yield staged
        finally:
            _SINK.reset(token)

    def commit(self, staged: _Staged, rank: int = -1, name: str = "", n: int = 0) -> None:
        """The staged text, and (``n`` > 0) that ``rank``'s ``name`` spool has been read ``n`` bytes further, to whole lines."""
        mark = None
        if n > 0:
            key = (rank, name)
            self.upto[key] = self.upto.get(key, self.shown.get(rank, name)) + n
            mark = (rank, [self.upto.get((rank, s), self.shown.get(rank, s)) for s in STREAMS])
        with staged.lock:  # a fold's timer that writes now goes after these
            parts, staged.parts, staged.committed = staged.parts, [], True
            self.add(parts, mark)

    def add(self, parts: List[Part], mark: Optional[Tuple[int, List[int]]]) -> None:
        if not parts and mark is None:
            return
        with self.lock:
            self._parts.extend(parts)
            if mark is not None:
                self._parts.append(("", None, mark))  # it goes with the message that holds the text before it
                self._counts[mark[0]] = mark[1]
        self.due()

    def due(self) -> None:
        """Flush soon: on ipykernel's IOPub thread, or here and now without one."""
        kernel_out = sys.stdout
        thread = getattr(kernel_out, "pub_thread", None)
        if thread is None or not callable(getattr(thread, "schedule", None)) or getattr(kernel_out, "session", None) is None:
            self._flush(None)
            return
        with self.lock:
            if self._due:
                return
            self._due = True
        thread.schedule(lambda: self._flush(kernel_out))

    def _flush(self, kernel_out: Any) -> None:
        """Send the text with the marks, after what the kernel's own streams hold; then count the marks in the file."""
        streams = [getattr(sys, name) for name in STREAMS]
        for s in streams:
            try:
                s._flush() if kernel_out is not None else s.flush()
            except (AttributeError, OSError, ValueError):
                log.debug("could not flush the kernel's %s", s, exc_info=True)
        with self.lock:
            self._due = False
            msgs, marks = _messages(self._parts, self._marks)
            self._parts, self._marks = [], marks  # marks with no text to go with: they wait for the next message
            counts, self._counts = self._counts, {}
        for name, parent, text, upto in msgs:
            self._send(kernel_out, name, parent, text, dict({"pool": self.pool_id}, **({"upto": upto} if upto else {})))
        for rank, pair in counts.items():
            self.shown.set(rank, dict(zip(STREAMS, pair)))

    def _send(self, kernel_out: Any, name: str, parent: Any, text: str, meta: Dict[str, Any]) -> None:
        if kernel_out is None:  # no ipykernel (plain IPython): the lines, as the printer would have written them
            getattr(sys, name).write(text)
            return
        target = getattr(sys, name)
        session = kernel_out.session
        msg = session.msg("stream", {"name": name, "text": text}, parent=parent or {}, metadata={META: meta})
        session.send(kernel_out.pub_thread, msg, ident=getattr(target, "topic", None) or f"stream.{name}".encode())


def _messages(parts: List[Part], waiting: Dict[str, List[int]]) -> Tuple[List[Message], Dict[str, List[int]]]:
    """The stream messages of ``parts`` (text pieces and marks, in order), consecutive pieces of one stream and parent
    joined, as ipykernel's buffer would send them. A mark goes with the message that holds the text before it; marks
    before any text (``waiting`` from earlier: lines held back, a hidden rank's) with the last. Returns the messages,
    and the marks left waiting when there is no text."""
    msgs: List[Message] = []
    early = dict(waiting)
    for name, parent, piece in parts:
        if not name:  # a mark: (rank, [stdout, stderr])
            (msgs[-1][3] if msgs else early)[str(piece[0])] = piece[1]
        elif msgs and msgs[-1][0] == name and msgs[-1][1] == parent:
            msgs[-1] = (name, parent, msgs[-1][2] + piece, msgs[-1][3])
        else:
            msgs.append((name, parent, piece, {}))
    if not msgs:
        return [], early
    marked = {r for m in msgs for r in m[3]}  # a later mark of a rank says more than its waiting one
    msgs[-1][3].update({r: p for r, p in early.items() if r not in marked})
    return msgs, {}
