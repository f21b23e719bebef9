"""bench_peers.py's report: sections 1-6 as Markdown tables, every figure median (min–max), ratios pair by pair."""
from __future__ import annotations

import argparse
import statistics
from typing import Any, Callable, List, Optional, Tuple

from harness import MIB, Series, Store, cell_text, fmt, fmt_ratio, notes_section, spread, table
from peers_tools import LABELS
from peers_train import TRAIN_BLOCK

POOLS = ("ddp", "ipp", "nbd")  # the tools whose pools live between cells


def _pools(args: argparse.Namespace) -> List[str]:
    return [t for t in POOLS if t in args.tools]


def _render_header(args: argparse.Namespace, meta: dict) -> List[str]:
    """The title and the run's circumstances (machine, versions, load)."""
    return [
        "# ddp_magic side by side with the alternatives\n",
        f"{meta['date']} · {meta['machine']} · Python {meta['python']} · torch {meta['torch']} · {args.backend} · "
        f"{meta['versions']} · total {meta['bench_s'] / 60:.1f} min · load average {meta['load_start']:.2f} at start, {meta['load_end']:.2f} at end\n",
        "Every figure: median (min–max) over the repeats; ratios are taken pair by pair (same repeat) and summarised the same way. "
        "A cell with an error shows the tool's own message. How each column is measured: bench/README.md.\n",
    ]


def _render_cold(store: Store, args: argparse.Namespace) -> List[str]:
    """1. Cold start, and each tool's time ÷ %%ddp's."""
    S = store.series.get
    tools = [t for t in ("ddp", "accelerate", "ipp", "nbd", "torchrun", "spawn", "bare") if t in args.tools]
    out = [f"## 1. Cold start: first cell → result (s), {args.repeats} repeats ({args.slow_repeats} for ipyparallel and nbdistributed)\n",
           "The same job everywhere: init the process group, `all_reduce(torch.ones(1))`, the result in hand. Notebook tools: a fresh kernel "
           "(start-up not counted), from the first cell (`%load_ext`, `import`, cluster start…) to the result cell going idle. "
           "torchrun, mp.spawn, bare: launch → the last rank printed its result. "
           "nbdistributed: the job cell is sent once every worker has connected (polled from outside); "
           "sent right after `%dist_init`, it is lost (row below).\n"]
    out += table(["n"] + [LABELS[t] for t in tools] + ["1 bare `import torch`"],
                 [[str(n)] + [fmt(S(f"cold.{t}.n{n}")) for t in tools] + [fmt(S("cold.import"))] for n in args.ns])
    peers = [t for t in tools if t != "ddp"]
    if "ddp" in tools and peers:
        out.append("Each tool's time ÷ %%ddp's, pair by pair (same repeat); > 1× means %%ddp is faster:\n")
        out += table(["n"] + [LABELS[t] for t in peers],
                     [[str(n)] + [fmt_ratio(store.ratios(f"cold.{t}.n{n}", f"cold.ddp.n{n}")) for t in peers] for n in args.ns])
    for n in args.ns:
        if S(f"cold.nbd_as_typed.n{n}"):
            out.append(f"nbdistributed as typed (`%dist_init -n {n}` then the job cell at once): {fmt(S(f'cold.nbd_as_typed.n{n}'))}\n")
    return out


def _warm_overheads(store: Store, args: argparse.Namespace, pools: List[str]) -> List[str]:
    """The all_reduce cell of each tool ÷ %%ddp's, and %%ddp's cells − the plain cell, pair by pair."""
    others = [t for t in pools if t != "ddp"]
    rows = []
    for n in args.ns:
        cells = [fmt_ratio(store.ratios(f"warm.{t}.allreduce.n{n}", f"warm.ddp.allreduce.n{n}"), 1) for t in others]
        cells += [spread(store.diffs(f"warm.ddp.{w}.n{n}", f"warm.plain.n{n}", 1e3), 1) for w in ("trivial", "allreduce")]
        rows.append([str(n)] + cells)
    return (["all_reduce cell: each tool's time ÷ %%ddp's, pair by pair; %%ddp overhead over the plain cell (ms, pair by pair):\n"]
            + table(["n"] + [f"{LABELS[t]} ÷ %%ddp" for t in others] + ["%%ddp `1` − plain", "%%ddp all_reduce − plain"], rows))


