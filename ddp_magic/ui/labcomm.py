"""The kernel side of the JupyterLab extension (``labextension/``): a comm target.

``%load_ext ddp_magic`` calls :func:`register`. In a kernel with a comm manager (ipykernel) it registers the comm
target ``ddp_magic``; plain IPython has none, and then nothing happens here at all. The front end opens a comm of
that target once a ``comm_info_request`` shows the target, so this module keeps one silent comm of it registered
(never opened towards a front end) while loaded. Front ends without the extension never get a message from here.

Kernel → front end, on every open comm:

- ``{"type": "snapshot", "session", "seq", "version", "protocol", "pool", "notices", "final", "cells", "ended"}``:
  ``pool`` is None or the session's pool (ui/labsnap.py builds it: ranks, the last cell, the env checks); ``cells``:
  the kept background cells (ui/transcripts.py); ``ended``: how the last pool ended while none runs since (a
  preemption, ui/labsnap.py ``pool_ended``). While a cell runs, snapshots follow the pool's events, at most one per
  ``MIN_INTERVAL`` (a trailing timer sends a burst's last change), and a watcher looks every ``MIN_INTERVAL`` for
  changes no event announces (a pool starting, a restart). When a cell ends one more is sent if anything changed.
  ``notices`` are forgotten when the next ``%%ddp`` cell runs.
- ``{"type": "metrics", ...}``: a cell's ``ddp_magic.log`` chart (:func:`metrics`); a comm that opens later gets the last.
- ``{"type": "reply", "id", "op", "ok", "message", "error"?, "report"?}`` for a request.
- ``{"type": "cell_output", ...}``: a background cell's output, to a page that follows it (ui/transcripts.py).

Front end → kernel: ``{"type": "shown", "pool", "upto"}`` (and a list of those as the ``hello``'s ``shown``): how far
the page holds a kept pool's output, where ``%ddp attach`` replays it from (kernel/keep/front.py).
``{"type": "request", "id", "op", "args"}`` with op ``restart``
(optional ``args.nproc``), ``stop``, ``env``, ``status``, ``stacks`` (optional ``args.ranks``,
``args.all_threads``) or ``follow`` (``args.msg_id``: a background cell's, ui/transcripts.py). They call the same :class:`~ddp_magic.session.Session` methods as
``%ddp restart``, ``%ddp stop``, ``%ddp_env --json``, ``%ddp status`` and ``%ddp stacks``
(ui/labrequests.py); the reply is built from what they return.

Threads. Comm messages arrive on the shell channel: on the main thread between
cells, or on a kernel subshell's thread while a cell runs (JupyterLab ≥ 4.4 with
ipykernel ≥ 7). The pool belongs to the main thread: ``restart``, ``stop`` and
``env`` from another thread go to the main thread's event loop, which runs them
when no cell holds it, after a ``{"type": "queued", "id", "op", "reason"}`` while a
cell runs. ``status``, ``stacks`` and snapshots are answered on any thread: ``stacks`` waits for the
ranks' answers, which the running cell's pump files (kernel/stacks.py), so the panel's Stacks works
while a foreground cell runs.

Nothing here may break a cell: every hook swallows its own errors (``LabBridge.last_error``, the log)."""
from __future__ import annotations

import asyncio
import contextvars
import json
import threading
import time
import uuid
import warnings
from collections import deque
from typing import Any, Callable, Deque, Dict, Optional, Tuple

from ..kernel import interrupts
from ..kernel.keep import front
from ..logs import log
from ..session import Session
from . import lab_hello, labrequests
from .labsnap import PoolSnapshots, jsonable
from .transcripts import RECORDER

TARGET = "ddp_magic"
PROTOCOL = 1  # labextension/src/model.ts PROTOCOL
MIN_INTERVAL = 0.25  # seconds between snapshots while a cell runs (at most 4 a second)
OPS = labrequests.OPS

_bridge: Optional["LabBridge"] = None


# ---------------------------------------------------------------- hooks for magics.py (cheap when nothing listens)
def changed() -> None:
    """The pool changed (a rank's state, its output): publish a snapshot, throttled."""
    bridge = _bridge
    if bridge is not None and bridge.comms:
        bridge.publish()


def notice(text: str, withdraw: bool = False) -> None:
    """A notice for the user (the magics print it too); the panel shows the last few. ``withdraw``: it is no longer
    true (a queued cell got its turn), the panel stops showing it."""
    bridge = _bridge
    if bridge is None or (withdraw and text not in bridge.notices):
        return
    bridge.notices.remove(text) if withdraw else bridge.notices.append(text)
    if bridge.comms:
        bridge.publish()


