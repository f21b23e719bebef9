"""One simulated rank: the real wire protocol (procs/worker.py's handshake, messages and sockets) on an asyncio loop.

Like a worker, a rank dials the kernel's control port three times (control,
then its stdout and stderr streams), proves the pool's secret on each
(wire/protocol.py's handshake), sends HELLO, HELLO_OUT twice and READY, then
serves the kernel's messages: RUN (a cell, read as a script.py script), STACK,
ENV, INTERRUPT, ABORT, REFORM, SHUTDOWN, KILL. Output goes to its raw stream
sockets with the same sync markers as wire/capture.py (a marker only on a stream written
since its last one; DONE's "sync" names the markers it follows); a value goes back in
DONE packed by wire/transfer.py (large buffers through /dev/shm). Many ranks
share one process and one loop (host.py); nothing here imports torch.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import os
import pickle
import socket
import time
from typing import Any, Callable, Dict, Optional, Tuple

from ddp_magic.logs import log
from ddp_magic.wire import protocol as P
from ddp_magic.wire import shm, transfer
from ddp_magic.wire.capture import SYNC_END, SYNC_PREFIX

from . import script as S

Streams = Tuple[asyncio.StreamReader, asyncio.StreamWriter]
SIM_RSS = 64 << 20  # what a simulated rank says it holds (MEMORY): no real rank of its own to measure
_BUFFERS: Dict[int, Any] = {}  # nbytes -> one filled array per process (each DONE still writes its own shm file)


def _answer_challenge(secret: bytes, hello: bytes) -> Tuple[bytes, bytes]:
    """wire/protocol.py's step; a ddp_magic from before it had one (bench_scale.py --git-rev) gets the same bytes from its _digest."""
    if hasattr(P, "answer_challenge"):
        return P.answer_challenge(secret, hello)
    nonce = os.urandom(P.NONCE_SIZE)
    return P._digest(secret, b"worker", hello[len(P.MAGIC):]) + nonce, nonce


def _check_proof(secret: bytes, nonce: bytes, proof: bytes) -> None:
    if hasattr(P, "check_proof"):
        return P.check_proof(secret, nonce, proof)
    if not hmac.compare_digest(proof, P._digest(secret, b"kernel", nonce)):
        raise P.AuthenticationError("kernel failed the challenge")


class Interrupted(Exception):
    """The kernel's INTERRUPT reached a step that can be interrupted (a sleep): KeyboardInterrupt on a real rank."""


class Released(Exception):
    """The kernel's ABORT released a collective wait."""


class Died(Exception):
    """The rank's process "exits" (sim.die): its sockets close at once, no DONE."""


def _buffer(nbytes: int) -> Any:
    """A filled ``nbytes`` array: pickled with its bytes out of band, as a tensor is (numpy, imported only here)."""
    if nbytes not in _BUFFERS:
        import numpy

        _BUFFERS[nbytes] = numpy.ones(nbytes, dtype=numpy.uint8)
    return _BUFFERS[nbytes]


