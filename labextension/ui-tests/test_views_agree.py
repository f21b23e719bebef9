"""What a person sees, in JupyterLab and in Notebook 7: the status bar, the DDP panel and the cell's status view
say the same thing at every moment of a cell that fails.

One story per frontend, on the session's one server (ui_fixtures.py), recorded once (``story``) and checked by
the tests below it:

1. light theme, a fresh kernel, Run All: ``%load_ext`` and a 4-rank cell that starts the pool, prints, runs a
   tqdm loop and then fails on rank 1 while the others wait in ``all_reduce``;
2. the palette's *Show %ddp_env* and *Restart DDP Pool*: their toasts;
3. the same cell again (the second run of a cell), which must clear the restart's message from the panel;
4. dark theme, Restart Kernel and Run All: the same cell, followed from the kernel's first moment.

At every sample (about 3 a second) the three views are read in one go in the page. Screenshots of each state
(starting, running, failed) in both themes go to ``docs/img/ui/`` with DDP_MAGIC_UPDATE_DOCS_IMG=1 (small palette PNGs). A shipped notebook,
opened untrusted (the server's trust database is new), must render its saved status view with its colours.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from typing import Any, Dict, Iterator, List, Optional

import pytest
from ui_server import OUT, ROOT, Server, code_cell

pytestmark = [pytest.mark.slow, pytest.mark.browser]
playwright_api = pytest.importorskip("playwright.sync_api", reason="Python Playwright is in requirements-dev.txt")

# the screenshots of each state: docs/img/ui/ with DDP_MAGIC_UPDATE_DOCS_IMG=1, else next to the other test shots (a test run leaves the tree clean)
IMG = os.path.join(ROOT, "docs", "img", "ui") if os.environ.get("DDP_MAGIC_UPDATE_DOCS_IMG") == "1" else os.path.join(OUT, "ui")
CELL = """%%ddp -n 4
import time, torch, torch.distributed as dist
from tqdm.auto import tqdm
rank = dist.get_rank()
print(f"hello from rank {rank}", flush=True)
for step in tqdm(range(12), desc=f"rank {rank}"):
    time.sleep(0.25)
if rank == 1:
    raise ValueError("bad shard on rank 1")
