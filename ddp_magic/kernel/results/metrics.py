"""A cell's ``ddp_magic.log`` rows in the kernel: kept per cell, given back as columns, summed up for the chart.

The ranks send rows (procs/rank_metrics.py) on their control sockets; the hub hands
them to the cell's listener, whose outermost layer (``MetricsTee``, put there by the
session) stores them here and passes them on to the front end's views. Each rank's
rows are kept in the order they arrived, which is the order the rank logged them.

``columns()`` is the data a user gets (``%ddp metrics``, the cell's ``.metrics``): a
dict of equal-length lists, ``{"rank": [...], "step": [...], "time": [...], "loss": [...]}``,
rank by rank, a missing value None. ``pandas.DataFrame(columns)`` takes it as it is.
``summary()`` and ``payload()`` are what the chart (ui/metrics_chart.py) and the
JupyterLab panel show.

The slowest rank has one rule (``Straggler``): when ``%%ddp --profile`` ran, the profile
names it (kernel/results/profile_merge.py: the rank the others waited for in collectives) and every
view says so; otherwise the steps do (the rank that logged the steps every rank logged later
than the others, typically). Either way a rank is named only when it cost the others at least
``STRAGGLER_MIN_S`` and a ``STRAGGLER_SHARE`` of the time (a step, or the profiled cell):
less is noise, and a "slowest rank +0.00 s" names nobody.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..ranks import Listener, RankInfo

Row = Tuple[int, float, Dict[str, float]]  # (step, wall time in s, {name: value})
Point = Tuple[int, float]  # (step, value)
MAX_POINTS = 200  # per line in a chart or a panel message: enough for a picture, small on the wire
STRAGGLER_MIN_S = 0.01  # a rank that holds the others back by less is no straggler: noise, and "+0.00 s" at two decimals
STRAGGLER_SHARE = 0.1  # ... nor one that costs them less than a tenth of a step (or of the profiled cell)


def stands_out(lag: float, span: float) -> bool:
    """Whether a delay of ``lag`` seconds, in ``span`` seconds (a step, or a profiled cell), names a straggler."""
    return lag >= max(STRAGGLER_MIN_S, STRAGGLER_SHARE * span)


class StragglerMeasure(str, Enum):
    """What named the slowest rank: the profile's collectives when a profile ran, else the logged steps."""

    STEPS = "steps"  # the ranks' wall clock at each ddp_magic.log step that every rank logged
    PROFILE = "profile"  # %%ddp --profile: who the others waited for in collectives


@dataclass(frozen=True)
class Straggler:
    """The slowest rank (None: no straggler) and by how much, in seconds: with STEPS, how much later it logged a
    step than the first rank (the median over the steps every rank logged); with PROFILE, how much longer the
    others sat in collectives than it did."""

    rank: Optional[int]
    lag: float
    measure: StragglerMeasure


@dataclass(frozen=True)
class MetricSummary:
    """One metric over the ranks: what the chart's table shows."""

    name: str
    last: float  # mean over the ranks of each rank's last value
    last_lo: float  # the lowest and highest of those last values
    last_hi: float
    min: float  # the lowest value any rank logged
    mean: float  # the mean over every rank and step
    slowest: Optional[int]  # the straggler (Straggler.rank; None: one rank, or none stands out)
    lag: float  # Straggler.lag (s)
    slowest_by: StragglerMeasure  # which measure named it
    steps: Tuple[int, int]  # the first and last step logged


