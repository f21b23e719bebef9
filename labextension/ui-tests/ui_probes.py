"""What the browser tests ask a page, each in one go: JavaScript run in the page by Playwright's ``evaluate``.

The story (test_views_agree.py) samples the three views with ``SAMPLE_JS`` about 3 times a second, and at each
state's screenshot checks the rendered text for contrast (``CONTRAST_JS``), for cut or broken words and labels
(``CLIP_JS``) and the colours of a starting rank (``COLOURS_JS``); test_metrics_ui.py and test_saved_chart.py use
``CONTRAST_JS`` too.
"""
from __future__ import annotations

MIN_CONTRAST = 4.5  # WCAG AA for text

# ---------------------------------------------------------------- what the page is asked, in one go
SAMPLE_JS = """(index) => {
  const q = s => document.querySelector(s);
  const cell = document.querySelectorAll('.jp-Notebook .jp-CodeCell')[index];
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
  // the panel: [state word, css modifier, the last cell's cause on a rank that is ready again, the note under it]
  const panelRanks = {};
  document.querySelectorAll('.jp-ddp-Panel tr.jp-ddp-Rank').forEach(tr => {
    const cls = [...tr.classList].find(c => /^jp-ddp-Rank-(active|ok|bad|warn|idle)$/.test(c)) || '';
    const note = tr.nextElementSibling && tr.nextElementSibling.querySelector('.jp-ddp-Rank-lastNote');
    panelRanks[tr.dataset.rank] = [tr.querySelector('.jp-ddp-Rank-state').textContent, cls.replace('jp-ddp-Rank-', ''),
                                   tr.dataset.lastCause || '', note ? note.textContent : ''];
  });
  const metrics = {};
  document.querySelectorAll('.jp-ddp-Panel tr.jp-ddp-MetricsRow').forEach(tr => {
    metrics[tr.dataset.name] = [...tr.querySelectorAll('td')].map(td => td.textContent);
  });
  const chart = q('.jp-ddp-Panel .jp-ddp-Metric svg');
  const panelBox = q('.jp-ddp-Panel') ? q('.jp-ddp-Panel').getBoundingClientRect() : null;
  let chartSeen = false;
  if (chart && panelBox && chart.getClientRects().length) {
    const r = chart.getBoundingClientRect();
    chartSeen = r.top >= panelBox.top && r.bottom <= Math.min(panelBox.bottom, window.innerHeight) && r.height > 20;
  }
  const sb = q('.jp-ddp-StatusItem');
  const prompt = cell ? cell.querySelector('.jp-InputPrompt').textContent : '';
  const box = q('.jp-ddp-Metrics');
  return {
    t: Date.now() / 1000,
    statusBar: sb ? (sb.offsetParent ? sb.textContent : '') : null,
    summary: q('.jp-ddp-Panel-summary') ? q('.jp-ddp-Panel-summary').textContent : '',
    lastCell: q('.jp-ddp-Panel-lastCell') ? q('.jp-ddp-Panel-lastCell').textContent : '',
    message: q('.jp-ddp-Panel-message') ? q('.jp-ddp-Panel-message').textContent : '',
    panelShown: !!(q('#ddp-magic-panel') && q('#ddp-magic-panel').offsetParent),
    panelRanks, cellRanks, metrics, chartSeen,
    metricsFinal: box && box.offsetParent ? box.dataset.final : null,
    live: !!(view && view.querySelector('.ddp-status-live')),
    viewText: view ? view.innerText.slice(0, 300) : '',
    outputText: cell ? [...cell.querySelectorAll('.jp-OutputArea-output')].map(o => o.innerText).join('\\n') : '',
    running: /\\*/.test(prompt),
    prompt,
    spinning: document.querySelectorAll('.Toastify__toast .Toastify__spinner').length,
  };
}"""