dist.all_reduce(torch.ones(1))"""
PATHS = {"lab": "lab/tree/{}", "notebook": "notebooks/{}"}
SHIPPED = "01_quickstart.ipynb"
AGREE_WITHIN_S = 1.5  # snapshots are throttled to 4 a second, the cell's view to its own pace: they may differ this long
MIN_CONTRAST = 4.5

# ---------------------------------------------------------------- what the page is asked, in one go
SAMPLE_JS = """() => {
  const q = s => document.querySelector(s);
  const cells = document.querySelectorAll('.jp-Notebook .jp-CodeCell');
  const cell = cells[cells.length - 1];
  const first = cell ? cell.querySelector('.jp-OutputArea-child') : null;
  const view = first && first.querySelector('.ddp-status, [class*="ddp-status"]') ? first : null;
  // the cell view's interface (ui/status_tables.py static_html): the strip's squares [data-rank][data-state] or
  // tqdm bars (a running rank), and the rank table's tr[data-rank][data-state]
  const cellRanks = {};
  if (view) {
    view.querySelectorAll('tr[data-rank][data-state]').forEach(r => { cellRanks[r.dataset.rank] = r.dataset.state; });
    view.querySelectorAll('.ddp-status-strip [data-rank]').forEach(e => {
      cellRanks[e.dataset.rank] = e.dataset.state || 'running';
    });
  }
  const panelRanks = {};
  document.querySelectorAll('.jp-ddp-Panel tr.jp-ddp-Rank').forEach(tr => {
    const cls = [...tr.classList].find(c => /^jp-ddp-Rank-(active|ok|bad|warn|idle)$/.test(c)) || '';
    panelRanks[tr.dataset.rank] = [tr.querySelector('.jp-ddp-Rank-state').textContent, cls.replace('jp-ddp-Rank-', '')];
  });
  const sb = q('.jp-ddp-StatusItem');
  const prompt = cell ? cell.querySelector('.jp-InputPrompt').textContent : '';
  return {
    t: Date.now() / 1000,
    statusBar: sb ? (sb.offsetParent ? sb.textContent : '') : null,
    summary: q('.jp-ddp-Panel-summary') ? q('.jp-ddp-Panel-summary').textContent : '',
    message: q('.jp-ddp-Panel-message') ? q('.jp-ddp-Panel-message').textContent : '',
    panelRanks, cellRanks,
    viewHeight: view ? view.getBoundingClientRect().height : null,
    viewText: view ? view.innerText.slice(0, 200) : '',
    running: /\\*/.test(prompt),
    prompt,
    spinning: document.querySelectorAll('.Toastify__toast .Toastify__spinner').length,
  };
}"""

CONTRAST_JS = """(selectors) => {
  const parse = c => {
    const m = /rgba?\\(([^)]+)\\)/.exec(c || '');
    if (!m) { return null; }
    const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const over = (top, under) => [0, 1, 2].map(i => top[i] * top[3] + under[i] * (1 - top[3]));
  const background = el => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = parse(getComputedStyle(e).backgroundColor);
      if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) { break; } }
    }
    let col = parse(getComputedStyle(document.documentElement).backgroundColor) || [255, 255, 255, 1];
    if (col[3] === 0) { col = [255, 255, 255, 1]; }
    col = col.slice(0, 3);
    for (let i = layers.length - 1; i >= 0; i--) { col = over(layers[i], col); }
    return col;
  };
  const lum = rgb => {
    const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(rgb[0]) + 0.7152 * f(rgb[1]) + 0.0722 * f(rgb[2]);
  };
  const out = [];
  let checked = 0;
  for (const sel of selectors) {
    for (const root of document.querySelectorAll(sel)) {
      for (const el of [root, ...root.querySelectorAll('*')]) {
        const text = [...el.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join('').trim();
        if (!text || !el.getClientRects().length) { continue; }
        const st = getComputedStyle(el);
        if (st.visibility === 'hidden' || el.closest('button:disabled, [aria-disabled="true"]')) { continue; }
        const closed = el.closest('details:not([open])');
        if (closed && !el.closest('summary')) { continue; }
        const bg = background(el);
        const fgc = parse(st.color);
        if (!fgc) { continue; }
        const fg = over(fgc, bg);
        const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
        const ratio = (a + 0.05) / (b + 0.05);
        checked++;
        if (ratio < %s) {
          const background = 'rgb(' + bg.map(Math.round).join(',') + ')';
          out.push({sel, text: text.slice(0, 40), ratio: Math.round(ratio * 100) / 100, color: st.color, background});
        }
      }
    }
  }
  return {checked, low: out};
}""" % MIN_CONTRAST

CELL_VIEW = ".jp-Notebook .jp-CodeCell:last-child .jp-OutputArea-child:first-child"
VIEWS = [".jp-ddp-Panel", ".jp-ddp-StatusItem", CELL_VIEW]


# ---------------------------------------------------------------- words to compare across views
def coarse(label: str, css: str = "") -> str:
    """A state as any view may word it, reduced to what must agree: starting, ready, running, done, failed, stopped."""
    label = label.strip().lower()
    if css == "idle" or label.startswith(("stopped", "released", "interrupted")):
        return "stopped"
    if css == "bad" or label.startswith(("failed", "killed", "died", "dead")):
        return "failed"
    for word in ("starting", "connecting"):
        if label.startswith(word):
            return "starting"
    return label.split()[0] if label else ""


def disagreement(sample: Dict[str, Any]) -> Optional[str]:
    """Why the cell view and the panel (and the status bar) disagree in this sample; None when they agree."""
    # the two read the clock ms apart: any time ("<1 ms", "35 ms", "2.31 s", "3 m 05 s") is a clock
    clockless = lambda text: re.sub(r"<?\d+(\.\d+)? (ms|s|m \d+ s|h \d+ m)\b", "T", text or "")  # noqa: E731
    if sample["statusBar"] not in (None, "") and clockless(sample["statusBar"]) != clockless(sample["summary"]):
        return f"status bar {sample['statusBar']!r} vs panel {sample['summary']!r}"
    cell = {int(r): coarse(s) for r, s in sample["cellRanks"].items()}
    panel = {int(r): coarse(s, css) for r, (s, css) in sample["panelRanks"].items()}
    if not cell:
        return None  # the cell has not shown its view yet
    if not panel:
        return f"the cell shows {cell}, the panel no ranks ({sample['summary']!r})"
    if cell != panel:
        return f"cell {cell} vs panel {panel}"
    return None


# ---------------------------------------------------------------- one frontend's page
class Front:
    def __init__(self, kind: str, server: Server, browser: Any) -> None:
        self.kind = kind
        self.server = server
        self.notebook = f"views_{kind}.ipynb"
        server.write_notebook(self.notebook, [code_cell("%load_ext ddp_magic"), code_cell(CELL)])
        self.context = browser.new_context(viewport={"width": 1200, "height": 720}, device_scale_factor=1)
        self.page = self.context.new_page()
        self.console: List[str] = []
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.shots: Dict[str, Dict[str, Dict[str, Any]]] = {}  # theme -> state -> its screenshot, sample and contrast

    def open(self, name: str) -> None:
        self.page.goto(self.server.url(PATHS[self.kind].format(name) + ("?reset" if self.kind == "lab" else "")), timeout=60_000)
        self.page.wait_for_function(
            "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
            " const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;"
            " return k && k.status === 'idle' && !!window.jupyterapp.ddpMagic; }",
            timeout=90_000,
        )
        if self.kind == "lab":
            self.page.evaluate("() => { const s = window.jupyterapp.shell; if (!s.leftCollapsed) { s.collapseLeft(); } }")
        self.command("ddp-magic:show-panel")

    def command(self, cid: str, args: Optional[dict] = None) -> None:
        self.page.evaluate("([c, a]) => { window.jupyterapp.commands.execute(c, a || {}); }", [cid, args])

    def theme(self, dark: bool) -> None:
        name = "JupyterLab Dark" if dark else "JupyterLab Light"
        self.command("apputils:change-theme", {"theme": name})
        self.page.wait_for_function(f"() => document.body.dataset.jpThemeLight === '{'false' if dark else 'true'}'", timeout=30_000)
        self.page.wait_for_timeout(500)

    def wait_kernel_idle(self) -> None:
        self.page.wait_for_function("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle'", timeout=90_000)

    def sample(self) -> Dict[str, Any]:
        return self.page.evaluate(SAMPLE_JS)

    def contrast(self) -> Dict[str, Any]:
        return self.page.evaluate(CONTRAST_JS, VIEWS)

    def shot(self, name: str) -> str:
        os.makedirs(IMG, exist_ok=True)
        path = os.path.join(IMG, f"{self.kind}-{name}.png")
        self.page.mouse.move(600, 5)
        self.page.screenshot(path=path)
        _shrink(path)
        return path

    def run_last_cell(self) -> None:
        self.page.evaluate(
            "() => { const nb = window.jupyterapp.shell.currentWidget.content; nb.activeCellIndex = nb.widgets.length - 1;"
            " window.jupyterapp.commands.execute('notebook:run-cell'); }"
        )

    def follow(self, start: Any, theme: Optional[str], timeout: float = 150.0) -> List[Dict[str, Any]]:
        """Run ``start`` (a cell run), sample the views until the cell has ended and settled; with a theme, shoot each state once."""
        samples: List[Dict[str, Any]] = []
        shots: Dict[str, Dict[str, Any]] = {}
        start()
        t0 = time.monotonic()
        ended_at: Optional[float] = None
        first_running: Optional[float] = None
        while time.monotonic() - t0 < timeout:
            s = self.sample()
            samples.append(s)
            states = {coarse(v) for v in s["cellRanks"].values()}
            ended = not s["running"] and time.monotonic() - t0 > 3 and re.match(r"^\[\d+\]", s["prompt"].strip()) is not None
            if ended:
                ended_at = ended_at or time.monotonic()
            phase = ("running" if "running" in states else "starting" if "starting" in states else "") if s["running"] else (
                "failed" if ended_at and time.monotonic() - ended_at > 1.0 else "")
            first_running = first_running or (s["t"] if phase == "running" else None)
            if phase == "running" and s["t"] - first_running < 1.2:
                phase = ""  # shoot the running state once tqdm has moved
            if theme and phase and phase not in shots:
                shots[phase] = {"contrast": self.contrast(), "sample": s, "shot": self.shot(f"{phase}-{theme}")}
            if ended_at and time.monotonic() - ended_at > 2.0:
                break
            self.page.wait_for_timeout(300)
        if theme:
            self.shots[theme] = shots
        return samples

    def toast_after(self, cid: str, result: str, timeout: float = 60.0) -> Dict[str, Any]:
        """Run a command; when its result toast shows, wait 1 s: is any toast still spinning?"""
        self.command(cid)
        t0 = time.monotonic()
        seen_at = None
        while time.monotonic() - t0 < timeout:
            dialog = self.page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept")
            if dialog.count() and seen_at is None:
                dialog.last.click()  # "Restart" after "the workers hold names", or the env report's Close
            toasts = self.page.evaluate(
                "() => [...document.querySelectorAll('.Toastify__toast')].map(t => ({text: t.textContent, spinning: !!t.querySelector('.Toastify__spinner')}))"
            )
            if seen_at is None and any(re.search(result, t["text"]) and not t["spinning"] for t in toasts):
                seen_at = time.monotonic()
            if seen_at is not None and time.monotonic() - seen_at >= 1.0:
                return {"toasts": toasts, "after": time.monotonic() - t0}
            self.page.wait_for_timeout(100)
        raise AssertionError(f"no toast matching {result!r} within {timeout}s")

    def saved_outputs(self) -> List[Dict[str, Any]]:
        self.command("docmanager:save")
        self.page.wait_for_timeout(1500)
        with open(os.path.join(self.server.nbdir, self.notebook)) as f:
            return json.load(f)["cells"][-1]["outputs"]

    def close(self) -> None:
        try:
            self.page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")
        finally:
            self.context.close()


def _shrink(path: str) -> None:
    """A 256-colour palette PNG: the UI's flat colours survive; the file is a fraction of the size."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


