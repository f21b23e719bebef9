#!/usr/bin/env python
"""Snapshots: save, load and heal of a DDP model and its optimizer, side by side with what a user writes by hand. One
run, a printed table.

    .venv/bin/python bench/bench_snapshots.py                     # a 1 GiB model + SGD momentum (1 GiB), n = 4
    .venv/bin/python bench/bench_snapshots.py --mib 256 --n 2 --repeats 2

The state: ``--mib`` MiB of float32 parameters (Linear layers of 64 MiB) wrapped in DDP, and SGD with momentum whose
buffers are as large (one step taken), on every rank of a ``Session``'s pool (the kernel's own code path, no
notebook). Each way in turn, within one repeat, so a slow moment of the machine hits all of them:

- **save**: ``%ddp save`` (``ui.snapshots.save``, the whole cell: the time training is paused); ``%ddp save --bg``
  (the cell: the training's pause; then the wait until its threads have written it); ``torch.save`` of
  ``{"model": ..., "opt": ...}`` on rank 0 then a barrier; DCP written by hand (``dcp.save`` of
  ``get_model_state_dict``/``get_optimizer_state_dict``), each as a cell; the floor: every rank copies its share of
  the replicated state (state bytes ÷ n) into fresh memory at once, the slowest rank's time (and, for scale, its whole
  replica);
- **bytes on disk** of each;
- **load**: into a new pool already started (its start is not the load's): every rank ``torch.load``s rank 0's
  ``torch.save`` file at once (each rank needs the whole replica), the value dropped; then ``%ddp load``. Both from
  the page cache: each is read through once first (the snapshot, the repeat's first write, was partly evicted by the
  4 GiB written after it, and a load that read it from disk was measured against a floor that did not);
- **heal**: rank 1 SIGKILLed between cells; the next cell (``1``) starts it again and heals it (the notice's own
  ``healed in`` time, and the whole cell); against the floor of sending its state once over the control channel
  (a cell whose rank 1 returns its model's and optimizer's state to the kernel, the others None).

Writes bench/results/snapshots.md (docs/bench/snapshots.md holds a run).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "scripts"))
from harness import spread  # noqa: E402

MIB = 1 << 20
SETUP = """import os, time, torch, torch.nn as nn, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
model = DDP(nn.Sequential(*[nn.Linear(4096, 4096, bias=False) for _ in range({layers})]))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
model(torch.ones(2, 4096)).sum().backward()
opt.step()
opt.zero_grad(set_to_none=True)
step = 1
sum(p.numel() for p in model.parameters()) * 4"""
TORCH_SAVE = """if dist.get_rank() == 0:
    torch.save({{"model": model.module.state_dict(), "opt": opt.state_dict()}}, {path!r})
