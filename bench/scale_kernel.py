"""bench_scale.py in a real Jupyter kernel on simulated ranks: %%ddp cells as a user runs them, the kernel's CPU per cell, its memory.

The kernel's CPU is read inside it, around each cell (IPython's pre/post_run_cell events,
``time.process_time``: every thread of the kernel); the wall time is execute → idle at the
client. For each n in turn, inside each repeat: the pool's start (its first cell), warm
cells interleaved (a plain ``1``, ``%%ddp`` ``1`` with the default status view, the same
with ``--no-widget``), one rank raising while the others wait in all_reduce, and n × 1 MiB
results. Memory: a fresh kernel per n, its RSS with the pool idle.
"""
from __future__ import annotations

import json as _json
import time
from typing import Dict, List, Optional, Tuple

import processes as P
from harness import HERE, Store, log, short_error
from kernels import KernelSession, stop_kernel
from scale_api import reform_seconds

SIM = "import simranks\nsimranks.install()\n"
SETUP = (
    "import sys, time as _t, json as _json\n"
    f"sys.path.insert(0, {HERE!r})\n"
    "import numpy, torch  # what the kernel imports anyway (results unpickle with them; the session imports torch in a thread): not in a measured cell\n"
    "_cpu, _c0 = [], _t.process_time()\n"
    "def _pre(info):\n    global _c0\n    _c0 = _t.process_time()\n"
    "def _post(result):\n    _cpu.append(_t.process_time() - _c0)\n"
    "get_ipython().events.register('pre_run_cell', _pre)\nget_ipython().events.register('post_run_cell', _post)\n"
)
RAISE = '%%ddp\nsim.error("ValueError", "boom", ranks=[1])\nsim.collective("all_reduce", 3)'
ENV = {"DDP_MAGIC_WARM_TEMPLATE": "0"}  # no torch template: simulated ranks need none


class Cells:
    """A kernel whose cells are timed at the client and measured (CPU) inside the kernel."""

    def __init__(self, k: KernelSession, sim: bool = True) -> None:
        self.k = k
        k.ok(SETUP + (SIM if sim else ""))
        k.ok("%load_ext ddp_magic")

    def run(self, code: str, timeout: float = 300.0) -> Tuple[dict, float]:
        """(the execution, the kernel's CPU seconds for it)."""
        ex = self.k.run(code, timeout)
        cpu = float(self.k.ok("_cpu[-1]")["value"] or "nan")  # the cell before this one's own entry
        return ex, cpu


def _sample(cells: Cells, code: str, error_expected: bool = False) -> Tuple[float, dict]:
    ex, cpu = cells.run(code)
    if ex["error"] and not error_expected:
        raise RuntimeError(f"{ex['error']} | {P.tail(ex['stderr'], 200)}")
    return ex["elapsed"], {"cpu": cpu, "ex": ex}


def _block(cells: Cells, n: int, rep: int, store: Store) -> None:
    """Every step at one n, once: start, warm cells, a raise and the cell after it, the 1 MiB results."""
    def start() -> Tuple[float, dict]:
        cells.k.ok("%ddp stop")
        wall, info = _sample(cells, f"%%ddp -n {n}\n1")
        return wall, {"cpu": info["cpu"]}

    store.measure(f"kernel.start.n{n}", start, rep, quiet=True)
    for i in range(3):  # interleaved: plain, view, no view
        for name, code in (("plain", "1"), ("view", "%%ddp\n1"), ("noview", "%%ddp --no-widget\n1")):
            def warm(code: str = code, name: str = name) -> Tuple[float, dict]:
                wall, info = _sample(cells, code)
                if name != "plain" and not (info["ex"]["value"] or "").startswith(f"RankResults({n} ranks)"):
                    raise RuntimeError(f"unexpected value {(info['ex']['value'] or '')[:80]!r}")
                return wall, {"cpu": info["cpu"]}

            store.measure(f"kernel.{name}.n{n}", warm, 3 * rep + i, quiet=True)

    def raised() -> Tuple[float, dict]:
        wall, info = _sample(cells, RAISE, error_expected=True)
        error = info["ex"]["error"] or ""
        if not error.startswith("CellError: rank 1 raised ValueError: boom"):
            raise RuntimeError(f"unexpected error {error[:120]!r}")
        reform = reform_seconds(error)
        nxt, _ = cells.run("%%ddp --no-widget\n1")
        if not (nxt["value"] or "").startswith(f"RankResults({n} ranks)"):
            raise RuntimeError("the cell after the failure did not run on every rank")
        return wall, {"cpu": info["cpu"], "reform_s": reform, "error_chars": len(error)}

    store.measure(f"kernel.raise.n{n}", raised, rep, quiet=True)

    def buffers() -> Tuple[float, dict]:
        wall, info = _sample(cells, "%%ddp --no-widget\nsim.buffer(1 << 20)")
        cells.k.ok("%reset -f out")
        return wall, {"cpu": info["cpu"]}

    store.measure(f"kernel.buffer.n{n}", buffers, rep, quiet=True)


def phase(ns: List[int], repeats: int, store: Store, watch: P.Watch) -> None:
    """One kernel; inside each repeat every n in turn (each block starts its pool afresh)."""
    k: Optional[KernelSession] = None
    try:
        k = KernelSession(env=ENV)
        cells = Cells(k)
        for rep in range(repeats):
            for n in ns:
                _block(cells, n, rep, store)
            log(f"kernel repeat {rep + 1}/{repeats} done")
    except Exception as e:
        store.error("kernel.phase", short_error(e))
    finally:
        stop_kernel(k, watch, "scale kernel")


