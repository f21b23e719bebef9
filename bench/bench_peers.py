#!/usr/bin/env python
"""ddp_magic side by side with the tools a user would otherwise pick, in one run on one machine.

    bash bench/run_peers.sh [--quick] [--publish]      # makes bench/.venv-peers, then runs this file
    bench/.venv-peers/bin/python bench/bench_peers.py [--quick] [--ns 1,2,4,8] [--backend gloo|nccl]

Compared: %%ddp (ddp_magic from this checkout), accelerate's ``notebook_launcher``,
ipyparallel (``Cluster(n).start_and_connect_sync()`` then ``%%px``), nbdistributed
(``%dist_init`` then ``%%distributed``), ``torchrun --standalone``, ``torch.multiprocessing.spawn``
and N bare ``python`` processes (the floor). The notebook tools run in real Jupyter kernels
(jupyter_client) of this interpreter. Sections: cold start, warm cell round trip, result return,
output (latency of a print, a cell printing 100,000 lines), training overhead (steps/s of a DDP loop
in a %%ddp cell vs the same loop under torchrun) and memory (kernel RSS after 500 cells, worker
RSS/USS beyond a bare ``import torch``).

Writes bench/results/peers.md, bench/results/peers.json and bench/results/peers_*.png. Every figure is
a median over repeats with (min–max); ratios are taken pair by pair (the same repeat, the same
machine state) and then summarised the same way. A measurement that fails shows the tool's own
error text in its table cell. See bench/README.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_core as core  # noqa: E402  (shared helpers: Store, KernelSession, processes, formatting)
from bench_core import (  # noqa: E402
    MIB, Store, _cell_text, _killpg, _parse_results, cmdline, cpu_count, descendants,
    fmt, free_port, log, med, pid_alive, run_proc, short_error, tail,
)

REPO = core.REPO
RESULTS_DIR = os.path.join(HERE, "results")
DOCS_DIR = os.path.join(REPO, "docs", "bench")
PY = sys.executable
KERNEL_NAME = "ddp-bench-peers"

# The tools, in table order. label: the column header.
LABELS = {
    "ddp": "%%ddp",
    "accelerate": "accelerate notebook_launcher",
    "ipp": "ipyparallel %%px",
    "nbd": "nbdistributed",
    "torchrun": "torchrun --standalone",
    "spawn": "mp.spawn (script)",
    "bare": "N bare python",
}
COLORS = {"ddp": "#d62728", "accelerate": "#ff7f0e", "ipp": "#1f77b4", "nbd": "#2ca02c", "torchrun": "#9467bd",
          "spawn": "#8c564b", "bare": "#7f7f7f", "plain": "#17becf", "memcpy": "#000000"}


def dev_expr(backend: str, rank_expr: str) -> str:
    return f"torch.device('cuda', {rank_expr})" if backend == "nccl" else "torch.device('cpu')"


# ====================================================================== scripts run outside a kernel
def script_job(backend: str) -> str:
    """torchrun and bare processes: env:// init, one all_reduce, a timestamped result line."""
    dev = dev_expr(backend, "int(os.environ['LOCAL_RANK'])")
    return (
        "import os, time, torch, torch.distributed as dist\n"
        f"backend = {backend!r}\n"
        "if backend == 'nccl': torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n"
        "dist.init_process_group(backend)\n"
        f"t = torch.ones(1, device={dev})\n"
        "dist.all_reduce(t)\n"
        "os.write(1, f'RESULT {time.time()!r} {t.item()}\\n'.encode())  # one write: ranks share the pipe\n"
        "dist.destroy_process_group()\n"
    )


SPAWN_JOB = r'''
import os, sys, time, torch, torch.distributed as dist, torch.multiprocessing as mp

def job(rank, n, port, backend):
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    t = torch.ones(1, device=torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu"))
    dist.all_reduce(t)
    os.write(1, f"RESULT {time.time()!r} {t.item()}\n".encode())
    dist.destroy_process_group()

if __name__ == "__main__":
    n, port, backend = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    mp.spawn(job, args=(n, port, backend), nprocs=n)
'''


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


# ====================================================================== processes: memory, ports
def proc_mem_kib(pid: int) -> Tuple[int, int, int]:
    """(RSS, USS, PSS) in KiB. USS: private pages, what this process alone costs (pages a fork shares with its parent are not);
    PSS: each page divided by the number of processes mapping it, so a pool's PSS adds up to what the pool costs."""
    rss = uss = pss = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    uss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1])
    except OSError:
        pass
    return rss, uss, pss


def listening_established(port: int) -> int:
    """How many ESTABLISHED TCP connections have local port `port` (the server ends), from /proc/net/tcp{,6}."""
    count = 0
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == "01" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                        count += 1
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    return count


class Cleanup:
    """Every pid we ever saw under our kernels and launchers; at the end, any still alive is killed by pid."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.pids: Dict[int, str] = {}

    def remember(self, pids: List[int], what: str) -> None:
        for p in pids:
            if p and p != os.getpid():
                self.pids.setdefault(p, f"{cmdline(p)[:100]}  ({what})")

    def reap(self, pids: List[int], what: str, timeout: float = 10.0) -> None:
        """Wait for pids to go; SIGKILL the ones left (they are ours) and say so."""
        pids = [p for p in pids if p and p != os.getpid()]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
            time.sleep(0.05)
        alive = [p for p in pids if pid_alive(p)]
        if alive:
            note = f"{what}: {len(alive)} process(es) still alive {timeout:.0f}s after stop, killed by pid: " + "; ".join(
                f"{p} {cmdline(p)[:80]}" for p in alive)
            self.store.notes.append(note)
            log("WARNING " + note)
            for p in alive:
                try:
                    os.kill(p, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def final(self) -> List[str]:
        left = [p for p in self.pids if pid_alive(p)]
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return [f"{p} {self.pids[p]}" for p in left]


# ====================================================================== a kernel of this interpreter
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


class PeerKernel(core.KernelSession):
    """A fresh IPython kernel (this interpreter), its own stdout/stderr in a log file."""

    def __init__(self, tmp: str, tag: str, startup_timeout: float = 120.0) -> None:
        from jupyter_client.manager import start_new_kernel

        env = core.child_env()
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
                return tail(f.read(), n)
        except OSError:
            return ""


def all_text(ex: dict) -> str:
    return ex["stdout"] + ex["stderr"] + "".join(ex["results"])


# ====================================================================== the notebook tools
class Tool:
    """One notebook tool in one kernel: start (untimed), cells for each measurement, a check for each, stop."""

    key = ""
    magic = ""  # the cell magic that sends a cell to the ranks

    def __init__(self, n: int, args: argparse.Namespace, tmp: str, cleanup: Cleanup) -> None:
        self.n, self.args, self.tmp, self.cleanup = n, args, tmp, cleanup
        self.k: Optional[PeerKernel] = None
        self.setup_error: Optional[str] = None

    # --- lifecycle
    def start_kernel(self) -> None:
        self.k = PeerKernel(self.tmp, self.key)
        self.cleanup.remember([self.k.pid], f"{self.key} kernel")

    def ok(self, code: str, timeout: float = 300.0) -> dict:
        assert self.k is not None
        ex = self.k.run(code, timeout)
        if ex["error"]:
            raise RuntimeError(f"{ex['error']} | {tail(ex['stderr'] or ex['stdout'], 300)}")
        return ex

    def cold_cells(self, port: int) -> List[str]:
        raise NotImplementedError

    def cold_check(self, exs: List[dict]) -> None:
        raise NotImplementedError

    def between_cold_cells(self, i: int) -> None:
        """Called after cold cell i (nbdistributed waits there until its workers have connected)."""

    def setup_live(self) -> None:
        """Pool up, torch and the process group ready on every rank (untimed)."""
        port = free_port()
        for i, code in enumerate(self.cold_cells(port)):
            exs = [self.ok(code, timeout=600)]
            self.between_cold_cells(i)
        self.cold_check(exs)

    def descendants(self) -> List[int]:
        return descendants(self.k.pid) if self.k else []

    def stop_pool(self) -> None:
        """Stop the ranks the tool started (its own documented way)."""

    def stop(self) -> None:
        if self.k is None:
            return
        pids = [self.k.pid] + self.descendants()
        self.cleanup.remember(pids, f"{self.key} n={self.n}")
        try:
            self.stop_pool()
        except Exception as e:
            log(f"{self.key} n={self.n}: stopping the pool failed: {short_error(e)}")
        try:
            self.k.shutdown()
        except Exception as e:
            log(f"{self.key} n={self.n}: kernel shutdown failed: {short_error(e)}")
        self.cleanup.reap(pids, f"{self.key} n={self.n}")
        self.k = None

    # --- live measurements: cell text and checks
    def cell(self, body: str) -> str:
        return f"{self.magic}\n{body}"

    def check_trivial(self, ex: dict) -> None:
        raise NotImplementedError

    def check_noerror(self, ex: dict) -> None:
        pass

    def worker_pids(self) -> Dict[str, List[int]]:
        """{'rank': [...], 'helper': [...]} among the kernel's descendants."""
        return {}


