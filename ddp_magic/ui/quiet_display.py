"""The status view's display messages, without ipykernel's stream flush when the kernel's streams hold nothing.

ipykernel flushes stdout and stderr before every display message, so that text printed
before it shows above it. Each flush is a round trip to its IO thread (two schedules and
an event wait per stream): 0.6 ms of a quick cell's kernel CPU, and more of its wall time,
for the one summary line a quick cell's view sends, when nothing was printed at all.
When both streams have nothing buffered and no flush pending, that flush has nothing to
put first (the IO thread sends in order whatever was flushed before), so the view's
message goes without it; with anything buffered, or a front end whose streams look
different (plain IPython, another ipykernel), the flush runs as before.
"""
from __future__ import annotations

import contextvars
import sys
from typing import Any, Optional

from ..logs import log

_QUIET = contextvars.ContextVar("ddp_magic_quiet_display", default=False)  # set only around the view's own messages


def _streams_idle() -> bool:
    """Whether ipykernel's stdout and stderr have nothing that a flush would send (private fields: any doubt is False)."""
    for stream in (sys.stdout, sys.stderr):
        buffers = getattr(stream, "_buffers", None)
        lock = getattr(stream, "_buffer_lock", None)
        if not isinstance(buffers, dict) or lock is None or getattr(stream, "_flush_pending", True) is not False:
            return False
        with lock:
            if any(b.tell() for b in list(buffers.values())):
                return False
    return True


def _publisher_ready() -> bool:
    """Let the shell's display publisher skip its flush where ``_QUIET`` says so (installed once per publisher)."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        pub = getattr(shell, "display_pub", None)
        real = getattr(pub, "_flush_streams", None)
        if pub is None or real is None:
            return False
        if getattr(real, "_ddp_quiet", False):
            return True

        def flush_streams() -> None:
            if not _QUIET.get():
                real()

        flush_streams._ddp_quiet = True  # type: ignore[attr-defined]
        pub._flush_streams = flush_streams
        return True
    except Exception:  # a front end unlike ipykernel's: its display flushes as it always did
        log.debug("status view: display messages keep their stream flush", exc_info=True)
        return False


def display(bundle: Any, display_id: Any = True, update: bool = False) -> Optional[Any]:
    """IPython's display (or update_display) of a raw bundle; without the stream flush when the streams are idle."""
    from IPython.display import display as show
    from IPython.display import update_display

    token = _QUIET.set(_publisher_ready() and _streams_idle())
    try:
        if update:
            update_display(bundle, raw=True, display_id=display_id)
            return None
        return show(bundle, raw=True, display_id=display_id)
    finally:
        _QUIET.reset(token)