# ---------------------------------------------------------------- the story, once per frontend
@pytest.fixture(scope="module", params=["lab", "notebook"])
def story(request: Any, server: Server, browser: Any) -> Iterator[Dict[str, Any]]:
    kind = request.param
    if kind == "notebook":
        pytest.importorskip("notebook", reason="Notebook 7 (pip install notebook) is in requirements-dev.txt")
    front = Front(kind, server, browser)
    rec: Dict[str, Any] = {"front": front}
    try:
        front.open(front.notebook)
        front.theme(dark=False)
        rec["no_pool"] = front.page.evaluate(
            "() => { const r = document.querySelector('.jp-ddp-Panel-ranks'); return {ranksShown: !!(r && r.offsetParent),"
            " summary: document.querySelector('.jp-ddp-Panel-summary').textContent}; }"
        )
        rec["light"] = front.follow(lambda: front.command("notebook:run-all-cells"), "light")
        rec["outputs"] = front.saved_outputs()
        rec["layout"] = front.page.evaluate(LAYOUT_JS)
        rec["env_toast"] = front.toast_after("ddp-magic:show-env", r"%ddp_env")
        front.page.keyboard.press("Escape")
        rec["restart_toast"] = front.toast_after("ddp-magic:restart-pool", r"ready in|restart failed")
        rec["message_after_restart"] = front.sample()["message"]
        rec["again"] = front.follow(front.run_last_cell, None)
        front.theme(dark=True)
        front.page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()")
        front.wait_kernel_idle()
        rec["after_kernel_restart"] = front.sample()
        rec["dark"] = front.follow(lambda: front.command("notebook:run-all-cells"), "dark")
        front.theme(dark=False)
        rec["errors"] = [c for c in front.console if c.startswith("error") and "ddp" in c.lower()]
        yield rec
    finally:
        front.close()


