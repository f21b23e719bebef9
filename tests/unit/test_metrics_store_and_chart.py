"""ddp_magic.log's pieces without processes: the rank's buffer, the kernel's store, the chart, the nbval rule."""
from __future__ import annotations

import base64
import json
import math
import re
import xml.etree.ElementTree as ET
import threading
import time
from pathlib import Path

import pytest

from ddp_magic.kernel.results.metrics import CellMetrics, thin
from ddp_magic.procs import rank_metrics
from ddp_magic.ui import metrics_chart
from ddp_magic.ui.metrics_chart import PALETTE, ChartForm, identical_ranks, metric_svg, tick_labels
from ddp_magic.ui.metrics_view import MetricsView, metrics_data
from ddp_magic.wire import protocol as P

ROOT = Path(__file__).resolve().parents[2]


def _store() -> CellMetrics:
    m = CellMetrics("3")
    m.add(0, [(0, 100.0, {"loss": 2.0}), (1, 100.5, {"loss": 1.0, "tok_s": 50.0})])
    m.add(1, [(0, 100.1, {"loss": 3.0}), (1, 101.5, {"loss": float("nan"), "tok_s": 40.0})])
    return m


def test_columns_are_equal_length_lists_rank_by_rank_with_none_where_not_logged():
    c = _store().columns()
    assert list(c) == ["rank", "step", "time", "loss", "tok_s"]
    assert c["rank"] == [0, 0, 1, 1] and c["step"] == [0, 1, 0, 1]
    assert c["tok_s"] == [None, 50.0, None, 40.0]
    assert len({len(v) for v in c.values()}) == 1


def test_summary_names_the_rank_that_logged_the_common_steps_late():
    loss, tok = _store().summary()
    assert loss.name == "loss" and loss.min == 1.0 and loss.steps == (0, 1)
    # loss: rank 1 logged step 0 0.1 s and step 1 1.0 s after rank 0: median lag 0.55 s, its steps 1.4 s apart (10%: 0.14 s)
    assert loss.slowest == 1 and loss.lag == pytest.approx(0.55) and loss.slowest_by == "steps"
    assert tok.slowest == 1 and tok.lag == pytest.approx(1.0)  # tok_s: one common step, 1.0 s apart
    assert tok.last == 45.0 and (tok.last_lo, tok.last_hi) == (40.0, 50.0)


def test_payload_is_json_without_nan_and_thins_long_lines():
    payload = _store().payload()
    json.loads(json.dumps(payload, allow_nan=False))  # the comm's JSON has no NaN
    assert payload["series"]["loss"]["1"][1] == [1, None]
    pts = [(i, float(i)) for i in range(1000)]
    kept = thin(pts, 200)
    assert len(kept) == 200 and kept[0] == pts[0] and kept[-1] == pts[-1]


def _images(html: str) -> list:
    """The SVG documents a saved chart embeds as <img src='data:image/svg+xml;base64,...'>."""
    return [base64.b64decode(b).decode() for b in re.findall(r"<img src='data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)'", html)]


def test_the_live_chart_is_inline_svg_in_theme_colours():
    html = metrics_chart.chart_html(_store().payload(), live=True)
    assert "<style" not in html and html.count("<svg") == 2 and html.count("<polyline") == 4 and "<img" not in html
    assert "var(--jp-ui-font-color1" in html and "var(--ddp-magic-rank-1,#ff7f0e)" in html and "slowest rank so far" in html
    assert "nothing logged" in metrics_chart.chart_html(CellMetrics().payload())