class SimRank:
    """A rank that speaks the control protocol; ``on_exit(rank, code)`` is told when it is gone."""

    def __init__(self, rank: int, world: int, config: dict, on_exit: Callable[[int, int], None]) -> None:
        self.rank, self.world, self.config, self.on_exit = rank, world, config, on_exit
        self.secret = bytes.fromhex(config["secret"])
        self.runs: "asyncio.Queue[Optional[dict]]" = asyncio.Queue()  # RUN and REFORM; None: the control channel ended
        self.outs: Dict[str, asyncio.StreamWriter] = {}
        self.marked: Dict[str, int] = {}  # stream -> its last marker's cell (wire/capture.py's FdCapture.sync)
        self.written: set = set()  # streams written since their last marker
        self.script: Optional[S.Script] = None  # the cell running now
        self.filename = ""
        self.line = 0  # the cell line the rank is at
        self.collective: Optional[Dict[str, Any]] = None  # the one it waits in
        self.seq = 0  # the default group's sequence number: the last collective it entered (its DONE says it, as a worker's)
        self.broken = False  # the group was aborted: DONE says so until a REFORM
        self._wake: Optional[asyncio.Future] = None  # a sleep or a collective's wait, ended early by INTERRUPT or ABORT
        self._closed = False
        self.dials: Optional["asyncio.Queue[dict]"] = None  # a kept pool (KEEP): the lease's dials to the next kernel
        self.cell = 0

    # ------------------------------------------------------------ start-up
    async def _dial(self) -> Streams:
        reader, writer = await asyncio.open_connection(self.config["addr"], int(self.config["port"]))  # (the dial's, once kept)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        answer, nonce = _answer_challenge(self.secret, await reader.readexactly(len(P.MAGIC) + P.NONCE_SIZE))
        writer.write(answer)
        _check_proof(self.secret, nonce, await reader.readexactly(P.DIGEST_SIZE))
        return reader, writer

    async def serve(self) -> None:
        """Join the pool, then serve until SHUTDOWN, KILL, sim.die or the kernel's EOF."""
        code = 1
        try:
            self.ctrl, self.ctrl_w = await self._dial()
            self.send(P.HELLO, pid=os.getpid(), host=socket.gethostname(), device="cpu", local_rank=self.rank, node=0)
            for stream in ("stdout", "stderr"):
                _, writer = await self._dial()
                writer.write(P.encode(P.message(P.HELLO_OUT, rank=self.rank, stream=stream)))
                self.outs[stream] = writer
            self.send(P.READY, device="cpu")
            code = await self._serve_loop()
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            log.debug("simulated rank %d: control channel closed", self.rank, exc_info=True)
        except Died as e:
            code = int(str(e) or 1)
        self.close(code)

    async def _serve_loop(self) -> int:
        reader = asyncio.ensure_future(self._read_loop())
        reader.add_done_callback(lambda _: self.runs.put_nowait(None))  # the channel ended: wake the loop (no task per message)
        try:
            while True:
                msg = await self.runs.get()
                if msg is None:
                    return reader.result()
                if msg["op"] == P.REFORM:
                    self.broken = False
                    self.send(P.REFORM, ok=True, seconds=0.0, swapped=[], stale=[])
                else:
                    await self.run_cell(msg)
        finally:
            reader.cancel()

    def close(self, code: int) -> None:
        """Close every socket (a dead process's are closed by the OS) and report the exit once."""
        if self._closed:
            return
        self._closed = True
        for writer in [getattr(self, "ctrl_w", None), *self.outs.values()]:
            if writer is not None:
                writer.close()
        self.on_exit(self.rank, code)

    # ------------------------------------------------------------ the kernel's messages
    def send(self, op: str, **fields: Any) -> None:
        self.ctrl_w.write(P.encode(P.message(op, rank=self.rank, **fields)))

    async def _read_loop(self) -> int:
        """The reader thread of a worker: answers at once, queues cells; returns the exit code. Kept (KEEP), the kernel's
        EOF is a wait for the next kernel's dial (procs/rank_keep.py's part, without the spool)."""
        while True:
            try:
                (size,) = P.HEADER.unpack(await self.ctrl.readexactly(P.HEADER.size))
                msg = pickle.loads(await self.ctrl.readexactly(size))
            except (ConnectionError, OSError, asyncio.IncompleteReadError):
                if self.dials is None:
                    raise
                await self._reattach()
                continue
            code = self.on_message(msg)
            if code is not None:
                return code

    async def _keep(self, msg: dict) -> None:
        """KEEP: join the lease socket (the pool's secret proved), then hear its dials."""
        self.dials = asyncio.Queue()
        for _ in range(3000):  # a full backlog (EAGAIN), a handshake the lease gave up on: again, as procs/rank_keep.py does
            try:
                reader, writer = await asyncio.open_unix_connection(msg["lease"]["path"])
                hello = await asyncio.wait_for(reader.readexactly(len(P.MAGIC) + P.NONCE_SIZE), 5.0)  # asyncio takes a unix EAGAIN for connected
                answer, nonce = _answer_challenge(self.secret, hello)
                writer.write(answer)
                _check_proof(self.secret, nonce, await reader.readexactly(P.DIGEST_SIZE))
                break
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
                await asyncio.sleep(0.02)
        writer.write((json.dumps({"op": "rank", "rank": self.rank, "busy": self.script is not None}) + "\n").encode())
        self.send(P.KEEP, on=True, written={"stdout": 0, "stderr": 0})
        self._lease = writer
        while True:
            line = await reader.readline()
            if not line:
                return
            dial = json.loads(line)
            if dial.get("op") == "dial":
                self.dials.put_nowait(dial)

    async def _reattach(self) -> None:
        assert self.dials is not None
        dial = await self.dials.get()
        self.config["addr"], self.config["port"] = dial["addr"], dial["port"]
        self.ctrl, self.ctrl_w = await self._dial()
        self.send(P.HELLO, pid=os.getpid(), host=socket.gethostname(), device="cpu", local_rank=self.rank, node=0, attach=True,
                  cell=self.cell, busy=self.script is not None, names=[])
        for stream in ("stdout", "stderr"):
            _, writer = await self._dial()
            writer.write(P.encode(P.message(P.HELLO_OUT, rank=self.rank, stream=stream)))
            self.outs[stream] = writer

    def on_message(self, msg: dict) -> Optional[int]:
        op = msg["op"]
        if op in (P.RUN, P.REFORM):
            self.runs.put_nowait(msg)
        elif op == P.STACK and "id" in msg:  # %ddp stacks: frames as data, as procs/rank_stacks.py sends them
            frames = S.stack_frames(self.script, self.filename, self.line, self.collective) if self.script else []
            self.send(P.STACK, id=msg["id"], in_cell=bool(self.script), collective=self._described(),
                      threads=[{"name": "main", "main": True, "frames": frames}])
        elif op == P.STACK:
            text = S.stack_text(self.script, self.filename, self.line, True) if self.script else "(idle)\n"
            self.send(P.STACK, text=text, collective=self._described())
        elif op == P.MEMORY:  # %ddp status between cells: one process's RSS, said by each of its ranks
            self.send(P.MEMORY, asked=True, rss=SIM_RSS, peak=SIM_RSS, cgroup=None)
        elif op == P.ENV:
            self.send(P.ENV, env=self.env_report())
        elif op == P.INTERRUPT and self.collective is None:  # a gloo wait does not see a signal either
            self._end_wait(Interrupted())
        elif op == P.ABORT:
            self.broken = True
            if self.collective is not None:
                self._end_wait(Released(f"released: {msg.get('why') or 'the kernel aborted the process group'} (this rank was in {self.collective['op']})"))
        elif op == P.KEEP and msg.get("on"):
            asyncio.ensure_future(self._keep(msg))
        elif op == P.SHUTDOWN:
            return 0
        elif op == P.KILL:
            return 137
        else:
            log.debug("simulated rank %d: %s is not simulated", self.rank, op)
        return None

    def _described(self) -> Optional[Dict[str, Any]]:
        if self.collective is None:
            return None
        return dict(self.collective, waited=time.monotonic() - self.collective["since"])

    def _end_wait(self, why: Exception) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_exception(why)

    def env_report(self) -> dict:
        env = {k: v for k, v in self.config.get("env", {}).items() if not k.startswith("DDP_MAGIC_SECRET")}
        env.update(RANK=str(self.rank), LOCAL_RANK=str(self.rank), WORLD_SIZE=str(self.world))
        pg = {"initialised": True, "backend": "gloo", "world_size": self.world, "rank": self.rank}
        return {"env": env, "process_group": pg, "pid": os.getpid(), "device": "cpu", "argv": ["simranks"]}

    # ------------------------------------------------------------ a cell
    async def run_cell(self, msg: dict) -> None:
        self.filename, cell = msg["filename"], msg["cell"]
        self.cell = cell
        status, error, value = "ok", None, None
        try:
            self.script = S.parse(msg["source"])
            value = await self._steps(self.script)
        except S.ScriptError as e:
            status, error = "error", {"type": "ScriptError", "message": str(e), "traceback": f"ScriptError: {e}\n"}
        except _CellError as e:
            status, error = "error", e.data
        except Interrupted:
            status, error = "interrupted", self._error("KeyboardInterrupt", "")
        except Released as e:
            status, error = "interrupted", self._error("RuntimeError", str(e))
        finally:
            self.script, self.collective, self.line = None, None, 0
        for stream, writer in self.outs.items():
            if stream in self.written or stream not in self.marked or not msg.get("named_marks"):  # an older kernel waits for every marker
                writer.write(SYNC_PREFIX + str(cell).encode() + SYNC_END)
                self.marked[stream] = cell
        self.written.clear()
        fields: Dict[str, Any] = {"cell": cell, "status": status, "error": error, "memory": None, "seq": self.seq, "sync": dict(self.marked),
                                  "mem": {"rss": SIM_RSS, "peak": SIM_RSS}}  # as a real rank's DONE carries (procs/rank_memory.at_done)
        if self.broken:
            fields["group_broken"] = True
        if status != "ok" or value is None:
            fields["result"] = None
        else:
            fields["result"] = transfer.pack(value, prefix=shm.result_prefix(self.rank))
        self.send(P.DONE, **fields)
        await self.ctrl_w.drain()

    def _error(self, type_name: str, message: str) -> dict:
        assert self.script is not None
        return {"type": type_name, "message": message, "traceback": S.traceback_text(self.script, self.filename, self.line, type_name, message)}

    async def _steps(self, script: S.Script) -> Any:
        value = None
        for step in script.for_rank(self.rank):
            self.line = step.line
            value = await self._step(step, value)
        return value

    async def _step(self, step: S.Step, value: Any) -> Any:
        kind, args, kw = step.kind, step.args, step.kw()
        if kind == "print":
            await self._print(int(args[0]) if args else 1, bool(kw.get("own")), str(kw.get("stream", "stdout")))
        elif kind == "sleep":
            await self._wait(float(args[0]) if args else 0.0)
        elif kind == "error":
            type_name, message = (list(args) + ["RuntimeError", "simulated error"][len(args):])[:2]
            raise _CellError(self._error(str(type_name), str(message)))
        elif kind == "collective":
            op, seq = (list(args) + ["all_reduce", 0][len(args):])[:2]
            self.collective = {"op": op, "seq": seq, "shape": [1], "dtype": "float32", "group": "default", "ranks": None, "since": time.monotonic()}
            self.seq = max(self.seq, int(seq))
            await self._wait(None)
        elif kind == "die":
            raise Died(str(int(args[0]) if args else 1))
        elif kind == "log":
            self.send(P.METRICS, rows=[(int(kw.pop("step", 0)), time.time(), {k: float(v) for k, v in kw.items()})])
        elif kind == "buffer":
            return _buffer(int(args[0]))
        elif kind == "value":
            return args[0] if args else None
        return value

    async def _print(self, lines: int, own: bool, stream: str) -> None:
        prefix = f"rank {self.rank} " if own else ""
        writer = self.outs[stream]
        self.written.add(stream)
        writer.write("".join(f"{prefix}line {i}\n" for i in range(lines)).encode())
        await writer.drain()

    async def _wait(self, seconds: Optional[float]) -> None:
        """Sleep ``seconds`` (None: until released); INTERRUPT or ABORT ends it with their exception."""
        self._wake = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self._wake), seconds)
        except asyncio.TimeoutError:
            return
        finally:
            self._wake = None


class _CellError(Exception):
    """sim.error: the cell raised; ``data`` is the DONE's error as wire/execution.py's error_data makes it."""

    def __init__(self, data: dict) -> None:
        super().__init__(data["message"])
        self.data = data