LAYOUT_JS = """() => {
  const panel = document.querySelector('.jp-ddp-Panel');
  const facts = document.querySelector('.jp-ddp-Panel-facts');
  const item = document.querySelector('.jp-ddp-StatusItem');
  const textTop = el => { const r = document.createRange(); r.selectNodeContents(el); const b = r.getBoundingClientRect(); return b.top + b.height / 2; };
  let neighbour = null;
  if (item && item.offsetParent) {
    const others = [...document.querySelectorAll('#jp-main-statusbar .jp-StatusBar-TextItem, #jp-main-statusbar span')]
      .filter(e => !item.contains(e) && e.textContent.trim() && e.offsetParent);
    if (others.length) { neighbour = {text: others[0].textContent, middle: textTop(others[0])}; }
  }
  const app = window.jupyterapp;
  return {
    scrollWidth: panel.scrollWidth, clientWidth: panel.clientWidth,
    facts: facts ? facts.textContent : '',
    item: item && item.offsetParent ? {middle: textTop(item), height: item.getBoundingClientRect().height} : null,
    neighbour,
    icons: ['ddp-magic:restart-pool', 'ddp-magic:stop-pool', 'ddp-magic:show-env'].map(c => !!app.commands.icon(c)),
  };
}"""


# ---------------------------------------------------------------- the checks
def _ended_ranks(samples: List[Dict[str, Any]]) -> Dict[str, Any]:
    return samples[-1]


