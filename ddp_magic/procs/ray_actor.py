"""One Ray actor a node of a Ray pool, pinned to its (first) placement-group bundle: it starts that node's template and relays its lines, nothing else.

Created by procs/ray_group.py, never detached: when the driver (the kernel's child, or a kept pool's under its
lease: procs/ray_keep.py) ends, Ray ends the actor, and its template follows it. The template is procs/ray_template.py's
(node_template's, watched by a beat): it is this actor's child with the actor as its parent
for the parent-death signal, so a SIGKILLed actor still ends it and, through theirs, its
ranks. The template gets the GPUs of the node's bundles (CUDA_VISIBLE_DEVICES: local rank i
uses cuda:i): those Ray gave this actor, and those of the node's other bundles when it has
several (a bundle a rank). Rank output never passes here: the ranks dial the kernel themselves; what
passes is the template's events (ready, spawned, exited, pong) and its last-resort words.
"""
from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from typing import Dict, List, Optional

from ..logs import log

TEMPLATE = ["-m", "ddp_magic.procs.ray_template"]  # a beat-watched node template that dies with this actor, kept or not


class NodeActor:
    """Holds one node's bundle; its template's stdin is ``write``, its stdout ``read``."""

    def __init__(self) -> None:
        self.proc: Optional[subprocess.Popen] = None
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()

    def where(self) -> Dict[str, object]:
        """This node as Ray and the host see it: hostname, Ray's node address and id, the GPU ids Ray gave this actor."""
        import ray

        ctx = ray.get_runtime_context()
        return {"host": socket.gethostname(), "ip": ray.util.get_node_ip_address(), "node_id": ctx.get_node_id(),
                "gpus": [str(g) for g in ray.get_gpu_ids()], "pid": os.getpid()}

    def start(self, node: str, cwd: str, pythonpath: str, gpus: Optional[List[str]] = None) -> int:
        """The node's template, this actor's child (it dies with us: procs/parent.py's parent-death signal); its pid.
        ``gpus``: every GPU id of the node's bundles (this actor's bundle's and the others'), else this actor's."""
        import ray

        env = dict(os.environ)
        gpus = [str(g) for g in ray.get_gpu_ids()] if gpus is None else list(gpus)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus) if gpus else env.get("CUDA_VISIBLE_DEVICES", "")
        if not env["CUDA_VISIBLE_DEVICES"]:
            env.pop("CUDA_VISIBLE_DEVICES")
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        env["PYTHONUNBUFFERED"] = "1"
        started: "queue.Queue[object]" = queue.Queue()
        argv = [sys.executable, *TEMPLATE, "--node", node]
        threading.Thread(target=self._run, args=(argv, env, cwd if os.path.isdir(cwd) else None, started), name="ddp-ray-pump", daemon=True).start()
        got = started.get()
        if isinstance(got, BaseException):
            raise got
        return int(got)  # type: ignore[call-overload]

    def _run(self, argv: List[str], env: Dict[str, str], cwd: Optional[str], started: "queue.Queue[object]") -> None:
        """Start the template, then relay its lines, in one thread that lives as long as the template does: Linux sends a
        parent-death signal when the *thread* that forked the child ends, and a Ray executor thread is not ours to keep."""
        # Ray's threads block SIGINT, and a child inherits its forking thread's mask: the ranks would never hear an
        # interrupt (the kernel's INTERRUPT raises SIGINT in the rank). The template starts with nothing blocked.
        blocked = signal.pthread_sigmask(signal.SIG_SETMASK, set())
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                         close_fds=True)
        except BaseException as e:  # said in start(), the actor's call
            log.debug("the node's template could not start", exc_info=True)
            started.put(e)
            return
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        started.put(self.proc.pid)
        self._pump()

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            self.lines.put(raw.decode(errors="replace"))
        self.proc.wait()
        self.lines.put(None)

    def read(self, timeout: float) -> Optional[List[str]]:
        """The template's lines so far (waiting up to ``timeout`` for the first); None once it ended and all were read."""
        out: List[str] = []
        try:
            first = self.lines.get(timeout=timeout)
        except queue.Empty:
            return out
        for line in [first] + self._drain():
            if line is None:
                return out or None
            out.append(line)
        return out

    def _drain(self) -> List[Optional[str]]:
        out: List[Optional[str]] = []
        while True:
            try:
                out.append(self.lines.get_nowait())
            except queue.Empty:
                return out
            if out[-1] is None:
                self.lines.put(None)  # said once more: the next read returns None
                return out[:-1]

    def write(self, line: str) -> None:
        """One line to the template (the kernel's commands, each to every node: a template acts on its own)."""
        if self.proc is None or self.proc.stdin is None:
            return
        try:
            self.proc.stdin.write(line.encode())
            self.proc.stdin.flush()
        except (OSError, ValueError):  # the template ended: read says so
            log.debug("the node's template no longer reads commands", exc_info=True)

    def close_stdin(self) -> None:
        """A kept pool's driver says no kernel is there any more (procs/ray_keep.py): the template's stdin ends, as a kept
        SSH template's session does, and its lease counts the idle time from now."""
        if self.proc is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                log.debug("the node's template's stdin was closed already", exc_info=True)

    def code(self) -> Optional[int]:
        return self.proc.poll() if self.proc is not None else None
