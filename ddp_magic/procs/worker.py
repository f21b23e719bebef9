"""One rank: connect to the kernel, initialise torch.distributed, run cells, send back results.

Started either by the fork server (``ddp_magic.procs.forkserver``, the fast path)
or as ``python -m ddp_magic.procs.worker`` with its config on stdin (the spawn path).
This is the only module that calls torch.distributed.
"""
from __future__ import annotations

import ctypes
import functools
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback
import types
from typing import Any, Optional

from ..wire import protocol as P
from ..wire import transfer
from ..wire.capture import FdCapture
from ..wire.execution import format_user_traceback, run_source
from ..wire.namespace import adopt

PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: Optional[int] = None, sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send us sig (SIGKILL) when our parent dies; exit now if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)


class Channel:
    """The authenticated socket to the kernel; sends from any thread, one frame at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._lock = threading.Lock()

    def send(self, op: str, **fields: Any) -> None:
        frame = P.encode(P.message(op, **fields))
        with self._lock:
            self.sock.sendall(frame)


class Worker:
    def __init__(self, config: dict, secret: bytes) -> None:
        self.config = config
        self.secret = secret
        self.rank = int(config["env"]["RANK"])
        self.local_rank = int(config["env"]["LOCAL_RANK"])
        self.runs: "queue.Queue[dict]" = queue.Queue()
        self.decisions: "queue.Queue[dict]" = queue.Queue()
        self.running_user_code = False
        self.main_ident = threading.get_ident()
        # The cells' global namespace is a real __main__ module, so classes defined in
        # a cell pickle by reference between ranks (DDP, all_gather_object) as in a script.
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = __builtins__
        sys.modules["__main__"] = main
        self.user_ns = main.__dict__
        self.device = "cpu"
        self.shm_ok = True

    # ------------------------------------------------------------ start-up
    def _dial(self) -> socket.socket:
        """An authenticated connection to the kernel's control port."""
        host, port = self.config["kernel_addr"], int(self.config["kernel_port"])
        sock = socket.create_connection((host, port), timeout=30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        P.client_handshake(sock, self.secret)
        sock.settimeout(None)
        return sock

    def connect(self) -> None:
        """The control channel, then one raw socket per output stream that becomes fd 1 or 2."""
        self.chan = Channel(self._dial())
        self.chan.send(
            P.HELLO, rank=self.rank, pid=os.getpid(), host=socket.gethostname(), device=self._planned_device(),
            local_rank=self.local_rank, node=int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0"))),
        )
        streams = {}
        for name in ("stdout", "stderr"):
            sock = self._dial()
            P.send(sock, P.message(P.HELLO_OUT, rank=self.rank, stream=name))
            streams[name] = sock
        self.capture = FdCapture(streams)

    def setup_torch(self) -> None:
        import torch
        import torch.distributed as dist

        threads = os.environ.get("OMP_NUM_THREADS")
        if threads and threads.isdigit():
            torch.set_num_threads(int(threads))
        backend = os.environ.get("DDP_MAGIC_BACKEND", "gloo")
        if backend == "nccl":
            torch.cuda.set_device(self.local_rank)
            self.device = f"cuda:{self.local_rank}"
        self._patch_init_process_group(dist)

    def _patch_init_process_group(self, dist: Any) -> None:
        """Tutorial code calls init_process_group itself: keep ours instead of failing twice-init."""
        import torch.distributed.distributed_c10d as c10d

        real = c10d.init_process_group
        if getattr(real, "_ddp_magic", False):
            return
        noticed = []

        @functools.wraps(real)
        def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> None:
            if dist.is_initialized():
                current = str(dist.get_backend())
                asked = kwargs.get("backend", backend)
                if asked is not None and str(asked).lower() != current and not noticed:
                    noticed.append(True)
                    print(
                        f"[ddp_magic] the process group is already initialised with {current}; "
                        f"keeping it (the cell asked for {asked})",
                        file=sys.stderr,
                    )
                return None
            return real(backend, *args, **kwargs)

        init_process_group._ddp_magic = True  # type: ignore[attr-defined]
        c10d.init_process_group = init_process_group
        dist.init_process_group = init_process_group

    def init_process_group(self) -> None:
        import torch.distributed as dist

        if os.environ.get("DDP_MAGIC_INIT", "1") != "1":
            return
        backend = os.environ.get("DDP_MAGIC_BACKEND", "gloo")
        kwargs: dict = {}
        timeout = os.environ.get("DDP_MAGIC_PG_TIMEOUT")
        if timeout:
            from datetime import timedelta

            # Short by default in a notebook: a collective whose peer is gone fails in
            # minutes, not torch's 10 (nccl) or 30 (gloo) minutes.
            kwargs["timeout"] = timedelta(seconds=float(timeout))
        if backend == "nccl":
            import torch

            kwargs["device_id"] = torch.device(self.device)
        store_path = os.environ.get("DDP_MAGIC_STORE")
        if store_path:
            # One host: a file store in /dev/shm. No port to race for and no TCPStore, whose
            # reverse DNS lookup of its peers stalled 1 start in 10 by 5 s on some hosts.
            world = int(os.environ["WORLD_SIZE"])
            kwargs.update(store=dist.FileStore(store_path, world), rank=self.rank, world_size=world)
        elif self.rank != 0:
            _wait_for_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), float(timeout or 300))
        try:
            dist.init_process_group(backend=backend, **kwargs)
        except TypeError:  # torch without device_id
            kwargs.pop("device_id", None)
            dist.init_process_group(backend=backend, **kwargs)

    # ------------------------------------------------------------ control
    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.running_user_code:
            raise KeyboardInterrupt

    def reader(self) -> None:
        """Reads the kernel's messages; EOF means the kernel is gone, so we go too."""
        try:
            while True:
                msg = P.recv(self.chan.sock)
                op = msg["op"]
                if op == P.RUN:
                    self.runs.put(msg)
                elif op == P.DECIDE:
                    self.decisions.put(msg)
                elif op == P.INTERRUPT:
                    if self.running_user_code:
                        signal.pthread_kill(self.main_ident, signal.SIGINT)
                elif op == P.STACK:
                    self.chan.send(P.STACK, rank=self.rank, text=self.main_stack())
                elif op == P.ENV:
                    self.chan.send(P.ENV, rank=self.rank, env=self.env_report())
                elif op == P.SHUTDOWN:
                    self.shutdown(0)
                elif op == P.KILL:
                    os._exit(137)
        except (ConnectionError, OSError, EOFError):
            pass
        self.shutdown(1)

    def shutdown(self, code: int) -> None:
        store = os.environ.get("DDP_MAGIC_STORE")
        if store and self.rank == 0:  # the kernel may be gone (even SIGKILLed): leave nothing in /dev/shm
            try:
                os.unlink(store)
            except OSError:
                pass
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)

    def main_stack(self) -> str:
        frame = sys._current_frames().get(self.main_ident)
        if frame is None:
            return "(no main thread)"
        lines = traceback.format_stack(frame)
        cell = [ln for ln in lines if "<ddp-cell" in ln]
        shown = lines[lines.index(cell[0]) :] if cell else lines[-6:]
        state = "running the cell" if self.running_user_code else "idle"
        return f"({state})\n" + "".join(shown)

    def env_report(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DDP_MAGIC_SECRET")}
        pg: dict = {"initialised": False}
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                pg = {"initialised": True, "backend": str(dist.get_backend()), "world_size": dist.get_world_size(), "rank": dist.get_rank()}
        except Exception as e:
            pg = {"initialised": False, "error": str(e)}
        return {"env": env, "process_group": pg, "pid": os.getpid(), "device": self.device, "argv": list(sys.argv)}

    # ------------------------------------------------------------ cells
    def serve(self) -> int:
        self.connect()
        signal.signal(signal.SIGINT, self._on_sigint)
        threading.Thread(target=self.reader, name="ddp-reader", daemon=True).start()
        try:
            self.setup_torch()
            self.init_process_group()
        except BaseException as e:
            self.capture.sync(0)
            self.chan.send(P.INIT_FAILED, rank=self.rank, error=_error_data(e, traceback.format_exc()))
            return 1
        self.chan.send(P.READY, rank=self.rank, device=self.device)
        while True:
            self.run_cell(self.runs.get())

    def _planned_device(self) -> str:
        if os.environ.get("DDP_MAGIC_BACKEND") == "nccl":
            return f"cuda:{self.local_rank}"
        return "cpu"

    def run_cell(self, msg: dict) -> None:
        filename = msg["filename"]
        self.shm_ok = bool(msg.get("shm", True))
        status, error, value = "ok", None, None
        try:
            import cloudpickle

            owned = set(msg.get("owned", ()))
            for name, blob in msg.get("names", {}).items():
                self.user_ns[name] = adopt(cloudpickle.loads(blob), self.user_ns, owned)
        except BaseException as e:
            status, error = "error", _error_data(e, f"could not load notebook variable {name!r} on the worker:\n" + traceback.format_exc())
        if status == "ok":
            sys.argv = list(msg.get("argv") or ["ddp_cell"])
            self.running_user_code = True
            try:
                value = run_source(msg["source"], filename, self.user_ns)
            except KeyboardInterrupt as e:
                status, error = "interrupted", _error_data(e, format_user_traceback(e, filename))
            except BaseException as e:
                status, error = "error", _error_data(e, format_user_traceback(e, filename))
            finally:
                self.running_user_code = False
        self.capture.sync(msg["cell"])
        fields: dict = {"rank": self.rank, "cell": msg["cell"], "status": status, "error": error, "memory": _gpu_memory()}
        if status != "ok" or value is None:
            self.chan.send(P.DONE, result=None, **fields)
            return
        if self._collective_candidate(value, msg.get("gather", "auto")):
            self.chan.send(P.DONE, pending=_tensor_meta(value), **fields)
            decision = self.decisions.get()
            self.send_decided(value, decision)
            return
        self.chan.send(P.DONE, **fields, **self._packed(value))

    def _packed(self, value: Any) -> dict:
        try:
            # /dev/shm is only a shortcut when the kernel runs on this same host.
            return {"result": transfer.pack(value, shm_dir=transfer.SHM_DIR if self.shm_ok else None)}
        except BaseException as e:
            return {"result": None, "result_error": {"type": type(value).__module__ + "." + type(value).__qualname__, "reason": f"{type(e).__name__}: {e}"}}

    @staticmethod
    def _collective_candidate(value: Any, gather: str) -> bool:
        if gather == "direct" or "torch" not in sys.modules:
            return False
        import torch
        import torch.distributed as dist

        if not isinstance(value, torch.Tensor) or not (dist.is_available() and dist.is_initialized()):
            return False
        return gather == "collective" or value.is_cuda

    def send_decided(self, value: Any, decision: dict) -> None:
        if decision["mode"] != "gather":
            self.chan.send(P.RESULT, rank=self.rank, **self._packed(value))
            return
        import torch.distributed as dist

        t = value.detach().contiguous()
        try:
            parts = [t.new_empty(t.shape) for _ in range(dist.get_world_size())]
            dist.all_gather(parts, t)
        except BaseException as e:
            self.chan.send(P.RESULT, rank=self.rank, gather_failed=f"{type(e).__name__}: {e}", **self._packed(value))
            return
        if self.rank == 0:
            self.chan.send(P.RESULT, rank=self.rank, gathered=True, **self._packed([p.cpu() for p in parts]))
        else:
            self.chan.send(P.RESULT, rank=self.rank, gathered=True, result=None)


def _wait_for_store(host: str, port: int, timeout: float) -> None:
    """Wait (5 ms steps) until rank 0's store listens: torch's own retry after a refused
    connection sleeps 0.25 s and more, which made a pool start or restart stall for nothing."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.005)


def _tensor_meta(t: Any) -> dict:
    return {"shape": tuple(t.shape), "dtype": str(t.dtype), "device": str(t.device)}


def _gpu_memory() -> Optional[int]:
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.memory_allocated())
    except Exception:
        pass
    return None


def _error_data(exc: BaseException, text: str) -> dict:
    """Errors cross processes as data, never as pickled exception objects."""
    return {"type": type(exc).__name__, "message": str(exc), "traceback": text}


def serve(config: dict, secret: bytes) -> int:
    """Entry point shared by the fork server's children and the spawn path."""
    return Worker(config, secret).serve()


def _connect_config(argv: list) -> "tuple[dict, bytes]":
    """A rank started by torchrun on any node: env from torchrun, the kernel's address from argv."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m ddp_magic.procs.worker", description="a ddp_magic rank started by torchrun")
    ap.add_argument("--connect", required=True, metavar="HOST:PORT", help="the kernel's control channel")
    ap.add_argument("--secret-file", default=os.environ.get("DDP_MAGIC_SECRET_FILE"), help="file holding the pool's secret (hex)")
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--no-init", action="store_true")
    args = ap.parse_args(argv)
    if not args.secret_file:
        ap.error("--secret-file (or DDP_MAGIC_SECRET_FILE) is required: the kernel printed its path")
    with open(os.path.expanduser(args.secret_file)) as f:
        secret = bytes.fromhex(f.read().strip())
    host, _, port = args.connect.rpartition(":")
    os.environ["DDP_MAGIC_BACKEND"] = args.backend
    os.environ["DDP_MAGIC_INIT"] = "0" if args.no_init else "1"
    os.environ.setdefault("NODE_RANK", os.environ.get("GROUP_RANK", "0"))
    return {"env": dict(os.environ), "kernel_addr": host.strip("[]"), "kernel_port": int(port)}, secret


def main() -> None:
    """`python -m ddp_magic.procs.worker`: config (with the secret) as one JSON line on stdin, or --connect under torchrun."""
    if len(sys.argv) > 1:
        config, secret = _connect_config(sys.argv[1:])
        die_with_parent(os.getppid())
    else:
        config = json.loads(sys.stdin.readline())
        secret = bytes.fromhex(config.pop("secret"))
        if config.get("parent_pid"):
            die_with_parent(int(config["parent_pid"]))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.environ.update(config["env"])
    code = 1
    try:
        code = serve(config, secret)
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


if __name__ == "__main__":
    main()