@pytest.mark.parametrize("run", ["light", "again", "dark"])
def test_status_bar_panel_and_cell_view_agree_at_every_moment(story: Dict[str, Any], run: str) -> None:
    samples = story[run]
    assert any(s["cellRanks"] for s in samples), "the cell never showed its status view"
    assert any(coarse(v) == "running" for s in samples for v in s["cellRanks"].values()), "no sample caught the ranks running"
    bad_since: Optional[float] = None
    worst: List[str] = []
    for s in samples:
        why = disagreement(s)
        if why is None:
            bad_since = None
            continue
        bad_since = bad_since if bad_since is not None else s["t"]
        if s["t"] - bad_since > AGREE_WITHIN_S:
            worst.append(f"{s['t'] - bad_since:.1f}s: {why}")
    assert not worst, f"{story['front'].kind}/{run}: the views disagreed for longer than {AGREE_WITHIN_S}s:\n" + "\n".join(worst[:8])


@pytest.mark.parametrize("run", ["light", "again", "dark"])
def test_only_the_root_cause_rank_is_marked_failed(story: Dict[str, Any], run: str) -> None:
    end = story[run][-1]
    panel_failed = {int(r) for r, (s, css) in end["panelRanks"].items() if css == "bad"}
    assert panel_failed == {1}, end["panelRanks"]
    if story["front"].kind == "lab":
        assert end["statusBar"] == "DDP 4×gloo · rank 1 failed"
    assert end["summary"] == "DDP 4×gloo · rank 1 failed"
    cell_failed = {int(r) for r, s in end["cellRanks"].items() if coarse(s) == "failed"}
    assert cell_failed == {1}, f"the cell's view marks {sorted(cell_failed)} failed: {end['cellRanks']}"


@pytest.mark.parametrize("run", ["light", "dark"])
def test_the_cell_view_keeps_its_height_from_live_to_settled(story: Dict[str, Any], run: str) -> None:
    heights = [s["viewHeight"] for s in story[run] if s["viewHeight"]]
    live = [s["viewHeight"] for s in story[run] if s["viewHeight"] and s["running"]]
    assert heights and live
    settled = heights[-1]
    line = 24  # px: one line of the view
    assert max(abs(h - settled) for h in live) <= line, f"live heights {sorted(set(round(h) for h in live))} vs settled {settled:.0f}"


def test_a_tqdm_loop_leaves_at_most_one_line_per_rank(story: Dict[str, Any]) -> None:
    text = "".join("".join(o.get("text", "")) for o in story["outputs"] if o.get("output_type") == "stream")
    shown = [line.split("\r")[-1] for line in text.split("\n")]  # what a reader sees: \r overwrites the line
    bars = [line for line in shown if re.search(r"\d+%\|", line)]
    per_rank = {r: sum(1 for line in bars if f"rank {r}" in line) for r in range(4)}
    assert all(n <= 1 for n in per_rank.values()), f"tqdm lines per rank in the saved output: {per_rank}"


