"""What the Slurm tests share: a kernel started inside an salloc, a cell interrupted once the notebook shows something, /proc."""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, List, Optional

from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel_helper import ANSI, Execution, Kernel, alive, own_runtime_dir  # noqa: E402,F401 (alive: the slurm tests import it from here)


def kernel_inside_salloc(salloc_args: List[str], job_name: str = "notebook") -> Kernel:
    """A real kernel whose process is salloc's command, as on a cluster's `salloc ... jupyter`: SLURM_JOB_ID in its env."""
    folder = Path(tempfile.mkdtemp(prefix="ddp-slurm-kernelspec-"))
    spec = folder / "salloc-python"
    spec.mkdir()
    argv = ["salloc", f"--job-name={job_name}", *salloc_args, sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "python in salloc", "language": "python"}))
    km = KernelManager(kernel_name="salloc-python", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(folder)]))
    runtime = own_runtime_dir()  # never the user's, as every test kernel's (kernel_helper.Kernel)
    km.start_kernel(env=dict(os.environ, JUPYTER_RUNTIME_DIR=runtime))
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    kernel = Kernel.__new__(Kernel)
    kernel.km, kernel.kc, kernel.runtime = km, kc, runtime
    return kernel


def run_interrupting(kernel: Kernel, code: str, seen: Callable[[dict], bool], timeout: float = 120.0) -> Execution:
    """Run a cell and interrupt it (Ctrl-C) once one of its iopub messages satisfies ``seen`` (never on a timer)."""
    ex = Execution(code)
    t0 = time.monotonic()
    msg_id = kernel.kc.execute(code)
    interrupted = False
    while time.monotonic() - t0 < timeout:
        try:
            msg = kernel.kc.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        ex.messages.append(msg)
        kind, content = msg["msg_type"], msg["content"]
        if not interrupted and seen(msg):
            kernel.km.interrupt_kernel()
            interrupted = True
        if kind == "stream":
            text = ANSI.sub("", content["text"])
            ex.stdout += text if content["name"] == "stdout" else ""
            ex.stderr += text if content["name"] == "stderr" else ""
        elif kind == "error":
            ex.error = (content["ename"], content["evalue"], [ANSI.sub("", line) for line in content["traceback"]])
        elif kind == "status" and content["execution_state"] == "idle":
            ex.elapsed = time.monotonic() - t0
            return ex
    raise TimeoutError(f"cell did not finish in {timeout}s: {code[:80]!r}")


def says(msg: dict, text: str) -> bool:
    """Whether an iopub message (a stream, a display, a widget update) carries ``text``."""
    return text in json.dumps(msg.get("content", {}), ensure_ascii=False)


def squeue(*args: str) -> str:
    return subprocess.run(["squeue", "-h", *args], capture_output=True, text=True, timeout=20).stdout


def job_state(job_id: str) -> str:
    return squeue("-j", job_id, "-o", "%T").strip()


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def parent_of(pid: int) -> int:
    """The parent pid of ``pid`` (0 when it is gone): a forked rank's is its node's template."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def on_this_host(pid: int) -> bool:
    """Whether ``pid`` runs on this host's network, not on a host of a cluster in a box (tests/cluster: a network
    namespace each, whose Slurm runs templates and sallocs of its own that /proc shows here too)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net")
    except OSError:
        return False


def slurm_ranks() -> List[int]:
    """Every process on this host running a Slurm node template of ddp_magic's, or a rank forked from one."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and "ddp_magic.procs.slurm_template" in cmdline(int(p)) and on_this_host(int(p))]


def env_of(pid: int) -> Optional[dict]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)  # type: ignore[misc]
    except OSError:
        return None
