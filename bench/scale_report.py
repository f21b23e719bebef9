"""bench_scale.py's report: the curve of every step against n (kernel CPU and wall), the cost per added rank, the goals at 1,024."""
from __future__ import annotations

import argparse
import statistics
from typing import Callable, List, Optional, Tuple

from harness import MIB, Series, Store, fmt, med, notes_section, spread, table

API_STEPS = (("start", "pool start: every socket admitted, every rank READY"), ("trivial", "warm trivial cell `1` (n small results)"),
             ("raise", "rank 1 raises, the others wait in all_reduce: the cell's error"), ("buffer", "n × 1 MiB results"))
KERNEL_STEPS = (("start", "`%%ddp -n N` first cell (the pool starts)"), ("plain", "plain cell `1`"), ("view", "`%%ddp` `1`, default status view"),
                ("noview", "`%%ddp --no-widget` `1`"), ("raise", "rank 1 raises, the others wait in all_reduce: the error shown"),
                ("buffer", "`%%ddp --no-widget` n × 1 MiB results (RankResults shown)"))
PROFILED = (("view", "`%%ddp` `1`, default view"), ("noview", "`%%ddp --no-widget` `1`"), ("raise", "rank 1 raises"))


def info_series(s: Optional[Series], field: str) -> Series:
    """The samples' ``info[field]`` as a series (e.g. each sample's kernel CPU)."""
    out = Series()
    out.values = [float(i[field]) for i in (s.info if s else []) if isinstance(i, dict) and i.get(field) is not None]
    out.errors = list(s.errors) if s else []
    return out


def _cpu(s: Optional[Series]) -> Series:
    return info_series(s, "cpu")


def _curve(store: Store, prefix: str, steps: Tuple[Tuple[str, str], ...], ns: List[int], pick: Callable[[Optional[Series]], Optional[Series]],
           scale: float = 1e3, digits: int = 1) -> List[str]:
    S = store.series.get
    return table(["step"] + [f"n = {n}" for n in ns], [[label] + [fmt(pick(S(f"{prefix}.{key}.n{n}")), scale, digits) for n in ns] for key, label in steps])


SUPERLINEAR = 1.25  # the last segment's cost per rank over the one before: more than this is flagged


def per_rank(store: Store, key: str, ns: List[int], pick: Callable[[Optional[Series]], Optional[Series]]) -> List[Optional[float]]:
    """µs per added rank between consecutive n (medians), from 64 up (None below, or where a median is missing)."""
    out: List[Optional[float]] = []
    for a, b in zip(ns, ns[1:]):
        ma, mb = med(pick(store.series.get(key.format(n=a)))), med(pick(store.series.get(key.format(n=b))))
        out.append(1e6 * (mb - ma) / (b - a) if ma is not None and mb is not None and a >= 64 else None)
    return out


def _verdict(slopes: List[Optional[float]]) -> str:
    """Whether the cost per rank grows with n (faster than linear) between the last two segments."""
    known = [x for x in slopes if x is not None]
    if len(known) < 2:
        return "—"
    before, last = known[-2], known[-1]
    return f"**yes** ({last / before:.2f}×)" if last > SUPERLINEAR * max(before, 1.0) else "no"


def _slopes(store: Store, ns: List[int]) -> List[str]:
    pairs = [f"{a} → {b}" for a, b in zip(ns, ns[1:])]
    rows = []
    for prefix, steps in (("api.sim", API_STEPS), ("kernel", KERNEL_STEPS)):
        for key, label in steps:
            for what, pick in (("CPU", _cpu), ("wall", lambda s: s)):
                slopes = per_rank(store, f"{prefix}.{key}.n{{n}}", ns, pick)
                cells = ["—" if x is None else f"{x:.0f}" for x in slopes]
                rows.append([f"{'API' if prefix == 'api.sim' else 'kernel'}: {label}, {what}"] + cells + [_verdict(slopes)])
    return ([f"### Cost per added rank (µs per rank, between consecutive n, medians; from 64 up); faster than linear: the last segment "
             f"costs more than {SUPERLINEAR}× per rank than the one before\n"]
            + table(["step"] + pairs + ["faster than linear?"], rows))


def _view_over_plain(store: Store, ns: List[int]) -> List[str]:
    """%%ddp `1` − the plain cell, pair by pair (the same repeat), wall and kernel CPU."""
    row_w, row_c = ["`%%ddp` `1` − plain cell, wall"], ["`%%ddp` `1` − plain cell, kernel CPU"]
    for n in ns:
        row_w.append(spread(store.diffs(f"kernel.view.n{n}", f"kernel.plain.n{n}", 1e3), 1))
        v, p = _cpu(store.series.get(f"kernel.view.n{n}")).values, _cpu(store.series.get(f"kernel.plain.n{n}")).values
        row_c.append(spread([1e3 * (a - b) for a, b in zip(v, p)], 1))
    return table(["ms"] + [f"n = {n}" for n in ns], [row_w, row_c])


