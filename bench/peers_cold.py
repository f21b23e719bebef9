"""bench_peers.py, section 1: cold start, the first cell → the result, every tool interleaved inside each repeat.

The notebook tools start in a fresh kernel (start-up not counted); the scripts and the
floors (torchrun, mp.spawn, N bare processes, one bare import) are jobs.py's. nbdistributed
is also run "as typed" (its job cell sent at once after ``%dist_init``), once.
"""
from __future__ import annotations

import argparse
import time
from typing import Tuple

import jobs
import processes as P
from harness import Store, free_port, log, short_error
from peers_tools import NBD, SLOW, TOOLS

def cold_kernel_tool(key: str, n: int, rep: int, args: argparse.Namespace, store: Store, tmp: str, cleanup: P.Watch) -> None:
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

        store.measure(skey, one, rep)
    except Exception as e:
        store.error(skey, short_error(e))
        if tool.k is not None and tool.k.log_tail():
            log(f"{key} kernel log: {tool.k.log_tail(600)}")
    finally:
        tool.stop()


def nbd_as_typed(n: int, args: argparse.Namespace, store: Store, tmp: str, cleanup: P.Watch) -> None:
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


def cold_phase(args: argparse.Namespace, store: Store, tmp: str, cleanup: P.Watch, paths: dict) -> None:
    """Every repeat visits every n and every tool (the slow ones only --slow-repeats times), so drift hits them alike."""
    for rep in range(args.repeats):
        log(f"cold start, repeat {rep + 1}/{args.repeats}")
        jobs.cold_import(rep, store)
        for n in args.ns:
            for key in ("ddp", "accelerate", "ipp", "nbd"):
                if key in args.tools and (key not in SLOW or rep < args.slow_repeats):
                    cold_kernel_tool(key, n, rep, args, store, tmp, cleanup)
            for kind in ("torchrun", "spawn"):
                if kind in args.tools:
                    jobs.cold_script(kind, n, rep, args.backend, store, paths)
            if "bare" in args.tools:
                jobs.cold_bare(n, rep, args.backend, store)
    if "nbd" in args.tools and not args.quick:
        n2 = min([n for n in args.ns if n >= 2] or args.ns)
        log(f"nbdistributed as typed, n={n2}")
        nbd_as_typed(n2, args, store, tmp, cleanup)