def test_the_saved_chart_is_what_a_sanitizer_keeps():
    """No <svg>, no <style>, no var() as a colour's only value: each metric an <img> of a self-contained SVG."""
    html = metrics_chart.chart_html(_store().payload())
    assert "<svg" not in html and "<style" not in html and "<script" not in html
    images = _images(html)
    assert len(images) == 2 and sum(svg.count("<polyline") for svg in images) == 4
    for svg in images:
        ET.fromstring(svg)  # a well-formed document
        assert "var(" not in svg and "#ffffff" in svg, "its own colours and its own light card: no page CSS reaches an <img>"
    assert "background:#1f77b4'" in html and "background:#ff7f0e'" in html, "the legend's swatches in plain hex"
    assert "rank 1 (+550 ms)" in html
    text = metrics_chart.chart_text(_store().payload())
    head, columns, loss, tok = text.splitlines()
    assert head == "ddp_magic metrics: loss, tok_s from 2 ranks, steps 0-1 (%ddp metrics gives the data)"
    assert columns.split() == ["metric", "last", "(mean", "over", "ranks)", "min", "mean", "slowest", "rank"]
    assert loss.split() == ["loss", "1", "1", "2", "rank", "1", "(+550", "ms)"]  # rank 1's last loss is NaN: the mean of the others
    assert tok.split() == ["tok_s", "45", "(40", "to", "50)", "40", "45", "rank", "1", "(+1.00", "s)"]


def _sanitize(text: str) -> str:
    """The rules of notebooks/nbval_sanitize.cfg, read and applied as nbval does."""
    cfg = (ROOT / "notebooks" / "nbval_sanitize.cfg").read_text()
    for rx, rep in re.findall("^regex: (.*)$\n^replace: (.*)$", cfg, flags=re.MULTILINE):
        text = re.sub(rx, rep, text)
    return text


def test_nbval_keeps_the_charts_first_line_and_replaces_its_numbers():
    a = _store()
    b = _store()
    b.rows[0].pop()
    b.add(0, [(1, 102.0, {"loss": 0.5, "tok_s": 55.0})])  # the same steps and names, other values
    for form in (metrics_chart.chart_html, metrics_chart.chart_text):
        fa, fb = form(a.payload()), form(b.payload())
        assert fa != fb and _sanitize(fa) == _sanitize(fb)
        assert "loss, tok_s from 2 ranks, steps 0-1" in _sanitize(fa)


def test_rank_log_buffers_and_sends_rows_in_order_off_the_main_thread():
    sent = []
    threads = set()

    def send(op, **fields):
        threads.add(threading.current_thread().name)
        sent.append((op, fields))

    rank_metrics.install(send, 3)
    rank_metrics.begin_cell(7)
    try:
        for i in range(50):
            rank_metrics.log(loss=float(i))
        deadline = time.monotonic() + 5
        while not sent and time.monotonic() < deadline:
            time.sleep(0.01)
        rank_metrics.log(step=100, loss=1.0)
        rank_metrics.end_cell()
        rows = [r for op, f in sent for r in f["rows"]]
        assert all(op == P.METRICS and f["rank"] == 3 and f["cell"] == 7 for op, f in sent)
        assert [s for s, _, _ in rows] == list(range(50)) + [100]
        assert "ddp-metrics" in threads
        with pytest.raises(TypeError, match="is not a number"):
            rank_metrics.log(loss="x")
        with pytest.raises(TypeError, match="needs at least one named value"):
            rank_metrics.log(step=1)
        with pytest.raises(TypeError, match="not a whole number"):
            rank_metrics.log(step=1.5, loss=1)
    finally:
        rank_metrics.STATE.send = None


def test_view_redraws_at_most_once_an_interval_and_leaves_one_static_chart():
    published, shown = [], []
    view = MetricsView(interval=60, publish=lambda p, final: published.append(final), display=lambda d, raw: shown.append(d))
    view.on_metrics(0, [(0, 1.0, {"loss": 1.0})])
    view.on_metrics(0, [(1, 2.0, {"loss": 0.5})])  # within the interval: a timer draws it later
    assert published == [False] and "ddp-metrics" in view.live_html()
    view.finish()
    assert published == [False, True] and len(shown) == 1 and "steps 0-1" in shown[0]["text/plain"]
    assert metrics_data(None) == {"rank": [], "step": [], "time": []}
    assert not math.isnan(view.data.summary()[0].mean)


