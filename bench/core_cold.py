"""bench_core.py, section 1: cold start to the first result, %%ddp in a fresh kernel and the Pool API in a fresh process.

The job everywhere: init gloo, all_reduce ``torch.ones(1)``, the value in hand; the
floors (torchrun, bare processes, one bare import) are jobs.py's. The table and the
notes that break a start into its phases are rendered here too.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, List, Optional, Tuple

import processes as P
from harness import PY, Series, Store, fmt, med, ratio, short_error, table
from kernels import KernelSession, stop_kernel

COLD_CELL_SRC = "import torch.distributed as dist\nt = __import__('torch').ones(1)\ndist.all_reduce(t)\nt"
API_COLD_CHILD = r'''
import json, sys, time
from ddp_magic.kernel.pool import Pool
n, src = int(sys.argv[1]), sys.argv[2]
out = {"torch_before": "torch" in sys.modules}
p = Pool(n)
try:
    o = p.run(src)
    out["t_result"] = time.time()
    out["torch_after"] = "torch" in sys.modules
    out["cell_s"] = o.elapsed
    out["ok"] = o.ok
    out["values"] = [repr(v) for v in o.values]
    out["failures"] = [f.headline() for f in o.failures]
    out["start_seconds"] = getattr(p, "start_seconds", None)
    out["template_info"] = getattr(p, "template_info", "")
    proc = getattr(p.launcher, "proc", None)
    out["pids"] = [x for x in p.pids if x] + ([proc.pid] if proc is not None else [])
finally:
    t = time.monotonic()
    p.stop()
    out["stop_s"] = time.monotonic() - t
print("BENCHJSON " + json.dumps(out), flush=True)
'''


def cold_kernel(n: int, rep: int, store: Store, watch: P.Watch) -> None:
    key = f"cold.kernel.n{n}"
    k = None
    try:
        k = KernelSession()
        k.ok("%load_ext ddp_magic")

        def one() -> Tuple[float, dict]:
            assert k is not None
            ex = k.ok(f"%%ddp -n {n}\n{COLD_CELL_SRC}", timeout=300)
            text = ex["results"][-1] if ex["results"] else ""
            if text.count(f"tensor([{n}.])") != n:
                raise RuntimeError(f"unexpected result {text[:200]!r}; stderr: {P.tail(ex['stderr'], 200)}")
            return ex["elapsed"], {"stderr": P.tail(ex["stderr"], 300)}

        store.measure(key, one, rep)
    except Exception as e:
        store.error(key, short_error(e))
    finally:
        stop_kernel(k, watch, f"cold kernel n={n}")


def cold_api(n: int, rep: int, store: Store, watch: P.Watch, as_float: bool = False) -> None:
    src = COLD_CELL_SRC + (".item()" if as_float else "")
    expected = [repr(float(n))] * n if as_float else [f"tensor([{n}.])"] * n

    def one() -> Tuple[float, dict]:
        t_launch = time.time()
        r = P.child_json([PY, "-c", API_COLD_CHILD, str(n), src], timeout=300)
        watch.expect_gone(r.get("pids", []), f"cold API n={n}")
        if not r["ok"] or r["values"] != expected:
            raise RuntimeError(f"values {r['values']} failures {r['failures']}")
        return r["t_result"] - t_launch, {k: r.get(k) for k in ("start_seconds", "template_info", "stop_s", "cell_s", "torch_before", "torch_after")}

    store.measure(f"cold.{'apifloat' if as_float else 'api'}.n{n}", one, rep)


def render_cold(S: Callable[[str], Optional[Series]], args: argparse.Namespace) -> List[str]:
    """Section 1: cold start to first result."""
    out = ["## 1. Cold start to first result (s)\n",
           "From nothing running to the all_reduced value of `torch.ones(1)` in hand. "
           "`%%ddp` in kernel: fresh kernel with `%load_ext ddp_magic` done, execute → idle. "
           "Pool API: `python -c` launch → `Pool(n).run(src)` returned. torchrun / bare: launch → the last rank printed its result.\n"]
    imp = S("cold.import")
    header = ["n", "%%ddp in kernel", "Pool API (fresh process)", "Pool API, cell ends `t.item()`", "torchrun --standalone",
              "N bare python (init+all_reduce)", "1 bare `import torch`", "kernel / import", "API / import", "torchrun / import"]
    rows = []
    for n in args.ns:
        k, a, af, t, b = (S(f"cold.{m}.n{n}") for m in ("kernel", "api", "apifloat", "torchrun", "bare"))
        rows.append([str(n), fmt(k), fmt(a), fmt(af), fmt(t), fmt(b), fmt(imp),
                     ratio(med(k), med(imp)), ratio(med(a), med(imp)), ratio(med(t), med(imp))])
    return out + table(header, rows)


def _template_import(info: List[dict]) -> str:
    imports = []
    for i in info:
        try:
            imports.append(float(str(i.get("template_info", "")).rsplit(" in ", 1)[1].rstrip("s")))
        except (IndexError, ValueError):
            pass
    return f"template import {statistics.median(imports):.2f}s" if imports else "template import ?"


def cold_notes(S: Callable[[str], Optional[Series]], args: argparse.Namespace) -> List[str]:
    """What a start is made of: the API's phases, torchrun's and the import's launch → exit."""
    extra = []
    for n in args.ns:
        info = [i for i in (S(f"cold.api.n{n}").info if S(f"cold.api.n{n}") else []) if isinstance(i, dict)]
        if info:
            def m(key: str, info: List[dict] = info) -> float:
                vals = [i[key] for i in info if isinstance(i.get(key), (int, float))]
                return statistics.median(vals) if vals else float("nan")

            extra.append(
                f"Pool API cold, n={n} (medians): {_template_import(info)}; Pool.start {m('start_seconds'):.2f}s, "
                f"then the cell until run() returned {m('cell_s'):.2f}s, Pool.stop {m('stop_s'):.2f}s; torch imported in the calling process by the result: "
                f"{sum(1 for i in info if i.get('torch_after') and not i.get('torch_before'))}/{len(info)}"
            )
    for n in args.ns:
        tr = S(f"cold.torchrun.n{n}")
        ex = [i["exit_s"] for i in (tr.info if tr else []) if isinstance(i, dict) and "exit_s" in i]
        if ex:
            extra.append(f"torchrun n={n}: launch → process exit median {statistics.median(ex):.2f}s")
    imp = S("cold.import")
    imp_exit = [i["exit_s"] for i in (imp.info if imp else []) if isinstance(i, dict) and "exit_s" in i]
    if imp_exit:
        extra.append(f"bare `import torch`: launch → process exit median {statistics.median(imp_exit):.2f}s (the table counts launch → import done)")
    return extra
