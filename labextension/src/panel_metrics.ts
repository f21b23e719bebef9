/**
 * The panel's Metrics section: what the last cell logged with ddp_magic.log, a chart per metric as wide as the
 * sidebar (inline SVG, a line per rank in the cell chart's rank colours) and the summary table.
 */
import type { IMetricsMsg } from './model';
import { CHART, estimateWidth, type IChart, identicalText, metricChart, metricRows, metricsHeadline, rankColour } from './metrics';
import { el, prose, svg } from './dom';

/** One metric's chart as inline SVG: grid lines with their values, the first and last step, a polyline per rank. */
function chartSvg(c: IChart): SVGSVGElement {
  const root = svg('svg', { class: 'jp-ddp-Metric-chart', width: c.width, height: c.height, viewBox: `0 0 ${c.width} ${c.height}` });
  root.setAttribute('role', 'img');
  root.setAttribute('aria-label', `${c.name}: one line per rank`);
  for (const t of c.yTicks) {
    const y = t.y.toFixed(1);
    root.appendChild(svg('line', { class: 'jp-ddp-Metric-grid', x1: c.plot.x0, x2: c.plot.x1, y1: y, y2: y }));
    root.appendChild(svg('text', { class: 'jp-ddp-Metric-tick', x: c.plot.x0 - 4, y: (t.y + 4).toFixed(1), 'text-anchor': 'end' }, t.label));
  }
  for (const t of c.xTicks) {
    root.appendChild(svg('text', { class: 'jp-ddp-Metric-tick', x: t.x.toFixed(1), y: c.height - 3, 'text-anchor': t.anchor }, t.label));
  }
  for (const l of c.lines) {
    const line = svg('polyline', { class: 'jp-ddp-Metric-line', points: l.points, 'data-rank': l.rank });
    line.setAttribute('style', `stroke: ${l.colour}`); // a var() with a fallback: only a style resolves it
    line.appendChild(svg('title', {}, `rank ${l.rank}`));
    root.appendChild(line);
  }
  return root;
}

/** A label's width in the charts' font, as a canvas measures it (the model's estimate where none can). */
function measurer(box: HTMLElement): (text: string) => number {
  const probe = box.appendChild(svg('svg', { class: 'jp-ddp-Metric-chart', width: 0, height: 0 }));
  const st = getComputedStyle(probe);
  const font = `${st.fontSize} ${st.fontFamily}`;
  probe.remove();
  const ctx = document.createElement('canvas').getContext('2d');
  if (!ctx || !st.fontSize) {
    return estimateWidth;
  }
  ctx.font = font;
  return (text: string) => ctx.measureText(text).width;
}

export class MetricsSection {
  readonly node = el('div', 'jp-ddp-Panel-section jp-ddp-Metrics');

  /**
   * The Metrics section: the headline, a legend of the ranks, a chart per metric as wide as the
   * sidebar, and the summary table. Drawn again only when the data or the width changed (refresh
   * runs every second while a cell runs).
   */
  render(m: IMetricsMsg | null, fallbackWidth: () => number): void {
    const box = this.node;
    if (!m) {
      box.textContent = '';
      box.style.display = 'none';
      this._shown = null;
      return;
    }
    box.style.display = '';
    const avail = box.clientWidth || fallbackWidth(); // 0 while the panel is hidden: drawn again when shown
    const width = avail > 0 ? Math.max(160, Math.floor(avail)) : 240;
    if (m === this._shown && width === this._width) {
      return;
    }
    this._shown = m;
    this._width = width;
    box.textContent = '';
    box.dataset.final = String(m.final);
    box.dataset.cell = m.cell;
    box.appendChild(el('h3', '', 'Metrics'));
    box.appendChild(prose('div', 'jp-ddp-Metrics-head', metricsHeadline(m)));
    const legend = el('div', 'jp-ddp-Metrics-legend');
    for (const r of m.ranks.slice(0, 16)) {
      const item = el('span', 'jp-ddp-Metrics-rank');
      item.dataset.rank = String(r);
      const swatch = el('span', 'jp-ddp-Metrics-swatch');
      swatch.setAttribute('style', `background: ${rankColour(r)}`);
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(`rank ${r}`));
      legend.appendChild(item);
    }
    if (m.ranks.length > 16) {
      legend.appendChild(el('span', 'jp-ddp-Metrics-more', `… ${m.ranks.length - 16} more`));
    }
    box.appendChild(legend);
    const measure = measurer(box);
    for (const name of m.names) {
      const fig = el('div', 'jp-ddp-Metric');
      fig.dataset.name = name;
      const title = fig.appendChild(el('div', 'jp-ddp-Metric-name', name));
      title.title = name; // a long name is cut with … (never wrapped inside): the whole of it here
      const chart = metricChart(m, name, width, CHART.height, measure);
      if (chart.same.length) {
        fig.appendChild(el('div', 'jp-ddp-Metric-same', identicalText(chart.same))); // one line drawn for them
      }
      fig.appendChild(chartSvg(chart));
      box.appendChild(fig);
    }
    box.appendChild(this._table(m));
  }

  /**
   * The summary table: per metric a line with its name across the table, then its last, min and mean (numbers whole:
   * never wrapped, never cut), then the slowest rank and the ranks' last values. Three columns share the sidebar.
   */
  private _table(m: IMetricsMsg): HTMLTableElement {
    const table = el('table', 'jp-ddp-MetricsTable');
    const hr = el('tr');
    for (const key of ['last', 'min', 'mean']) {
      hr.appendChild(el('th', `jp-ddp-Metrics-${key}`, key));
    }
    table.appendChild(el('thead')).appendChild(hr);
    const body = table.appendChild(el('tbody'));
    for (const r of metricRows(m)) {
      const head = el('tr', 'jp-ddp-MetricsName');
      head.dataset.name = r.name;
      const name = head.appendChild(el('td', 'jp-ddp-Metrics-name', r.name));
      name.colSpan = 3;
      name.title = r.name;
      body.appendChild(head);
      const tr = el('tr', 'jp-ddp-MetricsRow');
      tr.dataset.name = r.name;
      for (const [key, value] of [
        ['last', r.last],
        ['min', r.min],
        ['mean', r.mean]
      ]) {
        const td = el('td', `jp-ddp-Metrics-${key} jp-ddp-Metrics-value`, value);
        td.title = key === 'last' ? `${value}: the mean of the ranks' last values` : `${value}: the ${key} over every rank and step`;
        tr.appendChild(td);
      }
      body.appendChild(tr);
      const note = el('tr', 'jp-ddp-MetricsNote');
      note.dataset.name = r.name;
      const td = prose('td', 'jp-ddp-Metrics-note', r.note);
      td.colSpan = 3;
      note.appendChild(td);
      body.appendChild(note);
    }
    return table;
  }

  private _shown: IMetricsMsg | null = null;
  private _width = 0;
}