@pytest.mark.parametrize("which", ["env_toast", "restart_toast"])
def test_no_toast_is_still_spinning_a_second_after_its_result(story: Dict[str, Any], which: str) -> None:
    toasts = story[which]["toasts"]
    assert not [t for t in toasts if t["spinning"]], toasts


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_text_contrast_is_at_least_4_5_in_every_state(story: Dict[str, Any], theme: str) -> None:
    shots = story["front"].shots[theme]
    assert set(shots) == {"starting", "running", "failed"}, sorted(shots)
    low = {phase: rec["contrast"]["low"] for phase, rec in shots.items() if rec["contrast"]["low"]}
    assert all(rec["contrast"]["checked"] for rec in shots.values())
    assert not low, json.dumps(low, indent=1, ensure_ascii=False)[:3000]


def test_the_panel_fits_says_the_start_method_and_clears_old_messages(story: Dict[str, Any]) -> None:
    assert not story["no_pool"]["ranksShown"], "no pool: no empty 'Ranks' heading"
    assert "%%ddp\u00a0-n\u00a0N" in story["no_pool"]["summary"], "the command never wraps across lines"
    layout = story["layout"]
    assert layout["scrollWidth"] <= layout["clientWidth"] + 1, layout
    assert "start method fork" in layout["facts"], layout["facts"]
    assert layout["icons"] == [True, True, True]
    assert "ready in" in story["message_after_restart"]
    assert story["again"][-1]["message"] == "", "a later failure clears the restart's message"
    assert not story["errors"], story["errors"]


def test_the_panel_knows_the_kernel_restarted_and_follows_the_start(story: Dict[str, Any]) -> None:
    after = story["after_kernel_restart"]
    assert not after["panelRanks"] and after["statusBar"] in (None, "")
    starting = [s for s in story["dark"] if any(coarse(v) == "starting" for v in s["cellRanks"].values())]
    assert starting, "no sample caught the pool starting"
    assert any(s["panelRanks"] and all(coarse(st, css) == "starting" for st, css in s["panelRanks"].values()) for s in starting)


def test_the_status_bar_item_is_level_with_its_neighbours(story: Dict[str, Any]) -> None:
    if story["front"].kind != "lab":
        pytest.skip("Notebook 7 has no status bar")
    layout = story["layout"]
    assert layout["item"] and layout["neighbour"], layout
    assert abs(layout["item"]["middle"] - layout["neighbour"]["middle"]) <= 1.0, layout
    assert layout["item"]["height"] == 24, layout


def test_a_shipped_notebook_opened_untrusted_keeps_its_status_colours(story: Dict[str, Any], server: Server) -> None:
    front = story["front"]
    name = f"shipped_{front.kind}_{SHIPPED}"
    shutil.copyfile(os.path.join(ROOT, "notebooks", SHIPPED), os.path.join(server.nbdir, name))
    front.open(name)
    front.page.wait_for_selector(".ddp-status", timeout=30_000)
    trusted = front.page.evaluate("() => window.jupyterapp.shell.currentWidget.content.model.cells.get(0).trusted")
    assert trusted is False, "the copy must open untrusted (a fresh trust database)"
    found = front.page.evaluate(
        """() => [...document.querySelectorAll('.ddp-status')].slice(0, 3).map(v => {
            const marks = [...v.querySelectorAll('.ddp-status-strip [data-rank], .ddp-status-strip [title^="rank "]')].map(e => {
              const r = e.getBoundingClientRect(); const bg = getComputedStyle(e).backgroundColor;
              return {w: r.width, h: r.height, bg};
            });
            return {marks, text: v.innerText.slice(0, 80)};
        })"""
    )
    assert found, "no saved status view rendered"
    marks = [m for v in found for m in v["marks"]]
    assert marks, found
    invisible = [m for m in marks if m["w"] < 4 or m["h"] < 4 or m["bg"] in ("rgba(0, 0, 0, 0)", "transparent")]
    assert not invisible, f"rank marks without their size or colour when untrusted: {invisible[:4]}"
    low = front.page.evaluate(CONTRAST_JS, [".ddp-status"])
    assert not low["low"], low["low"][:5]