def _render_warm(store: Store, args: argparse.Namespace) -> List[str]:
    """2. Warm cell round trips, ratios to %%ddp and its overhead over a plain cell."""
    S = store.series.get
    pools = _pools(args)
    out = [f"## 2. Warm cell round trip on a live pool (ms), {args.warm_repeats} interleaved repeats\n",
           "Execute request → idle on the client. `1`: a trivial cell, its value shown from every rank; all_reduce: "
           "`x = torch.ones(1); dist.all_reduce(x)`. Plain cell: `1` in the %%ddp kernel (Jupyter's own round trip). "
           "%%ddp cells run with `--no-widget`, like the peers, which show no status view; what the default status view "
           "adds to a cell is measured in `bench/bench_core.py` section 3. "
           "accelerate keeps nothing between cells: each cell is a fresh `notebook_launcher` run of the cold-start job (s, not ms).\n"]
    acc = "accelerate" in args.tools
    hdr = ["n", "plain cell"] + [f"{LABELS[t]} {w}" for t in pools for w in ("`1`", "all_reduce")] + (["accelerate re-run (s)"] if acc else [])
    rows = [[str(n), fmt(S(f"warm.plain.n{n}"), 1e3, 1)] + [fmt(S(f"warm.{t}.{w}.n{n}"), 1e3, 1) for t in pools for w in ("trivial", "allreduce")]
            + ([fmt(S(f"warm.accelerate.relaunch.n{n}"))] if acc else []) for n in args.ns]
    out += table(hdr, rows)
    return out + (_warm_overheads(store, args, pools) if "ddp" in pools and len(pools) > 1 else [])


def _result_row(store: Store, args: argparse.Namespace, n: int, size: int) -> List[str]:
    S = store.series.get
    tot_mib = n * size
    tot = f"{tot_mib / 1024:.2f} GiB" if tot_mib >= 1024 else f"{tot_mib} MiB"
    if tot_mib > args.max_total_gib * 1024:
        return [str(n), f"{size} MiB", tot, f"skipped: total > --max-total-gib {args.max_total_gib:g}"] + [""] * 7
    mb = tot_mib * MIB / 1e6
    d, i, m = (S(f"result.{w}.n{n}.s{size}") for w in ("ddp", "ipp", "memcpy"))
    key = f"n{n}.s{size}"
    return [str(n), f"{size} MiB", tot, fmt(d, digits=3), fmt(d, digits=0, invert=mb), fmt(i, digits=3), fmt(i, digits=0, invert=mb),
            fmt(m, digits=0, invert=mb), fmt_ratio(store.ratios(f"result.ddp.{key}", f"result.memcpy.{key}"), 1),
            fmt_ratio(store.ratios(f"result.ipp.{key}", f"result.memcpy.{key}"), 1), fmt_ratio(store.ratios(f"result.ipp.{key}", f"result.ddp.{key}"), 1)]


def _render_results(store: Store, args: argparse.Namespace) -> List[str]:
    """3. Result return against memcpy and ipyparallel's pull."""
    out = [f"## 3. Result return: every rank's float32 tensor into the notebook, {args.result_repeats} repeats\n",
           "%%ddp: the cell `t` (its `RankResults` shown). ipyparallel: `dv.pull('t')` (the pull cell alone). memcpy: "
           "`torch.empty_like(x).copy_(x)` of the same n × size bytes in one process, the physical limit. MB/s = n × size / s (MB = 10^6 B); "
           "× memcpy = the tool's time ÷ memcpy's, pair by pair.\n"]
    hdr = ["n", "size/rank", "total", "%%ddp s", "%%ddp MB/s", "ipyparallel pull s", "ipyparallel MB/s", "memcpy MB/s",
           "%%ddp × memcpy", "ipyparallel × memcpy", "ipyparallel ÷ %%ddp"]
    return out + table(hdr, [_result_row(store, args, n, size) for n in args.ns for size in args.sizes])


