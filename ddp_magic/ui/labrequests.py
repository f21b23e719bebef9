"""What the JupyterLab panel may ask the kernel (ui/labcomm.py passes each request here): restart, stop, env, status, stacks.

Each calls the same :class:`~ddp_magic.session.Session` method as its magic (``%ddp restart``,
``%ddp stop``, ``%ddp_env --json``, ``%ddp status``, ``%ddp stacks``) and turns what it returns,
or the error it raises, into the reply's fields: ``ok``, ``message`` (one line), and ``error``,
``output`` or ``report``. A failure is the reply's, never the kernel's.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List

from ..errors import UsageError
from ..kernel import Listener
from ..logs import log
from ..session import NO_POOL, Session
from .report import env_report

OPS = ("restart", "stop", "env", "status", "stacks")


class Heard(Listener):
    """The notices a request's pool operation gives (the reply carries them), passed on to the panel too."""

    def __init__(self, notice: Callable[[str], None]) -> None:
        self.lines: List[str] = []
        self._notice = notice

    def on_notice(self, text: str) -> None:
        self.lines.append(f"ddp_magic: {text}")
        self._notice(text)


def handle(session: Session, op: str, args: Dict[str, Any], notice: Callable[[str], None]) -> Dict[str, Any]:
    """Run a front-end request on the session; returns ok, message, and error, output or report."""
    if op not in OPS:
        return {"ok": False, "message": "", "error": f"unknown request {op!r}; known: {', '.join(OPS)}"}
    heard = Heard(notice)
    try:
        if op == "env":
            report = env_report(session.env()).to_dict()
            return {"ok": True, "message": f"%ddp_env: {report.get('verdict', '')}".strip(), "report": report}
        if op == "stop":
            return {"ok": True, "message": session.stop() or NO_POOL}
        if op == "restart":
            nproc = args.get("nproc")
            spec = session.spec_for(int(nproc)) if nproc is not None else None
            message = session.restart(spec, heard).ready_text()
            return {"ok": True, "message": message, "output": "\n".join(heard.lines + [message])}
        if op == "stacks":
            ranks = args.get("ranks")
            holder = session.turns.holder  # the cell the stacks show: the panel marks them stale once it has ended
            stacks = session.stacks([int(r) for r in ranks] if ranks is not None else None, bool(args.get("all_threads")))
            lines = stacks.lines()
            return {"ok": True, "message": lines[0], "output": "\n".join(lines), "groups": stacks.groups,
                    "job": holder.name if holder is not None else None}
        text = session.status().text()
        return {"ok": True, "message": text.splitlines()[0], "output": text}
    except (Exception, KeyboardInterrupt) as e:  # a kernel interrupt while a request runs ends the request, not the kernel's loop
        log.debug("labcomm: request %s failed", op, exc_info=True)
        why = str(e) if isinstance(e, UsageError) else f"{type(e).__name__}: {e}"
        return {"ok": False, "refused": isinstance(e, UsageError), "message": "", "error": why.strip(), "output": "\n".join(heard.lines)}
