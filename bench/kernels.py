"""A real Jupyter kernel for the benchmarks: execute a cell, time execute → idle, keep what a notebook would show.

``KernelSession`` is a fresh IPython kernel driven through jupyter_client (imported
only here, when a kernel is made); ``PeerKernel`` is one of this interpreter under
its own kernelspec, its own output in a log file (bench_peers.py's tools).
``stop_kernel`` stops a kernel's pool, the kernel, and checks every process under it went.
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import time
from typing import Any, Dict, Optional

import processes as P
from harness import log, short_error

KERNEL_NAME = "ddp-bench-peers"


class KernelSession:
    """A fresh IPython kernel driven through jupyter_client; ``run`` times execute → idle."""

    def __init__(self, startup_timeout: float = 120.0, env: Optional[Dict[str, str]] = None) -> None:
        from jupyter_client.manager import start_new_kernel

        self.km, self.kc = start_new_kernel(startup_timeout=startup_timeout, kernel_name="python3", env=dict(P.child_env(), **(env or {})), cwd=P.SRC)
        self.pid = self.km.provisioner.process.pid  # type: ignore[union-attr]

    def run(self, code: str, timeout: float = 300.0) -> dict:
        """Execute; elapsed = execute request → idle; value = the execute_result's text (displays, such as
        the status view, are only in results); events = (arrival time.time(), text) of every output message."""
        ex: Dict[str, Any] = {"stdout": "", "stderr": "", "results": [], "value": None, "error": None, "events": []}
        displays: Dict[str, int] = {}  # display_id → index in results: update_display_data replaces it (ipyparallel streams so)
        t0 = time.perf_counter()
        msg_id = self.kc.execute(code)
        while True:
            left = timeout - (time.perf_counter() - t0)
            if left <= 0:
                raise TimeoutError(f"cell ran past {timeout:.0f}s: {code[:60]!r}; stdout: {P.tail(ex['stdout'], 200)!r}; stderr: {P.tail(ex['stderr'], 200)!r}")
            try:
                msg = self.kc.get_iopub_msg(timeout=min(left, 5.0))
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if self._take(ex, displays, msg, time.time()):
                break
        ex["elapsed"] = time.perf_counter() - t0
        return ex

    @staticmethod
    def _take(ex: Dict[str, Any], displays: Dict[str, int], msg: dict, now: float) -> bool:
        """One iopub message into ``ex``; True at the kernel's idle."""
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            ex[content["name"]] = ex.get(content["name"], "") + content["text"]
            ex["events"].append((now, content["text"], "stream"))
        elif kind in ("execute_result", "display_data", "update_display_data"):
            text = content["data"].get("text/plain", "")
            did = (content.get("transient") or {}).get("display_id")
            if kind == "update_display_data":
                if did in displays:
                    ex["results"][displays[did]] = text
            else:
                if did:
                    displays[did] = len(ex["results"])
                ex["results"].append(text)
                if kind == "execute_result":
                    ex["value"] = text
            ex["events"].append((now, text, "display"))
        elif kind == "error":
            ex["error"] = f"{content['ename']}: {content['evalue']}"
        return kind == "status" and content["execution_state"] == "idle"

    def ok(self, code: str, timeout: float = 300.0) -> dict:
        ex = self.run(code, timeout)
        if ex["error"]:
            raise RuntimeError(f"{ex['error']} | stderr: {P.tail(ex['stderr'], 300)}")
        return ex

    def shutdown(self) -> None:
        try:
            self.kc.stop_channels()
        finally:
            self.km.shutdown_kernel(now=True)


def stop_kernel(k: Optional[KernelSession], watch: P.Watch, what: str, kill: bool = False) -> None:
    """`%ddp stop`, the kernel's shutdown, then every process that was under it must be gone."""
    if k is None:
        return
    pids = [k.pid] + P.descendants(k.pid)
    try:
        k.run("%ddp stop", timeout=60)
    except Exception as e:
        log(f"{what}: %ddp stop failed: {short_error(e)}")
    try:
        k.shutdown()
    except Exception as e:
        log(f"{what}: kernel shutdown failed: {short_error(e)}")
    watch.expect_gone(pids, what, kill=kill)


def ensure_kernelspec() -> None:
    """Our kernels run this interpreter: a kernelspec in this venv's prefix whose argv[0] is sys.executable."""
    path = os.path.join(sys.prefix, "share", "jupyter", "kernels", KERNEL_NAME, "kernel.json")
    try:
        with open(path) as f:
            if json.load(f)["argv"][0] == sys.executable:
                return
    except (OSError, ValueError, KeyError, IndexError):
        pass
    from ipykernel.kernelspec import install

    install(prefix=sys.prefix, kernel_name=KERNEL_NAME, display_name="ddp bench peers")


class PeerKernel(KernelSession):
    """A fresh IPython kernel (this interpreter, KERNEL_NAME), its own stdout/stderr in a log file."""

    def __init__(self, tmp: str, tag: str, startup_timeout: float = 120.0) -> None:
        from jupyter_client.manager import start_new_kernel

        env = P.child_env()
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # nbdistributed starts "python"
        env["IPYTHONDIR"] = os.path.join(tmp, "ipython")  # ipyparallel's profile and cluster files, history: not ~/.ipython
        env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
        env.pop("MPLBACKEND", None)
        self.log_path = os.path.join(tmp, f"kernel-{tag}-{time.monotonic_ns()}.log")
        self._log = open(self.log_path, "wb")
        self.km, self.kc = start_new_kernel(startup_timeout=startup_timeout, kernel_name=KERNEL_NAME, env=env, cwd=tmp,
                                            stdout=self._log, stderr=subprocess.STDOUT)
        self.pid = self.km.provisioner.process.pid  # type: ignore[union-attr]

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            self._log.close()

    def log_tail(self, n: int = 300) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return P.tail(f.read(), n)
        except OSError:
            return ""