def _render_output(store: Store, args: argparse.Namespace) -> List[str]:
    """4. Output latency and the 100,000-line cell."""
    S = store.series.get
    shown = ["plain"] + _pools(args)
    out = ["## 4. Output\n",
           f"**Latency** (ms): every rank prints {args.lat_lines} lines `print(f'LAT {{rank}} {{time.time()!r}}')` 50 ms apart (plain `print`, no flush); "
           "latency = arrival of the line's output message at the notebook client − the timestamp printed. Median per cell, then median (min–max) "
           f"over {args.out_repeats} cells. **100,000 lines** (s): the cell `for i in range(100000 // n): print(i)` on every rank, "
           f"so {args.lines:,} lines reach the notebook whatever n; execute → idle, {args.lines_repeats} repeats. "
           "Plain: the same cell in the %%ddp kernel, not distributed.\n"]
    names = ["plain cell"] + [LABELS[t] for t in shown[1:]]
    hdr = ["n"] + [f"latency: {h}" for h in names] + [f"100k lines: {h}" for h in names]
    rows = [[str(n)] + [fmt(S(f"out.lat.{t}.n{n}"), 1e3, 0) for t in shown] + [fmt_lines(S(f"out.lines.{t}.n{n}")) for t in shown] for n in args.ns]
    return out + table(hdr, rows)


def _training_row(S: Callable[[str], Optional[Series]], n: int) -> List[str]:
    rs = S(f"train.ratio.n{n}")
    r = rs.values if rs else []
    infos = [i for i in (rs.info if rs else []) if isinstance(i, dict) and "q1" in i]
    rates = {tool: Series() for tool in ("ddp", "torchrun")}  # each tool's steps/s, from the same turns
    for i in infos:
        for tool, series in rates.items():
            series.values.append(i[f"{tool}_rate"])
    middle = f"{statistics.median(i['q1'] for i in infos):.3f}–{statistics.median(i['q3'] for i in infos):.3f}" if infos else "—"
    verdict = "—" if not r else ("yes" if statistics.median(r) >= 0.97 else "**no**")
    return [str(n), fmt(rates["ddp"], digits=1), fmt(rates["torchrun"], digits=1), fmt_ratio(r, 3) if r else fmt(rs), middle, verdict]