def test_the_lab_panel_gets_one_small_json_message():
    from ddp_magic.ui import labcomm

    class Bridge:
        session_id = "s1"

        def __init__(self):
            self.comms = {"c": object()}
            self.sent = []

        def _send(self, comm, data):
            self.sent.append(data)

    before, labcomm._bridge = labcomm._bridge, Bridge()
    try:
        labcomm.metrics(_store().payload(), final=True)
        (msg,) = labcomm._bridge.sent
        assert msg["type"] == "metrics" and msg["final"] is True and msg["session"] == "s1"
        assert msg["names"] == ["loss", "tok_s"] and msg["ranks"] == [0, 1] and msg["series"]["loss"]["1"][1] == [1, None]
        assert len(json.dumps(msg)) < 2000
    finally:
        labcomm._bridge = before


def test_the_chart_joins_the_status_view_only_once_something_was_logged():
    class View:
        def __init__(self):
            self.sections, self.changes = [], 0

        def changed(self):
            self.changes += 1

    class Snap:
        finished = False

    view = View()
    mv = MetricsView(interval=0, publish=lambda p, final: None, display=lambda d, raw: None)
    mv.attach(view)
    assert view.sections == []  # a cell that logs nothing: the view is as it was
    mv.on_metrics(1, [(0, 1.0, {"loss": 1.0})])
    ((title, html, text),) = view.sections
    assert title == "Metrics" and view.changes == 1 and "<svg" in html(Snap())
    Snap.finished = True
    assert "<svg" not in html(Snap()) and text(Snap()) == [mv.text]


@pytest.mark.parametrize("values, labels", [
    ([1.049, 8.9245, 16.8], ["1.05", "8.92", "16.80"]),  # once '1.049', '8.923', '16.8': three precisions on one axis
    ([0.0, 0.5, 1.0], ["0.0", "0.5", "1.0"]),
    ([0.0002628, 0.0002864, 0.00031], ["0.0002628", "0.0002864", "0.0003100"]),
    ([-0.05, 0.0, 0.05], ["-0.05", "0.00", "0.05"]),
    ([5181.0, 48840.0, 92500.0], ["5181", "48.8k", "92.5k"]),  # from 10,000 up: fmt's units
    ([1e-6, 2e-6, 3e-6], ["1e-06", "2e-06", "3e-06"]),
])
def test_the_y_axis_labels_read_as_one_scale(values, labels) -> None:
    assert tick_labels(values) == labels
    for v, t in zip(values, labels):  # each label stands for its value, within the digits it shows
        if t[-1] not in "kMGT" and "e" not in t:
            assert abs(float(t) - v) <= 0.5 * 10 ** -len(t.split(".")[1] if "." in t else "") * (1 + 1e-9), (v, t)


def test_identical_ranks_draw_one_line_and_say_so() -> None:
    def payload(second: list) -> dict:
        return {"names": ["loss"], "ranks": [0, 1, 2], "series": {"loss": {"0": [[0, 2.0], [1, 1.0]], "1": second, "2": [[0, 3.0], [1, 1.5]]}}}

    same = metric_svg(payload([[0, 2.0], [1, 1.0]]), "loss", ChartForm.SAVED)
    root = ET.fromstring(same)
    lines = [el for el in root.iter() if el.tag.endswith("polyline")]
    assert len(lines) == 2 and PALETTE[0] in lines[0].get("style", "") and PALETTE[2] in lines[1].get("style", ""), [el.get("style") for el in lines]
    assert any((el.text or "") == "ranks 0-1 identical" for el in root.iter() if el.tag.endswith("text"))
    apart = ET.fromstring(metric_svg(payload([[0, 2.0], [1, 1.01]]), "loss", ChartForm.SAVED))
    assert len([el for el in apart.iter() if el.tag.endswith("polyline")]) == 3
    assert not any("identical" in (el.text or "") for el in apart.iter() if el.tag.endswith("text"))
    assert identical_ranks({"0": [[0, 1.0]], "1": [[0, 1.0]], "2": [[0, 1.0]], "3": [[0, 2.0]]}) == [[0, 1, 2]]
