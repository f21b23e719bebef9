"""The saved metrics chart of notebooks/10_metrics_and_profile.ipynb, opened untrusted in JupyterLab and Notebook 7.

A shipped notebook opens untrusted (the server's trust database is new). JupyterLab then still shows the chart's
text/html (its renderer is "safe": it sanitizes), and the sanitizer drops <svg> elements and var() colours, which once
left ``loss0.00026287.29314.59049`` where the chart was. The saved chart is built to survive that
(ui/metrics_chart.py): each metric an <img> of a self-contained SVG, the legend's colours in hex, the table in plain
HTML. This opens the committed notebook as a user would and checks what a person sees: every picture decoded at its
size and no stray text where the pictures are; every label inside its picture, measured by Chromium's own fonts; the
legend's colours; numbers in the table that are consistent (min <= last <= the range's top); and the profiled cell's
chart naming the rank its profile says everyone waited for; each picture light in the light theme and dark in the
dark one (its pixels as Chromium paints them: not a white card on a dark page). Shots (light and dark) go to
``$DDP_MAGIC_UI_OUT/saved-chart-untrusted-*.png`` and, with ``DDP_MAGIC_UPDATE_DOCS_IMG=1``, to docs/img/ui/.
"""
from __future__ import annotations

import os
import re
import shutil
from typing import Any, Dict, Iterator

import pytest
from ui_pages import PATHS, luminance, notebook_url, set_theme, shrink, shut_down
from ui_probes import CONTRAST_JS
from ui_server import OUT, ROOT, Server

SHIPPED = "10_metrics_and_profile.ipynb"
NUMBER = re.compile(r"^-?\d+(?:\.\d+)?(?:e[-+]\d+)?[kMGT]?$")
UNITS = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}

pytestmark = [pytest.mark.slow, pytest.mark.browser]
pytest.importorskip("playwright.sync_api", reason="Python Playwright is in requirements-dev.txt")

# every saved chart of the page: its pictures, what text sits among them, its legend's swatches, its table
CHARTS_JS = """() => [...document.querySelectorAll('.jp-OutputArea-output .ddp-metrics')].map(box => {
  const imgs = [...box.querySelectorAll('img')];
  const pictures = imgs.length ? imgs[0].parentElement.parentElement : null;
  return {
    head: box.firstElementChild ? box.firstElementChild.textContent : '',
    svgs: box.querySelectorAll('svg').length,
    images: imgs.map(i => ({complete: i.complete, w: i.naturalWidth, h: i.naturalHeight, src: i.getAttribute('src') || '', alt: i.alt})),
    strayText: pictures ? pictures.textContent.trim() : null,
    swatches: [...box.querySelectorAll('span > span')].map(s => getComputedStyle(s).backgroundColor),
    rows: [...box.querySelectorAll('tr')].map(tr => [...tr.children].map(td => td.textContent)),
    trusted: (() => { const cell = box.closest('.jp-Cell'); const w = window.jupyterapp.shell.currentWidget;
      const i = [...document.querySelectorAll('.jp-Notebook .jp-Cell')].indexOf(cell);
      return w.content.model.cells.get(i).trusted; })(),
    profile: (() => { const out = box.closest('.jp-OutputArea'); return out ? out.textContent : ''; })(),
  };
})"""

# each picture's SVG laid out by Chromium itself: every <text>'s box against the viewBox
FIT_JS = """(srcs) => srcs.map(src => {
  const markup = atob(src.split(',')[1]);
  const host = document.createElement('div');
  host.style.cssText = 'position:absolute;left:-2000px;top:0';
  host.innerHTML = markup;
  document.body.appendChild(host);
  const svg = host.querySelector('svg');
  const [, , w, h] = svg.getAttribute('viewBox').split(' ').map(Number);
  const out = [...svg.querySelectorAll('text')].map(t => { const b = t.getBBox();
    return {text: t.textContent, x0: b.x, y0: b.y, x1: b.x + b.width, y1: b.y + b.height}; })
    .filter(b => b.x0 < -0.5 || b.y0 < -0.5 || b.x1 > w + 0.5 || b.y1 > h + 0.5);
  host.remove();
  return out;
})"""


