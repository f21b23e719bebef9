"""bench_peers.py's plots: each question's cost against n, one PNG per figure of docs/bench/ (matplotlib, imported here only)."""
from __future__ import annotations

import argparse
import statistics
from typing import Any, Callable, List, Optional, Tuple

from harness import MIB, Store
from peers_tools import LABELS

COLORS = {"ddp": "#d62728", "accelerate": "#ff7f0e", "ipp": "#1f77b4", "nbd": "#2ca02c", "torchrun": "#9467bd",
          "spawn": "#8c564b", "bare": "#7f7f7f", "plain": "#17becf", "memcpy": "#000000"}


def _plain_log_labels(ax: Any) -> None:
    """Log axes labelled 0.2, 0.5, 1, 2, 5, 10, not 2×10⁻¹."""
    import math

    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if v > 0 and round(v / 10 ** math.floor(math.log10(v))) in (2, 5) else ""))


def _points(ns: List[int], values: Callable[[int], List[float]]) -> Tuple[List[int], List[float], List[float], List[float]]:
    """Per n with samples: n, the median, and the error bar's reach down to the min and up to the max."""
    xs: List[int] = []
    ys: List[float] = []
    lo: List[float] = []
    hi: List[float] = []
    for n in ns:
        vals = values(n)
        if vals:
            m = statistics.median(vals)
            xs.append(n)
            ys.append(m)
            lo.append(m - min(vals))
            hi.append(max(vals) - m)
    return xs, ys, lo, hi


