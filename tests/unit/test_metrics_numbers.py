"""The metrics chart tells the truth: every number it writes reads back as the value it stands for, every label fits
its chart (measured with DejaVu Sans' real advances, the widest common sans-serif), and the slowest rank is named
only when it really held the others back (no "+0.00 s")."""
from __future__ import annotations

import base64
import re
import statistics
import xml.etree.ElementTree as ET
from typing import Dict, List, Tuple

import pytest
from matplotlib import font_manager
from matplotlib.ft2font import FT2Font

from format_patterns import half_place, read_back
from ddp_magic.kernel.results.metrics import STRAGGLER_MIN_S, CellMetrics, Straggler, StragglerMeasure, by_steps
from ddp_magic.ui import metrics_chart as C
from ddp_magic.ui.metrics_chart import fmt

# a dense sweep instead of hypothesis (not installed): 1e-6 ... 1e12 and a little past, each decade at 400 mantissas,
# both signs, plus the edges where rounding carries into the next digit or unit
MANTISSAS = [1 + 9 * i / 400 for i in range(400)] + [9.9994999, 9.9995001, 9.99949, 9.99951, 9.9999999, 1.0000001, 5.963, 1.59]
VALUES = [0.0, -0.0] + [s * m * 10.0**e for e in range(-6, 16) for m in MANTISSAS for s in (1, -1)]


def test_every_value_reads_back_as_itself_within_the_digits_shown():
    wrong = []
    for x in VALUES:
        text = fmt(x)
        back = read_back(text)
        digits = re.sub(r"e.*$|[kMGT]$", "", text).replace("-", "").replace(".", "").lstrip("0").rstrip("0")
        ok = abs(back - x) <= half_place(text) * (1 + 1e-9) and len(digits) <= 4
        ok = ok and abs(back - x) <= (5e-4 if abs(x) < 9999.5 else 5e-3) * abs(x) * (1 + 1e-9)  # 4 significant digits, 3 with a unit
        if not ok:
            wrong.append(f"{x!r} -> {text!r} (reads {back!r})")
    assert not wrong, "\n".join(wrong[:20])


def test_the_issues_numbers_and_the_units():
    assert [fmt(v) for v in (15900, 5963, 0.0002628, -0.0002628, 0, -0.0)] == ["15.9k", "5963", "0.0002628", "-0.0002628", "0", "0"]
    assert [fmt(v) for v in (9999, 9999.7, 999_999, 2.5e6, 3.2e9, 1.5e12, 999.96e12)] == ["9999", "10k", "1M", "2.5M", "3.2G", "1.5T", "1e+15"]
    assert [fmt(v) for v in (None, float("nan"), float("inf"))] == ["-", "-", "-"]


# ---------------------------------------------------------------- every place a value is written
def _throughput() -> CellMetrics:
    """Two ranks logging samples_per_s of about 15,900 (the issue's number) and a loss of about 0.0003."""
    m = CellMetrics("4")
    for rank, base in ((0, 15_900.0), (1, 19_100.0)):
        m.add(rank, [(i, 100.0 + i, {"samples_per_s": base + 10 * i, "loss": 0.0002628 + 1e-5 * i}) for i in range(10)])
    return m


