"""Drive a real Jupyter kernel (jupyter_client) and collect what a notebook would show."""
from __future__ import annotations

import atexit
import os
import queue
import shutil
import sys
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Tuple

from jupyter_client.manager import KernelManager, start_new_kernel

ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colour codes: assertions read the text a person reads


@dataclass
class Execution:
    code: str
    stdout: str = ""
    stderr: str = ""
    results: List[str] = field(default_factory=list)  # text/plain of execute_result / display_data
    displays: List[dict] = field(default_factory=list)  # full data bundles
    error: Optional[Tuple[str, str, List[str]]] = None  # (ename, evalue, traceback)
    messages: List[dict] = field(default_factory=list)  # every iopub message of this cell
    stream_times: List[Tuple[float, str, str]] = field(default_factory=list)  # (seconds since execute, name, text)
    elapsed: float = 0.0
    prompts: List[Tuple[str, bool]] = field(default_factory=list)  # the input_request messages (prompt, password) answered
    msg_id: str = ""  # the execute_request's: the parent of every message of this cell

    @property
    def result(self) -> Optional[str]:
        return self.results[-1] if self.results else None

    def ok(self) -> "Execution":
        assert self.error is None, f"cell failed: {self.error[0]}: {self.error[1]}\nstderr: {self.stderr}"
        return self


class _PrefixedKernelManager(KernelManager):
    """A kernel started under a command prefix (another host of a cluster in a box: ``nsenter -t ANCHOR ...``). Its
    ZMQ channels are unix sockets (``transport='ipc'``): a file path reaches a kernel in another network namespace,
    where 127.0.0.1 would not. The prefix execs the kernel, so its pid (interrupts, shutdown) is the kernel's."""

    prefix: List[str] = []

    def format_kernel_cmd(self, extra_arguments: Optional[List[str]] = None) -> List[str]:
        return [*self.prefix, *super().format_kernel_cmd(extra_arguments)]


IPC_FOLDERS: List[str] = []  # the ipc sockets' folders of this process's prefixed kernels: gone at its exit, a killed kernel's too


@atexit.register
def _remove_ipc_folders() -> None:
    for folder in IPC_FOLDERS:
        shutil.rmtree(folder, ignore_errors=True)


def _start_prefixed(prefix: List[str], env: dict) -> Tuple[KernelManager, Any]:
    import tempfile

    folder = tempfile.mkdtemp(prefix="ddp-kernel-ipc-")
    IPC_FOLDERS.append(folder)
    km = _PrefixedKernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(folder, "k"))
    km.prefix = list(prefix)
    km.start_kernel(env=env)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
    except RuntimeError:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        raise
    return km, kc


STARTED: List[int] = []  # the pid of every kernel this test process started (their /dev/shm files name it)


def _start_local(env: dict, tries: int = 3) -> Any:
    """``start_new_kernel``, again where the kernel died before its first reply: jupyter_client picks five free TCP
    ports, then the kernel binds them, and another process can take one in between (seen once in a full run: "ZMQError:
    Address already in use" as a second kernel started). Nothing of ddp_magic runs before that reply."""
    for attempt in range(tries):
        try:
            return start_new_kernel(kernel_name="python3", env=env)
        except RuntimeError as e:
            if "Kernel died before replying to kernel_info" not in str(e) or attempt == tries - 1:
                raise
            print(f"kernel_helper: a kernel died before its first reply ({e}); starting another", file=sys.stderr)
    raise AssertionError("unreachable")