def metrics(payload: Dict[str, Any], final: bool = False) -> None:
    """A cell's ``ddp_magic.log`` chart data (ui/metrics_view.py, at most once a second, and once with final
    when the cell ends): ``{"type": "metrics", "session", "final", "cell", "names", "ranks", "rows", "series", "summary"}``."""
    bridge = _bridge
    if bridge is None:
        return
    data = jsonable(dict(payload, type="metrics", session=bridge.session_id, final=final))
    if isinstance(bridge, LabBridge):
        bridge.last_metrics = (data, bridge.pool_key())  # a page that connects later (a reload) gets it too
    for comm in list(bridge.comms.values()):
        bridge._send(comm, data)


def bridge() -> Optional["LabBridge"]:
    return _bridge


# ---------------------------------------------------------------- registration
def register(shell: Any, session: Any) -> Optional["LabBridge"]:
    """Register the comm target for ``shell``'s kernel; None (and nothing done) without a comm manager."""
    global _bridge
    kernel = getattr(shell, "kernel", None)
    manager = getattr(kernel, "comm_manager", None) if kernel is not None else None
    if manager is None or not hasattr(manager, "register_target"):
        return None
    if _bridge is not None:
        _bridge.close()
    _bridge = LabBridge(shell, session, manager)
    lab_hello.loaded(kernel)  # a %ddp attach later in this very cell waits a moment for a page's hello
    RECORDER.install(kernel)  # a background cell's outputs are kept: a page that reloads gets them back
    return _bridge


def unregister(shell: Any = None) -> None:
    global _bridge
    if _bridge is not None:
        _bridge.close()
        _bridge = None


# ---------------------------------------------------------------- the bridge
def _quietly(what: str, fn: Callable[[], Any]) -> None:
    """Run a clean-up step that may fail (the kernel is going away, the comm is closed): log it, go on."""
    try:
        fn()
    except Exception:
        log.debug("labcomm: %s failed", what, exc_info=True)