class DDP(Tool):
    key, magic = "ddp", "%%ddp"

    def cold_cells(self, port: int) -> List[str]:
        b = self.args.backend
        return ["%load_ext ddp_magic",
                f"%%ddp -n {self.n} --backend {b} --no-widget\n"
                f"import torch, torch.distributed as dist\nt = torch.ones(1, device={dev_expr(b, 'torch.cuda.current_device()')})\ndist.all_reduce(t)\nt"]

    def cold_check(self, exs: List[dict]) -> None:
        text = exs[-1]["results"][-1] if exs[-1]["results"] else ""
        if text.count(f"tensor([{self.n}.") != self.n:
            raise RuntimeError(f"unexpected result {text[:200]!r}; stderr: {tail(exs[-1]['stderr'], 200)}")

    def cell(self, body: str) -> str:
        return f"%%ddp --no-widget\n{body}"

    def check_trivial(self, ex: dict) -> None:
        if not ex["results"] or ex["results"][-1].count("] 1") != self.n:
            raise RuntimeError(f"unexpected result {ex['results'][-1:]!r} {tail(ex['stderr'], 200)!r}")

    def check_noerror(self, ex: dict) -> None:
        if ex["results"]:
            raise RuntimeError(f"unexpected result {ex['results'][-1][:100]!r}")

    def stop_pool(self) -> None:
        self.ok("%ddp stop", timeout=60)

    def worker_pids(self) -> Dict[str, List[int]]:
        desc = self.descendants()
        tmpl = [p for p in desc if "ddp_magic.procs.forkserver" in cmdline(p) and core._proc_table().get(p) == self.k.pid]
        ranks = [p for p in desc if core._proc_table().get(p) in tmpl]
        return {"rank": ranks, "helper": tmpl}


class IPP(Tool):
    key, magic = "ipp", "%%px"

    def cold_cells(self, port: int) -> List[str]:
        n, b = self.n, self.args.backend
        return [
            "import ipyparallel as ipp\n"
            f"cluster = ipp.Cluster(n={n}, log_level=40)\n"
            "rc = cluster.start_and_connect_sync()\n"
            "dv = rc[:]\n"
            "dv.block = True\n"
            "dv.activate()\n"
            f"dv.scatter('rank', list(range({n})), flatten=True)\n"
            f"dv.push(dict(world={n}, port={port}, backend={b!r}))\n"
            "None",
            "%%px\n"
            "import torch, torch.distributed as dist\n"
            "if backend == 'nccl': torch.cuda.set_device(rank)\n"
            "dist.init_process_group(backend, init_method=f'tcp://127.0.0.1:{port}', rank=rank, world_size=world)\n"
            f"t = torch.ones(1, device={dev_expr(b, 'rank')})\n"
            "dist.all_reduce(t)\n"
            "t",
        ]

    def cold_check(self, exs: List[dict]) -> None:
        text = all_text(exs[-1])
        if text.count(f"tensor([{self.n}.") != self.n:
            raise RuntimeError(f"unexpected result {tail(text, 300)!r}")

    def check_trivial(self, ex: dict) -> None:
        outs = [r for r in ex["results"] if re.search(r"Out\[\d+:\d+\]: (\x1b\[0m)?1$", r.strip())]
        if len(outs) != self.n:
            raise RuntimeError(f"unexpected output {tail(all_text(ex), 200)!r}")

    def check_noerror(self, ex: dict) -> None:
        if ex["error"] or "Error" in all_text(ex):
            raise RuntimeError(tail(all_text(ex), 200))

    def stop_pool(self) -> None:
        self.ok("cluster.stop_cluster_sync()", timeout=120)

    def worker_pids(self) -> Dict[str, List[int]]:
        desc = self.descendants()
        return {"rank": [p for p in desc if "ipyparallel.engine" in cmdline(p) or "ipengine" in cmdline(p)],
                "helper": [p for p in desc if "ipyparallel.controller" in cmdline(p) or "ipcontroller" in cmdline(p)]}