class CellMetrics:
    """The rows of one cell, per rank, in arrival order."""

    def __init__(self, label: str = "") -> None:
        self.label = label
        self.rows: Dict[int, List[Row]] = {}
        self.names: List[str] = []  # metric names, first seen first
        self.version = 0  # moves with every add: a view redraws when it did
        self.profiled: Optional[Straggler] = None  # --profile's verdict (kernel/results/profile_merge.py): it names the straggler

    def __bool__(self) -> bool:
        return bool(self.rows)

    def __len__(self) -> int:
        return sum(len(r) for r in self.rows.values())

    def add(self, rank: int, rows: Sequence[Row]) -> None:
        kept = self.rows.setdefault(rank, [])
        for step, t, values in rows:
            kept.append((int(step), float(t), dict(values)))
            for name in values:
                if name not in self.names:
                    self.names.append(name)
        self.version += 1

    def last_step(self) -> Optional[int]:
        """The highest step any rank has logged (None: nothing yet): a running job's progress."""
        lasts = [rows[-1][0] for rows in list(self.rows.values()) if rows]
        return max(lasts) if lasts else None

    def tee(self, inner: Listener, front: Listener) -> "MetricsTee":
        return MetricsTee(self, inner, front)

    # ------------------------------------------------------------ data
    def columns(self) -> Dict[str, List[Any]]:
        """Every row as columns: rank, step, time (unix seconds), then one column per metric (None where not logged)."""
        out: Dict[str, List[Any]] = {"rank": [], "step": [], "time": []}
        names = [n for n in list(self.names) if n not in out]  # a background cell's rows keep coming while this reads
        out.update({n: [] for n in names})
        for rank in sorted(self.rows):
            for step, t, values in list(self.rows[rank]):
                out["rank"].append(rank)
                out["step"].append(step)
                out["time"].append(t)
                for n in names:
                    out[n].append(values.get(n))
        return out

    def frame(self) -> Any:
        """The columns as a pandas DataFrame (pandas must be installed)."""
        try:
            import pandas
        except ImportError:
            raise ImportError("%ddp metrics --df needs pandas (pip install pandas); without it, %ddp metrics gives a dict of lists") from None
        return pandas.DataFrame(self.columns())

    def series(self, name: str) -> Dict[int, List[Point]]:
        """One metric's (step, value) points per rank, in logging order."""
        out: Dict[int, List[Point]] = {}
        for rank in sorted(self.rows):
            points = [(step, values[name]) for step, _, values in self.rows[rank] if name in values]
            if points:
                out[rank] = points
        return out

    # ------------------------------------------------------------ summaries
    def summary(self) -> List[MetricSummary]:
        return [s for s in (self._summary(n) for n in self.names) if s is not None]

    def _summary(self, name: str) -> Optional[MetricSummary]:
        per_rank = {r: [(step, t, v[name]) for step, t, v in rows if name in v] for r, rows in self.rows.items()}
        per_rank = {r: p for r, p in per_rank.items() if p}
        values = [x for p in per_rank.values() for _, _, x in p if not math.isnan(x)]
        if not values:
            return None
        lasts = [p[-1][2] for p in per_rank.values()]
        slow = self.profiled if self.profiled is not None else by_steps(per_rank)
        steps = [s for p in per_rank.values() for s, _, _ in p]
        return MetricSummary(
            name=name, last=_mean(lasts), last_lo=min(lasts), last_hi=max(lasts), min=min(values), mean=_mean(values),
            slowest=slow.rank, lag=slow.lag, slowest_by=slow.measure, steps=(min(steps), max(steps)),
        )

    def payload(self, max_points: int = MAX_POINTS) -> Dict[str, Any]:
        """What a chart or the JupyterLab panel needs, JSON-ready: each line thinned to ``max_points``."""
        return {
            "cell": self.label,
            "names": list(self.names),
            "ranks": sorted(self.rows),
            "rows": len(self),
            "series": {n: {str(r): [[s, _finite(v)] for s, v in thin(pts, max_points)] for r, pts in self.series(n).items()} for n in self.names},
            "summary": [{k: _finite(v) for k, v in asdict(s).items()} | {"steps": list(s.steps), "slowest_by": s.slowest_by.value}
                        for s in self.summary()],
        }


def _finite(x: Any) -> Any:
    """NaN and infinities as None: JSON (the comm, a front end's JSON.parse) has no such numbers."""
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _mean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


def by_steps(per_rank: Dict[int, List[Tuple[int, float, float]]]) -> Straggler:
    """The rank that logged the steps every rank logged latest: its median lag behind the first rank, if it stands out.

    The median over the common steps, not the last one: one late wake-up under load names nobody, and a rank that
    is late every step is named whether or not a collective makes the others wait for it later in the step."""
    first: Dict[int, Dict[int, float]] = {}
    for rank, points in per_rank.items():
        mine = first.setdefault(rank, {})
        for step, t, _ in points:
            mine.setdefault(step, t)
    common = sorted(set.intersection(*(set(f) for f in first.values()))) if len(first) > 1 else []
    if not common:
        return Straggler(None, 0.0, StragglerMeasure.STEPS)
    earliest = {s: min(f[s] for f in first.values()) for s in common}
    lags = {r: statistics.median(f[s] - earliest[s] for s in common) for r, f in first.items()}
    rank = max(lags, key=lambda r: lags[r])
    typical = 0.0  # the slowest rank's typical step: the time a lag is measured against
    if len(common) > 1:
        typical = max(statistics.median(f[b] - f[a] for a, b in zip(common, common[1:])) for f in first.values())
    return Straggler(rank if stands_out(lags[rank], typical) else None, lags[rank], StragglerMeasure.STEPS)


def thin(points: Sequence[Point], limit: int) -> List[Point]:
    """At most ``limit`` points, evenly spread, the first and last always kept."""
    if len(points) <= limit or limit < 2:
        return list(points)
    step = (len(points) - 1) / (limit - 1)
    return [points[round(i * step)] for i in range(limit)]


class MetricsTee(Listener):
    """The outermost listener of a cell: rows into the store and on to the front end; the rest to ``inner``.

    ``inner`` is the chain the session builds (the export history's tap, then the front end);
    ``front`` is the front end itself, which hears the rows directly.
    """

    def __init__(self, store: CellMetrics, inner: Listener, front: Listener) -> None:
        self.store = store
        self.inner = inner
        self.front = front

    def on_output(self, rank: int, stream: str, text: str) -> None:
        self.inner.on_output(rank, stream, text)

    def on_state(self, info: RankInfo) -> None:
        self.inner.on_state(info)

    def on_states(self, infos: Any) -> None:
        self.inner.on_states(infos)

    def on_notice(self, text: str) -> None:
        self.inner.on_notice(text)

    def on_metrics(self, rank: int, rows: List[Row]) -> None:
        self.store.add(rank, rows)
        self.front.on_metrics(rank, rows)
