"""What a background cell's output area shows, kept in the kernel: a page that reloads (or reopens the notebook) gets it back.

JupyterLab and Notebook 7 route an output message to a cell by its parent header: the msg_id of the execute
request that page sent. A reloaded page has a new kernel connection and no such request, so every later message
of a background cell reaches the page and goes nowhere: the cell looks stopped, and the job's settled view and
chart never arrive. So the kernel keeps, per background cell, the output messages it sent with that cell's parent
(``Transcript``): every ``stream``, ``display_data``, ``update_display_data``, ``execute_result``, ``error`` and
``clear_output``, taken where they all leave, the kernel session's ``send`` (``Recorder``). They are kept as the
output area holds them: consecutive streams joined, a display update applied to the display it names, a clear
dropping what it clears; each message counts one ``seq``.

The JupyterLab extension (``labextension/src/rebind.ts``) reads ``cells`` in each snapshot (the kept transcripts:
the cell's id, which page ran it, whether it ended) and, for a cell its page did not run, sends ``{"op": "follow"}``
over the comm (ui/labcomm.py): the reply holds the cell's outputs and their ``seq``; from then on each new message
of that cell comes over the comm as ``{"type": "cell_output", "msg_id", "seq", "msg_type", "content"}``. The reply
and the messages after it are sent under one lock, in order: none is lost, none comes twice. A kept pool's lines
carry how far they go in their message's metadata (kernel/output/kept_output.py): a transcript keeps the highest per
pool and rank, the reply says them as ``shown`` (``[{"type": "shown", "pool", "upto"}]``) and a later message carries
its own ``metadata``, so a reloaded page that shows the cell again tells the next kernel it holds those lines
(held.ts; docs/keep.md, "Shown exactly once").
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional

from ..kernel.output.kept_output import META
from ..logs import log

OUTPUT_TYPES = frozenset({"stream", "display_data", "update_display_data", "execute_result", "error", "clear_output"})
KEEP = 8  # the background cells whose outputs are kept (the running ones and the last that ended)
Follower = Callable[[Dict[str, Any]], None]


def _display_id(content: Dict[str, Any]) -> Optional[str]:
    transient = content.get("transient") or {}
    return transient.get("display_id") if isinstance(transient, dict) else None


class Transcript:
    """One background cell's outputs, as its output area holds them, and the comms that follow it."""

    def __init__(self, msg_id: str, cell_id: str, client: str, name: str, done: Callable[[], bool]) -> None:
        self.msg_id = msg_id  # the execute request's: every output of the cell carries it as its parent
        self.cell_id = cell_id  # the notebook's id of the cell (JupyterLab sends it as the request's metadata.cellId)
        self.client = client  # the page that ran it (the request header's session): that page routes the cell itself
        self.name = name  # "cell [12]"
        self.done = done  # whether its job has ended
        self.seq = 0
        self.outputs: List[Dict[str, Any]] = []  # {"msg_type", "content"}, in order
        self._clear_next = False  # a clear_output(wait=True): the outputs go with the next message
        self.followers: Dict[str, Follower] = {}
        self.marks: Dict[str, Dict[str, List[int]]] = {}  # per kept pool and rank, how far the kept lines held go
        self.lock = threading.RLock()

    def add(self, msg_type: str, content: Dict[str, Any], metadata: Optional[Dict[str, Any]] = None) -> None:
        """One message the cell's output area receives: kept as the area keeps it, passed on to every follower."""
        with self.lock:
            self.seq += 1
            self._apply(msg_type, content)
            mark = self._mark(msg_type, metadata)
            delta = {"msg_id": self.msg_id, "seq": self.seq, "msg_type": msg_type, "content": content,
                     **({"metadata": {META: mark}} if mark else {})}
            for key, follower in list(self.followers.items()):
                try:
                    follower(delta)
                except Exception:  # a comm that went away: it follows no more
                    log.debug("transcripts: a follower of %s failed; dropped", self.name, exc_info=True)
                    self.followers.pop(key, None)

    def _mark(self, msg_type: str, metadata: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
        """A stream of a kept pool's lines carries how far they go (kernel/output/kept_output.py): kept, highest per
        rank, so a page that shows this cell again (a reload) tells the next kernel it holds them (docs/keep.md)."""
        mark = (metadata or {}).get(META) if msg_type == "stream" else None
        if not isinstance(mark, dict) or not isinstance(mark.get("upto"), dict):
            return None
        held = self.marks.setdefault(str(mark.get("pool")), {})
        for rank, pair in mark["upto"].items():
            had = held.get(str(rank), [0, 0])
            held[str(rank)] = [max(int(pair[0]), had[0]), max(int(pair[1]), had[1])]
        return mark

    def shown(self) -> List[Dict[str, Any]]:
        """What the page that shows these outputs holds of each kept pool, as the extension says it (kernel/keep/front.py)."""
        return [{"type": "shown", "pool": pool, "upto": {r: list(p) for r, p in upto.items()}} for pool, upto in self.marks.items()]

    def _apply(self, msg_type: str, content: Dict[str, Any]) -> None:
        if msg_type == "clear_output":
            if content.get("wait"):
                self._clear_next = True
            else:
                self.outputs.clear()
            return
        if msg_type == "update_display_data":
            did = _display_id(content)
            for out in self.outputs:
                if out["msg_type"] in ("display_data", "execute_result") and _display_id(out["content"]) == did:
                    out["content"] = dict(out["content"], data=content.get("data", {}), metadata=content.get("metadata", {}))
            return
        if self._clear_next:
            self._clear_next = False
            self.outputs.clear()
        last = self.outputs[-1] if self.outputs else None
        if msg_type == "stream" and last is not None and last["msg_type"] == "stream" and last["content"].get("name") == content.get("name"):
            last["content"] = dict(last["content"], text=str(last["content"].get("text", "")) + str(content.get("text", "")))
            return
        self.outputs.append({"msg_type": msg_type, "content": dict(content)})

    def follow(self, key: str, follower: Follower) -> Dict[str, Any]:
        """What the cell shows now and its seq; from then on ``follower`` gets each new message (``key``: its comm)."""
        with self.lock:
            self.followers[key] = follower
            return {"msg_id": self.msg_id, "cell_id": self.cell_id, "seq": self.seq, "ended": self.done(),
                    "outputs": [dict(o) for o in self.outputs], "shown": self.shown()}

    def brief(self) -> Dict[str, Any]:
        """What a snapshot says of it (``cells``): enough for a page to find the cell and know whether it ran it."""
        return {"msg_id": self.msg_id, "cell_id": self.cell_id, "client": self.client, "name": self.name, "ended": self.done()}


class Recorder:
    """The kernel session's ``send``, wrapped: each output message of a kept cell goes to its transcript too."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self.cells: "OrderedDict[str, Transcript]" = OrderedDict()
        self._session: Any = None
        self._send: Optional[Callable[..., Any]] = None

    def install(self, kernel: Any) -> bool:
        """Wrap ``kernel.session.send`` (ipykernel: every iopub message leaves through it); False without one."""
        session = getattr(kernel, "session", None)
        send = getattr(session, "send", None)
        if session is None or send is None or self._session is not None:
            return False
        self._session, self._send = session, send

        def recorded(stream: Any, msg_or_type: Any, *args: Any, **kwargs: Any) -> Any:
            msg = send(stream, msg_or_type, *args, **kwargs)
            if self.cells and isinstance(msg, dict):
                self.heard(msg)
            return msg

        session.send = recorded
        return True

    def uninstall(self) -> None:
        if self._session is not None:
            try:
                del self._session.send  # the instance attribute goes: the class's send is back
            except AttributeError:
                log.debug("transcripts: the session's send was replaced by someone else; left as it is")
        self._session = self._send = None
        self.cells.clear()

    def heard(self, msg: Dict[str, Any]) -> None:
        try:
            kind = msg.get("msg_type") or msg.get("header", {}).get("msg_type")
            if kind not in OUTPUT_TYPES:
                return
            cell = self.cells.get((msg.get("parent_header") or {}).get("msg_id", ""))
            if cell is not None:
                cell.add(kind, dict(msg.get("content") or {}), msg.get("metadata"))
        except Exception:  # never break a send
            log.debug("transcripts: could not record a message", exc_info=True)

    def begin(self, parent: Dict[str, Any], name: str, done: Callable[[], bool]) -> Optional[Transcript]:
        """Keep the outputs of the cell whose request is ``parent`` (the kernel's current one); None without a request."""
        header = parent.get("header") or {}
        msg_id = header.get("msg_id")
        if not msg_id or self._session is None:
            return None
        cell_id = str((parent.get("metadata") or {}).get("cellId") or "")
        for old in [k for k, c in self.cells.items() if cell_id and c.cell_id == cell_id]:
            self.cells.pop(old)  # the cell ran again: its output area is the new run's (the old job's output shows nowhere)
        cell = self.cells[msg_id] = Transcript(msg_id, cell_id, str(header.get("session") or ""), name, done)
        while len(self.cells) > self.keep:
            oldest = next((k for k, c in self.cells.items() if c.done()), None)
            if oldest is None:
                break
            self.cells.pop(oldest)
        return cell

    def briefs(self) -> List[Dict[str, Any]]:
        return [c.brief() for c in list(self.cells.values())]

    def follow(self, msg_id: str, key: str, follower: Follower) -> Optional[Dict[str, Any]]:
        cell = self.cells.get(msg_id)
        return cell.follow(key, follower) if cell is not None else None

    def follow_reply(self, rid: Any, args: Dict[str, Any], key: str, send: Follower) -> Dict[str, Any]:
        """The reply to a page's ``follow`` request (ui/labcomm.py); ``send`` takes each later message of the cell."""
        kept = self.follow(str(args.get("msg_id")), key, lambda delta: send(dict(delta, type="cell_output")))
        return dict(kept or {}, type="reply", id=rid, op="follow", ok=kept is not None, message="",
                    **({} if kept is not None else {"error": "that cell's outputs are no longer kept"}))

    def unfollow(self, key: str) -> None:
        for cell in list(self.cells.values()):
            with cell.lock:
                cell.followers.pop(key, None)


RECORDER = Recorder()


def begin(shell: Any, name: str, done: Callable[[], bool]) -> Optional[Transcript]:
    """A background cell starts (magics.py): keep its outputs, if the kernel records them (ui/labcomm.py installs it)."""
    kernel = getattr(shell, "kernel", None)
    get_parent = getattr(kernel, "get_parent", None)
    if get_parent is None:
        return None
    try:
        parent = get_parent()
        return RECORDER.begin(parent, name, done) if isinstance(parent, dict) else None
    except Exception:
        log.debug("transcripts: could not begin one for %s", name, exc_info=True)
        return None