PROFILED = (("view", "%%ddp\n1"), ("noview", "%%ddp --no-widget\n1"), ("raise", RAISE))
CPROFILE = (  # cProfile on the kernel's main thread for each cell (IPython's events), then its top functions to a file
    "import cProfile as _cp, pstats as _ps, io as _io, time as _tt\n_prof = _cp.Profile(_tt.thread_time)  # the main thread's CPU: not its waits for the GIL\n"
    "def _pon(info): _prof.enable()\n\ndef _poff(result): _prof.disable()\n\n"
    "get_ipython().events.register('pre_run_cell', _pon)\nget_ipython().events.register('post_run_cell', _poff)\n"
    "def _pdump(path, cells):\n    get_ipython().events.unregister('pre_run_cell', _pon)\n"
    "    get_ipython().events.unregister('post_run_cell', _poff)\n    out = _io.StringIO()\n"
    "    print(f'cProfile of {cells} cells, main-thread CPU (totals; cProfile adds ~1 µs a call, so call-heavy code reads high)', file=out)\n"
    "    for key in ('tottime', 'cumulative'):\n        _ps.Stats(_prof, stream=out).sort_stats(key).print_stats(40)\n"
    "    open(path, 'w').write(out.getvalue())\n"
)


def cprofile(k: KernelSession, cells: "Cells", count: int, path: str) -> None:
    """``count`` default-view cells under cProfile (after the timed ones: it slows what it watches); the stats to ``path``."""
    k.ok(CPROFILE)
    for _ in range(count):
        cells.run("%%ddp\n1")
    k.ok(f"_pdump({path!r}, {count})")
    log(f"cProfile of {count} default-view cells: {path}")


def profile(n: int, repeats: int, store: Store, watch: P.Watch, cprofile_to: str = "") -> None:
    """Where the kernel's CPU goes at n ranks, phase by phase (scale_phases.py), for the cells the goals are about;
    ``cprofile_to``: then cProfile's view of the default-view cell there (its top functions)."""
    k: Optional[KernelSession] = None
    try:
        k = KernelSession(env=ENV)
        cells = Cells(k)
        k.ok("import scale_phases\nscale_phases.install()")
        cells.run(f"%%ddp -n {n}\n1")
        for rep in range(repeats):
            for name, code in PROFILED:
                def sample(code: str = code) -> Tuple[float, dict]:
                    k.ok("scale_phases.take()")
                    ex, cpu = cells.run(code)
                    spent = _json.loads(k.ok("print(_json.dumps(scale_phases.take()))")["stdout"])
                    return cpu, dict(spent, wall=ex["elapsed"], error=bool(ex["error"]))

                store.measure(f"phase.{name}.n{n}", sample, rep, quiet=True)
        log(f"profile at n={n}: {repeats} repeats")
        if cprofile_to:
            cprofile(k, cells, 4 * repeats, cprofile_to)
    except Exception as e:
        store.error(f"phase.n{n}", short_error(e))
    finally:
        stop_kernel(k, watch, "scale profile")


def rss_mib(pid: int) -> float:
    return P.proc_mem_kib(pid)[0] / 1024


def memory(ns: List[int], store: Store, watch: P.Watch) -> None:
    """A fresh kernel per n (1 first, the baseline): its RSS once its pool of n is up and idle after a few cells."""
    for n in [1] + [x for x in ns if x != 1]:
        k: Optional[KernelSession] = None
        try:
            k = KernelSession(env=ENV)
            cells = Cells(k)
            for code in (f"%%ddp -n {n}\n1", "%%ddp\nsim.print(1)\n2", "%%ddp --no-widget\n3", "%reset -f out"):
                cells.run(code)
            time.sleep(1.0)
            store.get(f"mem.kernel.n{n}").values.append(rss_mib(k.pid))
            log(f"kernel RSS with an idle pool of {n}: {store.get(f'mem.kernel.n{n}').values[-1]:.0f} MiB")
        except Exception as e:
            store.error(f"mem.kernel.n{n}", short_error(e))
        finally:
            stop_kernel(k, watch, f"memory kernel n={n}")


def view_update(ns: List[int], repeats: int, store: Store) -> None:
    """The live status view's update at n ranks (half running, half done): a snapshot and the two HTML values it sends."""
    from ddp_magic.kernel.ranks import RankInfo
    from ddp_magic.states import RankState
    from ddp_magic.ui import status_render as R
    from ddp_magic.ui import status_tables as T

    for n in ns:
        now = time.monotonic()
        infos: Dict[int, RankInfo] = {r: RankInfo(rank=r, state=RankState.RUNNING if r % 2 else RankState.DONE, pid=1000 + r,
                                                  started=now - 2.0, finished=None if r % 2 else now - 0.5, last_line=f"step {r}") for r in range(n)}
        for rep in range(repeats):
            def update(n: int = n, infos: Dict[int, RankInfo] = infos) -> float:
                t0 = time.perf_counter()
                s = R.Snapshot(nproc=n, infos=dict(infos), now=time.monotonic(), elapsed=2.0, backend="gloo")
                R.header_html(s)
                T.body_html(s)
                return time.perf_counter() - t0

            store.measure(f"view.update.n{n}", update, rep, quiet=True)

