"""The benchmarks' shared harness: samples kept by repeat, median (min–max), ratios pair by pair, the report writer.

Every bench_*.py file measures one question and leaves the bookkeeping here:

- ``Store.measure(key, fn, rep)`` runs one sample; an exception becomes the table cell's error, never a crash;
  ``rep`` keeps the sample by repeat, so two columns measured in the same repeat make a ratio pair by pair
  (``Store.ratios``): the repeats interleave the things compared, and a slow moment of the machine hits both;
- ``fmt`` and ``fmt_ratio`` write a figure as "median (min–max)"; ``write_report`` keeps the Markdown table
  and every raw sample (JSON); ``run_meta`` says on what machine, under what load, the figures were taken.

Standard library only: children of a bench (``python -c``, ``--child``) import it before anything else.
"""
from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESULTS_DIR = os.path.join(HERE, "results")
DOCS_DIR = os.path.join(REPO, "docs", "bench")
PY = sys.executable
MIB = 1 << 20


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def short_error(e: BaseException, limit: int = 300) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def cell_text(text: str) -> str:
    """Text that fits in one Markdown table cell."""
    return text.replace("|", "/").replace("\n", " ").strip()


class Series:
    """The repeats of one measurement: values (seconds, or whatever the key says), errors, and per-sample info."""

    def __init__(self) -> None:
        self.values: List[float] = []
        self.errors: List[str] = []
        self.info: List[Any] = []

    def to_dict(self) -> dict:
        return {"values": self.values, "errors": self.errors, "info": self.info}

    @classmethod
    def from_dict(cls, d: dict) -> "Series":
        s = cls()
        s.values, s.errors, s.info = list(d.get("values", [])), list(d.get("errors", [])), list(d.get("info", []))
        return s


class Store:
    """Every series of a run, the samples also by repeat (for pairwise ratios), and notes for the report."""

    def __init__(self) -> None:
        self.series: Dict[str, Series] = {}
        self.by_rep: Dict[str, Dict[int, float]] = {}
        self.notes: List[str] = []

    def get(self, key: str) -> Series:
        return self.series.setdefault(key, Series())

    def measure(self, key: str, fn: Callable[[], Any], rep: Optional[int] = None, quiet: bool = False) -> Optional[float]:
        """Run fn; a float (or (float, info)) is one sample; an exception is one error, never a crash."""
        s = self.get(key)
        try:
            got = fn()
        except Exception as e:  # a failed measurement goes in its table cell
            s.errors.append(short_error(e))
            if not quiet:
                log(f"{key}: FAILED {short_error(e, 200)}")
            return None
        value, info = got if isinstance(got, tuple) else (got, None)
        if info is not None:
            s.info.append(info)
        s.values.append(float(value))
        if rep is not None:
            self.by_rep.setdefault(key, {})[rep] = float(value)
        if not quiet:
            log(f"{key}: {float(value):.4f}")
        return float(value)

    def error(self, key: str, text: str) -> None:
        self.get(key).errors.append(text)
        log(f"{key}: FAILED {text[:200]}")

    def add(self, key: str, values: List[float]) -> None:
        """Samples taken elsewhere (a child process), by repeat in the order given."""
        for v in values:
            self.by_rep.setdefault(key, {})[len(self.get(key).values)] = v
            self.get(key).values.append(v)

    def merge(self, series: Dict[str, dict]) -> None:
        """A child's series (``Series.to_dict``), appended to ours."""
        for key, d in series.items():
            other, s = Series.from_dict(d), self.get(key)
            s.values += other.values
            s.errors += other.errors
            s.info += other.info
            if other.values:
                log(f"{key}: median {statistics.median(other.values):.4f} over {len(other.values)}")

    def ratios(self, num: str, den: str) -> List[float]:
        a, b = self.by_rep.get(num, {}), self.by_rep.get(den, {})
        return [a[r] / b[r] for r in sorted(set(a) & set(b)) if b[r]]

    def diffs(self, a_key: str, b_key: str, scale: float = 1.0) -> List[float]:
        a, b = self.by_rep.get(a_key, {}), self.by_rep.get(b_key, {})
        return [scale * (a[r] - b[r]) for r in sorted(set(a) & set(b))]

    def payload(self, meta: dict) -> dict:
        return {"meta": meta, "series": {k: s.to_dict() for k, s in self.series.items()}, "by_repeat": self.by_rep, "notes": self.notes}


def spread(vals: List[float], digits: int = 2, unit: str = "") -> str:
    """"median (min–max)" of plain numbers; one value alone; "—" for none."""
    if not vals:
        return "—"
    m, lo, hi = statistics.median(vals), min(vals), max(vals)
    return f"{m:.{digits}f}{unit} ({lo:.{digits}f}–{hi:.{digits}f})" if len(vals) > 1 else f"{m:.{digits}f}{unit}"


def fmt(s: Optional[Series], scale: float = 1.0, digits: int = 2, invert: Optional[float] = None) -> str:
    """median (min–max) of s.values*scale, or of invert/value (a rate); errors shown in the cell."""
    if s is None or (not s.values and not s.errors):
        return "—"
    if not s.values:
        return cell_text(f"ERROR: {s.errors[0][:160]}")
    text = spread([invert / v if invert is not None else v * scale for v in s.values], digits)
    if s.errors:
        text += f" [{len(s.errors)} failed: {s.errors[0][:80]}]"
    return cell_text(text)


def fmt_ratio(vals: List[float], digits: int = 2) -> str:
    return spread(vals, digits, "×")


def med(s: Optional[Series]) -> Optional[float]:
    return statistics.median(s.values) if s is not None and s.values else None


def ratio(a: Optional[float], b: Optional[float], digits: int = 2) -> str:
    return f"{a / b:.{digits}f}×" if a is not None and b else "—"


def table(header: List[str], rows: List[List[str]]) -> List[str]:
    """A Markdown table, then a blank line."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows] + [""]


def notes_section(notes: List[str]) -> List[str]:
    return ["## Notes\n"] + [f"- {cell_text(x)}" for x in notes] + [""] if notes else []


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def machine() -> Tuple[str, str]:
    """(a long description of this machine, a short one for plot captions)."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    cpus = cpu_count()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    return f"{cpus} CPU cores ({model}), {mem:.0f} GiB RAM, Linux {platform.release()}", f"{cpus} cores, {mem:.0f} GiB"


def run_meta(args: Any, t_start: float, load_start: float, **more: Any) -> dict:
    """When, where and under what load a run was taken (the report's header reads it)."""
    mach, short = machine()
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "machine": mach, "machine_short": short, "cpus": cpu_count(),
        "mem_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30), "python": platform.python_version(),
        "bench_s": time.monotonic() - t_start, "load_start": load_start, "load_end": os.getloadavg()[0],
        "args": {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(args).items()},
    }
    meta.update(more)
    return meta


def write_report(out: str, md: str, payload: dict) -> None:
    """Print the Markdown report and keep it, with every raw sample, as out.md and out.json."""
    print(md)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out + ".md", "w") as f:
        f.write(md + "\n")
    with open(out + ".json", "w") as f:
        json.dump(payload, f, indent=1)
    log(f"wrote {out}.md and {out}.json")