# Is any text cut or broken? In the panel and the status bar: a word (any run without a space: a number, a metric's
# name, "%%ddp -n N") on two lines, a text box that sticks out of the box that clips it, a text cut with … without a
# title that holds it whole. In every chart (the panel's and the cell's): an SVG label outside its picture.
CLIP_JS = """(roots) => {
  const out = [];
  const clipper = el => { for (let e = el.parentElement; e; e = e.parentElement) {
    const st = getComputedStyle(e); if (st.overflowX !== 'visible' || st.overflowY !== 'visible') { return e; } } return null; };
  let words = 0;
  for (const root of document.querySelectorAll(roots.html)) {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      const el = n.parentElement;
      if (!el || !el.getClientRects().length || el.closest('svg')) { continue; }
      const st = getComputedStyle(el);
      if (st.visibility === 'hidden') { continue; }
      const re = /\\S+/g;
      let m;
      while ((m = re.exec(n.textContent))) {
        const range = document.createRange();
        range.setStart(n, m.index); range.setEnd(n, m.index + m[0].length);
        const rects = [...range.getClientRects()].filter(r => r.width > 0);
        if (!rects.length) { continue; }
        words++;
        if (new Set(rects.map(r => Math.round(r.top))).size > 1) { out.push({what: 'broken across lines', text: m[0]}); }
        const c = clipper(el);
        const cut = st.textOverflow === 'ellipsis' || (c && getComputedStyle(c).textOverflow === 'ellipsis');
        if (cut && c && c.scrollWidth > c.clientWidth + 1 && !(c.title || el.title)) {
          out.push({what: 'cut without a title', text: m[0]});
        } else if (c && !cut) {
          const b = c.getBoundingClientRect();
          const r = range.getBoundingClientRect();
          if (r.left < b.left - 0.5 || r.right > b.right + 0.5) { out.push({what: 'sticks out', text: m[0], right: r.right, box: b.right}); }
        }
      }
    }
  }
  let labels = 0;
  for (const root of document.querySelectorAll(roots.svg)) {
    for (const svg of root.querySelectorAll('svg')) {
      const vb = svg.viewBox && svg.viewBox.baseVal && svg.viewBox.baseVal.width ? svg.viewBox.baseVal
        : {x: 0, y: 0, width: svg.width.baseVal.value, height: svg.height.baseVal.value};
      for (const t of svg.querySelectorAll('text')) {
        if (!t.textContent.trim()) { continue; }
        const b = t.getBBox();
        labels++;
        if (b.x < vb.x - 0.5 || b.x + b.width > vb.x + vb.width + 0.5 || b.y < vb.y - 0.5 || b.y + b.height > vb.y + vb.height + 0.5) {
          out.push({what: 'label outside its chart', text: t.textContent, x: Math.round(b.x), w: Math.round(b.width), width: vb.width});
        }
      }
    }
  }
  return {words, labels, bad: out};
}"""
CLIP_ROOTS = {"html": ".jp-ddp-Panel, .jp-ddp-StatusItem", "svg": ".jp-ddp-Panel, .jp-Notebook .jp-OutputArea"}


# the rendered colour of a starting (or running) rank: the panel's state word, the cell view's square
COLOURS_JS = """() => {
  // the panel's state word of an active rank, drawn by its own rules in a probe row (its rows may lag the cell's by a snapshot)
  const panel = document.querySelector('.jp-ddp-Panel');
  const probe = document.createElement('table');
  probe.className = 'jp-ddp-Ranks';
  probe.innerHTML = '<tbody><tr class="jp-ddp-Rank jp-ddp-Rank-active"><td class="jp-ddp-Rank-state">starting</td></tr></tbody>';
  panel.appendChild(probe);
  const word = getComputedStyle(probe.querySelector('td')).color;
  probe.remove();
  const square = document.querySelector('.jp-Notebook .ddp-status-strip .ddp-status-square[data-state="starting"]');
  return {panel: word, cell: square ? getComputedStyle(square).backgroundColor : null};
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

NO_POOL_JS = """() => {
  const r = document.querySelector('.jp-ddp-Panel-ranks');
  const summary = document.querySelector('.jp-ddp-Panel-summary');
  // the sentence at every width a sidebar may have: a command in it stays on one line at each
  const broken = [];
  for (let w = 120; w <= 360; w += 6) {
    summary.style.width = w + 'px';
    for (const c of summary.querySelectorAll('code')) {
      if (new Set([...c.getClientRects()].map(x => Math.round(x.top))).size > 1) { broken.push(w + 'px: ' + c.textContent); }
    }
  }
  summary.style.width = '';
  return {ranksShown: !!(r && r.offsetParent), summary: summary.textContent,
          commands: [...summary.querySelectorAll('code')].map(c => c.textContent), broken};
}"""

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




