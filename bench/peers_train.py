"""bench_peers.py, section 5 (and bench_metrics.py): the same DDP loop in a %%ddp cell and under torchrun, taking turns.

The two jobs run at the same time; a referee (``TurnReferee``, a loopback socket) gives
them strict turns of ``TRAIN_BLOCK`` steps, so each pair of turns sees the machine in the
same state; a run's ratio is the median over its turn pairs of torchrun's turn time ÷
%%ddp's. Why turns, and what they do not charge: bench/README.md, section 5.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import threading
from typing import Any, Dict, List, Optional, Tuple

import processes as P
from jobs import dev_expr, torchrun_argv
from peers_tools import Tool

TRAIN_BLOCK = 50  # steps per turn (the two jobs take turns); each turn prints one loss line, so every turn is alike


def train_body(backend: str, blocks: int, warmup: int, dev: str, referee_port: int, tag: str, log_steps: bool = False) -> str:
    """The same DDP loop for the %%ddp cell and the torchrun script.

    The two jobs run at the same time and take turns: before each block of TRAIN_BLOCK steps
    every rank waits for its job's turn from the bench's referee (a loopback socket), then
    reports the block's time. Both jobs see the machine in the same state, block by block:
    on a shared machine whose speed drifts by a fifth within seconds, runs one after the
    other cannot resolve a difference of 3 %. ``log_steps`` (--train-log, the %%ddp side only):
    one ``ddp_magic.log(step, loss)`` per step, the live chart's cost.
    """
    return (
        "import socket as _socket, time, torch, torch.distributed as dist" + (", ddp_magic\n" if log_steps else "\n") +
        "from torch.nn.parallel import DistributedDataParallel as _DDP\n"
        f"_dev = {dev}\n"
        "torch.manual_seed(0)\n"
        "_model = _DDP(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)).to(_dev),\n"
        f"             device_ids=[_dev.index] if {backend == 'nccl'!r} else None)\n"
        "_opt = torch.optim.SGD(_model.parameters(), lr=0.01)\n"
        "_x, _y = torch.randn(64, 256, device=_dev), torch.randn(64, 256, device=_dev)\n"
        "def _step():\n"
        "    _opt.zero_grad()\n"
        "    _loss = torch.nn.functional.mse_loss(_model(_x), _y)\n"
        "    _loss.backward()\n"
        "    _opt.step()\n"
        "    return _loss\n"
        f"for _ in range({warmup}):\n"
        "    _step()\n"
        "dist.barrier()\n"
        f"_turn = _socket.create_connection(('127.0.0.1', {referee_port}))\n"
        "_turn.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)\n"
        "_turns = _turn.makefile('rw')\n"
        f"_turns.write('{tag} %d\\n' % dist.get_rank())\n"
        "_turns.flush()\n"
        "_i = 0\n"
        f"for _b in range({blocks}):\n"
        "    if _turns.readline().strip() != 'go':\n"
        "        raise RuntimeError('the bench ended the turns early')\n"
        "    _step()  # untimed: the first step after a wait pays for waking threads and caches\n"
        "    _t0 = time.perf_counter()\n"
        f"    for _ in range({TRAIN_BLOCK}):\n"
        "        _loss = _step()\n"
        + ("        ddp_magic.log(step=_i, loss=_loss)\n" if log_steps else "") +
        f"        if _i % {TRAIN_BLOCK} == 0:\n"
        "            print(f'step {_i} loss {_loss.item():.4f}')\n"
        "        _i += 1\n"
        "    if _dev.type == 'cuda':\n"
        "        torch.cuda.synchronize(_dev)\n"
        "    _turns.write(repr(time.perf_counter() - _t0) + '\\n')\n"
        "    _turns.flush()\n"
        "_turn.close()\n"
        "dist.barrier()\n"
        "del _model, _opt\n"
    )


def train_script(backend: str, blocks: int, warmup: int, referee_port: int) -> str:
    return (
        "import os, torch, torch.distributed as dist\n"
        f"if {backend!r} == 'nccl': torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n"
        f"dist.init_process_group({backend!r})\n"
        + train_body(backend, blocks, warmup, dev_expr(backend, "int(os.environ['LOCAL_RANK'])"), referee_port, "torchrun")
        + "dist.destroy_process_group()\n"
    )


class TurnReferee:
    """Gives the ranks of two jobs alternate turns of one block each, and keeps each turn's time.

    A turn's time is the slowest rank's (DDP keeps the ranks in step, so they differ by the
    start skew only). Turns strictly alternate, A B A B ...: every turn follows one of the
    other job. (With A B B A each job runs two turns back to back, and the second, warm one
    was ~15 % faster at n = 1 here: the pair ratios split into two groups ~0.83 and ~1.13
    whose median was decided by chance.) Loopback only; ``abort()`` closes every socket, so
    a rank waiting for its turn gets an error instead of waiting forever.
    """

    def __init__(self, n: int, tags: Tuple[str, str] = ("ddp", "torchrun"), timeout: float = 600.0) -> None:
        self.n, self.tags, self.timeout = n, tags, timeout
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(2 * n + 8)
        self.port = self.listener.getsockname()[1]
        self.times: Dict[str, List[float]] = {t: [] for t in tags}
        self.error: Optional[str] = None
        self._socks: List[Any] = []

    def run(self, blocks: int) -> None:
        try:
            files: Dict[str, Dict[int, Any]] = {t: {} for t in self.tags}
            self.listener.settimeout(self.timeout)
            while sum(len(f) for f in files.values()) < 2 * self.n:
                sock, _ = self.listener.accept()
                sock.settimeout(self.timeout)
                self._socks.append(sock)
                f = sock.makefile("rw")
                tag, rank = f.readline().split()
                files[tag][int(rank)] = f
            for b in range(blocks):
                for tag in self.tags:
                    for f in files[tag].values():
                        f.write("go\n")
                        f.flush()
                    times = []
                    for rank, f in files[tag].items():
                        line = f.readline()
                        if not line:
                            raise RuntimeError(f"{tag} rank {rank} left during turn {b}")
                        times.append(float(line))
                    self.times[tag].append(max(times))
        except Exception as e:
            self.error = f"turns: {type(e).__name__}: {e}"
        finally:
            self.abort()

    def abort(self) -> None:
        for s in [self.listener] + self._socks:
            try:
                s.close()
            except OSError:
                pass


def train_turns(d: "Tool", n: int, args: argparse.Namespace, tmp: str) -> Tuple[float, dict]:
    """One run: the loop in a %%ddp cell (the default status view on) and under torchrun, started
    together and taking turns block by block. The ratio is the median over the turn pairs of
    (torchrun's block time ÷ %%ddp's), i.e. %%ddp steps/s ÷ torchrun steps/s."""
    blocks = max(2, args.train_steps // TRAIN_BLOCK)
    referee = TurnReferee(n)
    path = os.path.join(tmp, f"train_{n}.py")
    with open(path, "w") as f:
        f.write(train_script(args.backend, blocks, args.train_warmup, referee.port))
    thread = threading.Thread(target=referee.run, args=(blocks,), daemon=True, name="turns")
    thread.start()
    proc = subprocess.Popen(torchrun_argv(n) + [path], env=P.child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        body = train_body(args.backend, blocks, args.train_warmup, "t.device", referee.port, "ddp", getattr(args, "train_log", False))
        ex = d.ok(f"%%ddp\n{body}", timeout=900)
        out, err = proc.communicate(timeout=300)
        thread.join(60)
        if proc.returncode != 0:
            raise RuntimeError(f"torchrun exit {proc.returncode}: {P.tail(err, 300)}")
        if referee.error:
            raise RuntimeError(referee.error)
    finally:
        referee.abort()
        if proc.poll() is None:
            P.killpg(proc)
            proc.wait(30)
    dt, tt = referee.times["ddp"], referee.times["torchrun"]
    if len(dt) != blocks or len(tt) != blocks:
        raise RuntimeError(f"{len(dt)} and {len(tt)} of {blocks} turns timed")
    pairs = sorted(t / x for x, t in zip(dt, tt))
    q = lambda f: pairs[min(len(pairs) - 1, int(f * len(pairs)))]  # noqa: E731
    return statistics.median(pairs), {
        "ddp_rate": TRAIN_BLOCK / statistics.median(dt), "torchrun_rate": TRAIN_BLOCK / statistics.median(tt),
        "pairs": len(pairs), "q1": q(0.25), "q3": q(0.75), "ddp_mean_rate": TRAIN_BLOCK * len(dt) / sum(dt),
        "torchrun_mean_rate": TRAIN_BLOCK * len(tt) / sum(tt), "cell_s": ex["elapsed"],
    }