dist.barrier()"""
DCP_SAVE = """dcp.save({{"model": get_model_state_dict(model), "opt": get_optimizer_state_dict(model, opt)}}, checkpoint_id={path!r})"""
MEMCPY = """share = torch.empty({elems}).fill_(1.0)
dist.barrier()
t0 = time.perf_counter()
copy = torch.empty_like(share).copy_(share)
took = time.perf_counter() - t0
del share, copy
took"""
TORCH_LOAD = """t0 = time.perf_counter()
got = torch.load({path!r})
took = time.perf_counter() - t0
del got
took"""
SEND = "(model.module.state_dict(), opt.state_dict()) if dist.get_rank() == 1 else None  # the others' None: nothing gathered"


def timed(fn: Callable[[], object]) -> float:
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def warm(path: str) -> None:
    """Read every file under ``path`` once: the page cache holds it (a 4 GiB repeat of writes evicts the first ones)."""
    files = [os.path.join(r, f) for r, _d, fs in os.walk(path) for f in fs] if os.path.isdir(path) else [path]
    buf = bytearray(8 * MIB)
    for name in files:
        with open(name, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def du(path: str) -> int:
    return int(subprocess.run(["du", "-sb", path], capture_output=True, text=True, check=True).stdout.split()[0])


def ok(result):  # type: ignore[no-untyped-def]
    assert result.ok, (result.outcome.failures, result.outcome.notes)
    return result


class Notices:
    """A listener keeping the pool's notices (the heal's line is one)."""

    def __init__(self) -> None:
        self.said: List[str] = []

    def on_notice(self, text: str) -> None:
        self.said.append(text)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        from ddp_magic.kernel.ranks import Listener

        return getattr(Listener(), name)


class Bench:
    """One session, its pool of n holding the state; each way a method filling ``rows``."""

    def __init__(self, n: int, mib: int, where: str) -> None:
        from ddp_magic.session import CellOptions, Session

        self.n, self.mib, self.where = n, mib, where
        self.Options = CellOptions
        self.s = Session()
        self.rows: Dict[str, List[float]] = {}
        self.state_bytes = 0

    def run(self, code: str, listener=None):  # type: ignore[no-untyped-def]
        return ok(self.s.run(code, {}, self.Options(), listener))

    def add(self, key: str, value: float) -> None:
        self.rows.setdefault(key, []).append(value)

    def setup(self) -> None:
        self.s.start(self.s.spec_for(self.n))
        got = self.run(SETUP.format(layers=max(1, self.mib // 64)))
        self.state_bytes = 2 * int(got.outcome.values[0])  # the parameters and as many momentum bytes

    def fresh(self, name: str) -> str:
        path = os.path.join(self.where, name)
        shutil.rmtree(path, ignore_errors=True)
        return path

    def save_ways(self, rep: int) -> None:
        from ddp_magic.ui import snapshots as ui

        folder = self.fresh("ddp")
        t0 = time.monotonic()
        result, _saved = ui.save(self.s, folder)  # every name the ranks own, as a user types it
        self.add("save.ddp", time.monotonic() - t0)
        ok(result)
        self.add("bytes.ddp", du(folder))
        self.snapshot = folder
        self.save_bg()
        path = self.fresh(f"torch-{rep}.pt")
        self.add("save.torch", timed(lambda: self.run(TORCH_SAVE.format(path=path))))
        self.add("bytes.torch", os.path.getsize(path))
        self.torch_file = path
        path = self.fresh("dcp")
        self.add("save.dcp", timed(lambda: self.run(DCP_SAVE.format(path=path))))
        self.add("bytes.dcp", du(path))
        got = self.run(MEMCPY.format(elems=self.state_bytes // self.n // 4))
        self.add("save.memcpy", max(got.outcome.values))
        got = self.run(MEMCPY.format(elems=self.state_bytes // 4))
        self.add("save.memcpy.all", max(got.outcome.values))

    def save_bg(self) -> None:
        """``%ddp save --bg``: the cell's time is the training's pause; then the wait until the threads have written it."""
        from ddp_magic.kernel.snapshots import WRITTEN_SOURCE
        from ddp_magic.ui import snapshots as ui

        folder = self.fresh("ddp-bg")
        t0 = time.monotonic()
        result, saved = ui.save(self.s, folder, background=True)
        self.add("save.bg", time.monotonic() - t0)
        ok(result)
        assert saved is not None and saved.report.get("background"), saved
        self.add("save.bg.ranks", saved.report["paused"])
        self.add("save.bg.written", timed(lambda: self.run(WRITTEN_SOURCE)))
        assert self.s.pool is not None
        self.s.pool.recovery.writing = None  # waited for here
        self.add("bytes.bg", du(folder))

    def load_ways(self) -> None:
        from ddp_magic.ui import snapshots as ui

        self.s.stop()  # both loads into a new pool, one after the other: two copies of the state a rank at most
        self.add("load.start", timed(lambda: self.s.start(self.s.spec_for(self.n))))
        self.run("import time, torch")
        warm(self.torch_file)  # both from the page cache, as just written (the snapshot was the repeat's first write)
        warm(self.snapshot)
        got = self.run(TORCH_LOAD.format(path=self.torch_file))
        self.add("load.torch", max(got.outcome.values))
        t0 = time.monotonic()
        result, loaded = ui.load(self.s, self.snapshot)
        self.add("load.ddp", time.monotonic() - t0)
        ok(result)
        assert loaded is not None and {"model", "opt"} <= set(loaded.names), loaded

    def heal_ways(self) -> None:
        self.add("heal.send", timed(lambda: self.run(SEND)))
        pool = self.s.pool
        assert pool is not None
        os.kill(pool.pids[1], signal.SIGKILL)
        time.sleep(1)  # the death is seen between cells
        notices = Notices()
        t0 = time.monotonic()
        self.run("1", notices)
        self.add("heal.cell", time.monotonic() - t0)
        said = " ".join(notices.said)
        m = re.search(r"healed in ([\d.]+) (ms|s)", said)
        assert m, said
        self.add("heal.notice", float(m.group(1)) / (1000 if m.group(2) == "ms" else 1))


def report(b: Bench, repeats: int) -> str:
    r, gib = b.rows, b.state_bytes / (1 << 30)
    med = lambda k: statistics.median(r[k])  # noqa: E731
    s = lambda k, unit="s", d=2: spread(r[k], d, f" {unit}")  # noqa: E731
    mb = lambda k: f"{med(k) / MIB:,.0f} MiB"  # noqa: E731
    lines = [
        f"n = {b.n}, gloo on CPUs; state: {b.mib} MiB of DDP parameters + {b.mib} MiB of SGD momentum = {gib:.2f} GiB a rank "
        f"(replicated); median (min–max) of {repeats}",
        "",
        "| | time | ÷ floor | on disk |",
        "|---|---|---|---|",
        f"| floor: every rank copies its share ({b.state_bytes / b.n / MIB:,.0f} MiB) into fresh memory, the slowest | {s('save.memcpy', 's', 3)} | 1.00 | |",
        f"| every rank copies its whole replica ({b.state_bytes / MIB:,.0f} MiB) at once, the slowest | {s('save.memcpy.all', 's', 3)} "
        f"| {med('save.memcpy.all') / med('save.memcpy'):.1f} | |",
        f"| `%ddp save` (sync; training paused the whole time) | {s('save.ddp')} | {med('save.ddp') / med('save.memcpy'):.1f} | {mb('bytes.ddp')} |",
        f"| `%ddp save --bg`: the training's pause (the cell) | {s('save.bg')} | {med('save.bg') / med('save.memcpy'):.1f} | {mb('bytes.bg')} |",
        f"| … of which rank 0's own (fingerprints, its share copied, the names pickled) | {s('save.bg.ranks')} "
        f"| {med('save.bg.ranks') / med('save.memcpy'):.1f} | |",
        f"| … then until the ranks' threads have written it (meta.json, renamed) | {s('save.bg.written')} | | |",
        f"| `torch.save` on rank 0, then a barrier | {s('save.torch')} | {med('save.torch') / med('save.memcpy'):.1f} | {mb('bytes.torch')} |",
        f"| DCP by hand (`dcp.save` of the model's and optimizer's state dicts) | {s('save.dcp')} "
        f"| {med('save.dcp') / med('save.memcpy'):.1f} | {mb('bytes.dcp')} |",
        f"| a new pool's start, before both loads (its template imports DCP and torch._dynamo once, then forks) | {s('load.start')} | | |",
        f"| load floor: every rank `torch.load`s rank 0's file at once, the slowest | {s('load.torch')} | 1.00 | |",
        f"| `%ddp load` into a started pool of {b.n} | {s('load.ddp')} | {med('load.ddp') / med('load.torch'):.2f} | |",
        f"| heal floor: rank 1's model and optimizer state sent to the kernel (a cell) | {s('heal.send')} | 1.00 | |",
        f"| heal of rank 1 (its notice's `healed in`) | {s('heal.notice')} | {med('heal.notice') / med('heal.send'):.2f} | |",
        f"| the next cell after rank 1's SIGKILL (its start again, the group re-formed, the heal) | {s('heal.cell')} | | |",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=1024, help="MiB of parameters (as many again of momentum)")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    where = tempfile.mkdtemp(prefix="bench_snapshots-", dir=os.environ.get("BENCH_DIR", "/var/tmp"))
    b = Bench(a.n, a.mib, where)
    try:
        for rep in range(a.repeats):
            b.setup()
            b.save_ways(rep)
            b.load_ways()
            b.heal_ways()
            b.s.stop()
            print(f"repeat {rep + 1}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in b.rows.items() if not k.startswith("bytes")), flush=True)
    finally:
        b.s.stop()
        shutil.rmtree(where, ignore_errors=True)
    text = report(b, a.repeats)
    print("\n" + text)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "snapshots.md"), "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