class NBD(Tool):
    key, magic = "nbd", "%%distributed"

    def cold_cells(self, port: int) -> List[str]:
        return ["%load_ext nbdistributed", f"%dist_init -n {self.n}",
                "%%distributed\nt = torch.ones(1, device=device)\ndist.all_reduce(t)\nt"]

    def between_cold_cells(self, i: int) -> None:
        if i == 1 and not self.args.nbd_no_wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until every worker holds its connection to the kernel's ZMQ port: a message sent earlier is dropped.

        %dist_init returns after a fixed 2 s sleep, before the workers have imported torch; the
        ROUTER socket silently drops what it cannot route, so a first cell sent then waits 30 s
        and fails. A user would wait and re-run; this is the best case of that (polled every 20 ms).
        """
        deadline = time.monotonic() + timeout
        port = None
        while time.monotonic() < deadline:
            if port is None:
                for p in self.descendants():
                    argv = cmdline(p).split()
                    if any(a.endswith("nbdistributed/worker.py") for a in argv) and len(argv) >= 7:
                        port = int(argv[argv.index(next(a for a in argv if a.endswith("worker.py"))) + 5])
                        break
            if port is not None and listening_established(port) >= self.n:
                time.sleep(0.02)  # the ZMTP greeting after the TCP handshake
                return
            time.sleep(0.02)
        raise TimeoutError(f"nbdistributed workers not connected after {timeout:.0f}s")

    def cold_check(self, exs: List[dict]) -> None:
        text = all_text(exs[-1])
        if "Error" in text or text.count(f"tensor([{self.n}.") != self.n:
            errs = [line.strip() for line in text.splitlines() if "Error" in line]
            raise RuntimeError(errs[0] if errs else tail(text.strip(), 240))

    def check_trivial(self, ex: dict) -> None:
        text = ex["stdout"]
        if "Error" in text or sum(1 for line in text.splitlines() if line.strip() == "1") != self.n:
            raise RuntimeError(tail(text.strip(), 200))

    def check_noerror(self, ex: dict) -> None:
        if "Error" in all_text(ex):
            raise RuntimeError(tail(all_text(ex).strip(), 200))

    def stop_pool(self) -> None:
        # Not %dist_shutdown / %dist_reset: they run `pkill -f worker.py`, `pkill -9 -f "python.*worker"` and
        # `pkill -f nbdistributed`, machine-wide (other users' processes too). Its own ProcessManager.shutdown()
        # terminates just the workers it started.
        self.ok("%dist_mode --disable", timeout=30)
        self.ok("_m = get_ipython().magics_manager.registry['DistributedMagic']\n"
                "if _m._process_manager is not None:\n    _m._process_manager.shutdown()", timeout=60)

    def worker_pids(self) -> Dict[str, List[int]]:
        return {"rank": [p for p in self.descendants() if "nbdistributed/worker.py" in cmdline(p)], "helper": []}


class Accelerate(Tool):
    key = "accelerate"

    def cold_cells(self, port: int) -> List[str]:
        b = self.args.backend
        dev = dev_expr(b, "int(os.environ.get('LOCAL_RANK', 0))")
        return [
            "from accelerate import notebook_launcher\n"
            "import socket\n"
            "def free_port():\n"
            "    with socket.socket() as s:\n"
            "        s.bind(('127.0.0.1', 0))\n"
            "        return s.getsockname()[1]\n"
            "def job(port, backend):\n"
            "    import os, torch, torch.distributed as dist\n"
            "    if 'WORLD_SIZE' in os.environ:  # a rank forked by notebook_launcher's elastic agent (n > 1)\n"
            "        if backend == 'nccl': torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n"
            "        dist.init_process_group(backend)\n"
            "    else:  # n == 1: notebook_launcher calls the function in the kernel itself\n"
            "        dist.init_process_group(backend, init_method=f'tcp://127.0.0.1:{port}', rank=0, world_size=1)\n"
            f"    t = torch.ones(1, device={dev})\n"
            "    dist.all_reduce(t)\n"
            "    os.write(1, f'RESULT {t.item()}\\n'.encode())\n"
            "    dist.destroy_process_group()",
            self.launch_cell(),
        ]

    def launch_cell(self) -> str:
        return f"notebook_launcher(job, args=(free_port(), {self.args.backend!r}), num_processes={self.n}, use_port=str(free_port()))"

    def cold_check(self, exs: List[dict]) -> None:
        text = all_text(exs[-1])
        if text.count(f"RESULT {float(self.n)}") != self.n:
            raise RuntimeError(tail(text.strip(), 240))


TOOLS = {"ddp": DDP, "ipp": IPP, "nbd": NBD, "accelerate": Accelerate}
SLOW = {"ipp", "nbd"}  # cold start: --slow-repeats of these


# ====================================================================== the store: samples by repeat, for pairwise ratios
class PeerStore(Store):
    def __init__(self) -> None:
        super().__init__()
        self.by_rep: Dict[str, Dict[int, float]] = {}

    def measure_rep(self, key: str, rep: int, fn: Callable[[], Any], quiet: bool = False) -> Optional[float]:
        v = self.measure_quiet(key, fn) if quiet else self.measure(key, fn)
        if v is not None:
            self.by_rep.setdefault(key, {})[rep] = v
        return v

    def ratios(self, num: str, den: str) -> List[float]:
        a, b = self.by_rep.get(num, {}), self.by_rep.get(den, {})
        return [a[r] / b[r] for r in sorted(set(a) & set(b)) if b[r]]


def fmt_ratio(vals: List[float], digits: int = 2) -> str:
    if not vals:
        return "—"
    m, lo, hi = statistics.median(vals), min(vals), max(vals)
    return f"{m:.{digits}f}× ({lo:.{digits}f}–{hi:.{digits}f})" if len(vals) > 1 else f"{m:.{digits}f}×"


# ====================================================================== 1. cold start
def cold_kernel_tool(key: str, n: int, rep: int, args: argparse.Namespace, store: PeerStore, tmp: str, cleanup: Cleanup) -> None:
    skey = f"cold.{key}.n{n}"
    tool = TOOLS[key](n, args, tmp, cleanup)
    try:
        tool.start_kernel()

        def one() -> Tuple[float, dict]:
            port = free_port()
            exs = []
            t0 = time.perf_counter()
            for i, code in enumerate(tool.cold_cells(port)):
                exs.append(tool.ok(code, timeout=600))
                tool.between_cold_cells(i)
            dt = time.perf_counter() - t0
            tool.cold_check(exs)
            return dt, {"cells": [round(e["elapsed"], 3) for e in exs]}

        store.measure_rep(skey, rep, one)
    except Exception as e:
        store.error(skey, short_error(e))
        if tool.k is not None and tool.k.log_tail():
            log(f"{key} kernel log: {tool.k.log_tail(600)}")
    finally:
        tool.stop()


def nbd_as_typed(n: int, args: argparse.Namespace, store: PeerStore, tmp: str, cleanup: Cleanup) -> None:
    """%dist_init then the job cell at once, as a user types them (no waiting)."""
    a = argparse.Namespace(**vars(args))
    a.nbd_no_wait = True
    tool = NBD(n, a, tmp, cleanup)
    key = f"cold.nbd_as_typed.n{n}"
    try:
        tool.start_kernel()
        t0 = time.perf_counter()
        exs = [tool.ok(code, timeout=120) for code in tool.cold_cells(free_port())]
        dt = time.perf_counter() - t0
        try:
            tool.cold_check(exs)
            store.get(key).values.append(dt)
            log(f"{key}: {dt:.2f}")
        except RuntimeError as e:
            store.error(key, f"after {dt:.1f}s: {short_error(e)}")
    except Exception as e:
        store.error(key, short_error(e))
    finally:
        tool.stop()


def torchrun_argv(n: int) -> List[str]:
    torchrun = os.path.join(os.path.dirname(PY), "torchrun")
    return ([torchrun] if os.path.exists(torchrun) else [PY, "-m", "torch.distributed.run"]) + ["--standalone", f"--nproc-per-node={n}"]


def cold_script(kind: str, n: int, rep: int, args: argparse.Namespace, store: PeerStore, paths: Dict[str, str]) -> None:
    def one() -> Tuple[float, dict]:
        env = core.child_env()
        if kind == "torchrun":
            argv = torchrun_argv(n) + [paths["job"]]
        else:
            argv = [PY, paths["spawn"], str(n), str(free_port()), args.backend]
        t_launch = time.time()
        code, out, err = run_proc(argv, env=env)
        t_exit = time.time()
        if code != 0:
            raise RuntimeError(f"exit {code}: {tail(err, 300)}")
        times = _parse_results(out, n)
        return max(times) - t_launch, {"exit_s": t_exit - t_launch}

    store.measure_rep(f"cold.{kind}.n{n}", rep, one)


def cold_bare(n: int, rep: int, args: argparse.Namespace, store: PeerStore) -> None:
    src = script_job(args.backend)

    def one() -> Tuple[float, dict]:
        t_launch, t_exit, out = core.launch_bare(n, src)
        return max(_parse_results(out, n)) - t_launch, {"exit_s": t_exit - t_launch}

    store.measure_rep(f"cold.bare.n{n}", rep, one)


def cold_import(rep: int, store: PeerStore) -> None:
    def one() -> float:
        t0 = time.time()
        code, out, err = run_proc([PY, "-c", "import torch, time, os; os.write(1, repr(time.time()).encode())"], env=core.child_env())
        if code != 0:
            raise RuntimeError(f"exit {code}: {tail(err)}")
        return float(out.strip()) - t0

    store.measure_rep("cold.import", rep, one)


# ====================================================================== 2-6. live pools, interleaved
def lat_body(lines: int, gap: float, rank: str) -> str:
    # One string per print: nbdistributed sends each write() separately, so print('LAT', x) would arrive as two lines.
    # The rank is in the line: two ranks often print the same time.time() here (a coarse clock).
    return f"import time\nfor _i in range({lines}):\n    print(f'LAT {{{rank}}} {{time.time()!r}}')\n    time.sleep({gap})"


def latencies(ex: dict, expected: int) -> List[float]:
    first: Dict[Tuple[str, str], float] = {}  # a line may come again in a later, cumulative display update: its first arrival counts
    stream, ends = "", []  # stream messages are concatenated (a line may be split over two); a line arrives with its last character
    pattern = r"LAT (\d+) (\d+\.\d+)\n"
    for t_arr, text, kind in ex["events"]:
        if kind == "stream":
            stream += text
            ends.append((len(stream), t_arr))
        else:
            for m in re.finditer(pattern, text + "\n"):
                first.setdefault(m.groups(), t_arr)
    for m in re.finditer(pattern, stream):
        first.setdefault(m.groups(), next(t for end, t in ends if end >= m.end()))
    out = [t - float(stamp) for (_, stamp), t in first.items()]
    if len(out) != expected:
        odd = [line for line in (stream + "\n".join(ex["results"])).splitlines() if "LAT" in line and not re.search(r"LAT \d+ \d+\.\d+$", line)]
        raise RuntimeError(f"{len(out)} of {expected} timestamped lines arrived; lines not as printed: {odd[:4]!r}")
    return out


def count_lines(ex: dict) -> int:
    return sum(1 for line in all_text(ex).splitlines() if re.search(r"(^|\s)\d+$", line))


def check_plain(ex: dict) -> None:
    if ex["results"] != ["1"]:
        raise RuntimeError(f"unexpected result {ex['results']!r}")


def _live_tools(n: int, args: argparse.Namespace, tmp: str, cleanup: Cleanup) -> Dict[str, Tool]:
    """Each notebook tool's kernel with a live pool of n ranks; a failed setup is kept as the tool's setup_error."""
    tools: Dict[str, Tool] = {}
    for key in ("ddp", "ipp", "nbd", "accelerate"):
        if key not in args.tools:
            continue
        tool = TOOLS[key](n, args, tmp, cleanup)
        tools[key] = tool
        try:
            tool.start_kernel()
            t0 = time.perf_counter()
            tool.setup_live()
            log(f"live n={n}: {key} ready in {time.perf_counter() - t0:.1f}s")
        except Exception as e:
            tool.setup_error = f"setup: {short_error(e)}"
            log(f"live n={n}: {key} setup FAILED: {tool.setup_error}")
            if tool.k is not None:
                log(f"{key} kernel log: {tool.k.log_tail(600)}")
    return tools


def _live_memory(n: int, pools: Dict[str, Tool], args: argparse.Namespace, store: PeerStore, tmp: str, cleanup: Cleanup) -> None:
    """6a. memory of the workers, beyond a bare `import torch` process; 6b. kernel RSS after 500 cells."""
    bare_mem(n, store)
    for key, t in pools.items():
        if t.setup_error:
            store.error(f"mem.{key}.rank.rss.n{n}", t.setup_error)
            continue
        pids = t.worker_pids()
        for role, plist in pids.items():
            mems = [proc_mem_kib(p) for p in plist]
            mems = [m for m in mems if m[0]]
            if mems:
                store.get(f"mem.{key}.{role}.rss.n{n}").values += [m[0] / 1024 for m in mems]
                store.get(f"mem.{key}.{role}.uss.n{n}").values += [m[1] / 1024 for m in mems]
                store.get(f"mem.{key}.{role}.pss.n{n}").values += [m[2] / 1024 for m in mems]
                store.get(f"mem.{key}.{role}.count.n{n}").values.append(len(mems))
        if not pids.get("rank"):
            store.error(f"mem.{key}.rank.rss.n{n}", "no worker process found among the kernel's descendants")
    if n == args.mem_n:
        kernel_memory(n, pools, args, store, tmp, cleanup)


def _run_warm(name: str, body: str, rep: int, record: bool, n: int, tools: Dict[str, Tool], pools: Dict[str, Tool], store: PeerStore) -> None:
    """One warm cell: `plain` in the %%ddp kernel, else `<tool>.trivial` / `<tool>.allreduce`; timed when record."""
    if name == "plain":
        t = tools.get("ddp")
        if t is None or t.k is None:
            return
        code, check = body, check_plain
    else:
        key, what = name.split(".")
        t = pools[key]
        if t.setup_error:
            return
        code = t.cell(body)
        check = t.check_trivial if what == "trivial" else t.check_noerror

    def one() -> float:
        ex = t.ok(code, timeout=120)
        check(ex)
        return ex["elapsed"]

    if record:
        store.measure_rep(f"warm.{name}.n{n}", rep, one, quiet=True)
    else:
        try:
            one()
        except Exception as e:
            log(f"warm-up {name}: {short_error(e)}")


def _live_warm(n: int, tools: Dict[str, Tool], pools: Dict[str, Tool], args: argparse.Namespace, store: PeerStore) -> None:
    """2. warm round trips, interleaved: plain, %%ddp, %%px, %%distributed; then accelerate's re-launches."""
    warm_cells = [("plain", "1")]
    for key in pools:
        warm_cells += [(f"{key}.trivial", "1"), (f"{key}.allreduce", "x = torch.ones(1, device=t.device)\ndist.all_reduce(x)")]
    for key, t in pools.items():
        if t.setup_error:
            for w in ("trivial", "allreduce"):
                store.error(f"warm.{key}.{w}.n{n}", t.setup_error)
    for _ in range(3):
        for name, body in warm_cells:
            _run_warm(name, body, -1, False, n, tools, pools, store)
    for i in range(args.warm_repeats):
        for name, body in warm_cells:
            _run_warm(name, body, i, True, n, tools, pools, store)
    log(f"warm n={n}: " + ", ".join(f"{name} {1e3 * (med(store.series.get(f'warm.{name}.n{n}')) or float('nan')):.1f} ms" for name, _ in warm_cells))
    # accelerate: each cell is a fresh launch (nothing lives between cells)
    acc = tools.get("accelerate")
    if acc is not None:
        if acc.setup_error:
            store.error(f"warm.accelerate.relaunch.n{n}", acc.setup_error)
        else:
            for i in range(args.acc_repeats):
                def relaunch() -> float:
                    ex = acc.ok(acc.launch_cell(), timeout=300)
                    acc.cold_check([ex])
                    return ex["elapsed"]

                store.measure_rep(f"warm.accelerate.relaunch.n{n}", i, relaunch)