def _goals(store: Store, ns: List[int]) -> List[str]:
    """The issue's table at the largest n: each goal, what was measured (medians), whether it holds."""
    S, top = store.series.get, max(ns)

    def m(key: str, pick: Callable[[Optional[Series]], Optional[Series]] = lambda s: s, scale: float = 1e3) -> Optional[float]:
        v = med(pick(S(key)))
        return None if v is None else v * scale

    def f(v: Optional[float], digits: int = 0) -> str:
        return "—" if v is None else f"{v:.{digits}f}"

    def met(ok: Optional[bool]) -> str:
        return "—" if ok is None else ("yes" if ok else "**no**")

    over_w = store.diffs(f"kernel.view.n{top}", f"kernel.plain.n{top}", 1e3)
    v, p = _cpu(S(f"kernel.view.n{top}")).values, _cpu(S(f"kernel.plain.n{top}")).values
    over_c = [1e3 * (a - b) for a, b in zip(v, p)]
    slope = per_rank(store, "kernel.view.n{n}", ns, _cpu)[-1] if len(ns) > 1 else None
    start_cpu, raise_wall = m(f"api.sim.start.n{top}", _cpu), m(f"kernel.raise.n{top}", scale=1.0)
    reform = info_series(S(f"api.sim.raise.n{top}"), "reform_s").values
    small = m(f"api.sim.trivial.n{top}")
    mem = med(S(f"mem.kernel.n{top}")), med(S("mem.kernel.n1"))
    buf, copy = med(S(f"api.sim.buffer.n{top}")), med(S(f"api.memcpy.n{top}"))
    rate = lambda t: None if t is None else top * MIB / t / 1e6  # noqa: E731
    view = m(f"view.update.n{top}")
    c_med = statistics.median(over_c) if over_c else None
    rows = [
        ["pool start: every socket admitted, authenticated", "≤ 2 s kernel-side", f"{f(start_cpu)} ms CPU, {f(m(f'api.sim.start.n{top}'))} ms wall",
         met(None if start_cpu is None else start_cpu <= 2000)],
        ["warm trivial cell over a plain cell, default view", "≤ 50 ms, ≤ 50 µs per added rank from 64 up",
         f"{spread(over_c, 0)} ms CPU, {spread(over_w, 0)} ms wall; {f(slope)} µs CPU per added rank ({ns[-2] if len(ns) > 1 else '—'} → {top})",
         met(None if c_med is None else c_med <= 50 and (slope is None or slope <= 50))],
        ["one rank raises while the others wait: the error shown", "≤ 1 s after the raise",
         f"{f(raise_wall, 2)} s wall in a kernel (execute → idle); {f(m(f'api.sim.raise.n{top}', scale=1.0), 2)} s through the API",
         met(None if raise_wall is None else raise_wall <= 1.0)],
        ["group re-form", "≤ 2 s", f"{spread(reform, 2)} s", met(statistics.median(reform) <= 2.0 if reform else None)],
        [f"{top} small results", "≤ 100 ms", f"{f(small)} ms wall, {f(m(f'api.sim.trivial.n{top}', _cpu))} ms kernel CPU (API)",
         met(None if small is None else small <= 100)],
        [f"{top} × 1 MiB results", "at memory speed over loopback", f"{f(rate(buf))} MB/s (API); one memcpy of the same bytes: {f(rate(copy))} MB/s",
         met(None if buf is None or copy is None else rate(buf) >= 0.5 * rate(copy))],  # type: ignore[operator]
        ["kernel memory with the pool idle, over a 1-rank pool", "≤ 300 MB",
         "—" if None in mem else f"{mem[0] - mem[1]:+.0f} MiB ({mem[0]:.0f} vs {mem[1]:.0f})", met(None if None in mem else mem[0] - mem[1] <= 300)],  # type: ignore[operator]
        ["status view's update, live", "≤ 10 ms", f"{f(view, 1)} ms (snapshot + the two HTML values, in-process)", met(None if view is None else view <= 10)],
    ]
    return ([f"## The goals at n = {top}\n", "Met: “at memory speed” is read as at least half a memcpy's rate (the ranks write the bytes too, "
             "on the same two cores). Where a goal is missed, the next section says where the time goes.\n"]
            + table(["step", "goal", "measured (median (min–max))", "met"], rows) + _phases(store, top))


