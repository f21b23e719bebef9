"""One ticker thread for every status view of the kernel: it sleeps until the earliest view's next render.

A view used to start (and, when its cell ended, join) a thread of its own: two context
switches each way, a millisecond or more of a quick cell on a busy machine. The thread here
starts once, with the first view that needs it, and idles on a condition while no cell runs.
Each view is rendered in the context it was registered from, so its comm messages keep
their cell as parent.
"""
from __future__ import annotations

import contextvars
import threading
from typing import Any, Dict, Optional, Protocol, Tuple

from ..logs import log

MAX_SLEEP = 1.0  # look again at least this often (a view's clock may not be the ticker's)


class Ticked(Protocol):
    """What the ticker needs of a view (status_view.StatusView)."""

    def clock(self) -> float: ...

    def next_render(self) -> float: ...

    def tick(self) -> None: ...


class Ticker:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._views: Dict[int, Tuple[Ticked, contextvars.Context]] = {}
        self.thread: Optional[threading.Thread] = None

    def add(self, view: Ticked) -> None:
        with self._cond:
            self._views[id(view)] = (view, contextvars.copy_context())
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, name="ddp-status", daemon=True)
                self.thread.start()
            self._cond.notify()

    def remove(self, view: Ticked) -> None:
        with self._cond:
            self._views.pop(id(view), None)

    def has(self, view: Ticked) -> bool:
        return id(view) in self._views

    def wake(self) -> None:
        """Something became due sooner than the ticker's sleep."""
        with self._cond:
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._views:
                    self._cond.wait()
                    continue
                self._cond.wait(self._sleep(list(self._views.values())))
                due = [(v, ctx) for v, ctx in self._views.values() if v.clock() >= v.next_render()]
            for view, ctx in due:
                try:
                    ctx.run(view.tick)
                except Exception:  # a view's failure is its own (it stops itself); the ticker goes on
                    log.debug("a status view's tick failed", exc_info=True)

    @staticmethod
    def _sleep(views: Any) -> float:
        return max(0.0, min([MAX_SLEEP] + [v.next_render() - v.clock() for v, _ in views]))


TICKER = Ticker()