def _live_output(n: int, tools: Dict[str, Tool], pools: Dict[str, Tool], args: argparse.Namespace, store: PeerStore) -> None:
    """4a. output latency: a print on each rank → its arrival in the notebook; 4b. a cell printing 100,000 lines (split over the ranks)."""
    for key, t in pools.items():
        if t.setup_error:
            store.error(f"out.lat.{key}.n{n}", t.setup_error)
    for rep in range(args.out_repeats):
        for name in ["plain"] + list(pools):
            t = tools.get("ddp") if name == "plain" else pools[name]
            if t is None or t.k is None or t.setup_error:
                continue
            body = lat_body(args.lat_lines, 0.05, "0" if name == "plain" else "dist.get_rank()")
            code, nlines = (body, args.lat_lines) if name == "plain" else (t.cell(body), args.lat_lines * n)

            def lat(code: str = code, nlines: int = nlines, t: Tool = t) -> float:
                ex = t.ok(code, timeout=120)
                return statistics.median(latencies(ex, nlines))

            store.measure_rep(f"out.lat.{name}.n{n}", rep, lat, quiet=True)
    for key, t in pools.items():
        if t.setup_error:
            store.error(f"out.lines.{key}.n{n}", t.setup_error)
    total = args.lines
    for rep in range(args.lines_repeats):
        for name in ["plain"] + list(pools):
            t = tools.get("ddp") if name == "plain" else pools[name]
            if t is None or t.k is None or t.setup_error:
                continue
            per = total if name == "plain" else total // n
            body = f"for _i in range({per}):\n    print(_i)"
            code = body if name == "plain" else t.cell(body)

            def lines(code: str = code, t: Tool = t, want: int = per if name == "plain" else per * n) -> Tuple[float, dict]:
                ex = t.ok(code, timeout=600)
                return ex["elapsed"], {"shown": count_lines(ex), "want": want}

            store.measure_rep(f"out.lines.{name}.n{n}", rep, lines)


def _result_once(key: str, t: Tool, n: int, elems: int) -> float:
    """One timed result return: %%ddp's cell `t`, or ipyparallel's `dv.pull('t')` (checked after the clock stops)."""
    if key == "ddp":
        ex = t.ok("%%ddp --no-widget\nt", timeout=600)
        text = ex["results"][-1] if ex["results"] else ""
        if not text.startswith("RankResults(") or text.count("tensor(") != n:
            raise RuntimeError(f"unexpected result {text[:200]!r}")
        dt = ex["elapsed"]
        t.ok("%reset -f out")
    else:
        ex = t.ok("_r = dv.pull('t')", timeout=600)
        dt = ex["elapsed"]
        chk = t.ok(f"[int(_x.numel()) for _x in _r] == [{elems}] * {n}")
        if chk["results"] != ["True"]:
            raise RuntimeError(f"pull gave {t.ok('[int(_x.numel()) for _x in _r]')['results'][:1]!r}")
        t.ok("del _r")
    return dt


def _result_tools(n: int, size: int, elems: int, pools: Dict[str, Tool], args: argparse.Namespace, store: PeerStore) -> Dict[str, Tool]:
    """The tools (ddp, ipp) whose ranks now hold a tensor of `size` MiB, untimed; the others' cells say why not."""
    total_mib = n * size
    make = f"t = torch.empty({elems}, device=t.device).fill_(1.0)"
    ready = {}
    for key in ("ddp", "ipp"):
        t = pools.get(key)
        if t is None:
            continue
        if t.setup_error:
            store.error(f"result.{key}.n{n}.s{size}", t.setup_error)
            continue
        if key == "ipp" and total_mib > args.ipp_max_total_mib:
            store.error(f"result.{key}.n{n}.s{size}", f"skipped: n × size > --ipp-max-total-mib {args.ipp_max_total_mib}")
            continue
        try:
            t.ok(t.cell(make), timeout=300)
            ready[key] = t
        except Exception as e:
            store.error(f"result.{key}.n{n}.s{size}", short_error(e))
    return ready


def _live_results(n: int, pools: Dict[str, Tool], args: argparse.Namespace, store: PeerStore) -> None:
    """3. result return: %%ddp `t` vs ipyparallel pull, per size."""
    ip = pools.get("ipp")
    if ip is not None and not ip.setup_error:
        try:  # the first tensor unpickled imports torch in the kernel (~1 s): paid here, untimed, as %%ddp's kernel paid it in its setup
            ip.ok("_r = dv.pull('t')\ndel _r")
        except Exception as e:
            log(f"ipp warm-up pull: {short_error(e)}")
    for size in args.sizes:
        if n * size > args.max_total_gib * 1024:
            continue
        elems = size * MIB // 4
        ready = _result_tools(n, size, elems, pools, args, store)
        for rep in range(args.result_repeats):
            for key, t in ready.items():
                store.measure_rep(f"result.{key}.n{n}.s{size}", rep, lambda key=key, t=t, elems=elems: _result_once(key, t, n, elems))
        for key, t in ready.items():
            try:
                t.ok(t.cell("del t\nt = torch.ones(1, device=x.device)"), timeout=120)
            except Exception as e:
                log(f"{key}: freeing t failed: {short_error(e)}")