def _phases(store: Store, top: int) -> List[str]:
    """The profiled cells at the largest n: kernel CPU per phase (scale_phases.py), medians of the repeats."""
    S = store.series.get
    series = {name: S(f"phase.{name}.n{top}") for name, _ in PROFILED}
    if not any(s and s.info for s in series.values()):
        return []
    from scale_phases import GC, PHASES

    def col(name: str, phase: Optional[str]) -> str:
        s = series[name]
        if not s or not s.info:
            return "—"
        if phase is None:  # the rest: the cell's CPU no phase covers
            vals = [1e3 * (v - sum(i[p] for _, _, p in PHASES)) for v, i in zip(s.values, s.info)]
        else:
            vals = [1e3 * (i[phase] if phase != "total" else v) for v, i in zip(s.values, s.info)]
        return spread(vals, 1)

    rows = [[label] + [col(name, phase) for name, _ in PROFILED] for label, phase in
            [("the cell, all of it", "total")] + [(p, p) for _, _, p in PHASES] + [("the rest (IPython, the session, the magic)", None), (GC, GC)]]
    walls = [spread([1e3 * i["wall"] for i in series[name].info], 0) if series[name] and series[name].info else "—" for name, _ in PROFILED]
    return ([f"### Where the kernel's CPU goes at n = {top} (ms, a kernel of its own, bench/scale_phases.py)\n"]
            + table(["phase"] + [label for _, label in PROFILED], rows + [["wall (execute → idle)"] + walls]))


def _real(store: Store, ns: List[int]) -> List[str]:
    if not ns:
        return []
    out = [f"## Real ranks (torch, gloo, forked from the template) at n = {', '.join(map(str, ns))}, on this machine's cores (oversubscribed)\n",
           "What is measured is the kernel's cost; a rank's own time on a shared core is in the wall figure.\n", "Kernel CPU (ms):\n"]
    out += _curve(store, "api.real", API_STEPS, ns, _cpu)
    return out + ["Wall (ms):\n"] + _curve(store, "api.real", API_STEPS, ns, lambda s: s)


def _memory(store: Store, ns: List[int]) -> List[str]:
    S = store.series.get
    base = med(S("mem.kernel.n1"))
    rows = []
    for n in [1] + ns:
        rss = med(S(f"mem.kernel.n{n}"))
        rows.append([f"n = {n}", fmt(S(f"mem.kernel.n{n}"), digits=0), "—" if base is None or rss is None else f"{rss - base:+.0f}"])
    view = [[f"n = {n}", fmt(S(f"view.update.n{n}"), 1e3, 2)] for n in ns]
    return (["## Kernel memory with the pool idle (MiB RSS, a fresh kernel per n) and the status view's update (ms)\n"]
            + table(["pool", "kernel RSS", "over a 1-rank pool"], rows) + table(["pool", "view update"], view))


def render(store: Store, args: argparse.Namespace, meta: dict) -> str:
    ns = args.ns
    head = [
        "# A thousand ranks from one notebook: what the kernel pays\n",
        f"{meta['date']} · {meta['machine']} · Python {meta['python']} · load average {meta['load_start']:.2f} at start, "
        f"{meta['load_end']:.2f} at end (other engineers' work shared the machine; every figure is a median (min–max) of {args.repeats} "
        "interleaved repeats, each repeat visiting every n) · total {:.1f} min\n".format(meta["bench_s"] / 60),
        "The kernel side runs for real (session, pool, hub, admission, policy, recovery, forensics, view); the ranks are simulated "
        "(bench/simranks: the real wire protocol, hundreds per process, no torch). Kernel CPU: every thread of the kernel process "
        "(time.process_time); wall: the call (API) or execute → idle at the client (kernel). How it is measured: bench/README.md.\n",
    ]
    api = ["## Through the Pool API (the kernel side without IPython)\n", "Kernel CPU (ms):\n"] + _curve(store, "api.sim", API_STEPS, ns, _cpu)
    api += ["Wall (ms):\n"] + _curve(store, "api.sim", API_STEPS, ns, lambda s: s)
    kern = ["## In a Jupyter kernel (%%ddp cells as a user runs them)\n", "Kernel CPU (ms):\n"] + _curve(store, "kernel", KERNEL_STEPS, ns, _cpu)
    kern += ["Wall (ms, execute → idle):\n"] + _curve(store, "kernel", KERNEL_STEPS, ns, lambda s: s) + _view_over_plain(store, ns)
    out = head + _goals(store, ns) + api + kern + _slopes(store, ns) + _real(store, args.real_ns) + _memory(store, ns)
    return "\n".join(out + notes_section(store.notes + _errors(store)))


def _errors(store: Store) -> List[str]:
    return [f"{key}: {len(s.errors)} failed: {s.errors[0][:200]}" for key, s in sorted(store.series.items()) if s.errors]

