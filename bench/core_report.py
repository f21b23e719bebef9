"""bench_core.py's report: the header, sections 1-4 and the notes, as Markdown (every figure median (min–max))."""
from __future__ import annotations

import argparse
from typing import Any, Callable, List, Optional

from core_cold import cold_notes, render_cold
from core_live import sizes_for
from harness import MIB, Series, Store, fmt, med, notes_section, ratio, table


def _header(args: argparse.Namespace, meta: dict) -> List[str]:
    """The title and the run's circumstances (load, repeats, source)."""
    return [
        "# ddp_magic core benchmark\n",
        f"{meta['date']} · {meta['cpus']} CPU cores · {meta['mem_gib']:.0f} GiB RAM · Python {meta['python']} · torch {meta['torch']} · "
        f"gloo on CPU · repeats: cold {args.repeats}, restart {args.restart_repeats}, warm {args.warm_repeats}, result {args.result_repeats} · "
        f"total bench time {meta['bench_s']:.0f} s · load average {meta['load_start']:.2f} at start, {meta['load_end']:.2f} at end "
        f"(other work on the machine skews the figures)\n",
        f"Benchmarked: {args.source_desc}.\n",
        "Every figure: median (min–max) over the repeats. Columns are explained in bench/README.md.\n",
    ]


def _live(S: Callable[[str], Optional[Series]], args: argparse.Namespace) -> List[str]:
    """Sections 2, 3 and 3b: restart, warm round trips, the first tensor result."""
    out = ["## 2. Restart of a live pool (s)\n"]
    out += table(["n", "`%ddp restart` in kernel (execute → idle)", "`Pool.restart()` via API"],
                 [[str(n), fmt(S(f"restart.kernel.n{n}"), digits=3), fmt(S(f"restart.api.n{n}"), digits=3)] for n in args.ns])
    out.append("## 3. Warm round trip on a live pool (ms)\n")
    out.append("Kernel: execute request → idle on the client. API: `Pool.run(src)` call → return. "
               "Overhead = median(ddp) − median(plain cell `1`) in the same kernel.\n")
    out.append("`%%ddp` cells show the status view (the default; a cell this quick gets only its summary line, no ipywidget); "
               "the `--no-widget` column is the same cell without it.\n")
    rows = []
    for n in args.ns:
        pl, dd, nw, ar = (S(f"warm.kernel.{c}.n{n}") for c in ("plain", "ddp", "nowidget", "allreduce"))

        def over(s: Any, pl: Any = pl) -> str:
            return f"{1e3 * (med(s) - med(pl)):.2f}" if med(s) is not None and med(pl) is not None else "—"

        rows.append([str(n), fmt(pl, 1e3), fmt(dd, 1e3), over(dd), fmt(nw, 1e3), over(nw), fmt(ar, 1e3), over(ar),
                     fmt(S(f"warm.api.ddp.n{n}"), 1e3), fmt(S(f"warm.api.allreduce.n{n}"), 1e3)])
    out += table(["n", "plain cell `1`", "`%%ddp` `1`", "overhead", "`%%ddp --no-widget` `1`", "overhead", "`%%ddp` one all_reduce", "overhead",
                  "API `run('1')`", "API one all_reduce"], rows)
    out.append("### 3b. A one-element tensor result, first and second time on a live pool (s)\n")
    out.append("The kernel (or API process) has not imported torch before its first tensor result; the first `%%ddp` cell `torch.ones(1)` pays that import.\n")
    out += table(["n", "kernel: first", "kernel: second", "API: first", "API: second"],
                 [[str(n)] + [fmt(S(f"tensor1.{w}.{which}.n{n}"), digits=3) for w in ("kernel", "api") for which in ("first", "second")] for n in args.ns])
    return out


def _results(S: Callable[[str], Optional[Series]], args: argparse.Namespace) -> List[str]:
    """Section 4: result return against memcpy."""
    out = ["## 4. Result return: every rank returns a float32 tensor (`%%ddp` cell `t`)\n",
           "MB/s = n × size / seconds (MB = 10^6 bytes). "
           "memcpy = `torch.empty_like(x).copy_(x)` of the same n × size bytes in one process (the physical limit). "
           + ("Tensors: a bare `torch.empty` (--untouched), so the first timed return faults its pages in.\n" if args.untouched else
              "Tensors: `torch.empty(N)` then `fill_(1.0)` in the untimed cell, so the timed cell does not fault fresh pages in (see bench/README.md).\n")]
    rows = []
    for n in args.ns:
        for size, allowed in sizes_for(n, args.sizes, args.max_total_gib):
            total_mib = n * size
            tot = f"{total_mib / 1024:.2f} GiB" if total_mib >= 1024 else f"{total_mib} MiB"
            if not allowed:
                rows.append([str(n), f"{size} MiB", tot, f"skipped: total > --max-total-gib {args.max_total_gib:g}"] + [""] * 6)
                continue
            mb = n * size * MIB / 1e6
            k, a, m = (S(f"result.{w}.n{n}.s{size}") for w in ("kernel", "api", "memcpy"))
            rows.append([str(n), f"{size} MiB", tot, fmt(k, digits=3), fmt(k, digits=0, invert=mb), fmt(a, digits=3), fmt(a, digits=0, invert=mb),
                         fmt(m, digits=3), fmt(m, digits=0, invert=mb), ratio(med(k), med(m), 1)])
    return out + table(["n", "size per rank", "total", "kernel s", "kernel MB/s", "API s", "API MB/s", "memcpy s", "memcpy MB/s",
                        "kernel / memcpy time"], rows)


def _notes(store: Store, args: argparse.Namespace) -> List[str]:
    """The per-phase breakdowns, errors of the live pools and the store's notes."""
    S = store.series.get
    extra = []
    for n in args.ns:
        extra += [f"live pool n={n}: {e}" for w in ("kernel", "api") for e in (S(f"live.{w}.n{n}").errors if S(f"live.{w}.n{n}") else [])]
    return notes_section(extra + cold_notes(S, args) + store.notes)


def render(store: Store, args: argparse.Namespace, meta: dict) -> str:
    """The markdown report: header, sections 1-4, notes."""
    S = store.series.get
    return "\n".join(_header(args, meta) + render_cold(S, args) + _live(S, args) + _results(S, args) + _notes(store, args))
