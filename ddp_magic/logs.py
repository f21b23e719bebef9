"""ddp_magic's own log: what went wrong quietly, kept so a user can attach it to a bug report.

Every place that survives an exception on purpose logs it here at debug level
(``log.debug(..., exc_info=True)``) instead of passing silently. The records
stay in a small ring buffer in each process; ``%ddp log`` shows the kernel's.
``DDP_MAGIC_LOG=debug`` (or ``info``, ``warning``) in the environment also
echoes them to stderr, in the kernel and on every rank.
"""
from __future__ import annotations

import logging
import os
from collections import deque
from typing import Deque, List

LOGGER_NAME = "ddp_magic"
log = logging.getLogger(LOGGER_NAME)
FORMAT = "%(asctime)s %(levelname)s %(name)s [pid %(process)d] %(message)s"


class RingHandler(logging.Handler):
    """Keeps the last ``capacity`` formatted records in memory."""

    def __init__(self, capacity: int = 500) -> None:
        super().__init__(logging.DEBUG)
        self.records: Deque[str] = deque(maxlen=capacity)
        self.setFormatter(logging.Formatter(FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.records.append(self.format(record))
        except Exception:  # a logging handler must never raise into the code it logs for
            self.handleError(record)


_ring = RingHandler()


def _install() -> None:
    if any(isinstance(h, RingHandler) for h in log.handlers):
        return
    log.addHandler(_ring)
    log.setLevel(logging.DEBUG)
    log.propagate = False  # ours to show; never into the notebook through the root logger
    level = os.environ.get("DDP_MAGIC_LOG", "").upper()
    if level in ("DEBUG", "INFO", "WARNING", "ERROR"):
        echo = logging.StreamHandler()
        echo.setLevel(getattr(logging, level))
        echo.setFormatter(logging.Formatter(FORMAT))
        log.addHandler(echo)


def recent(limit: int = 200) -> List[str]:
    """The last ``limit`` records of this process, oldest first."""
    return list(_ring.records)[-limit:]


def clear() -> None:
    _ring.records.clear()


_install()