def live_phase(n: int, args: argparse.Namespace, store: PeerStore, tmp: str, cleanup: Cleanup) -> None:
    """Every live-pool section for n ranks, the tools' kernels up once: memory, warm cells, output, results, training."""
    tools = _live_tools(n, args, tmp, cleanup)
    pools = {k: t for k, t in tools.items() if k != "accelerate"}
    try:
        _live_memory(n, pools, args, store, tmp, cleanup)
        _live_warm(n, tools, pools, args, store)
        _live_output(n, tools, pools, args, store)
        _live_results(n, pools, args, store)
        # ---- 5. training: the loop in a %%ddp cell and under torchrun at the same time, taking turns
        d = pools.get("ddp")
        if d is not None and "train" not in args.skip:
            for rep in range(args.train_repeats):
                if d.setup_error:
                    store.error(f"train.ratio.n{n}", d.setup_error)
                    continue
                store.measure_rep(f"train.ratio.n{n}", rep, lambda: train_turns(d, n, args, tmp))
    finally:
        for t in tools.values():
            t.stop()


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
    proc = subprocess.Popen(torchrun_argv(n) + [path], env=core.child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        body = train_body(args.backend, blocks, args.train_warmup, "t.device", referee.port, "ddp", getattr(args, "train_log", False))
        ex = d.ok(f"%%ddp\n{body}", timeout=900)
        out, err = proc.communicate(timeout=300)
        thread.join(60)
        if proc.returncode != 0:
            raise RuntimeError(f"torchrun exit {proc.returncode}: {tail(err, 300)}")
        if referee.error:
            raise RuntimeError(referee.error)
    finally:
        referee.abort()
        if proc.poll() is None:
            _killpg(proc)
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


def bare_mem(n: int, store: PeerStore) -> None:
    """RSS and USS of one `python -c "import torch"` process, measured at the same moment as the workers."""
    p = subprocess.Popen([PY, "-c", "import torch, sys; sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=core.child_env(), text=True)
    try:
        p.stdout.readline()
        time.sleep(0.2)
        rss, uss, pss = proc_mem_kib(p.pid)
        store.get(f"mem.bare.rss.n{n}").values.append(rss / 1024)
        store.get(f"mem.bare.uss.n{n}").values.append(uss / 1024)
        store.get(f"mem.bare.pss.n{n}").values.append(pss / 1024)
    finally:
        p.stdin.close()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def kernel_memory(n: int, pools: Dict[str, Tool], args: argparse.Namespace, store: PeerStore, tmp: str, cleanup: Cleanup) -> None:
    """Kernel RSS before and after `--mem-cells` cells (half `1`, half one all_reduce); a plain kernel running `1` as the baseline."""
    cells = args.mem_cells
    plain = Tool(n, args, tmp, cleanup)
    plain.key = "plain"
    try:
        plain.start_kernel()
        plain.ok("1")
        runs = [("plain", plain, ["1"])]
    except Exception as e:
        store.error(f"mem.kernel.plain.before.n{n}", short_error(e))
        runs = []
    for key, t in pools.items():
        if t.setup_error:
            store.error(f"mem.kernel.{key}.before.n{n}", t.setup_error)
            continue
        runs.append((key, t, [t.cell("1"), t.cell("x = torch.ones(1, device=t.device)\ndist.all_reduce(x)")]))
    try:
        for key, t, codes in runs:
            try:
                before = proc_mem_kib(t.k.pid)[0] / 1024
                t0 = time.perf_counter()
                for i in range(cells):
                    t.ok(codes[i % len(codes)], timeout=120)
                    if i % 100 == 99:
                        t.ok("%reset -f out")
                dt = time.perf_counter() - t0
                after = proc_mem_kib(t.k.pid)[0] / 1024
                store.get(f"mem.kernel.{key}.before.n{n}").values.append(before)
                store.get(f"mem.kernel.{key}.after.n{n}").values.append(after)
                store.get(f"mem.kernel.{key}.cells_s.n{n}").values.append(dt)
                log(f"kernel memory {key}: {before:.0f} → {after:.0f} MiB after {cells} cells ({dt:.1f}s)")
            except Exception as e:
                store.error(f"mem.kernel.{key}.before.n{n}", short_error(e))
    finally:
        plain.stop()


def memcpy_baseline(args: argparse.Namespace, store: PeerStore) -> None:
    combos = [(n, s) for n in args.ns for s in args.sizes if n * s <= args.max_total_gib * 1024]
    if not combos:
        return
    argv = [PY, os.path.join(HERE, "bench_core.py"), "--child", "memcpy", "--combos", ";".join(f"{n},{s}" for n, s in combos),
            "--result-repeats", str(args.result_repeats)]
    try:
        code, out, err = run_proc(argv, env=core.child_env(), timeout=600)
        got = [json.loads(line[len("BENCHJSON "):]) for line in out.splitlines() if line.startswith("BENCHJSON ")]
        if not got:
            raise RuntimeError(f"exit {code}: {tail(err, 300)}")
        for combo, times in got[-1]["memcpy"].items():
            n, s = combo.split(",")
            for rep, v in enumerate(times):
                store.get(f"result.memcpy.n{n}.s{s}").values.append(v)
                store.by_rep.setdefault(f"result.memcpy.n{n}.s{s}", {})[rep] = v
        store.notes.append(f"memcpy baseline: one process, torch.get_num_threads() = {got[-1]['threads']}, fresh destination memory")
    except Exception as e:
        for n, s in combos:
            store.error(f"result.memcpy.n{n}.s{s}", short_error(e))


# ====================================================================== tables
def _render_header(args: argparse.Namespace, meta: dict) -> List[str]:
    """The title and the run's circumstances (machine, versions, load)."""
    out: List[str] = []
    out.append("# ddp_magic side by side with the alternatives\n")
    out.append(
        f"{meta['date']} · {meta['machine']} · Python {meta['python']} · torch {meta['torch']} · {args.backend} · "
        f"{meta['versions']} · total {meta['bench_s'] / 60:.1f} min · load average {meta['load_start']:.2f} at start, {meta['load_end']:.2f} at end\n"
    )
    out.append("Every figure: median (min–max) over the repeats; ratios are taken pair by pair (same repeat) and summarised the same way. "
               "A cell with an error shows the tool's own message. How each column is measured: bench/README.md.\n")
    return out


def _render_cold(store: PeerStore, args: argparse.Namespace) -> List[str]:
    """1. Cold start, and each tool's time ÷ %%ddp's."""
    S = store.series.get
    ns = args.ns
    out: List[str] = []
    tools = [t for t in ("ddp", "accelerate", "ipp", "nbd", "torchrun", "spawn", "bare") if t in args.tools]
    out.append(f"## 1. Cold start: first cell → result (s), {args.repeats} repeats ({args.slow_repeats} for ipyparallel and nbdistributed)\n")
    out.append("The same job everywhere: init the process group, `all_reduce(torch.ones(1))`, the result in hand. Notebook tools: a fresh kernel "
               "(start-up not counted), from the first cell (`%load_ext`, `import`, cluster start…) to the result cell going idle. "
               "torchrun, mp.spawn, bare: launch → the last rank printed its result. "
               "nbdistributed: the job cell is sent once every worker has connected (polled from outside); "
               "sent right after `%dist_init`, it is lost (row below).\n")
    out.append("| n | " + " | ".join(LABELS[t] for t in tools) + " | 1 bare `import torch` |")
    out.append("|---|" + "---|" * (len(tools) + 1))
    for n in ns:
        out.append(f"| {n} | " + " | ".join(fmt(S(f"cold.{t}.n{n}")) for t in tools) + f" | {fmt(S('cold.import'))} |")
    out.append("")
    peers = [t for t in tools if t != "ddp"]
    if "ddp" in tools and peers:
        out.append("Each tool's time ÷ %%ddp's, pair by pair (same repeat); > 1× means %%ddp is faster:\n")
        out.append("| n | " + " | ".join(LABELS[t] for t in peers) + " |")
        out.append("|---|" + "---|" * len(peers))
        for n in ns:
            out.append(f"| {n} | " + " | ".join(fmt_ratio(store.ratios(f"cold.{t}.n{n}", f"cold.ddp.n{n}")) for t in peers) + " |")
        out.append("")
    typed = [(n, S(f"cold.nbd_as_typed.n{n}")) for n in ns if S(f"cold.nbd_as_typed.n{n}")]
    for n, s in typed:
        out.append(f"nbdistributed as typed (`%dist_init -n {n}` then the job cell at once): {fmt(s)}\n")
    return out


def _render_warm(store: PeerStore, args: argparse.Namespace) -> List[str]:
    """2. Warm cell round trips, ratios to %%ddp and its overhead over a plain cell."""
    S = store.series.get
    ns = args.ns
    out: List[str] = []
    pools = [t for t in ("ddp", "ipp", "nbd") if t in args.tools]
    out.append(f"## 2. Warm cell round trip on a live pool (ms), {args.warm_repeats} interleaved repeats\n")
    out.append("Execute request → idle on the client. `1`: a trivial cell, its value shown from every rank; all_reduce: "
               "`x = torch.ones(1); dist.all_reduce(x)`. Plain cell: `1` in the %%ddp kernel (Jupyter's own round trip). "
               "%%ddp cells run with `--no-widget`, like the peers, which show no status view; what the default status view "
               "adds to a cell is measured in `bench/bench_core.py` section 3. "
               "accelerate keeps nothing between cells: each cell is a fresh `notebook_launcher` run of the cold-start job (s, not ms).\n")
    hdr = ["plain cell"] + [f"{LABELS[t]} {w}" for t in pools for w in ("`1`", "all_reduce")]
    if "accelerate" in args.tools:
        hdr.append("accelerate re-run (s)")
    out.append("| n | " + " | ".join(hdr) + " |")
    out.append("|---|" + "---|" * len(hdr))
    for n in ns:
        row = [fmt(S(f"warm.plain.n{n}"), 1e3, 1)] + [fmt(S(f"warm.{t}.{w}.n{n}"), 1e3, 1) for t in pools for w in ("trivial", "allreduce")]
        if "accelerate" in args.tools:
            row.append(fmt(S(f"warm.accelerate.relaunch.n{n}")))
        out.append(f"| {n} | " + " | ".join(row) + " |")
    out.append("")
    if "ddp" in pools and len(pools) > 1:
        others = [t for t in pools if t != "ddp"]
        out.append("all_reduce cell: each tool's time ÷ %%ddp's, pair by pair; %%ddp overhead over the plain cell (ms, pair by pair):\n")
        out.append("| n | " + " | ".join(f"{LABELS[t]} ÷ %%ddp" for t in others) + " | %%ddp `1` − plain | %%ddp all_reduce − plain |")
        out.append("|---|" + "---|" * (len(others) + 2))
        for n in ns:
            cells = [fmt_ratio(store.ratios(f"warm.{t}.allreduce.n{n}", f"warm.ddp.allreduce.n{n}"), 1) for t in others]
            for w in ("trivial", "allreduce"):
                a, b = store.by_rep.get(f"warm.ddp.{w}.n{n}", {}), store.by_rep.get(f"warm.plain.n{n}", {})
                diffs = [1e3 * (a[r] - b[r]) for r in sorted(set(a) & set(b))]
                cells.append(f"{statistics.median(diffs):.1f} ({min(diffs):.1f}–{max(diffs):.1f})" if diffs else "—")
            out.append(f"| {n} | " + " | ".join(cells) + " |")
        out.append("")
    return out


def _render_results(store: PeerStore, args: argparse.Namespace) -> List[str]:
    """3. Result return against memcpy and ipyparallel's pull."""
    S = store.series.get
    ns = args.ns
    out: List[str] = []
    out.append(f"## 3. Result return: every rank's float32 tensor into the notebook, {args.result_repeats} repeats\n")
    out.append("%%ddp: the cell `t` (its `RankResults` shown). ipyparallel: `dv.pull('t')` (the pull cell alone). memcpy: "
               "`torch.empty_like(x).copy_(x)` of the same n × size bytes in one process, the physical limit. MB/s = n × size / s (MB = 10^6 B); "
               "× memcpy = the tool's time ÷ memcpy's, pair by pair.\n")
    out.append("| n | size/rank | total | %%ddp s | %%ddp MB/s | ipyparallel pull s | ipyparallel MB/s | memcpy MB/s "
               "| %%ddp × memcpy | ipyparallel × memcpy | ipyparallel ÷ %%ddp |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in ns:
        for size in args.sizes:
            tot_mib = n * size
            tot = f"{tot_mib / 1024:.2f} GiB" if tot_mib >= 1024 else f"{tot_mib} MiB"
            if tot_mib > args.max_total_gib * 1024:
                out.append(f"| {n} | {size} MiB | {tot} | skipped: total > --max-total-gib {args.max_total_gib:g} |" + " |" * 7)
                continue
            nbytes = tot_mib * MIB / 1e6
            d, i, m = (S(f"result.{w}.n{n}.s{size}") for w in ("ddp", "ipp", "memcpy"))
            out.append(
                f"| {n} | {size} MiB | {tot} | {fmt(d, digits=3)} | {fmt(d, digits=0, invert=nbytes)} | {fmt(i, digits=3)} | {fmt(i, digits=0, invert=nbytes)} "
                f"| {fmt(m, digits=0, invert=nbytes)} | {fmt_ratio(store.ratios(f'result.ddp.n{n}.s{size}', f'result.memcpy.n{n}.s{size}'), 1)} "
                f"| {fmt_ratio(store.ratios(f'result.ipp.n{n}.s{size}', f'result.memcpy.n{n}.s{size}'), 1)} "
                f"| {fmt_ratio(store.ratios(f'result.ipp.n{n}.s{size}', f'result.ddp.n{n}.s{size}'), 1)} |"
            )
    out.append("")
    return out


def _render_output(store: PeerStore, args: argparse.Namespace) -> List[str]:
    """4. Output latency and the 100,000-line cell."""
    S = store.series.get
    ns = args.ns
    out: List[str] = []
    pools = [t for t in ("ddp", "ipp", "nbd") if t in args.tools]
    out.append("## 4. Output\n")
    out.append(f"**Latency** (ms): every rank prints {args.lat_lines} lines `print(f'LAT {{rank}} {{time.time()!r}}')` 50 ms apart (plain `print`, no flush); "
               "latency = arrival of the line's output message at the notebook client − the timestamp printed. Median per cell, then median (min–max) "
               f"over {args.out_repeats} cells. **100,000 lines** (s): the cell `for i in range(100000 // n): print(i)` on every rank, "
               f"so {args.lines:,} lines reach the notebook whatever n; execute → idle, {args.lines_repeats} repeats. "
               "Plain: the same cell in the %%ddp kernel, not distributed.\n")
    hdr = ["plain cell"] + [LABELS[t] for t in pools]
    out.append("| n | " + " | ".join(f"latency: {h}" for h in hdr) + " | " + " | ".join(f"100k lines: {h}" for h in hdr) + " |")
    out.append("|---|" + "---|" * (2 * len(hdr)))
    for n in ns:
        out.append(f"| {n} | " + " | ".join(fmt(S(f"out.lat.{t}.n{n}"), 1e3, 0) for t in ["plain"] + pools) + " | "
                   + " | ".join(fmt_lines(S(f"out.lines.{t}.n{n}")) for t in ["plain"] + pools) + " |")
    out.append("")
    return out


def _render_training(store: PeerStore, args: argparse.Namespace) -> List[str]:
    """5. Training turns: %%ddp against torchrun."""
    S = store.series.get
    ns = args.ns
    out: List[str] = []
    if "train" not in args.skip:
        blocks = max(2, args.train_steps // TRAIN_BLOCK)
        out.append(f"## 5. Training overhead: the same DDP loop in a %%ddp cell and under torchrun, taking turns; {args.train_repeats} runs\n")
        out.append(f"MLP 256→512→256, batch 64 per rank, SGD; {args.train_warmup} warm-up steps, then {blocks * TRAIN_BLOCK} timed steps. "
                   "The `%%ddp` cell (status view on, as a user has it) and the `torchrun --standalone` script run at the same time and take "
                   f"strict turns of {TRAIN_BLOCK} steps (%%ddp, torchrun, %%ddp, …), so each pair of turns sees the machine in the same state; "
                   "each turn starts with one untimed step and prints one loss line per rank (forwarded live to the notebook for %%ddp). "
                   f"A turn's time is the slowest rank's. Steps/s = {TRAIN_BLOCK} ÷ the median turn's time; a run's ratio = the median over its "
                   f"{blocks} turn pairs of torchrun's turn time ÷ %%ddp's (= %%ddp steps/s ÷ torchrun steps/s); the table shows the median over "
                   "the runs (min–max) and the middle half of the turn pairs. The goal is ≥ 0.97.\n")
        out.append("| n | %%ddp steps/s | torchrun steps/s | ratio | middle half of the turn pairs | ≥ 0.97 |")
        out.append("|---|---|---|---|---|---|")
        for n in ns:
            rs = S(f"train.ratio.n{n}")
            r = rs.values if rs else []
            spread = "—"
            infos = [i for i in (rs.info if rs else []) if isinstance(i, dict) and "q1" in i]
            rates = {tool: core.Series() for tool in ("ddp", "torchrun")}  # each tool's steps/s, from the same turns
            for i in infos:
                for tool, series in rates.items():
                    series.values.append(i[f"{tool}_rate"])
            if infos:
                spread = f"{statistics.median(i['q1'] for i in infos):.3f}–{statistics.median(i['q3'] for i in infos):.3f}"
            verdict = "—" if not r else ("yes" if statistics.median(r) >= 0.97 else "**no**")
            out.append(f"| {n} | {fmt(rates['ddp'], digits=1)} | {fmt(rates['torchrun'], digits=1)} | "
                       f"{fmt_ratio(r, 3) if r else fmt(rs)} | {spread} | {verdict} |")
        out.append("")
    return out


def _render_memory(store: PeerStore, args: argparse.Namespace) -> List[str]:
    """6. Kernel RSS after many cells; each worker's and the whole pool's memory."""
    S = store.series.get
    ns = args.ns
    out: List[str] = []
    pools = [t for t in ("ddp", "ipp", "nbd") if t in args.tools]
    out.append("## 6. Memory (MiB)\n")
    mn = args.mem_n
    out.append(f"**Kernel RSS after {args.mem_cells} cells** (n = {mn}; the cells alternate `1` and one all_reduce; `%reset -f out` every 100). "
               "Before: after the pool is up and one all_reduce has run. Plain: a fresh kernel running `1`.\n")
    out.append("| kernel | RSS before | RSS after | growth | per cell (KiB) | time for the cells (s) |")
    out.append("|---|---|---|---|---|---|")
    for key in ["plain"] + pools:
        b, a, c = S(f"mem.kernel.{key}.before.n{mn}"), S(f"mem.kernel.{key}.after.n{mn}"), S(f"mem.kernel.{key}.cells_s.n{mn}")
        name = "plain" if key == "plain" else LABELS[key]
        if b is not None and b.values and a is not None and a.values:
            g = a.values[0] - b.values[0]
            out.append(f"| {name} | {b.values[0]:.0f} | {a.values[0]:.0f} | {g:+.1f} | {1024 * g / args.mem_cells:+.1f} | {fmt(c, digits=1)} |")
        elif b is not None:
            out.append(f"| {name} | {fmt(b)} | | | | |")
    out.append("")
    out.append("**Each worker** after the job ran (torch imported, process group up), medians over the workers of one pool: RSS, and "
               "USS (its private pages, what one more rank costs; a rank forked from ddp_magic's template shares torch's pages with it, so its RSS "
               "undercounts and its USS is small). Bare: one `python -c \"import torch\"` process measured at the same moment; "
               "RSS − bare is what the issue asks, USS − bare USS the marginal cost. Helpers: ddp_magic's template, ipyparallel's controller. "
               "**Pool Σ PSS**: every rank and helper, each shared page divided among the processes that map it: what the whole pool costs "
               "(pages shared with processes outside the pool, e.g. libtorch's code, are split with them too).\n")
    hdr = [f"{LABELS[t]} worker RSS / USS (− bare)" for t in pools] + ["%%ddp template RSS / USS", "ipyparallel controller RSS / USS",
                                                                       "bare `import torch` RSS / USS"]
    hdr += [f"{LABELS[t]} pool Σ PSS" for t in pools]
    out.append("| n | " + " | ".join(hdr) + " |")
    out.append("|---|" + "---|" * len(hdr))

    for n in ns:
        br, bu = S(f"mem.bare.rss.n{n}"), S(f"mem.bare.uss.n{n}")
        bare = (br.values[0], bu.values[0]) if br is not None and br.values and bu is not None and bu.values else None
        cells = [ru_n(S, t, "rank", n, bare) for t in pools] + [ru_n(S, "ddp", "helper", n), ru_n(S, "ipp", "helper", n)]
        cells.append(f"{bare[0]:.0f} / {bare[1]:.0f}" if bare else "—")
        for t in pools:
            tot = sum(sum(S(f"mem.{t}.{role}.pss.n{n}").values) for role in ("rank", "helper") if S(f"mem.{t}.{role}.pss.n{n}") is not None)
            cells.append(f"{tot:.0f}" if tot else fmt(S(f"mem.{t}.rank.rss.n{n}")))
        out.append(f"| {n} | " + " | ".join(cells) + " |")
    out.append("")
    return out


def _render_notes(store: PeerStore, args: argparse.Namespace) -> List[str]:
    """Per-phase breakdowns and the store's notes."""
    S = store.series.get
    ns = args.ns
    out: List[str] = []
    notes = []
    for n in ns:
        for kind in ("torchrun", "spawn", "bare"):
            s = S(f"cold.{kind}.n{n}")
            ex = [i["exit_s"] for i in (s.info if s else []) if isinstance(i, dict) and "exit_s" in i]
            if ex:
                notes.append(f"{LABELS[kind]} n={n}: launch → every process exited, median {statistics.median(ex):.2f}s")
    for n in ns:
        s = S(f"cold.ipp.n{n}")
        cells = [i["cells"] for i in (s.info if s else []) if isinstance(i, dict) and "cells" in i]
        if cells:
            notes.append(f"ipyparallel n={n}: cluster start cell {statistics.median(c[0] for c in cells):.2f}s, "
                         f"then the `%%px` job cell {statistics.median(c[-1] for c in cells):.2f}s (medians)")
        s = S(f"cold.ddp.n{n}")
        cells = [i["cells"] for i in (s.info if s else []) if isinstance(i, dict) and "cells" in i]
        s = S(f"train.ratio.n{n}")
        cs = [i["cell_s"] for i in (s.info if s else []) if isinstance(i, dict) and "cell_s" in i]
        if cs:
            notes.append(f"training n={n}: the %%ddp cell of a turn-taking run took {statistics.median(cs):.2f}s end to end (median)")
    notes += store.notes
    if notes:
        out.append("## Notes\n")
        out += [f"- {_cell_text(x)}" for x in notes]
        out.append("")
    return out


def render(store: PeerStore, args: argparse.Namespace, meta: dict) -> str:
    """The markdown report: header, sections 1-6, notes."""
    out = _render_header(args, meta) + _render_cold(store, args) + _render_warm(store, args) + _render_results(store, args)
    out += _render_output(store, args) + _render_training(store, args) + _render_memory(store, args) + _render_notes(store, args)
    return "\n".join(out)


def fmt_lines(s: Optional[Any]) -> str:
    """Seconds, and how many lines the notebook actually got when some were lost."""
    text = fmt(s)
    info = [i for i in (s.info if s is not None else []) if isinstance(i, dict) and "shown" in i]
    short = [i for i in info if i["shown"] < i["want"]]
    if short:
        worst = min(short, key=lambda i: i["shown"])
        text += f" — lines lost in {len(short)} of {len(info)} runs, as few as {worst['shown']:,} of {worst['want']:,} shown"
    return _cell_text(text)


def ru_n(S: Callable, tool: str, role: str, n: int, bare: Optional[Tuple[float, float]] = None) -> str:
    """'RSS / USS' in MiB (medians over the processes), with the difference from a bare `import torch` process when given."""
    r, u = S(f"mem.{tool}.{role}.rss.n{n}"), S(f"mem.{tool}.{role}.uss.n{n}")
    if r is None or not r.values:
        return fmt(r)
    rm, um = statistics.median(r.values), statistics.median(u.values)
    return f"{rm:.0f} / {um:.0f}" + (f" ({rm - bare[0]:+.0f} / {um - bare[1]:+.0f})" if bare else "")


# ====================================================================== plots
def _plain_log_labels(ax: Any) -> None:
    """Log axes labelled 0.2, 0.5, 1, 2, 5, 10, not 2×10⁻¹."""
    import math

    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if v > 0 and round(v / 10 ** math.floor(math.log10(v))) in (2, 5) else ""))


class _Plotter:
    """The figures of one run, each a PNG next to the report; `written` lists their paths."""

    def __init__(self, store: PeerStore, args: argparse.Namespace, meta: dict, out_prefix: str) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        self.plt = plt
        self.store, self.args, self.out_prefix = store, args, out_prefix
        self.S = store.series.get
        self.ns = args.ns
        self.written: List[str] = []
        self.sub = f"{meta['date']} · {meta['machine_short']} · {args.backend}"

    def series_line(self, ax: Any, key_fmt: str, label: str, color: str, scale: float = 1.0,
                    invert: Optional[Callable[[int], float]] = None, style: str = "-o") -> None:
        xs, ys, lo, hi = [], [], [], []
        for n in self.ns:
            s = self.S(key_fmt.format(n=n))
            if s is None or not s.values:
                continue
            vals = [(invert(n) / v) if invert else v * scale for v in s.values]
            m = statistics.median(vals)
            xs.append(n)
            ys.append(m)
            lo.append(m - min(vals))
            hi.append(max(vals) - m)
        if xs:
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt=style, color=color, label=label, capsize=3, ms=4, lw=1.5)

    def axes_n(self, ax: Any, logy: bool = True) -> None:
        """x: ranks on a log2 scale labelled by n; y: log with plain labels unless told otherwise."""
        ax.set_xscale("log", base=2)
        ax.set_xticks(self.ns)
        ax.set_xticklabels([str(n) for n in self.ns])
        if logy:
            ax.set_yscale("log")
            _plain_log_labels(ax)

    def save(self, fig: Any, name: str) -> None:
        fig.text(0.99, 0.01, self.sub, ha="right", va="bottom", fontsize=6, color="#666")
        fig.tight_layout()
        path = f"{self.out_prefix}_{name}.png"
        fig.savefig(path, dpi=90)
        self.plt.close(fig)
        self.written.append(path)

    def finish(self, fig: Any, ax: Any, title: str, ylabel: str, name: str, logy: bool = True) -> None:
        self.axes_n(ax, logy)
        ax.set_xlabel("ranks (n)")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.tick_params(labelsize=7, which="both")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        self.save(fig, name)

    def cold_start(self) -> None:
        fig, ax = self.plt.subplots(figsize=(7.6, 3.6))
        for t in ("ddp", "accelerate", "ipp", "nbd", "torchrun", "spawn", "bare"):
            if t in self.args.tools:
                self.series_line(ax, f"cold.{t}.n{{n}}", LABELS[t], COLORS[t], style="--o" if t == "bare" else "-o")
        self.finish(fig, ax, "Cold start: first cell → result (lower is better)", "seconds", "cold_start")

    def warm(self) -> None:
        fig, ax = self.plt.subplots(figsize=(7.6, 3.6))
        self.series_line(ax, "warm.plain.n{n}", "plain cell (Jupyter)", COLORS["plain"], 1e3, style="--o")
        for t in ("ddp", "ipp", "nbd"):
            if t in self.args.tools:
                self.series_line(ax, f"warm.{t}.allreduce.n{{n}}", f"{LABELS[t]} all_reduce cell", COLORS[t], 1e3)
                self.series_line(ax, f"warm.{t}.trivial.n{{n}}", f"{LABELS[t]} `1`", COLORS[t], 1e3, style=":s")
        if "accelerate" in self.args.tools:
            self.series_line(ax, "warm.accelerate.relaunch.n{n}", "accelerate re-run", COLORS["accelerate"], 1e3)
        self.finish(fig, ax, "Warm cell round trip on a live pool (lower is better)", "milliseconds", "warm")

    def result(self) -> None:
        fig, ax = self.plt.subplots(figsize=(7.6, 3.6))
        styles = {s: st for s, st in zip(sorted(self.args.sizes, reverse=True), ["-o", "--s", ":^"])}
        for size in self.args.sizes:
            def inv(n: int, size: int = size) -> float:
                return n * size * MIB / 1e6

            self.series_line(ax, f"result.ddp.n{{n}}.s{size}", f"%%ddp {size} MiB/rank", COLORS["ddp"], invert=inv, style=styles[size])
            self.series_line(ax, f"result.ipp.n{{n}}.s{size}", f"ipyparallel pull {size} MiB/rank", COLORS["ipp"], invert=inv, style=styles[size])
            self.series_line(ax, f"result.memcpy.n{{n}}.s{size}", f"memcpy {size} MiB/rank", COLORS["memcpy"], invert=inv, style=styles[size])
        self.finish(fig, ax, "Result return into the notebook (higher is better)", "MB/s", "result")

    def output(self) -> None:
        fig, axs = self.plt.subplots(1, 2, figsize=(8, 3.6))
        panels = ((axs[0], "lat", 1e3, "print → notebook latency", "milliseconds"),
                  (axs[1], "lines", 1.0, f"a cell printing {self.args.lines:,} lines", "seconds"))
        for ax, what, scale, title, unit in panels:
            self.series_line(ax, f"out.{what}.plain.n{{n}}", "plain cell", COLORS["plain"], scale, style="--o")
            for t in ("ddp", "ipp", "nbd"):
                if t in self.args.tools:
                    self.series_line(ax, f"out.{what}.{t}.n{{n}}", LABELS[t], COLORS[t], scale)
            self.axes_n(ax)
            ax.tick_params(labelsize=7, which="both")
            ax.set_xlabel("ranks (n)")
            ax.set_ylabel(unit)
            ax.set_title(title + " (lower is better)", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        self.save(fig, "output")

    def training(self) -> None:
        fig, ax = self.plt.subplots(figsize=(7.6, 3.2))
        xs, ys, lo, hi = [], [], [], []
        for n in self.ns:
            r = self.store.series[f"train.ratio.n{n}"].values if f"train.ratio.n{n}" in self.store.series else []
            if r:
                m = statistics.median(r)
                xs.append(n)
                ys.append(m)
                lo.append(m - min(r))
                hi.append(max(r) - m)
        if xs:
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt="-o", color=COLORS["ddp"], capsize=3, ms=4, label="%%ddp ÷ torchrun steps/s (turn pairs; runs min–max)")
        ax.axhline(0.97, color="#999", ls="--", lw=1, label="0.97")
        ax.axhline(1.0, color="#ccc", ls=":", lw=1)
        self.finish(fig, ax, "Training loop: %%ddp cell vs torchrun script (higher is better)", "steps/s ratio", "training", logy=False)


def plots(store: PeerStore, args: argparse.Namespace, meta: dict, out_prefix: str) -> List[str]:
    """The PNGs of docs/bench/: cold start, warm cell, result return, output, training; returns their paths."""
    p = _Plotter(store, args, meta, out_prefix)
    p.cold_start()
    p.warm()
    p.result()
    p.output()
    if "train" not in args.skip:
        p.training()
    return p.written


# ====================================================================== docs/bench
def publish(md: str, pngs: List[str]) -> None:
    """Copy the report and its plots to docs/bench/ (README.md links there; nothing here edits it)."""
    os.makedirs(DOCS_DIR, exist_ok=True)
    with open(os.path.join(DOCS_DIR, "peers.md"), "w") as f:
        f.write(md + "\n")
    for p in pngs:
        shutil.copy(p, os.path.join(DOCS_DIR, os.path.basename(p)))
    log(f"published {DOCS_DIR}/peers.md and {len(pngs)} plots")


# ====================================================================== main
def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="n = 1,2 and fewer repeats (under 4 minutes)")
    p.add_argument("--ns", help="rank counts (default 1,2,4,8; --quick 1,2)")
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl"], help="gloo (CPU) or nccl (one GPU per rank)")
    p.add_argument("--tools", default="ddp,accelerate,ipp,nbd,torchrun,spawn,bare", help="which tools (default all)")
    p.add_argument("--repeats", type=int, help="cold-start repeats (default 3; --quick 1)")
    p.add_argument("--slow-repeats", type=int, help="cold-start repeats of ipyparallel and nbdistributed, the slow ones (default 2; --quick 1)")
    p.add_argument("--warm-repeats", type=int, help="warm round trips per cell (default 20; --quick 10)")
    p.add_argument("--acc-repeats", type=int, help="accelerate re-runs on a warm kernel (default 3; --quick 2)")
    p.add_argument("--result-repeats", type=int, help="result returns per size (default 3; --quick 2)")
    p.add_argument("--sizes", help="MiB per rank returned (default 1,64,256; --quick 1,64)")
    p.add_argument("--max-total-gib", type=float, default=3.0, help="skip result sizes whose n × size is larger (default 3)")
    p.add_argument("--ipp-max-total-mib", type=int, default=2048, help="ipyparallel pulls at most this many MiB in all (default 2048)")
    p.add_argument("--out-repeats", type=int, help="latency cells per tool (default 4; --quick 2)")
    p.add_argument("--lat-lines", type=int, default=10, help="timestamped lines per rank per latency cell (default 10)")
    p.add_argument("--lines", type=int, default=100_000, help="lines printed by the big-output cell, split over the ranks (default 100000)")
    p.add_argument("--lines-repeats", type=int, help="big-output cells per tool (default 2; --quick 1)")
    p.add_argument("--train-steps", type=int, help=f"timed training steps, taken in turns of {TRAIN_BLOCK} (default 1000; --quick 200)")
    p.add_argument("--train-warmup", type=int, default=20)
    p.add_argument("--train-log", action="store_true", help="the %%ddp side calls ddp_magic.log(step, loss) every step (its cost)")
    p.add_argument("--train-repeats", type=int, help="training runs, each a pair of jobs taking turns (default 3; --quick 2)")
    p.add_argument("--mem-n", type=int, help="n at which the kernel runs --mem-cells cells (default 2)")
    p.add_argument("--mem-cells", type=int, help="cells the kernels run for the memory figure (default 500; --quick 100)")
    p.add_argument("--skip", default="", help="sections to skip: cold,live,train,memcpy")
    p.add_argument("--nbd-no-wait", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=os.path.join(RESULTS_DIR, "peers"), help="output path without extension (default bench/results/peers)")
    p.add_argument("--publish", action="store_true", help="copy the table and plots to docs/bench/ (README.md is never edited)")
    p.add_argument("--publish-only", action="store_true", help="publish the last run's results (--out) without running anything")
    a = p.parse_args(argv)
    q = a.quick
    a.ns = [int(x) for x in (a.ns or ("1,2" if q else "1,2,4,8")).split(",") if x.strip()]
    a.tools = [t.strip() for t in a.tools.split(",") if t.strip()]
    for name, full, quick in (("repeats", 3, 1), ("slow_repeats", 2, 1), ("warm_repeats", 20, 10), ("acc_repeats", 3, 2), ("result_repeats", 3, 2),
                              ("out_repeats", 4, 2), ("lines_repeats", 2, 1), ("train_repeats", 3, 2), ("mem_n", 2, 2), ("mem_cells", 500, 100),
                              ("train_steps", 1000, 200)):
        if getattr(a, name) is None:
            setattr(a, name, quick if q else full)
    a.sizes = [int(x) for x in (a.sizes or ("1,64" if q else "1,64,256")).split(",") if x.strip()]
    a.skip = {x.strip() for x in a.skip.split(",") if x.strip()}
    return a


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for dist in ("accelerate", "ipyparallel", "nbdistributed", "ipykernel", "jupyter_client"):
        try:
            out.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            out.append(f"{dist} not installed")
    try:
        import ddp_magic

        out.insert(0, f"ddp_magic {ddp_magic.__version__} (working tree)")
    except Exception as e:
        out.insert(0, f"ddp_magic: {short_error(e)}")
    return ", ".join(out)


def machine() -> Tuple[str, str]:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    cpus = cpu_count()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    return f"{cpus} CPU cores ({model}), {mem:.0f} GiB RAM, Linux {platform.release()}", f"{cpus} cores, {mem:.0f} GiB"


def watched_processes() -> Dict[int, str]:
    try:
        out = subprocess.run(["pgrep", "-af", "ddp_magic|ipengine|ipcontroller|ipyparallel|nbdistributed|ipykernel_launcher|torchrun|torch.distributed.run"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    rows = {}
    for line in out.splitlines():
        pid, _, cmd = line.partition(" ")
        if pid.isdigit() and int(pid) != os.getpid():
            rows[int(pid)] = cmd
    return rows


def _publish_last(args: argparse.Namespace) -> int:
    """--publish-only: the last run's report and plots (--out) to docs/bench/, nothing run."""
    with open(args.out + ".md") as f:
        md = f.read().rstrip()
    prefix = os.path.basename(args.out) + "_"
    folder = os.path.dirname(args.out)
    publish(md, sorted(os.path.join(folder, x) for x in os.listdir(folder) if x.startswith(prefix) and x.endswith(".png")))
    return 0


def _warm_imports() -> str:
    """Page cache: the first torch import after boot reads from disk; nobody should pay for it. Returns torch's version."""
    try:
        run_proc([PY, "-c", "import torch, torch.distributed, torch.nn.parallel, cloudpickle, ddp_magic.procs.worker, ipyparallel, accelerate, "
                  "nbdistributed, ipykernel"], env=core.child_env())
    except Exception as e:
        log(f"warm-up import failed: {short_error(e)}")
    _, tv, _ = run_proc([PY, "-c", "import torch; print(torch.__version__)"], env=core.child_env())
    return tv.strip()


def _run_sections(args: argparse.Namespace, store: PeerStore, tmp: str, cleanup: Cleanup, paths: Dict[str, str]) -> None:
    """Cold starts (interleaved over repeats, n and tools), the live pools per n, then the memcpy baseline."""
    if "cold" not in args.skip:
        for rep in range(args.repeats):
            log(f"cold start, repeat {rep + 1}/{args.repeats}")
            cold_import(rep, store)
            for n in args.ns:
                for key in ("ddp", "accelerate", "ipp", "nbd"):
                    if key in args.tools and (key not in SLOW or rep < args.slow_repeats):
                        cold_kernel_tool(key, n, rep, args, store, tmp, cleanup)
                for kind in ("torchrun", "spawn"):
                    if kind in args.tools:
                        cold_script(kind, n, rep, args, store, paths)
                if "bare" in args.tools:
                    cold_bare(n, rep, args, store)
        if "nbd" in args.tools and not args.quick:
            n2 = min([n for n in args.ns if n >= 2] or args.ns)
            log(f"nbdistributed as typed, n={n2}")
            nbd_as_typed(n2, args, store, tmp, cleanup)
    if "live" not in args.skip:
        for n in args.ns:
            log(f"live pools n={n}")
            live_phase(n, args, store, tmp, cleanup)
    if "memcpy" not in args.skip:
        log("memcpy baseline")
        memcpy_baseline(args, store)


def _new_processes(before: Dict[int, str], store: PeerStore) -> Dict[int, str]:
    """Processes of this interpreter that were not there at the start (noted in the report either way)."""
    time.sleep(0.5)
    new = {p: c for p, c in watched_processes().items() if p not in before and sys.prefix in c}
    if new:
        store.notes.append("WARNING: `pgrep -af` shows processes of this interpreter that were not there at the start: "
                           + "; ".join(f"{p} {c[:80]}" for p, c in new.items()))
    else:
        store.notes.append("Clean-up: every process this run started was gone at the end "
                           f"(checked by pid, and `pgrep -af` shows no new process of {sys.prefix}).")
    return new


def _meta(args: argparse.Namespace, torch_version: str, t_start: float, load_start: float) -> dict:
    mach, mach_short = machine()
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": mach,
        "machine_short": mach_short,
        "python": platform.python_version(),
        "torch": torch_version,
        "backend": args.backend,
        "versions": versions(),
        "bench_s": time.monotonic() - t_start,
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
        "args": {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(args).items()},
    }


def main() -> int:
    args = parse_args()
    if args.publish_only:
        return _publish_last(args)
    t_start = time.monotonic()
    load_start = os.getloadavg()[0]
    store = PeerStore()
    cleanup = Cleanup(store)
    before = watched_processes()
    os.makedirs(RESULTS_DIR, exist_ok=True)
    ensure_kernelspec()
    log(f"ns={args.ns} tools={args.tools} backend={args.backend} cold repeats={args.repeats} warm={args.warm_repeats} sizes={args.sizes}")
    torch_version = _warm_imports()
    tmp = tempfile.mkdtemp(prefix="ddp_bench_peers_")
    paths = {"job": os.path.join(tmp, "job.py"), "spawn": os.path.join(tmp, "spawn_job.py")}
    with open(paths["job"], "w") as f:
        f.write(script_job(args.backend))
    with open(paths["spawn"], "w") as f:
        f.write(SPAWN_JOB)
    try:
        _run_sections(args, store, tmp, cleanup, paths)
    except KeyboardInterrupt:
        store.notes.append("interrupted by the user; the tables are partial")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        left = cleanup.final()
        if left:
            store.notes.append("WARNING: processes this benchmark started were still alive at the end and were killed by pid: " + "; ".join(left))
    new = _new_processes(before, store)
    meta = _meta(args, torch_version, t_start, load_start)
    md = render(store, args, meta)
    core.write_report(args.out, md, {"meta": meta, "series": {k: s.to_dict() for k, s in store.series.items()},
                                     "by_repeat": store.by_rep, "notes": store.notes})
    pngs = []
    try:
        pngs = plots(store, args, meta, args.out)
    except Exception:
        log("plots failed:\n" + traceback.format_exc())
    log(f"wrote {args.out}.md, {args.out}.json and {len(pngs)} plots")
    if args.publish:
        publish(md, pngs)
    if new:
        print("\nWARNING: new processes since the start:\n" + "\n".join(f"  {p} {c}" for p, c in new.items()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
