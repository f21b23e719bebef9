"""Who interrupted the kernel: the user's Ctrl-C (the kernel's own interrupt), unless the DDP panel said, just before,
that the interrupt is its *Interrupt* button's (ui/labcomm.py hears it over the comm, labextension/src/connection.ts
sends it first). A cell the interrupt takes out of the queue then names the panel, not a key the user never pressed."""
from __future__ import annotations

import threading
import time

PANEL_WINDOW_S = 10.0  # the panel's word counts for the interrupt that follows it within this
_lock = threading.Lock()
_panel_at = 0.0


def from_panel() -> None:
    """The DDP panel is about to interrupt the kernel (its Interrupt button)."""
    global _panel_at
    with _lock:
        _panel_at = time.monotonic()


def how() -> str:
    """``(Ctrl-C)``, or ``by the DDP panel's Interrupt`` when the panel said so just before (each word counts once)."""
    global _panel_at
    with _lock:
        panel = _panel_at and time.monotonic() - _panel_at < PANEL_WINDOW_S
        _panel_at = 0.0
    return "by the DDP panel's Interrupt" if panel else "(Ctrl-C)"