def _render_training(store: Store, args: argparse.Namespace) -> List[str]:
    """5. Training turns: %%ddp against torchrun."""
    if "train" in args.skip:
        return []
    blocks = max(2, args.train_steps // TRAIN_BLOCK)
    out = [f"## 5. Training overhead: the same DDP loop in a %%ddp cell and under torchrun, taking turns; {args.train_repeats} runs\n",
           f"MLP 256→512→256, batch 64 per rank, SGD; {args.train_warmup} warm-up steps, then {blocks * TRAIN_BLOCK} timed steps. "
           "The `%%ddp` cell (status view on, as a user has it) and the `torchrun --standalone` script run at the same time and take "
           f"strict turns of {TRAIN_BLOCK} steps (%%ddp, torchrun, %%ddp, …), so each pair of turns sees the machine in the same state; "
           "each turn starts with one untimed step and prints one loss line per rank (forwarded live to the notebook for %%ddp). "
           f"A turn's time is the slowest rank's. Steps/s = {TRAIN_BLOCK} ÷ the median turn's time; a run's ratio = the median over its "
           f"{blocks} turn pairs of torchrun's turn time ÷ %%ddp's (= %%ddp steps/s ÷ torchrun steps/s); the table shows the median over "
           "the runs (min–max) and the middle half of the turn pairs. The goal is ≥ 0.97.\n"]
    hdr = ["n", "%%ddp steps/s", "torchrun steps/s", "ratio", "middle half of the turn pairs", "≥ 0.97"]
    return out + table(hdr, [_training_row(store.series.get, n) for n in args.ns])


def _kernel_rss(S: Callable[[str], Optional[Series]], args: argparse.Namespace) -> List[str]:
    mn = args.mem_n
    rows = []
    for key in ["plain"] + _pools(args):
        b, a, c = S(f"mem.kernel.{key}.before.n{mn}"), S(f"mem.kernel.{key}.after.n{mn}"), S(f"mem.kernel.{key}.cells_s.n{mn}")
        name = "plain" if key == "plain" else LABELS[key]
        if b is not None and b.values and a is not None and a.values:
            g = a.values[0] - b.values[0]
            rows.append([name, f"{b.values[0]:.0f}", f"{a.values[0]:.0f}", f"{g:+.1f}", f"{1024 * g / args.mem_cells:+.1f}", fmt(c, digits=1)])
        elif b is not None:
            rows.append([name, fmt(b), "", "", "", ""])
    return ([f"**Kernel RSS after {args.mem_cells} cells** (n = {mn}; the cells alternate `1` and one all_reduce; `%reset -f out` every 100). "
             "Before: after the pool is up and one all_reduce has run. Plain: a fresh kernel running `1`.\n"]
            + table(["kernel", "RSS before", "RSS after", "growth", "per cell (KiB)", "time for the cells (s)"], rows))


def _worker_row(S: Callable[[str], Optional[Series]], pools: List[str], n: int) -> List[str]:
    br, bu = S(f"mem.bare.rss.n{n}"), S(f"mem.bare.uss.n{n}")
    bare = (br.values[0], bu.values[0]) if br is not None and br.values and bu is not None and bu.values else None
    cells = [ru_n(S, t, "rank", n, bare) for t in pools] + [ru_n(S, "ddp", "helper", n), ru_n(S, "ipp", "helper", n)]
    cells.append(f"{bare[0]:.0f} / {bare[1]:.0f}" if bare else "—")
    for t in pools:
        tot = sum(sum(S(f"mem.{t}.{role}.pss.n{n}").values) for role in ("rank", "helper") if S(f"mem.{t}.{role}.pss.n{n}") is not None)
        cells.append(f"{tot:.0f}" if tot else fmt(S(f"mem.{t}.rank.rss.n{n}")))
    return [str(n)] + cells


def _render_memory(store: Store, args: argparse.Namespace) -> List[str]:
    """6. Kernel RSS after many cells; each worker's and the whole pool's memory."""
    S, pools = store.series.get, _pools(args)
    out = ["## 6. Memory (MiB)\n"] + _kernel_rss(S, args)
    out.append("**Each worker** after the job ran (torch imported, process group up), medians over the workers of one pool: RSS, and "
               "USS (its private pages, what one more rank costs; a rank forked from ddp_magic's template shares torch's pages with it, so its RSS "
               "undercounts and its USS is small). Bare: one `python -c \"import torch\"` process measured at the same moment; "
               "RSS − bare is what the issue asks, USS − bare USS the marginal cost. Helpers: ddp_magic's template, ipyparallel's controller. "
               "**Pool Σ PSS**: every rank and helper, each shared page divided among the processes that map it: what the whole pool costs "
               "(pages shared with processes outside the pool, e.g. libtorch's code, are split with them too).\n")
    hdr = ["n"] + [f"{LABELS[t]} worker RSS / USS (− bare)" for t in pools]
    hdr += ["%%ddp template RSS / USS", "ipyparallel controller RSS / USS", "bare `import torch` RSS / USS"] + [f"{LABELS[t]} pool Σ PSS" for t in pools]
    return out + table(hdr, [_worker_row(S, pools, n) for n in args.ns])


def _medians(s: Optional[Series], field: str) -> List[Any]:
    return [i[field] for i in (s.info if s else []) if isinstance(i, dict) and field in i]


def _render_notes(store: Store, args: argparse.Namespace) -> List[str]:
    """Per-phase breakdowns and the store's notes."""
    S = store.series.get
    notes = []
    for n in args.ns:
        for kind in ("torchrun", "spawn", "bare"):
            ex = _medians(S(f"cold.{kind}.n{n}"), "exit_s")
            if ex:
                notes.append(f"{LABELS[kind]} n={n}: launch → every process exited, median {statistics.median(ex):.2f}s")
    for n in args.ns:
        cells = _medians(S(f"cold.ipp.n{n}"), "cells")
        if cells:
            notes.append(f"ipyparallel n={n}: cluster start cell {statistics.median(c[0] for c in cells):.2f}s, "
                         f"then the `%%px` job cell {statistics.median(c[-1] for c in cells):.2f}s (medians)")
        cs = _medians(S(f"train.ratio.n{n}"), "cell_s")
        if cs:
            notes.append(f"training n={n}: the %%ddp cell of a turn-taking run took {statistics.median(cs):.2f}s end to end (median)")
    return notes_section(notes + store.notes)


def render(store: Store, args: argparse.Namespace, meta: dict) -> str:
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
    return cell_text(text)


def ru_n(S: Callable, tool: str, role: str, n: int, bare: Optional[Tuple[float, float]] = None) -> str:
    """'RSS / USS' in MiB (medians over the processes), with the difference from a bare `import torch` process when given."""
    r, u = S(f"mem.{tool}.{role}.rss.n{n}"), S(f"mem.{tool}.{role}.uss.n{n}")
    if r is None or not r.values:
        return fmt(r)
    rm, um = statistics.median(r.values), statistics.median(u.values)
    return f"{rm:.0f} / {um:.0f}" + (f" ({rm - bare[0]:+.0f} / {um - bare[1]:+.0f})" if bare else "")
