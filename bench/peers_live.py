"""bench_peers.py, sections 2-4 on live pools: warm round trips, output (latency, 100,000 lines), result return.

For each n every tool's kernel holds a live pool at the same time; each repeat runs
every cell of every tool in turn after untimed warm-up rounds, so the ratios are taken
pair by pair within a repeat. ``live_phase`` also runs the memory (peers_memory.py) and
training (peers_train.py) sections on the same pools.
"""
from __future__ import annotations

import argparse
import re
import statistics
import time
from typing import Dict, List, Tuple

import processes as P
from harness import MIB, Store, log, med, short_error
from peers_memory import live_memory
from peers_tools import TOOLS, Tool, all_text
from peers_train import train_turns

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


def _live_tools(n: int, args: argparse.Namespace, tmp: str, cleanup: P.Watch) -> Dict[str, Tool]:
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


def _run_warm(name: str, body: str, rep: int, record: bool, n: int, tools: Dict[str, Tool], pools: Dict[str, Tool], store: Store) -> None:
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
        store.measure(f"warm.{name}.n{n}", one, rep, quiet=True)
    else:
        try:
            one()
        except Exception as e:
            log(f"warm-up {name}: {short_error(e)}")


def _live_warm(n: int, tools: Dict[str, Tool], pools: Dict[str, Tool], args: argparse.Namespace, store: Store) -> None:
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

                store.measure(f"warm.accelerate.relaunch.n{n}", relaunch, i)


def _live_output(n: int, tools: Dict[str, Tool], pools: Dict[str, Tool], args: argparse.Namespace, store: Store) -> None:
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

            store.measure(f"out.lat.{name}.n{n}", lat, rep, quiet=True)
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

            store.measure(f"out.lines.{name}.n{n}", lines, rep)


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


def _result_tools(n: int, size: int, elems: int, pools: Dict[str, Tool], args: argparse.Namespace, store: Store) -> Dict[str, Tool]:
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


def _live_results(n: int, pools: Dict[str, Tool], args: argparse.Namespace, store: Store) -> None:
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
                store.measure(f"result.{key}.n{n}.s{size}", lambda key=key, t=t, elems=elems: _result_once(key, t, n, elems), rep)
        for key, t in ready.items():
            try:
                t.ok(t.cell("del t\nt = torch.ones(1, device=x.device)"), timeout=120)
            except Exception as e:
                log(f"{key}: freeing t failed: {short_error(e)}")


def live_phase(n: int, args: argparse.Namespace, store: Store, tmp: str, cleanup: P.Watch) -> None:
    """Every live-pool section for n ranks, the tools' kernels up once: memory, warm cells, output, results, training."""
    tools = _live_tools(n, args, tmp, cleanup)
    pools = {k: t for k, t in tools.items() if k != "accelerate"}
    try:
        live_memory(n, pools, args, store, tmp, cleanup)
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
                store.measure(f"train.ratio.n{n}", lambda: train_turns(d, n, args, tmp), rep)
    finally:
        for t in tools.values():
            t.stop()
