/**
 * ddp_magic.log's chart data (the kernel's {type: "metrics"} message): parsed, formatted, laid out as SVG lines.
 */

import { cellName, fmtSeconds, pyFixed, rankRuns } from './format';
import type { IMetricsMsg, IMetricSummary, MetricPoint } from './model';

const num = (x: unknown): number | null => (typeof x === 'number' && isFinite(x) ? x : null);

/** A metrics message, checked and cleaned (points that are not [number, number|null] dropped); null if it is not one. */
export function parseMetrics(data: unknown): IMetricsMsg | null {
  const d = data as Record<string, unknown> | null;
  if (!d || d.type !== 'metrics' || !Array.isArray(d.names) || !d.names.every(n => typeof n === 'string')) {
    return null;
  }
  const names = d.names as string[];
  const rawSeries = d.series && typeof d.series === 'object' ? (d.series as Record<string, unknown>) : {};
  const series: IMetricsMsg['series'] = {};
  for (const name of names) {
    const lines = rawSeries[name] && typeof rawSeries[name] === 'object' ? (rawSeries[name] as Record<string, unknown>) : {};
    series[name] = {};
    for (const [rank, pts] of Object.entries(lines)) {
      if (Array.isArray(pts)) {
        series[name][rank] = pts
          .filter(p => Array.isArray(p) && num(p[0]) !== null)
          .map(p => [p[0] as number, num(p[1])] as MetricPoint);
      }
    }
  }
  const summary: IMetricSummary[] = (Array.isArray(d.summary) ? d.summary : [])
    .filter(s => s && typeof s === 'object' && typeof (s as IMetricSummary).name === 'string')
    .map(s => {
      const r = s as Record<string, unknown>;
      const steps = Array.isArray(r.steps) ? r.steps : [];
      return {
        name: r.name as string,
        last: num(r.last),
        last_lo: num(r.last_lo),
        last_hi: num(r.last_hi),
        min: num(r.min),
        mean: num(r.mean),
        slowest: num(r.slowest),
        lag: num(r.lag),
        ...(r.slowest_by === 'steps' || r.slowest_by === 'profile' ? { slowest_by: r.slowest_by } : {}),
        steps: [num(steps[0]) ?? 0, num(steps[1]) ?? 0]
      } as IMetricSummary;
    });
  return {
    type: 'metrics',
    session: String(d.session ?? ''),
    final: d.final === true,
    cell: String(d.cell ?? ''),
    names,
    ranks: (Array.isArray(d.ranks) ? d.ranks : []).filter(r => num(r) !== null) as number[],
    rows: num(d.rows) ?? 0,
    series,
    summary
  };
}

/**
 * Whether a metrics message replaces the chart shown: the last cell that logged anything stays (as
 * %ddp metrics does), so a message with nothing logged never wipes it; a live message of a cell whose
 * final picture is shown (a redraw that overtook the end), or of an earlier cell, is late. Without a
 * cell label (the kernel may send "") live data after a final picture is a new cell's only once a
 * snapshot has shown a cell running since (`cellRan`).
 */
export function takesOver(prev: IMetricsMsg | null, next: IMetricsMsg, cellRan = false): boolean {
  if (!next.names.length) {
    return false;
  }
  if (!prev || prev.session !== next.session) {
    return true;
  }
  const [a, b] = [Number(prev.cell), Number(next.cell)];
  if (isFinite(a) && isFinite(b) && b < a) {
    return false;
  }
  if (prev.final && !next.final) {
    return prev.cell || next.cell ? prev.cell !== next.cell : cellRan;
  }
  return true;
}

/** ddp_magic/ui/metrics_chart.py PALETTE: a rank's line has the same colour in the panel as in the cell's chart (a test checks). */
export const RANK_PALETTE = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2', '#7f7f7f', '#bcbd22', '#17becf'];

/** A rank's colour, as metrics_chart.rank_color: a theme may set --ddp-magic-rank-N; else the palette. */
export function rankColour(rank: number): string {
  return `var(--ddp-magic-rank-${rank}, ${RANK_PALETTE[((rank % RANK_PALETTE.length) + RANK_PALETTE.length) % RANK_PALETTE.length]})`;
}

/** Python's f"{x:.{p}g}" (except on exact decimal ties, which Python rounds half to even). */
function pyG(x: number, p: number): string {
  if (x === 0) {
    return '0';
  }
  const [mant, expText] = x.toExponential(p - 1).split('e');
  const e = Number(expText);
  const strip = (t: string) => (t.indexOf('.') >= 0 ? t.replace(/0+$/, '').replace(/\.$/, '') : t);
  if (e < -4 || e >= p) {
    return `${strip(mant)}e${e < 0 ? '-' : '+'}${Math.abs(e) < 10 ? '0' : ''}${Math.abs(e)}`;
  }
  return strip(x.toFixed(Math.max(0, p - 1 - e)));
}

/** The units of fmtValue, largest first: a value of 10,000 and up is written in the largest one it reaches. */
const UNITS: Array<[number, string]> = [
  [1e12, 'T'],
  [1e9, 'G'],
  [1e6, 'M'],
  [1e3, 'k']
];