class Kernel:
    """One real IPython kernel; ``run`` executes a cell and waits for it to go idle. ``prefix``: the command the kernel
    runs under (``cluster_box.Box.enter("login")``: the kernel is on the box's login host)."""

    def __init__(self, extra_env: Optional[dict] = None, prefix: Optional[List[str]] = None) -> None:
        env = dict(os.environ)
        env.update(extra_env or {})
        self.runtime: Optional[str] = None  # the runtime directory made for this kernel (None: the test gave one)
        if not (extra_env or {}).get("JUPYTER_RUNTIME_DIR"):  # never the user's own: a kept pool's files would land there
            self.runtime = env["JUPYTER_RUNTIME_DIR"] = own_runtime_dir()
        if prefix:
            self.km, self.kc = _start_prefixed(prefix, env)
        else:
            self.km, self.kc = _start_local(env)
        STARTED.append(self.pid)
        self.elsewhere: List[dict] = []  # iopub messages of another cell than the one running (a background cell's, late ones)

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid  # type: ignore[union-attr]

    def run(
        self, code: str, timeout: float = 120.0, interrupt_after: Optional[float] = None, on_stream: Any = None,
        answer: Optional[Callable[[str, bool], str]] = None, allow_stdin: Optional[bool] = None,
    ) -> Execution:
        """Execute code; on_stream(name, text) is called as each stream message arrives; answer(prompt, password)
        replies to each input_request (as a notebook's input box would); allow_stdin=False: a front end without stdin."""
        ex = Execution(code)
        t0 = time.monotonic()
        msg_id = ex.msg_id = self.kc.execute(code, allow_stdin=True if answer is not None else allow_stdin)
        interrupted = False
        while True:
            if interrupt_after is not None and not interrupted and time.monotonic() - t0 >= interrupt_after:
                self.km.interrupt_kernel()
                interrupted = True
            left = timeout - (time.monotonic() - t0)
            if left <= 0:
                raise TimeoutError(f"cell did not finish in {timeout}s: {code[:80]!r}\nstdout so far: {ex.stdout[-2000:]}\nstderr: {ex.stderr[-2000:]}")
            if answer is not None:
                self._answer_stdin(ex, answer)
            try:
                msg = self.kc.get_iopub_msg(timeout=min(left, 0.1 if interrupt_after is not None or answer is not None else left))
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                self.elsewhere.append(msg)
                continue
            ex.messages.append(msg)
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                ex.stream_times.append((time.monotonic() - t0, content["name"], content["text"]))
                if on_stream is not None:
                    on_stream(content["name"], content["text"])
                text = ANSI.sub("", content["text"])  # rank prefixes are coloured; the raw text stays in messages
                if content["name"] == "stdout":
                    ex.stdout += text
                else:
                    ex.stderr += text
            elif kind in ("execute_result", "display_data"):
                ex.displays.append(content["data"])
                if "text/plain" in content["data"]:
                    ex.results.append(content["data"]["text/plain"])
            elif kind == "error":
                ex.error = (content["ename"], content["evalue"], [ANSI.sub("", line) for line in content["traceback"]])
            elif kind == "status" and content["execution_state"] == "idle":
                break
        ex.elapsed = time.monotonic() - t0
        return ex

    def collect(self, seconds: float = 0.3) -> List[dict]:
        """Read the iopub messages that came while no cell was being read (a background cell's) into ``elsewhere``."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                self.elsewhere.append(self.kc.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                break
        return self.elsewhere

    def _answer_stdin(self, ex: Execution, answer: Callable[[str, bool], str]) -> None:
        try:
            req = self.kc.get_stdin_msg(timeout=0.01)
        except queue.Empty:
            return
        if req["msg_type"] == "input_request":
            prompt, password = req["content"]["prompt"], bool(req["content"].get("password"))
            ex.prompts.append((prompt, password))
            self.kc.input(answer(prompt, password))

    def value(self, expr: str) -> Any:
        """Evaluate an expression in the kernel and return its repr's literal value."""
        import ast

        ex = self.run(expr).ok()
        assert ex.result is not None, f"no value for {expr!r}"
        return ast.literal_eval(ex.result)

    def armed(self, timeout: float = 30.0, exists: Callable[[str], bool] = os.path.exists) -> bool:
        """Wait until the ranks of the session's pool are armed by ``--save-on-preempt`` (their marker in /dev/shm: what
        their template looks for on SIGTERM, wire/shm.py ``armed_file``; ``exists``: looked for on another host). A signal
        before that ends the pool unsaved, so a test that signals once some steps were logged only may signal in that moment."""
        from ddp_magic.wire import shm

        marker = shm.armed_file(self.value("get_ipython().magics_manager.registry['DDPMagics'].pool.shm_prefix"))
        deadline = time.monotonic() + timeout
        while not exists(marker):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def shutdown(self) -> None:
        try:
            self.kc.stop_channels()
        finally:
            self.km.shutdown_kernel(now=True)
            if isinstance(self.km, _PrefixedKernelManager):  # its unix sockets' folder
                shutil.rmtree(os.path.dirname(self.km.ip), ignore_errors=True)
            if getattr(self, "runtime", None) is not None:  # a Kernel made without __init__ (slurm_helpers) has none
                drop_runtime_dir(str(self.runtime))


def own_runtime_dir() -> str:
    """A Jupyter runtime directory of a test's own (short: a kept pool's lease socket path must fit AF_UNIX). One whose
    kernel was ended another way than ``Kernel.shutdown`` goes at this process's exit, if nothing is left in it."""
    import atexit
    import tempfile

    path = tempfile.mkdtemp(prefix="ddp-rt-", dir="/tmp")
    atexit.register(_remove_if_empty, path)
    return path


def _remove_if_empty(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:  # gone already, or something is left in it (a kept pool's files: look, then `python -m ddp_magic stop`)
        pass


def drop_runtime_dir(path: str) -> None:
    """Stop every kept pool left in ``path`` (``python -m ddp_magic stop``: no orphan rank), then remove it."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=path, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
    try:
        names = os.listdir(path)
    except OSError:
        names = []
    for name in names:
        if name.startswith("ddp-kept-") and name.endswith(".json"):
            subprocess.run([sys.executable, "-m", "ddp_magic", "stop", name[len("ddp-kept-"):-len(".json")]], env=env,
                           capture_output=True, timeout=60, check=False)
    shutil.rmtree(path, ignore_errors=True)


def simulated_kernel(per_host: int, extra_env: Optional[dict] = None) -> Kernel:
    """A real kernel whose ``%%ddp`` pools are bench/simranks' simulated ranks, ``per_host`` to a host process
    (no template: nothing imports torch for them). The caller shuts it down."""
    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
    k = Kernel(extra_env={"DDP_MAGIC_WARM_TEMPLATE": "0", **(extra_env or {})})
    try:
        k.run(f"import sys; sys.path.insert(0, {bench!r}); import simranks; simranks.install(per_host={per_host})").ok()
        k.run("%load_ext ddp_magic").ok()
    except BaseException:
        k.shutdown()
        raise
    return k


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited and not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