class _Plotter:
    """The figures of one run, each a PNG next to the report; `written` lists their paths."""

    def __init__(self, store: Store, args: argparse.Namespace, meta: dict, out_prefix: str) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        self.plt = plt
        self.store, self.args, self.out_prefix = store, args, out_prefix
        self.S = store.series.get
        self.ns = args.ns
        self.written: List[str] = []
        self.sub = f"{meta['date']} · {meta['machine_short']} · {args.backend}"

    def series_line(self, ax: Any, key_fmt: str, label: str, color: str, scale: float = 1.0,
                    invert: Optional[Callable[[int], float]] = None, style: str = "-o") -> None:
        def values(n: int) -> List[float]:
            s = self.S(key_fmt.format(n=n))
            return [(invert(n) / v) if invert else v * scale for v in s.values] if s is not None else []

        xs, ys, lo, hi = _points(self.ns, values)
        if xs:
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt=style, color=color, label=label, capsize=3, ms=4, lw=1.5)

    def axes_n(self, ax: Any, logy: bool = True) -> None:
        """x: ranks on a log2 scale labelled by n; y: log with plain labels unless told otherwise."""
        ax.set_xscale("log", base=2)
        ax.set_xticks(self.ns)
        ax.set_xticklabels([str(n) for n in self.ns])
        if logy:
            ax.set_yscale("log")
            _plain_log_labels(ax)

    def save(self, fig: Any, name: str) -> None:
        fig.text(0.99, 0.01, self.sub, ha="right", va="bottom", fontsize=6, color="#666")
        fig.tight_layout()
        path = f"{self.out_prefix}_{name}.png"
        fig.savefig(path, dpi=90)
        self.plt.close(fig)
        self.written.append(path)

    def finish(self, fig: Any, ax: Any, title: str, ylabel: str, name: str, logy: bool = True) -> None:
        self.axes_n(ax, logy)
        ax.set_xlabel("ranks (n)")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.tick_params(labelsize=7, which="both")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        self.save(fig, name)

    def cold_start(self) -> None:
        fig, ax = self.plt.subplots(figsize=(7.6, 3.6))
        for t in ("ddp", "accelerate", "ipp", "nbd", "torchrun", "spawn", "bare"):
            if t in self.args.tools:
                self.series_line(ax, f"cold.{t}.n{{n}}", LABELS[t], COLORS[t], style="--o" if t == "bare" else "-o")
        self.finish(fig, ax, "Cold start: first cell → result (lower is better)", "seconds", "cold_start")

    def warm(self) -> None:
        fig, ax = self.plt.subplots(figsize=(7.6, 3.6))
        self.series_line(ax, "warm.plain.n{n}", "plain cell (Jupyter)", COLORS["plain"], 1e3, style="--o")
        for t in ("ddp", "ipp", "nbd"):
            if t in self.args.tools:
                self.series_line(ax, f"warm.{t}.allreduce.n{{n}}", f"{LABELS[t]} all_reduce cell", COLORS[t], 1e3)
                self.series_line(ax, f"warm.{t}.trivial.n{{n}}", f"{LABELS[t]} `1`", COLORS[t], 1e3, style=":s")
        if "accelerate" in self.args.tools:
            self.series_line(ax, "warm.accelerate.relaunch.n{n}", "accelerate re-run", COLORS["accelerate"], 1e3)
        self.finish(fig, ax, "Warm cell round trip on a live pool (lower is better)", "milliseconds", "warm")

    def result(self) -> None:
        fig, ax = self.plt.subplots(figsize=(7.6, 3.6))
        styles = {s: st for s, st in zip(sorted(self.args.sizes, reverse=True), ["-o", "--s", ":^"])}
        for size in self.args.sizes:
            def inv(n: int, size: int = size) -> float:
                return n * size * MIB / 1e6

            self.series_line(ax, f"result.ddp.n{{n}}.s{size}", f"%%ddp {size} MiB/rank", COLORS["ddp"], invert=inv, style=styles[size])
            self.series_line(ax, f"result.ipp.n{{n}}.s{size}", f"ipyparallel pull {size} MiB/rank", COLORS["ipp"], invert=inv, style=styles[size])
            self.series_line(ax, f"result.memcpy.n{{n}}.s{size}", f"memcpy {size} MiB/rank", COLORS["memcpy"], invert=inv, style=styles[size])
        self.finish(fig, ax, "Result return into the notebook (higher is better)", "MB/s", "result")

    def output(self) -> None:
        fig, axs = self.plt.subplots(1, 2, figsize=(8, 3.6))
        panels = ((axs[0], "lat", 1e3, "print → notebook latency", "milliseconds"),
                  (axs[1], "lines", 1.0, f"a cell printing {self.args.lines:,} lines", "seconds"))
        for ax, what, scale, title, unit in panels:
            self.series_line(ax, f"out.{what}.plain.n{{n}}", "plain cell", COLORS["plain"], scale, style="--o")
            for t in ("ddp", "ipp", "nbd"):
                if t in self.args.tools:
                    self.series_line(ax, f"out.{what}.{t}.n{{n}}", LABELS[t], COLORS[t], scale)
            self.axes_n(ax)
            ax.tick_params(labelsize=7, which="both")
            ax.set_xlabel("ranks (n)")
            ax.set_ylabel(unit)
            ax.set_title(title + " (lower is better)", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        self.save(fig, "output")

    def training(self) -> None:
        fig, ax = self.plt.subplots(figsize=(7.6, 3.2))
        xs, ys, lo, hi = _points(self.ns, lambda n: self.store.series[f"train.ratio.n{n}"].values if f"train.ratio.n{n}" in self.store.series else [])
        if xs:
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt="-o", color=COLORS["ddp"], capsize=3, ms=4, label="%%ddp ÷ torchrun steps/s (turn pairs; runs min–max)")
        ax.axhline(0.97, color="#999", ls="--", lw=1, label="0.97")
        ax.axhline(1.0, color="#ccc", ls=":", lw=1)
        self.finish(fig, ax, "Training loop: %%ddp cell vs torchrun script (higher is better)", "steps/s ratio", "training", logy=False)


def plots(store: Store, args: argparse.Namespace, meta: dict, out_prefix: str) -> List[str]:
    """The PNGs of docs/bench/: cold start, warm cell, result return, output, training; returns their paths."""
    p = _Plotter(store, args, meta, out_prefix)
    p.cold_start()
    p.warm()
    p.result()
    p.output()
    if "train" not in args.skip:
        p.training()
    return p.written
