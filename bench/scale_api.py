"""bench_scale.py through the Pool API: what each step costs the kernel process (its CPU, every thread) and how long it takes.

One pool per n, all alive at once, visited in turn inside each repeat (so drift hits
every n alike); simulated ranks (bench/simranks) for the curve, real forked ranks (torch,
gloo) at a few n beside it. Each sample is (wall seconds, {"cpu": kernel CPU seconds, ...}).
"""
from __future__ import annotations

import re
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from harness import MIB, Store, log

REFORMED = re.compile(r"re-formed in ([\d.]+) (ms|s)\b")  # words.fmt_seconds: "17 ms", "1.02 s"


def reform_seconds(text: str) -> Optional[float]:
    """The re-form's duration a failure's note gives, in seconds (None: no such note)."""
    m = REFORMED.search(text)
    return None if m is None else float(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0)

# What each step runs, on simulated ranks and on real ones (rank 1 raises: every other rank waits in all_reduce #3 / its first).
CELLS = {
    "sim": {"trivial": "1", "raise": 'sim.error("ValueError", "boom", ranks=[1])\nsim.collective("all_reduce", 3)', "buffer": "sim.buffer(1 << 20)"},
    "real": {"trivial": "1", "buffer": "torch.ones(1 << 18)",
             "raise": "import torch, torch.distributed as dist\nx = torch.ones(1)\nif dist.get_rank() == 1:\n    raise ValueError('boom')\ndist.all_reduce(x)"},
}


def timed(fn: Callable[[], Any]) -> Tuple[float, float, Any]:
    """(wall, this process's CPU, fn's value): the CPU of every thread of the kernel process (admission included)."""
    c0, t0 = time.process_time(), time.perf_counter()
    got = fn()
    return time.perf_counter() - t0, time.process_time() - c0, got


def make_pool(kind: str, n: int) -> Any:
    """A started pool of n simulated ranks, or of n real ranks forked from a template (imports torch once)."""
    if kind == "sim":
        import simranks

        pool = simranks.sim_pool(n)
    else:
        from ddp_magic.kernel.pool import Pool

        pool = Pool(n, start_method="fork")
    pool.start()
    if kind == "real":
        pool.run("import torch, torch.distributed as dist")
    for step in ("trivial", "buffer"):  # untimed: the first buffer makes this process import numpy (or torch) to unpickle it
        pool.run(CELLS[kind][step])
    return pool


def _ok(out: Any, n: int, what: str) -> None:
    if not out.ok or len(out.values) != n:
        raise RuntimeError(f"{what}: " + "; ".join(f.headline() for f in out.failures[:2]))


def _start(pool: Any, n: int) -> Tuple[float, dict]:
    pool.stop(keep_template=True)
    wall, cpu, _ = timed(pool.start)
    if sorted(pool.hub.conns) != list(range(n)):
        raise RuntimeError(f"{len(pool.hub.conns)} of {n} ranks joined")
    return wall, {"cpu": cpu, "start_seconds": pool.start_seconds}


def _cell(pool: Any, n: int, src: str, check: Callable[[Any], None]) -> Tuple[float, dict]:
    wall, cpu, out = timed(lambda: pool.run(src))
    check(out)
    return wall, {"cpu": cpu}


def _raise(pool: Any, n: int, src: str) -> Tuple[float, dict]:
    """The failing cell: its error, whom it names, the re-form's seconds (from its note); then the next cell must run on every rank."""
    wall, cpu, out = timed(lambda: pool.run(src))
    root = out.failures[0] if out.failures else None
    if root is None or root.rank != 1 or root.type != "ValueError":
        raise RuntimeError(f"the root cause is not rank 1's ValueError: {root.headline() if root else 'no failure'}")
    reform = [x for x in map(reform_seconds, out.notes) if x is not None]
    nxt = pool.run("1")
    _ok(nxt, n, "the cell after the failure")
    return wall, {"cpu": cpu, "reform_s": reform[0] if reform else None, "notes": len(out.notes)}


def steps(kind: str) -> Dict[str, Callable[[Any, int], Tuple[float, dict]]]:
    """step name -> (pool, n) -> one sample; what each checks is arithmetic (every rank's value), not the run's figures."""
    cells = CELLS[kind]

    def trivial(pool: Any, n: int) -> Tuple[float, dict]:
        def check(out: Any) -> None:
            _ok(out, n, "trivial")
            if out.values != [1] * n:
                raise RuntimeError(f"values {out.values[:4]}…")
        return _cell(pool, n, cells["trivial"], check)

    def buffer(pool: Any, n: int) -> Tuple[float, dict]:
        def check(out: Any) -> None:
            _ok(out, n, "buffer")
            if any(int(v.numel() * v.element_size() if hasattr(v, "numel") else v.nbytes) != MIB for v in out.values):
                raise RuntimeError("a result is not 1 MiB")
        return _cell(pool, n, cells["buffer"], check)

    return {"start": _start, "trivial": trivial, "raise": lambda pool, n: _raise(pool, n, cells["raise"]), "buffer": buffer}


def phase(kind: str, ns: List[int], repeats: int, store: Store) -> None:
    """Every step at every n, ``repeats`` times, the n's interleaved inside each repeat; pools stopped at the end."""
    pools: Dict[int, Any] = {}
    try:
        for n in ns:
            t0 = time.perf_counter()
            pools[n] = make_pool(kind, n)
            log(f"{kind} pool n={n} up in {time.perf_counter() - t0:.1f}s")
        for rep in range(repeats):
            for n in ns:
                for name, step in steps(kind).items():
                    store.measure(f"api.{kind}.{name}.n{n}", lambda step=step, n=n: step(pools[n], n), rep, quiet=True)
            log(f"{kind} repeat {rep + 1}/{repeats} done")
    finally:
        for pool in pools.values():
            pool.stop()


def memcpy_rate(ns: List[int], repeats: int, store: Store) -> None:
    """The floor of n × 1 MiB into the kernel: one copy of that many bytes into fresh memory, in this process (numpy)."""
    import numpy

    for n in ns:
        src = numpy.ones(n * MIB, dtype=numpy.uint8)
        src.copy()  # untimed: the allocator's first pages
        for rep in range(repeats):
            store.measure(f"api.memcpy.n{n}", lambda src=src: timed(lambda: src.copy())[0], rep, quiet=True)
        del src
