"""One rank: connect to the kernel, run cells, send back results and output.

Started either by the fork server (``ddp_magic.procs.forkserver``, the fast path),
as ``python -m ddp_magic.procs.worker`` with its config on stdin (the spawn path),
by torchrun as ``python -m ddp_magic.procs.worker --connect HOST:PORT`` (any node),
or by srun as ``python -m ddp_magic.procs.worker --slurm`` (config in the step's env, wire/slurm_env.py).
torch.distributed itself (devices, the process group, the gather) is rank_torch.py's.

Threads: the main thread runs cells; a reader thread takes the kernel's messages
(it queues cells and decisions, and answers interrupts, stack and env requests
at once, even while a cell runs: ``%ddp stacks`` is answered there, rank_stacks.py); a
peek thread, from the first ``%%ddp --peek`` on, runs peeks beside the cell (rank_peek.py); a
memory sampler sends the rank's memory when it moves (rank_memory.py).
"""
from __future__ import annotations

import faulthandler
import json
import os
import queue
import signal
import socket
import sys
import threading
import traceback
import types
from typing import Any, Optional, Tuple

from ..logs import log
from ..wire import protocol as P
from ..wire import liveness, shm, slurm_env, tls, transfer
from ..wire.capture import FdCapture
from ..wire.execution import error_data, format_user_traceback, run_source
from ..wire.namespace import adopt
from ..wire.protocol import CellStatus
from . import mesh, rank_keep, rank_argv, rank_collectives, rank_debug, rank_group, rank_memory, rank_metrics, rank_net, rank_peek
from . import rank_profile, rank_recover, rank_safepoint, rank_stacks, rank_torch
from . import rank_cli
from .parent import die_with_parent
from .rank_channel import Channel
from .rank_reload import RELOADER


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
        self.keeper = rank_keep.Keeper(self.rank, secret)
        self.keeper.on_dial = self._fence
        self.cell = 0  # the last cell sent to us (a new kernel resumes it)

    # ------------------------------------------------------------ start-up
    def _dial(self, control: bool = False) -> socket.socket:
        """An authenticated connection to the kernel's control port; one that cannot be made is reported (rank_net.report_unreachable)."""
        host, port = self.config["kernel_addr"], int(self.config["kernel_port"])
        timeout = float(self.config["env"].get(liveness.CONNECT_ENV) or 30)
        try:
            if self.config.get("tls"):  # ranks on other hosts: TLS, the kernel's certificate pinned (wire/tls.py)
                sock = tls.connect((host, port), self.config["tls"], timeout, control=control)
                sock.settimeout(30)
            else:
                sock = socket.create_connection((host, port), timeout=timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if control:  # the kernel's host gone silent: the rank goes within seconds (wire/liveness.py)
                    liveness.arm(sock, silence=liveness.RANK_SILENCE_S)
        except OSError as e:
            rank_net.report_unreachable(self.rank, host, port, e)
            raise
        P.client_handshake(sock, self.secret)
        sock.settimeout(None)
        return sock

    def _hello(self, **extra: Any) -> dict:
        return P.message(
            P.HELLO, rank=self.rank, pid=os.getpid(), host=socket.gethostname(), device=rank_torch.planned_device(self.local_rank),
            local_rank=self.local_rank, node=int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0"))),
            node_name=slurm_env.node_name(), **extra,
        )

    def _out_streams(self) -> dict:
        streams = {}
        for name in ("stdout", "stderr"):
            sock = self._dial()
            P.send(sock, P.message(P.HELLO_OUT, rank=self.rank, stream=name))
            streams[name] = sock
        return streams

    def connect(self) -> None:
        """The control channel, then one raw socket per output stream that becomes fd 1 or 2."""
        self.chan = Channel(self._dial(control=True))
        assert self.chan.sock is not None
        P.send(self.chan.sock, self._hello())
        self.capture = FdCapture(self._out_streams())

    def reattach(self) -> None:
        """A kept pool's rank, no kernel attached: wait for the next kernel's dial, join it, replay what it has not seen."""
        self.chan.detach()
        while True:
            dial = self.keeper.detached()
            self.config["kernel_addr"], self.config["kernel_port"] = dial["addr"], int(dial["port"])
            if dial.get("tls"):  # a TLS pool: the attaching kernel's certificate, told over the authenticated lease
                self.config["tls"] = dial["tls"]
            try:
                sock = self._dial(control=True)
                P.send(sock, self._hello(attach=True, cell=self.cell, busy=self.keeper.busy, undelivered=self.chan.undelivered,
                                         names=[n for n in self.user_ns if not n.startswith("_")], dropped=self.keeper.dropped(dial.get("offsets") or [0, 0]),
                                         reform_gen=rank_recover.group_gen(), clock=self.keeper.clock(),
                                         replay=self.keeper.replay_stamps(dial.get("offsets") or [0, 0])))
                self.keeper.attach_outputs(self._out_streams(), dial.get("offsets") or [0, 0])
                self.chan.attach(sock)
                return
            except (OSError, EOFError):  # that kernel went before we joined: wait for the next one
                log.debug("rank %d: could not join the attaching kernel", self.rank, exc_info=True)

    def _fence(self) -> None:
        """The lease says another kernel takes the pool (--force): stop hearing this one; the reader then re-dials."""
        sock = self.chan.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                log.debug("rank %d: the fenced kernel's socket was gone already", self.rank, exc_info=True)

    # ------------------------------------------------------------ control
    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.running_user_code:
            raise KeyboardInterrupt

    def reader(self) -> None:
        """Reads the kernel's messages; EOF means the kernel is gone, so we go too (a kept pool's rank waits for the next)."""
        while True:
            self._read_kernel()
            if not self.keeper.on:
                self.shutdown(1)
            self.reattach()

    def _read_kernel(self) -> None:
        """Until the kernel's socket closes."""
        source: Any = None
        try:
            while True:
                sock = self.chan.sock
                if sock is None:
                    return
                if source is None or getattr(source, "sock", source) is not sock:
                    source = tls.reading(sock)  # over TLS this thread decrypts what comes (no hand-off to the relay's)
                msg = P.recv(source)
                op = msg["op"]
                self.chan.heard(op, msg)  # a kept pool's DONE, once counted by the kernel (or a new cell came): not sent again
                if op == P.RUN:
                    self.cell = msg["cell"]
                    self.keeper.set_busy(True)
                    self.runs.put(msg)
                    rank_memory.cell_started()  # the cell's peak starts here; the sampler looks again (on its own thread)
                elif op == P.DECIDE:
                    self.decisions.put(msg)
                elif op == P.INTERRUPT:
                    if self.running_user_code:
                        signal.pthread_kill(self.main_ident, signal.SIGINT)
                elif op == P.STACK:  # the collective first: a rank seen in one that cannot complete is still in it when its stack is taken
                    collective = rank_collectives.describe()
                    if "id" in msg:  # %ddp stacks, job.stacks(), the panel's Stacks: every frame, as data
                        rank_stacks.answer(msg, self.chan.send, self.rank, self.main_ident, self.running_user_code, collective)
                    else:
                        self.chan.send(P.STACK, rank=self.rank, text=self.main_stack(), collective=collective)
                elif op == P.MEMORY:  # %ddp status between cells: memory now
                    rank_memory.answer(self.chan.send, self.rank)
                elif op == P.ABORT:  # release the main thread's collective wait (rank_recover.py)
                    rank_recover.on_abort(msg)
                elif op == P.REFORM:  # a new process group, formed by the main thread between cells
                    self.runs.put(msg)
                elif op == P.ENV:
                    self.chan.send(P.ENV, rank=self.rank, env=self.env_report())
                elif op == P.SHUTDOWN:
                    self.shutdown(0)
                elif op == P.KILL:
                    os._exit(137)
                elif op in rank_debug.OPS:  # input replies, the debugger's hold
                    rank_debug.on_message(msg)
                elif op == P.PEEK:  # a short read-only cell beside the running one, on the peek thread
                    rank_peek.submit(msg)
                elif op == P.SAFE_POINT:  # a save at the next safe point the ranks agree on (procs/rank_safepoint.py)
                    rank_safepoint.on_message(msg)
                elif op == P.VERSIONS:  # autoreload: this rank's versions of the modules named, read between cells
                    self.chan.send(P.VERSIONS, rank=self.rank, modules=RELOADER.versions(msg.get("names", ())))
                elif op == P.PROFILE:  # the next cell runs under torch.profiler (it comes before that cell's RUN)
                    rank_profile.arm(msg)
                elif op == P.KEEP:  # %ddp keep: outlive the kernel (procs/rank_keep.py)
                    self.chan.kept = bool(msg.get("on"))
                    self.chan.send(P.KEEP, **self.keeper.keep(msg))
        except (ConnectionError, OSError, EOFError):
            log.debug("rank %d: control channel closed", self.rank, exc_info=True)

    def shutdown(self, code: int) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # the kernel's end of the socket may be gone; we exit either way
                log.debug("rank %d: flush at exit failed", self.rank, exc_info=True)
        os._exit(code)

    def main_stack(self) -> str:
        frame = sys._current_frames().get(self.main_ident)
        if frame is None:
            return "(no main thread)"
        lines = [ln for ln in traceback.format_stack(frame) if "rank_collectives.py" not in ln]  # not our record's wrapper
        cell = [ln for ln in lines if "<ddp-cell" in ln]
        shown = lines[lines.index(cell[0]) :] if cell else lines[-6:]
        state = "running the cell" if self.running_user_code else "idle"
        return f"({state})\n" + "".join(shown)

    def env_report(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DDP_MAGIC_SECRET")}
        pg = rank_torch.process_group_report()
        return {"env": env, "process_group": pg, "pid": os.getpid(), "device": self.device, "argv": list(sys.argv),
                "net": rank_net.report(os.environ)}

    # ------------------------------------------------------------ cells
    def serve(self) -> int:
        self.connect()
        faulthandler.enable(file=2, all_threads=False)  # a segfault or abort: its stack to fd 2, the kernel's socket (kernel/failures/deaths.py)
        signal.signal(signal.SIGINT, self._on_sigint)
        threading.Thread(target=self.reader, name="ddp-reader", daemon=True).start()
        try:
            rank_net.choose(os.environ, str(self.config["kernel_addr"]))  # across hosts: the collectives' interface
            self.device = rank_torch.setup(self.local_rank)
            rank_recover.install()  # before the group forms: its sockets, the collectives' record
            rank_torch.init_process_group(self.rank, self.device)
            mesh.install(self.user_ns, self.device)  # --mesh: `mesh` before the first cell
        except BaseException as e:
            log.debug("rank %d: start-up failed (reported to the kernel)", self.rank, exc_info=True)
            self.capture.sync(0)
            self.chan.send(P.INIT_FAILED, rank=self.rank, error=error_data(e, traceback.format_exc()))
            return 1
        rank_argv.install()  # before any cell: argparse gets --local_rank only where a parser declares it
        rank_group.keep_groups()  # what the pool made before the first cell outlives a script's destroy
        rank_debug.install(self.chan.send, self.rank, self.main_ident)  # stdin, breakpoint(), post-mortem via the kernel
        rank_metrics.install(self.chan.send, self.rank)  # ddp_magic.log(...) rows to the kernel's chart
        rank_peek.install(self.chan.send, self.rank, self.user_ns)  # %%ddp --peek reads these globals
        rank_memory.install(self.chan.send, self.rank)  # memory sampled on its own thread, sent when it moves
        self.chan.send(P.READY, rank=self.rank, device=self.device)
        while True:
            msg = self.runs.get()
            if msg["op"] == P.REFORM:
                self.chan.send(P.REFORM, **rank_recover.reform(msg, self.rank, self.device, self.user_ns))
            else:
                self.run_cell(msg)

    def run_cell(self, msg: dict) -> None:
        self.shm_ok = bool(msg.get("shm", True))
        value = None
        rank_debug.begin_cell(msg["source"])  # the last failure's frames go (unless this is its post-mortem)
        rank_recover.begin_cell()
        rank_metrics.begin_cell(msg["cell"])
        error = self._reform_group() or RELOADER.begin_cell(msg.get("reload")) or self._load_names(msg)  # autoreload: agreed modules first
        status = CellStatus.OK if error is None else CellStatus.ERROR
        with rank_profile.profiled(self.rank, self.device, self.shm_ok):  # --profile armed it: torch.profiler around the cell
            if error is None:
                status, error, value = self._run_user_code(msg)
        rank_metrics.end_cell()  # every row logged before DONE
        status, error = rank_recover.cell_status(status, error)  # a wait released by ABORT ends as interrupted
        # the markers this DONE follows (a quiet stream's older one); a rank that was ever kept writes to whichever kernel is
        # attached (through its spool, or that kernel's socket after --off), which may not have read an older marker: new ones
        marks = self.capture.sync(msg["cell"], bool(msg.get("named_marks")) and not self.keeper.spooled)
        mem = rank_memory.at_done()  # RSS, the cell's peak, CUDA's figures: a few µs
        fields: dict = {"rank": self.rank, "cell": msg["cell"], "status": status.value, "error": error, "mem": mem,
                        "memory": (mem.get("cuda") or {}).get("allocated"), "seq": rank_collectives.default_seq(), "sync": marks}
        fields.update(rank_profile.take())
        fields.update(rank_recover.done_fields())
        fields.update(RELOADER.done_fields())
        self.keeper.set_busy(False)  # a kept pool's lease: the job ended (its DONE may wait for the next kernel)
        if status != CellStatus.OK or value is None:
            self.chan.send(P.DONE, result=None, **fields)
            return
        if rank_torch.collective_candidate(value, msg.get("gather", "auto")):
            self.chan.send(P.DONE, pending=rank_torch.tensor_meta(value), **fields)
            decision = self.decisions.get()
            self.send_decided(value, decision)
            return
        self.chan.send(P.DONE, **fields, **self._packed(value))

    def _reform_group(self) -> Optional[dict]:
        """A new cell: the pool's process group, re-formed if a cell destroyed it around the deferral (error data if that fails)."""
        rank_group.begin_cell()
        if not rank_group.gone():
            return None
        try:
            rank_group.STATE.reforms += 1
            rank_torch.init_process_group(self.rank, self.device, generation=rank_group.STATE.reforms)
        except BaseException as e:
            log.debug("rank %d: could not re-form the process group", self.rank, exc_info=True)
            return error_data(e, "the pool's process group was gone and could not be re-formed (%ddp restart gives a fresh pool):\n" + traceback.format_exc())
        rank_group.notice("the pool's process group had been destroyed (around ddp_magic's deferral); re-formed it for this cell")
        return None

    def _load_names(self, msg: dict) -> Optional[dict]:
        """Put the notebook values the cell needs into the rank's namespace; error data if one fails."""
        owned = set(msg.get("owned", ()))
        for name, blob in msg.get("names", {}).items():
            try:
                self.user_ns[name] = adopt(transfer.load_name(blob), self.user_ns, owned)
            except BaseException as e:
                log.debug("rank %d: could not load notebook variable %r", self.rank, name, exc_info=True)
                return error_data(e, f"could not load notebook variable {name!r} on the worker:\n" + traceback.format_exc())
        return None

    def _run_user_code(self, msg: dict) -> Tuple[CellStatus, Optional[dict], Any]:
        """The cell itself: (status, error data, the last expression's value)."""
        filename = msg["filename"]
        sys.argv = rank_argv.cell_argv(msg.get("argv"), self.local_rank)
        try:
            self.running_user_code = True
            try:
                return CellStatus.OK, None, run_source(msg["source"], filename, self.user_ns)
            finally:
                self.running_user_code = False  # from here on an interrupt cannot hit our own code
                rank_argv.end_cell()
        except KeyboardInterrupt as e:
            return CellStatus.INTERRUPTED, error_data(e, format_user_traceback(e, filename)), None
        except SystemExit as e:  # a script's sys.exit(): as under torchrun, 0/None is a normal end
            ended, why = rank_argv.exit_outcome(e)
            return (CellStatus.OK, None, None) if ended else (CellStatus.ERROR, {"type": "SystemExit", "message": why, "traceback": ""}, None)
        except BaseException as e:
            log.debug("rank %d: the cell raised (reported to the kernel)", self.rank, exc_info=True)
            rank_debug.keep(e, filename)  # for %ddp_debug
            return CellStatus.ERROR, dict(error_data(e, format_user_traceback(e, filename)), **rank_memory.on_error(e), **rank_collectives.on_error(e)), None

    def _packed(self, value: Any) -> dict:
        try:
            # /dev/shm is only a shortcut when the kernel runs on this same host.
            return {"result": transfer.pack(value, shm_dir=transfer.SHM_DIR if self.shm_ok else None, prefix=shm.result_prefix(self.rank))}
        except BaseException as e:
            log.debug("rank %d: the result could not be pickled (reported to the kernel)", self.rank, exc_info=True)
            return {"result": None, "result_error": {"type": type(value).__module__ + "." + type(value).__qualname__, "reason": f"{type(e).__name__}: {e}"}}

    def send_decided(self, value: Any, decision: dict) -> None:
        """A pending tensor result, the way the kernel decided: gathered to rank 0, or each rank's own."""
        if decision["mode"] != "gather":
            self.chan.send(P.RESULT, rank=self.rank, **self._packed(value))
            return
        try:
            parts = rank_torch.all_gather(value)
        except BaseException as e:
            log.debug("rank %d: all_gather of the result failed (sending it directly)", self.rank, exc_info=True)
            self.chan.send(P.RESULT, rank=self.rank, gather_failed=f"{type(e).__name__}: {e}", **self._packed(value))
            return
        if self.rank == 0:
            self.chan.send(P.RESULT, rank=self.rank, gathered=True, **self._packed([p.cpu() for p in parts]))
        else:
            self.chan.send(P.RESULT, rank=self.rank, gathered=True, result=None)


def serve(config: dict, secret: bytes) -> int:
    """Entry point shared by the fork server's children and the spawn path."""
    return Worker(config, secret).serve()


def main() -> None:
    """`python -m ddp_magic.procs.worker`: config (with the secret) as one JSON line on stdin, or --connect under torchrun."""
    if sys.argv[1:] == ["--slurm"]:  # a task of the pool's srun step: everything in its env
        config, secret = slurm_env.config(os.environ)
        die_with_parent(os.getppid())
    elif len(sys.argv) > 1:
        config, secret = rank_cli.torchrun_config(sys.argv[1:])
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
        log.debug("rank failed outside a cell", exc_info=True)
        traceback.print_exc()  # to the kernel's output socket, or the launcher's stderr before connect
    finally:
        os._exit(code)


if __name__ == "__main__":
    main()