/**
 * Short numbers as the cell's chart writes them (metrics_chart.fmt): 4 significant digits below 10,000
 * ("5963", "0.0002628"), 3 significant digits and a unit from 10,000 up ("15.9k" is 15,900; "2.5M", "3.2G",
 * "1.5T"); a value that rounds up to the next unit takes it ("999,999" is "1M", never "1e+03k").
 */
export function fmtValue(x: number | null | undefined): string {
  if (x === null || x === undefined || !isFinite(x)) {
    return '-';
  }
  if (Math.abs(Number(x.toPrecision(4))) < 1e4) {
    return pyG(x, 4);
  }
  for (let i = UNITS.length - 1; i >= 0; i--) {
    const [div, suffix] = UNITS[i];
    const bigger = UNITS[i - 1];
    const m = Number((x / div).toPrecision(3));
    if (Math.abs(m) < 1000 || !bigger) {
      return Math.abs(m) < 1000 ? `${pyG(m, 3)}${suffix}` : pyG(x, 3);
    }
  }
  return pyG(x, 3);
}

/**
 * The y axis' labels, in one precision: 4 significant digits on the largest, every label with as many decimals, and
 * no more than the labels need (1.05 / 8.92 / 16.80, 0.0 / 0.5 / 1.0), so that they read as one scale. From 10,000
 * up, and below 0.0001, fmtValue's own forms (15.9k, 1e-05). ddp_magic/ui/metrics_chart.py tick_labels is the same.
 */
export function tickLabels(values: number[]): string[] {
  const top = Math.max(...values.map(v => Math.abs(v)));
  if (!(top > 0) || top >= 1e4 || top < 1e-4) {
    return values.map(v => fmtValue(v));
  }
  let decimals = Math.max(0, 3 - Math.floor(Math.log10(top)));
  let labels = values.map(v => pyFixed(v, decimals));
  while (decimals > 0 && labels.every(l => l.endsWith('0'))) {
    decimals--;
    labels = values.map(v => pyFixed(v, decimals));
  }
  return labels.map(l => (Number(l) === 0 ? l.replace('-', '') : l));
}

/**
 * The ranks whose points are all the same (a loss DDP keeps in step): groups of two or more, lowest rank first. One
 * line is drawn for each group, in its first rank's colour, and the chart says so ("ranks 0-1 identical"): drawn
 * one over the other, the last rank's line would hide the others'. ddp_magic/ui/metrics_chart.py identical_ranks is the same.
 */
export function identicalRanks(lines: Record<string, MetricPoint[]>): number[][] {
  const groups: Array<{ rep: MetricPoint[]; ranks: number[] }> = []; // the group's longest points, its ranks
  const key = (pts: MetricPoint[]) => JSON.stringify(pts);
  for (const rank of Object.keys(lines).sort((a, b) => Number(a) - Number(b))) {
    const pts = lines[rank];
    const g = groups.find(({ rep }) => {
      const [short, long] = pts.length <= rep.length ? [pts, rep] : [rep, pts];
      return pts.length > 0 && key(long.slice(0, short.length)) === key(short);
    });
    if (g) {
      g.rep = pts.length > g.rep.length ? pts : g.rep;
      g.ranks.push(Number(rank));
    } else {
      groups.push({ rep: pts, ranks: [Number(rank)] });
    }
  }
  return groups.map(g => g.ranks).filter(g => g.length > 1);
}

/** The points drawn for an identical group: its longest member's (metrics_chart.group_line). */
export function groupLine(lines: Record<string, MetricPoint[]>, group: number[]): MetricPoint[] {
  return group.map(r => lines[String(r)] || []).reduce((a, b) => (b.length > a.length ? b : a), []);
}

/** What a chart says of its identical ranks: "ranks 0-1 identical" ('' when none). */
export function identicalText(groups: number[][]): string {
  return groups.map(g => `ranks ${rankRuns(g)} identical`).join('; ');
}

/** The line over a chart: what was logged, by how many ranks, over which steps, and whether the cell still runs. */
export function metricsHeadline(m: IMetricsMsg): string {
  const steps = m.summary.reduce<number[]>((acc, s) => acc.concat(s.steps), []);
  const span = steps.length ? `, steps ${Math.min(...steps)}-${Math.max(...steps)}` : '';
  const ranks = `${m.ranks.length} rank${m.ranks.length === 1 ? '' : 's'}`;
  return `${m.cell ? `${cellName(m.cell)}: ` : ''}${m.names.join(', ')} from ${ranks}${span}${m.final ? '' : ' (live)'}`;
}

/**
 * The chart's box (pixels): the plot sits inside it, leaving room for the value labels at the left (as wide as the
 * widest label needs, `left` at least) and the steps below.
 */
export const CHART = { height: 96, left: 28, right: 6, top: 6, bottom: 16, gap: 4 };

/** A label's width in pixels when nothing can measure it: digits of the panel's small font are about 6.5 px. */
export function estimateWidth(text: string): number {
  return text.length * 6.5;
}

