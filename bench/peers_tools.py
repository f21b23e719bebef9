"""bench_peers.py's notebook tools, one class per peer: how each starts its pool, sends a cell, shows a value, and stops.

%%ddp (``DDP``), ipyparallel ``%%px`` (``IPP``), nbdistributed ``%%distributed`` (``NBD``) and
accelerate's ``notebook_launcher`` (``Accelerate``), each in its own real kernel of this
interpreter (kernels.PeerKernel). Every tool is stopped its own documented way, then its
kernel; every pid seen under it must be gone (processes.Watch). Nothing is stopped by name.
"""
from __future__ import annotations

import argparse
import re
import time
from typing import Dict, List, Optional

import processes as P
from harness import free_port, log, short_error
from jobs import dev_expr
from kernels import PeerKernel

LABELS = {
    "ddp": "%%ddp",
    "accelerate": "accelerate notebook_launcher",
    "ipp": "ipyparallel %%px",
    "nbd": "nbdistributed",
    "torchrun": "torchrun --standalone",
    "spawn": "mp.spawn (script)",
    "bare": "N bare python",
}


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


def all_text(ex: dict) -> str:
    return ex["stdout"] + ex["stderr"] + "".join(ex["results"])


class Tool:
    """One notebook tool in one kernel: start (untimed), cells for each measurement, a check for each, stop."""

    key = ""
    magic = ""  # the cell magic that sends a cell to the ranks

    def __init__(self, n: int, args: argparse.Namespace, tmp: str, cleanup: P.Watch) -> None:
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
            raise RuntimeError(f"{ex['error']} | {P.tail(ex['stderr'] or ex['stdout'], 300)}")
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
        return P.descendants(self.k.pid) if self.k else []

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
        self.cleanup.expect_gone(pids, f"{self.key} n={self.n}", kill=True)
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
            raise RuntimeError(f"unexpected result {text[:200]!r}; stderr: {P.tail(exs[-1]['stderr'], 200)}")

    def cell(self, body: str) -> str:
        return f"%%ddp --no-widget\n{body}"

    def check_trivial(self, ex: dict) -> None:
        if not ex["results"] or ex["results"][-1].count("] 1") != self.n:
            raise RuntimeError(f"unexpected result {ex['results'][-1:]!r} {P.tail(ex['stderr'], 200)!r}")

    def check_noerror(self, ex: dict) -> None:
        if ex["results"]:
            raise RuntimeError(f"unexpected result {ex['results'][-1][:100]!r}")

    def stop_pool(self) -> None:
        self.ok("%ddp stop", timeout=60)

    def worker_pids(self) -> Dict[str, List[int]]:
        desc = self.descendants()
        tmpl = [p for p in desc if "ddp_magic.procs.forkserver" in P.cmdline(p) and P.proc_table().get(p) == self.k.pid]
        ranks = [p for p in desc if P.proc_table().get(p) in tmpl]
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
            raise RuntimeError(f"unexpected result {P.tail(text, 300)!r}")

    def check_trivial(self, ex: dict) -> None:
        outs = [r for r in ex["results"] if re.search(r"Out\[\d+:\d+\]: (\x1b\[0m)?1$", r.strip())]
        if len(outs) != self.n:
            raise RuntimeError(f"unexpected output {P.tail(all_text(ex), 200)!r}")

    def check_noerror(self, ex: dict) -> None:
        if ex["error"] or "Error" in all_text(ex):
            raise RuntimeError(P.tail(all_text(ex), 200))

    def stop_pool(self) -> None:
        self.ok("cluster.stop_cluster_sync()", timeout=120)

    def worker_pids(self) -> Dict[str, List[int]]:
        desc = self.descendants()
        return {"rank": [p for p in desc if "ipyparallel.engine" in P.cmdline(p) or "ipengine" in P.cmdline(p)],
                "helper": [p for p in desc if "ipyparallel.controller" in P.cmdline(p) or "ipcontroller" in P.cmdline(p)]}


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
                    argv = P.cmdline(p).split()
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
            raise RuntimeError(errs[0] if errs else P.tail(text.strip(), 240))

    def check_trivial(self, ex: dict) -> None:
        text = ex["stdout"]
        if "Error" in text or sum(1 for line in text.splitlines() if line.strip() == "1") != self.n:
            raise RuntimeError(P.tail(text.strip(), 200))

    def check_noerror(self, ex: dict) -> None:
        if "Error" in all_text(ex):
            raise RuntimeError(P.tail(all_text(ex).strip(), 200))

    def stop_pool(self) -> None:
        # Not %dist_shutdown / %dist_reset: they run `pkill -f worker.py`, `pkill -9 -f "python.*worker"` and
        # `pkill -f nbdistributed`, machine-wide (other users' processes too). Its own ProcessManager.shutdown()
        # terminates just the workers it started.
        self.ok("%dist_mode --disable", timeout=30)
        self.ok("_m = get_ipython().magics_manager.registry['DistributedMagic']\n"
                "if _m._process_manager is not None:\n    _m._process_manager.shutdown()", timeout=60)

    def worker_pids(self) -> Dict[str, List[int]]:
        return {"rank": [p for p in self.descendants() if "nbdistributed/worker.py" in P.cmdline(p)], "helper": []}


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
            raise RuntimeError(P.tail(text.strip(), 240))


TOOLS = {"ddp": DDP, "ipp": IPP, "nbd": NBD, "accelerate": Accelerate}


SLOW = {"ipp", "nbd"}  # cold start: --slow-repeats of these
