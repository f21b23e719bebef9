"""bench_core.py, sections 2-4 in a real kernel: restart, warm round trips (with and without the status view), result return.

One kernel per n, its pool up once; the warm cells are interleaved (plain, %%ddp,
%%ddp --no-widget, all_reduce, plain, …) so drift hits every column alike, and a
cell counts only if its value is what it should be.
"""
from __future__ import annotations

import argparse
import os
import statistics
import traceback
from typing import Callable, List, Tuple

import processes as P
from harness import MIB, Store, log, short_error
from kernels import KernelSession, stop_kernel

KERNEL_SETUP = "import torch, torch.distributed as dist"


def make_tensor(elems: int, untouched: bool) -> str:
    """The untimed cell that makes the tensor a rank returns.

    A fresh torch.empty is not in memory yet: its pages are faulted in by whoever reads them first, and
    that was the first timed return (5.9 s instead of 1.6 s for 8 x 256 MiB here). fill_ pays it up front.
    """
    return f"t = torch.empty({elems})" + ("" if untouched else ".fill_(1.0)")


def sizes_for(n: int, sizes_mib: List[int], max_total_gib: float) -> List[Tuple[int, bool]]:
    return [(s, n * s * MIB <= max_total_gib * (1 << 30)) for s in sizes_mib]


def _small_tensor(k: KernelSession, n: int, store: Store) -> None:
    """The first tensor result makes the kernel import torch (it had no need before): first and second timed apart."""
    for which in ("first", "second"):
        def small_tensor() -> float:
            ex = k.ok("%%ddp\ntorch.ones(1)", timeout=120)
            if not ex["results"] or ex["results"][-1].count("tensor([1.])") != n:
                raise RuntimeError(f"unexpected result {ex['results'][-1:]!r}")
            return ex["elapsed"]

        store.measure(f"tensor1.kernel.{which}.n{n}", small_tensor)


def _restart(k: KernelSession, n: int, args: argparse.Namespace, store: Store) -> None:
    """2. `%ddp restart` until the 'ready in' line."""
    for _ in range(args.restart_repeats):
        def restart() -> Tuple[float, str]:
            ex = k.ok("%ddp restart", timeout=300)
            if "ready in" not in ex["stdout"]:
                raise RuntimeError(f"no 'ready' line: {P.tail(ex['stdout'])} {P.tail(ex['stderr'])}")
            return ex["elapsed"], ex["stdout"].strip()

        store.measure(f"restart.kernel.n{n}", restart)


def _warm(k: KernelSession, n: int, args: argparse.Namespace, store: Store) -> None:
    """3. Warm round trips, interleaved so drift hits every column alike.

    "ddp"/"allreduce" as a user gets them (with the status view), "nowidget" with --no-widget."""
    cells = {
        "plain": ("1", lambda ex: ex["value"] == "1"),
        "ddp": ("%%ddp\n1", lambda ex: (ex["value"] or "").count("] 1") == n),
        "nowidget": ("%%ddp --no-widget\n1", lambda ex: (ex["value"] or "").count("] 1") == n and len(ex["results"]) == 1),
        "allreduce": ("%%ddp\nx = torch.ones(1)\ndist.all_reduce(x)", lambda ex: ex["value"] is None),
    }
    for _ in range(3):  # warm-up
        for code, _check in cells.values():
            k.ok(code)
    for i in range(args.warm_repeats):
        for name, (code, check) in cells.items():
            def one(code: str = code, check: Callable = check) -> float:
                ex = k.ok(code, timeout=60)
                if not check(ex):
                    raise RuntimeError(f"unexpected output: value={ex['value']!r} results={ex['results'][-2:]!r} stderr={P.tail(ex['stderr'], 200)!r}")
                return ex["elapsed"]

            store.measure(f"warm.kernel.{name}.n{n}", one, i, quiet=True)
        if i % 25 == 24:
            k.ok("%reset -f out")
    medians = {name: statistics.median(store.get(f"warm.kernel.{name}.n{n}").values or [float("nan")]) for name in cells}
    log(f"warm kernel n={n}: " + ", ".join(f"{name} median {1e3 * m:.2f} ms" for name, m in medians.items()))


def _results(k: KernelSession, n: int, args: argparse.Namespace, store: Store) -> None:
    """4. Result return: every rank's tensor of each size into the notebook."""
    for size, allowed in sizes_for(n, args.sizes, args.max_total_gib):
        key = f"result.kernel.n{n}.s{size}"
        if not allowed:
            continue
        elems = size * MIB // 4
        try:
            k.ok(f"%%ddp\n{make_tensor(elems, args.untouched)}", timeout=300)
        except Exception as e:
            store.error(key, short_error(e))
            continue
        for _ in range(args.result_repeats):
            def ret() -> float:
                ex = k.ok("%%ddp\nt", timeout=600)
                text = ex["results"][-1] if ex["results"] else ""
                if not text.startswith("RankResults(") or text.count("tensor(") != n:
                    raise RuntimeError(f"unexpected result {text[:200]!r}")
                return ex["elapsed"]

            store.measure(key, ret)
            k.ok("%reset -f out")
        k.ok("%%ddp\ndel t")


def live_kernel(n: int, args: argparse.Namespace, store: Store, watch: P.Watch) -> None:
    """Sections 2-4 through a real kernel: small tensor, restart, warm cells, result return."""
    k = None
    try:
        k = KernelSession()
        k.ok("%load_ext ddp_magic")
        where = k.ok("import ddp_magic as _m; _m.__file__")["results"]
        if not where or P.SRC + os.sep not in where[-1]:
            store.notes.append(f"WARNING: the kernel imported ddp_magic from {where}, not from {P.SRC}")
        k.ok("del _m")
        k.ok(f"%%ddp -n {n}\n{KERNEL_SETUP}", timeout=300)
        _small_tensor(k, n, store)
        _restart(k, n, args, store)
        k.ok(f"%%ddp\n{KERNEL_SETUP}", timeout=300)
        _warm(k, n, args, store)
        _results(k, n, args, store)
    except Exception as e:
        store.error(f"live.kernel.n{n}", short_error(e))
        log(traceback.format_exc())
    finally:
        stop_kernel(k, watch, f"live kernel n={n}")