def read_back(text: str) -> float:
    """"15.9k" is 15900.0."""
    assert NUMBER.match(text), f"{text!r} is not a number as the chart writes them"
    return float(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else float(text)


@pytest.fixture(scope="module", params=list(PATHS))
def shipped(request: Any, server: Server, browser: Any) -> Iterator[Dict[str, Any]]:
    """The committed notebook 10, copied into the server's fresh directory and opened (untrusted) in one front end."""
    kind = request.param
    name = f"saved_chart_{kind}_{SHIPPED}"
    shutil.copyfile(os.path.join(ROOT, "notebooks", SHIPPED), os.path.join(server.nbdir, name))
    context = browser.new_context(viewport={"width": 1200, "height": 900}, device_scale_factor=1)
    page = context.new_page()
    try:
        page.goto(notebook_url(server, kind, name), timeout=60_000)  # JupyterLab's with ?reset: no notebook an earlier test left open
        page.wait_for_selector(".jp-OutputArea-output .ddp-metrics img", timeout=60_000)
        # both saved charts (the notebook has two): on a busy machine Notebook 7 had drawn only the first when read
        page.wait_for_function("() => document.querySelectorAll('.jp-OutputArea-output .ddp-metrics').length >= 2", timeout=60_000)
        page.wait_for_function("() => [...document.querySelectorAll('.ddp-metrics img')].every(i => i.complete)", timeout=30_000)
        page.add_style_tag(content=".Toastify { display: none !important; }")
        yield {"kind": kind, "page": page}
    finally:
        try:
            shut_down(page)
        finally:
            context.close()


def test_the_saved_chart_renders_untrusted(shipped: Dict[str, Any]) -> None:
    page = shipped["page"]
    charts = page.evaluate(CHARTS_JS)
    assert [c["head"] for c in charts] == [
        "ddp_magic metrics: loss, samples_per_s from 2 ranks, steps 0-59 (%ddp metrics gives the data)",
        "ddp_magic metrics: value from 2 ranks, steps 0-9 (%ddp metrics gives the data)",
    ]
    for chart in charts:
        assert chart["trusted"] is False, "the copy must open untrusted (a fresh trust database)"
        assert chart["svgs"] == 0, "no inline SVG reaches an untrusted page"
        assert chart["images"] and all(i["complete"] and (i["w"], i["h"]) == (300, 150) for i in chart["images"]), chart["images"]
        assert chart["strayText"] == "", f"text left among the pictures (a sanitized SVG's labels): {chart['strayText']!r}"
        assert chart["swatches"][:2] == ["rgb(31, 119, 180)", "rgb(255, 127, 14)"], "the legend keeps the ranks' colours"
    training, profiled = charts
    assert [i["alt"].split(":")[0] for i in training["images"]] == ["loss", "samples_per_s"]
    clipped = page.evaluate(FIT_JS, [i["src"] for c in charts for i in c["images"]])
    assert not any(clipped), f"labels outside their picture, as Chromium lays them out: {clipped}"


def test_the_saved_table_is_consistent_and_agrees_with_the_profile(shipped: Dict[str, Any]) -> None:
    training, profiled = shipped["page"].evaluate(CHARTS_JS)
    head, *rows = training["rows"]
    assert head == ["metric", "last (mean over ranks)", "min", "mean", "slowest rank"]
    for name, last, low, mean, slowest in rows:
        m = re.fullmatch(r"(\S+)(?: \((\S+) to (\S+)\))?", last)
        assert m, last
        lo, hi = (read_back(m.group(2)), read_back(m.group(3))) if m.group(2) else (read_back(m.group(1)),) * 2
        value, floor, avg = read_back(m.group(1)), read_back(low), read_back(mean)
        tol = 5e-3 * max(abs(hi), 1e-12)  # the digits shown
        assert floor <= lo + tol and lo - tol <= value <= hi + tol and floor <= avg + tol, (name, last, low, mean)
        assert re.fullmatch(r"no straggler|rank [01] \(\+\d+\.\d\d s\)", slowest) and "+0.00 s" not in slowest, slowest
    (value_row,) = profiled["rows"][1:]
    named = re.search(r"everyone waited for rank (\d)", profiled["profile"])
    assert named, profiled["profile"]
    assert value_row[4].startswith(f"rank {named.group(1)} (profile: the others waited +"), (value_row, named.group(0))


def test_shots_of_the_saved_chart_in_both_themes(shipped: Dict[str, Any]) -> None:
    page, kind = shipped["page"], shipped["kind"]
    os.makedirs(OUT, exist_ok=True)
    docs = os.environ.get("DDP_MAGIC_UPDATE_DOCS_IMG") == "1" and kind == "lab"
    for theme in ("light", "dark"):
        if theme == "dark":
            set_theme(page, dark=True)
        chart = page.locator(".jp-OutputArea-output .ddp-metrics").first
        chart.scroll_into_view_if_needed()
        shot = os.path.join(OUT, f"saved-chart-untrusted-{kind}-{theme}.png")
        chart.screenshot(path=shot)
        if docs:
            kept = os.path.join(ROOT, "docs", "img", "ui", f"saved-chart-untrusted-{theme}.png")
            shutil.copyfile(shot, kept)
            shrink(kept)
        low = page.evaluate(CONTRAST_JS, [".ddp-metrics"])
        assert low["checked"] >= 10 and not low["low"], f"{theme}: text under 4.5:1 {low['low'][:5]}"
        pictures = [luminance(img.screenshot()) for img in page.locator(".jp-OutputArea-output .ddp-metrics img").all()[:2]]
        dark = theme == "dark"
        assert pictures and all((lum < 0.3) if dark else (lum > 0.7) for lum in pictures), f"{theme}: the pictures' luminance {pictures}"
    page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})")