export interface IChartLine {
  rank: number;
  colour: string;
  points: string; // an SVG polyline's points
}

export interface IChart {
  name: string;
  width: number;
  height: number;
  plot: { x0: number; x1: number; y0: number; y1: number }; // the plot area, in pixels
  yTicks: Array<{ y: number; label: string }>; // the bottom, middle and top values, with a grid line each
  xTicks: Array<{ x: number; label: string; anchor: 'start' | 'end' }>; // the first and last step
  lines: IChartLine[]; // one per rank that logged the metric, in rank order (one per group of identical ranks)
  same: number[][]; // the groups of ranks whose points are identical (identicalRanks)
}

/** The data range of some lines (metrics_chart._bounds): a single step or a flat line is widened so it can be drawn. */
export function chartBounds(lines: Record<string, MetricPoint[]>): [number, number, number, number] {
  const pts = Object.values(lines).reduce<MetricPoint[]>((acc, p) => acc.concat(p.filter(q => q[1] !== null)), []);
  if (!pts.length) {
    return [0, 1, 0, 1];
  }
  let [x0, x1] = [Math.min(...pts.map(p => p[0])), Math.max(...pts.map(p => p[0]))];
  let [y0, y1] = [Math.min(...pts.map(p => p[1] as number)), Math.max(...pts.map(p => p[1] as number))];
  if (x1 === x0) {
    [x0, x1] = [x0 - 1, x1 + 1];
  }
  if (y1 === y0) {
    const pad = Math.abs(y0) * 0.05 || 1;
    [y0, y1] = [y0 - pad, y1 + pad];
  }
  return [x0, x1, y0, y1];
}

/**
 * One metric's chart, `width` pixels wide: a polyline per rank (points with no value skipped), step on x. `measure`
 * gives a label's width in pixels (the panel measures its font): the plot starts right of the widest value label.
 */
export function metricChart(m: IMetricsMsg, name: string, width: number, height = CHART.height, measure = estimateWidth): IChart {
  const lines = m.series[name] || {};
  const [x0, x1, y0, y1] = chartBounds(lines);
  const values = [0, 0.5, 1].map(f => y0 + f * (y1 - y0));
  const labels = tickLabels(values);
  const left = Math.max(CHART.left, Math.ceil(Math.max(...labels.map(l => measure(l)))) + CHART.gap + 2);
  const same = identicalRanks(lines);
  const drawnOnce = new Set(same.reduce<number[]>((acc, g) => acc.concat(g.slice(1)), []));
  const drawn = new Map(same.map(g => [g[0], groupLine(lines, g)] as [number, MetricPoint[]]));
  const plot = { x0: left, x1: width - CHART.right, y0: CHART.top, y1: height - CHART.bottom };
  const px = (x: number) => plot.x0 + ((x - x0) / (x1 - x0)) * (plot.x1 - plot.x0);
  const py = (y: number) => plot.y0 + ((y1 - y) / (y1 - y0)) * (plot.y1 - plot.y0);
  const out: IChartLine[] = [];
  for (const rank of Object.keys(lines).sort((a, b) => Number(a) - Number(b))) {
    if (drawnOnce.has(Number(rank))) {
      continue; // the same points as a lower rank's, drawn in its colour
    }
    const points = (drawn.get(Number(rank)) || lines[rank])
      .filter(p => p[1] !== null)
      .map(([x, y]) => `${px(x).toFixed(1)},${py(y as number).toFixed(1)}`)
      .join(' ');
    if (points) {
      out.push({ rank: Number(rank), colour: rankColour(Number(rank)), points });
    }
  }
  return {
    name,
    width,
    height,
    plot,
    yTicks: values.map((v, i) => ({ y: py(v), label: labels[i] })),
    xTicks: [
      { x: px(x0), label: fmtValue(x0), anchor: 'start' },
      { x: px(x1), label: fmtValue(x1), anchor: 'end' }
    ],
    lines: out,
    same
  };
}

export interface IMetricRow {
  name: string;
  last: string;
  range: string; // the ranks' last values, lowest to highest, when they differ ('' when not)
  min: string;
  mean: string;
  slowest: string;
  /** The line under the row (the sidebar is narrow): the slowest rank, and the ranks' last values when they differ. */
  note: string;
}

/** The summary table's rows (metrics_chart.table_html): last (mean over ranks), min, mean, slowest rank. */
export function metricRows(m: IMetricsMsg): IMetricRow[] {
  return m.summary.map(s => {
    const range = s.last_lo !== s.last_hi ? `${fmtValue(s.last_lo)} to ${fmtValue(s.last_hi)}` : '';
    const by = s.slowest_by === 'profile' ? ', the others waited for it' : '';
    const slowest = s.slowest !== null ? `rank ${s.slowest} (+${fmtSeconds(s.lag ?? 0)}${by})` : 'none stands out';
    const note = `slowest${m.final ? '' : ' so far'}: ${slowest}${range ? ` · last per rank: ${range}` : ''}`;
    return { name: s.name, last: fmtValue(s.last), range, min: fmtValue(s.min), mean: fmtValue(s.mean), slowest, note };
  });
}