class LabBridge:
    """The comms of one kernel's front ends, and what they are told."""

    def __init__(self, shell: Any, session: Session, manager: Any) -> None:
        self.shell = shell
        self.session = session
        self.pools = PoolSnapshots(session)
        self.manager = manager
        self.session_id = uuid.uuid4().hex[:12]  # the snapshots' "session": a new one per registration
        self.seq = 0
        self.comms: Dict[str, Any] = {}
        self.notices: Deque[str] = deque(maxlen=5)
        self.sent = 0  # snapshots sent (to all comms); for tests
        self.last_error: Optional[str] = None
        self._lock = threading.RLock()
        self._last_time = float("-inf")
        self._last_key: Optional[str] = None
        self._last_final = False  # the last snapshot sent was a final one (a cell's end)
        self._timer: Optional[threading.Timer] = None
        self.last_metrics: Optional[Tuple[Dict[str, Any], Any]] = None  # the last metrics message, and the pool it was logged on
        self.cell_running = False  # a cell runs on the main thread (between pre_ and post_run_cell)
        self._watching = 0  # the cell a watcher thread looks for changes for (0: none runs)
        self._watch_seq = 0
        self._cell_ctx = contextvars.copy_context()
        self._main = threading.main_thread()
        self._loop = _main_loop()
        manager.register_target(TARGET, self._on_open)
        self._announce = self._make_announcement()
        shell.events.register("pre_run_cell", self._pre_run_cell)
        shell.events.register("post_run_cell", self._post_run_cell)

    def _failed(self, what: str, e: BaseException) -> None:
        """A hook failed (its caller has logged it): keep the last one for tests, never raise into the kernel."""
        self.last_error = f"{what}: {type(e).__name__}: {e}"

    # ------------------------------------------------------------ lifecycle
    def _make_announcement(self) -> Any:
        """A registered comm of our target that no front end has: comm_info_request then lists the target."""
        try:
            from ipykernel.comm import Comm

            comm = Comm(comm_id=f"ddp_magic-announce-{self.session_id}", primary=False, target_name=TARGET, show_warning=False)
            self.manager.register_comm(comm)
            return comm
        except Exception as e:  # an ipykernel without it: the front end then finds us after %%ddp cells only
            log.debug("labcomm: announce failed", exc_info=True)
            self._failed("announce", e)
            return None

    def close(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        for comm in list(self.comms.values()):
            _quietly("closing a comm", comm.close)
        self.comms.clear()
        _quietly("unregistering the target", lambda: self.manager.unregister_target(TARGET, self._on_open))
        if self._announce is not None:
            _quietly("unregistering the announcement", lambda: self.manager.unregister_comm(self._announce))
            self._announce._closed = True  # it was never open on any front end: no comm_close to send
            self._announce = None
        _quietly("unregistering pre_run_cell", lambda: self.shell.events.unregister("pre_run_cell", self._pre_run_cell))
        _quietly("unregistering post_run_cell", lambda: self.shell.events.unregister("post_run_cell", self._post_run_cell))
        _quietly("uninstalling the transcripts", RECORDER.uninstall)

    # ------------------------------------------------------------ comms
    def _on_open(self, comm: Any, msg: dict) -> None:
        self.comms[comm.comm_id] = comm
        for said in (msg.get("content", {}).get("data") or {}).get("shown") or []:  # what the page holds of kept pools
            front.heard(said)
        lab_hello.opened()
        # ipykernel ≥ 7.4 routes a front end's comm messages to the subshell of the last one this comm sent; snapshots
        # go out with the running cell's parent (the main shell), so the panel's requests would wait behind the cell:
        # they stay on the subshell the front end chose (a request like Stacks is answered while the cell runs)
        comm._reply_subshell_for = lambda data, default: default
        comm.on_msg(lambda m, c=comm: self._on_msg(c, m))
        comm.on_close(lambda m, cid=comm.comm_id: self._closed(cid))
        with self._lock:
            self._send(comm, self.snapshot(final=True))
        chart = self.last_metrics
        if chart is not None and chart[1] == self.pool_key():  # a reload keeps the pool's chart; a restarted pool has none
            self._send(comm, chart[0])
        self._start_watch()  # connected while a cell runs: changes no event announces reach it too

    def _closed(self, comm_id: str) -> None:
        self.comms.pop(comm_id, None)
        RECORDER.unfollow(comm_id)

    def pool_key(self) -> Any:
        """Which start of which pool runs now (None: no pool): a chart belongs to the pool it was logged on."""
        pool = self.session.pool
        return None if pool is None else (id(pool), getattr(pool, "generation", 0))

    def _on_msg(self, comm: Any, msg: dict) -> None:
        try:
            data = msg.get("content", {}).get("data") or {}
            if data.get("type") == "shown":
                front.heard(data)
            if data.get("type") == "interrupting":  # the panel's Interrupt comes next: a queued cell it takes out says so
                interrupts.from_panel()
                return self._send(comm, {"type": "interrupt_noted", "id": data.get("id")})
            if data.get("type") != "request":
                return
            op, rid, args = str(data.get("op")), data.get("id"), data.get("args") or {}
            if op == "follow":  # only reads, on any thread; the front end joins the reply and the cell's next messages by seq
                return self._send(comm, jsonable(RECORDER.follow_reply(rid, args, comm.comm_id, lambda d: self._send(comm, d))))
            if op in ("restart", "stop", "env") and threading.current_thread() is not self._main and self._loop is not None:
                # a subshell's thread: the pool belongs to the main thread (see the module's docstring)
                if self.cell_running:
                    self._send(comm, {"type": "queued", "id": rid, "op": op, "reason": "a cell is running; this runs when it ends"})
                self._loop.call_soon_threadsafe(self._answer, comm, rid, op, args)
                return
            self._answer(comm, rid, op, args)
        except Exception as e:
            log.debug("labcomm: request failed", exc_info=True)
            self._failed("request", e)

    def _answer(self, comm: Any, rid: Any, op: str, args: Dict[str, Any]) -> None:
        try:
            reply = self.handle(op, args)
            reply.update(type="reply", id=rid, op=op)
            self._send(comm, jsonable(reply))
        except Exception as e:
            log.debug("labcomm: request failed", exc_info=True)
            self._failed("request", e)
        self.publish(final=True)

    def _send(self, comm: Any, data: dict) -> None:
        try:
            comm.send(data)
        except Exception as e:
            log.debug("labcomm: send failed", exc_info=True)
            self._failed("send", e)

    # ------------------------------------------------------------ requests
    def handle(self, op: str, args: Dict[str, Any]) -> Dict[str, Any]:
        """Run a front-end request on the session (ui/labrequests.py); returns ok, message, and error, output or report."""
        return labrequests.handle(self.session, op, args, notice)

    # ------------------------------------------------------------ snapshots
    def publish(self, final: bool = False) -> None:
        """Send a snapshot to every open comm: now if the interval allows (or final), else once it has passed."""
        try:
            with self._lock:
                if not self.comms:
                    return
                now = time.monotonic()
                if final:
                    if self._timer is not None:
                        self._timer.cancel()
                        self._timer = None
                    self._broadcast(final=True, only_if_changed=True)
                    return
                if self._timer is not None:
                    return  # a send is already due; it will carry this change
                wait = self._last_time + MIN_INTERVAL - now
                if wait <= 0:
                    self._broadcast(final=False)
                    return
                ctx = contextvars.copy_context()  # comm messages keep the cell as their parent
                timer = threading.Timer(wait, ctx.run, args=(self._on_timer,))
                timer.daemon = True
                self._timer = timer
                timer.start()
        except Exception as e:
            log.debug("labcomm: publish failed", exc_info=True)
            self._failed("publish", e)

    def _on_timer(self) -> None:
        try:
            with self._lock:
                if self._timer is None:
                    return
                self._timer = None
                self._broadcast(final=False)
        except Exception as e:
            log.debug("labcomm: timer failed", exc_info=True)
            self._failed("timer", e)

    def _broadcast(self, final: bool, only_if_changed: bool = False) -> None:
        snap = self.snapshot(final=final)
        key = json.dumps({k: v for k, v in snap.items() if k not in ("seq", "final")}, sort_keys=True, default=str)
        if only_if_changed and key == self._last_key and (self._last_final or not final):
            return  # nothing new; but a cell's end is news even when a throttled snapshot already showed its last state
        self._last_key, self._last_final = key, final
        self._last_time = time.monotonic()
        self.sent += 1
        for comm in list(self.comms.values()):
            self._send(comm, snap)

    def _pre_run_cell(self, info: Any = None) -> None:
        if threading.current_thread() is not self._main:
            return
        self.cell_running = True
        raw = str(getattr(info, "raw_cell", "") or "")
        if "%ddp" in raw:  # %%ddp, %ddp restart, ...
            self.notices.clear()  # a notice is about the cell that gave it: the next ddp cell is the news now
        self.pools.cell_started(raw)
        self._watch_seq += 1
        self._cell_ctx = contextvars.copy_context()  # a watcher's messages keep this cell as their parent
        if self.comms:  # no front end, no watcher: a plain cell costs no thread
            self._start_watch()

    def _start_watch(self) -> None:
        """One watcher for the running cell, from its start or from the moment a front end connects."""
        with self._lock:
            if not self.cell_running or self._watching == self._watch_seq:
                return
            self._watching = self._watch_seq
        threading.Thread(target=self._cell_ctx.copy().run, args=(self._watch, self._watching), name="ddp_magic-labcomm-watch", daemon=True).start()

    def _post_run_cell(self, result: Any = None) -> None:
        if threading.current_thread() is self._main:
            self.cell_running = False
            self._watching = 0
            self.pools.cell_ended(result)
        if self.comms:
            self.publish(final=True)

    def _watch(self, cell: int) -> None:
        """While cell ``cell`` runs: send what changed without an event (a pool created, starting, restarting)."""
        while self._watching == cell and _bridge is self:
            time.sleep(MIN_INTERVAL)
            try:
                with self._lock:
                    due = self.comms and self._timer is None and time.monotonic() - self._last_time >= MIN_INTERVAL
                    if due and self._watching == cell:
                        self._broadcast(final=False, only_if_changed=True)
            except Exception as e:
                log.debug("labcomm: watch failed", exc_info=True)
                self._failed("watch", e)

    def snapshot(self, final: bool = False) -> Dict[str, Any]:
        with self._lock:
            self.seq += 1
            seq = self.seq
        from .._version import __version__

        return {"type": "snapshot", "session": self.session_id, "seq": seq, "version": __version__, "protocol": PROTOCOL,
                "pool": self.pools.pool_dict(), "kept": self.pools.kept_dicts(), "notices": list(self.notices), "final": final,
                "cells": RECORDER.briefs(), "ended": self.pools.ended_dict()}


def _main_loop() -> Optional[asyncio.AbstractEventLoop]:
    """The event loop of the kernel's main thread (ipykernel ≥ 6 runs one), if we are on that thread."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        pass  # no loop running in this very call: ask the policy for the thread's loop
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            loop = asyncio.get_event_loop_policy().get_event_loop()
        return loop if loop.is_running() else None
    except Exception:
        log.debug("labcomm: no event loop on the main thread; requests from subshells run where they arrive", exc_info=True)
        return None