def test_the_table_the_axis_and_the_panel_say_the_numbers_logged():
    m = _throughput()
    payload = m.payload()
    tp = next(s for s in payload["summary"] if s["name"] == "samples_per_s")
    lasts = [15_990.0, 19_190.0]
    assert tp["last"] == statistics.mean(lasts) and tp["min"] == 15_900.0  # the panel gets the numbers themselves
    assert tp["mean"] == pytest.approx(statistics.mean([b + 10 * i for b in (15_900.0, 19_100.0) for i in range(10)]))
    text = C.chart_text(payload)
    row = next(line.split() for line in text.splitlines() if line.strip().startswith("samples_per_s"))
    assert [read_back(row[1]), read_back(row[2].strip("(")), read_back(row[4].strip(")"))] == pytest.approx([17_590.0, 15_990.0, 19_190.0], rel=5e-3)
    assert read_back(row[5]) == pytest.approx(15_900.0, rel=5e-3) and read_back(row[6]) == pytest.approx(tp["mean"], rel=5e-3)
    for form in C.ChartForm:
        svg = C.metric_svg(payload, "samples_per_s", form)
        labels = [t.text or "" for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text") if t.get("text-anchor") == "end"]
        ys = [read_back(t) for t in labels[:3]]  # the y axis' labels come first, bottom up; the last step's follows
        assert ys == pytest.approx([15_900.0, (15_900.0 + 19_190.0) / 2, 19_190.0], rel=5e-3), labels  # y0, the middle, y1
    html = C.chart_html(payload)
    assert "15.9k" in html and "19.2k" in html and "1.59k" not in html


# ---------------------------------------------------------------- no label leaves its chart
_FONTS: Dict[bool, FT2Font] = {}


def _measure(text: str, bold: bool) -> float:
    """The text's width in px at the chart's size, from DejaVu Sans' own advances (bold for the title)."""
    if bold not in _FONTS:
        _FONTS[bold] = FT2Font(font_manager.findfont("DejaVu Sans:bold" if bold else "DejaVu Sans"))
    font = _FONTS[bold]
    font.set_size(C.SIZE, 72)  # 11 pt at 72 dpi: 11 px
    return sum(font.load_char(ord(c)).horiAdvance / 64 for c in text)


class Box:
    """A <text>'s measured box, and what it is."""

    def __init__(self, t: ET.Element) -> None:
        self.text, self.anchor = t.text or "", t.get("text-anchor", "start")
        x, self.baseline = float(t.get("x", 0)), float(t.get("y", 0))
        width = _measure(self.text, "font-weight:600" in (t.get("style") or ""))
        self.left = {"start": x, "middle": x - width / 2, "end": x - width}[self.anchor]
        self.right, self.top, self.bottom = self.left + width, self.baseline - C.ASCENT * C.SIZE, self.baseline + C.DESCENT * C.SIZE

    def __repr__(self) -> str:
        return f"{self.text!r}@({self.left:.1f}..{self.right:.1f}, {self.top:.1f}..{self.bottom:.1f})"


def _boxes(svg: str) -> List[Box]:
    return [Box(t) for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")]


PAYLOADS = {
    "the issue's loss": [0.0002628, 7.29314, 4.59049],
    "tiny": [1e-6, 2.5e-6, 3.3e-6],
    "negative": [-0.0002628, -123456.0, -9.5e11],
    "huge": [1.5e12, 9.99e11, 3.3e12],
    "flat": [5963.0, 5963.0],
    "widest digits": [-88888.8e-9, -0.0008888],
}


@pytest.mark.parametrize("name", list(PAYLOADS))
@pytest.mark.parametrize("form", list(C.ChartForm))
def test_no_label_leaves_the_chart(name, form):
    m = CellMetrics()
    title = "a_metric_with_a_long_name_MMMMWWWW_samples_per_second_per_gpu" if name == "negative" else name
    for rank in (0, 1):
        m.add(rank, [(step * 12_345, 1.0 + step, {title: v}) for step, v in enumerate(PAYLOADS[name])])
    svg = C.metric_svg(m.payload(), title, form)
    root = ET.fromstring(svg)
    vw, vh = (float(v) for v in root.get("viewBox", "").split()[2:])
    title_box, *labels = _boxes(svg)
    note = [b for b in labels if b.text.endswith("identical")]  # both ranks log the same values: one line, and it says so
    assert [b.text for b in note] == ["ranks 0-1 identical"] and note[0].left >= title_box.right, (title_box, note)
    outside = [b for b in [title_box] + labels if b.left < 0 or b.top < 0 or b.right > vw or b.bottom > vh]
    labels = [b for b in labels if b not in note]
    assert not outside, f"labels cut by the chart's edge ({vw}x{vh}): {outside}"
    plot_left = min(float(ln.get("x1", 0)) for ln in root.iter("{http://www.w3.org/2000/svg}line"))
    y_labels = [b for b in labels if b.anchor == "end" and b.baseline < vh - C.BOTTOM + 8]
    assert len(y_labels) == 3 and all(b.right <= plot_left for b in y_labels), f"a y label runs into the plot at {plot_left}: {y_labels}"
    assert all(b.top >= title_box.bottom for b in labels), f"a label overlaps the title {title_box}: {labels}"
    if form is C.ChartForm.SAVED:
        assert "var(" not in svg


# ---------------------------------------------------------------- the slowest rank: named only when it stands out
def _ranks(lateness: Dict[int, List[float]], step_s: float) -> Dict[int, List[Tuple[int, float, float]]]:
    """Rows per rank: step i logged at i * step_s plus the rank's lateness at that step."""
    return {r: [(i, 1000.0 + i * step_s + late, 1.0) for i, late in enumerate(lates)] for r, lates in lateness.items()}


def test_ranks_in_step_have_no_straggler_and_one_late_wakeup_names_nobody():
    jitter = [0.0004 * ((i * 7) % 5) for i in range(20)]  # sub-ms noise, no rank always last
    assert by_steps(_ranks({0: jitter, 1: jitter[::-1], 2: [0.0] * 20}, 0.02)).rank is None
    late_once = [0.0] * 19 + [0.05]  # rank 2 woke up 50 ms late at the last step only: noise, not a straggler
    s = by_steps(_ranks({0: [0.0] * 20, 1: [0.0] * 20, 2: late_once}, 0.02))
    assert s.rank is None and s.measure is StragglerMeasure.STEPS


def test_a_rank_late_every_step_is_named_with_its_lag():
    s = by_steps(_ranks({0: [0.0] * 20, 1: [0.03] * 20}, 0.1))
    assert (s.rank, s.lag) == (1, pytest.approx(0.03))
    # drifting apart (no collective): rank 1 takes 50 ms a step longer; its median lag is its lag at the middle step
    s = by_steps(_ranks({0: [0.0] * 21, 1: [0.05 * i for i in range(21)]}, 0.01))
    assert (s.rank, s.lag) == (1, pytest.approx(0.5))


def test_a_small_lag_names_nobody_whatever_the_step():
    assert by_steps(_ranks({0: [0.0] * 10, 1: [0.005] * 10}, 0.01)).rank is None  # 5 ms: under STRAGGLER_MIN_S
    assert by_steps(_ranks({0: [0.0] * 10, 1: [0.05] * 10}, 1.0)).rank is None  # 50 ms of a 1 s step: under a tenth
    for lag in [i / 1000 + 0.0005 for i in range(30)]:  # off the exact edge, which float sums may land either side of
        s = by_steps(_ranks({0: [0.0] * 5, 1: [lag] * 5}, 0.02))
        text = C.slowest_text({"slowest": s.rank, "lag": s.lag, "slowest_by": s.measure.value})
        assert "+0.00 s" not in text and (text == C.NO_STRAGGLER) == (lag < STRAGGLER_MIN_S), (lag, text)


def test_a_profiles_verdict_names_the_straggler_of_every_metric():
    m = CellMetrics()
    for rank in (0, 1):
        m.add(rank, [(i, 100.0 + i * 0.05, {"loss": 1.0, "x": 2.0}) for i in range(10)])  # the steps say: no straggler
    assert [s.slowest for s in m.summary()] == [None, None] and C.NO_STRAGGLER in C.chart_text(m.payload())
    m.profiled = Straggler(1, 0.45, StragglerMeasure.PROFILE)  # the profile says: everyone waited for rank 1
    assert [(s.slowest, s.slowest_by) for s in m.summary()] == [(1, StragglerMeasure.PROFILE)] * 2
    assert [s["slowest_by"] for s in m.payload()["summary"]] == ["profile", "profile"]  # the panel hears which measure
    text = C.chart_text(m.payload())
    assert text.count("rank 1 (profile: the others waited +450 ms)") == 2 and C.NO_STRAGGLER not in text
    m.profiled = Straggler(None, 0.002, StragglerMeasure.PROFILE)
    assert C.chart_text(m.payload()).count(C.NO_STRAGGLER) == 2


def test_the_saved_chart_embeds_what_it_draws():
    html = C.chart_html(_throughput().payload())
    (a, b) = [base64.b64decode(x).decode() for x in re.findall(r"base64,([A-Za-z0-9+/=]+)'", html)]
    assert "samples_per_s" in a and "loss" in b and a.count("<polyline") == 2
    assert b.count("<polyline") == 1 and "ranks 0-1 identical" in b  # the ranks logged the same loss: one line, said so
