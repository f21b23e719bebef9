"""A rank's stdin: ``input()``, ``sys.stdin`` and ``getpass`` ask the notebook, through the kernel, one line at a time.

A rank's fd 0 is /dev/null, so without this a cell that reads stdin gets nothing.
Each read sends an INPUT request over the control channel and blocks for the
kernel's reply; the kernel asks the notebook (the kernel's own stdin channel,
``[rank r] `` before the prompt) and answers ranks one at a time. A front end
without stdin (nbval, ``allow_stdin=False``) makes the reply an EOF with the
reason, so the rank gets ``EOFError`` at once instead of waiting.

The wait is interruptible: the kernel's INTERRUPT raises KeyboardInterrupt in it
(a late reply to an abandoned request is recognised by its id and dropped).
"""
from __future__ import annotations

import builtins
import getpass
import io
import queue
import sys
import threading
from typing import Any, Callable, Optional

from ..wire import protocol as P

Send = Callable[..., None]  # Channel.send(op, **fields)


class Asker:
    """Sends a rank's INPUT requests and waits for the matching reply (the reader thread hands replies in)."""

    def __init__(self, send: Send, rank: int) -> None:
        self.send = send
        self.rank = rank
        self.replies: "queue.Queue[dict]" = queue.Queue()
        self._seq = 0
        self.no_stdin = False  # the last EOF came from a front end without stdin (not from an interrupt)
        self._lock = threading.Lock()  # one question at a time per rank (threads of a cell may read too)

    def ask(self, prompt: str = "", password: bool = False) -> str:
        """One line from the notebook, without its newline; EOFError when the front end has none to give."""
        for stream in (sys.stdout, sys.stderr):  # what the rank printed before asking shows above the box
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        with self._lock:
            self._seq += 1
            seq = self._seq
            self.send(P.INPUT, rank=self.rank, id=seq, prompt=str(prompt), password=bool(password))
            while True:
                reply = self.replies.get()
                if reply.get("id") == seq:
                    break
        self.no_stdin = bool(reply.get("no_stdin"))
        if reply.get("eof") is not None:
            raise EOFError(reply["eof"])
        return str(reply.get("text", ""))

    def on_reply(self, msg: dict) -> None:
        self.replies.put(msg)


class RankStdin(io.TextIOBase):
    """``sys.stdin`` on a rank: every line read is one question to the notebook ("" at EOF, as a file gives)."""

    def __init__(self, asker: Asker) -> None:
        super().__init__()
        self.asker = asker

    def readable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def readline(self, size: Optional[int] = -1) -> str:  # type: ignore[override]
        try:
            return self.asker.ask("") + "\n"
        except EOFError:
            return ""

    def read(self, size: Optional[int] = -1) -> str:
        return self.readline()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"


ASKER: Optional[Asker] = None


def install(send: Send, rank: int) -> Asker:
    """Route this rank's input(), sys.stdin and getpass through the kernel."""
    global ASKER
    ASKER = asker = Asker(send, rank)

    def rank_input(prompt: Any = "") -> str:
        return asker.ask(str(prompt))

    def rank_getpass(prompt: str = "Password: ", stream: Any = None) -> str:
        return asker.ask(prompt, password=True)

    builtins.input = rank_input
    getpass.getpass = rank_getpass
    sys.stdin = RankStdin(asker)
    return asker
