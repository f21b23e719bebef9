/**
 * The DDP panel (right sidebar): the current notebook's pool, one row per rank
 * (pid, device, state, time, memory, last output line), the pool's env
 * validation, the live chart of what the ranks log with ddp_magic.log, and
 * buttons for the pool commands. It only presents: every decision comes from
 * model.ts, every action is a command.
 */
import { CommandRegistry } from '@lumino/commands';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import * as M from './model';
import { ConnectionTracker } from './tracker';

export const CommandIDs = {
  restart: 'ddp-magic:restart-pool',
  stop: 'ddp-magic:stop-pool',
  env: 'ddp-magic:show-env',
  panel: 'ddp-magic:show-panel',
  interrupt: 'ddp-magic:interrupt-kernel'
};

function el<K extends keyof HTMLElementTagNameMap>(tag: K, cls?: string, text?: string): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (cls) {
    node.className = cls;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

const SVG_NS = 'http://www.w3.org/2000/svg';

function svg<K extends keyof SVGElementTagNameMap>(tag: K, attrs: Record<string, string | number>, text?: string): SVGElementTagNameMap[K] {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    node.setAttribute(k, String(v));
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** One metric's chart as inline SVG: grid lines with their values, the first and last step, a polyline per rank. */
function chartSvg(c: M.IChart): SVGSVGElement {
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

/**
 * Text with its commands kept whole: each `...` part becomes a <code> that never wraps (a browser breaks a line after
 * a hyphen, so "%%ddp -n N" with no-break spaces still broke after its "-").
 */
function withCommands(node: HTMLElement, text: string): void {
  node.textContent = '';
  text.split('`').forEach((part, i) => {
    node.appendChild(i % 2 ? el('code', 'jp-ddp-command', part) : words(part));
  });
}

/**
 * Text whose words are never broken inside: a browser breaks a line after a hyphen or a slash ("--timeout" became
 * "-" / "-timeout"), so each word that holds one is a span that does not wrap; lines break between words only.
 */
function words(text: string): DocumentFragment {
  const out = document.createDocumentFragment();
  for (const part of text.split(/(\s+)/)) {
    if (part) {
      out.appendChild(/[-/\u2010-\u2014]/.test(part) && !/\s/.test(part) ? el('span', 'jp-ddp-word', part) : document.createTextNode(part));
    }
  }
  return out;
}

/** An element of text made of whole words (see `words`). */
function prose<K extends keyof HTMLElementTagNameMap>(tag: K, cls: string, text: string): HTMLElementTagNameMap[K] {
  const node = el(tag, cls);
  node.appendChild(words(text));
  return node;
}

/** A label's width in the charts' font, as a canvas measures it (the model's estimate where none can). */
function measurer(box: HTMLElement): (text: string) => number {
  const probe = box.appendChild(svg('svg', { class: 'jp-ddp-Metric-chart', width: 0, height: 0 }));
  const st = getComputedStyle(probe);
  const font = `${st.fontSize} ${st.fontFamily}`;
  probe.remove();
  const ctx = document.createElement('canvas').getContext('2d');
  if (!ctx || !st.fontSize) {
    return M.estimateWidth;
  }
  ctx.font = font;
  return (text: string) => ctx.measureText(text).width;
}

export class PoolPanel extends Widget {
  constructor(tracker: ConnectionTracker, commands: CommandRegistry) {
    super();
    this._tracker = tracker;
    this._commands = commands;
    this.id = 'ddp-magic-panel';
    this.addClass('jp-ddp-Panel');
    this.title.caption = 'DDP pool (ddp_magic)';

    const head = el('div', 'jp-ddp-Panel-head');
    head.appendChild(el('h2', 'jp-ddp-Panel-title', 'DDP pool'));
    this._where = el('div', 'jp-ddp-Panel-where');
    head.appendChild(this._where);
    this.node.appendChild(head);

    this._summary = el('div', 'jp-ddp-Panel-summary');
    this.node.appendChild(this._summary);
    this._lastCell = el('div', 'jp-ddp-Panel-lastCell'); // what the last failed cell left: its prompt, its root cause
    this.node.appendChild(this._lastCell);

    const actions = el('div', 'jp-ddp-Panel-actions');
    const buttons: Array<[string, string, string]> = [
      ['restart', CommandIDs.restart, 'Restart'],
      ['stop', CommandIDs.stop, 'Stop'],
      ['env', CommandIDs.env, '%ddp_env'],
      ['interrupt', CommandIDs.interrupt, 'Interrupt']
    ];
    for (const [key, command, label] of buttons) {
      const b = el('button', `jp-ddp-Panel-button jp-ddp-Panel-button-${key}`, label);
      b.type = 'button';
      b.dataset.command = command;
      b.addEventListener('click', () => {
        void this._commands.execute(command);
      });
      actions.appendChild(b);
      this._buttons.set(command, b);
    }
    this.node.appendChild(actions);

    this._message = el('div', 'jp-ddp-Panel-message');
    this.node.appendChild(this._message);

    const ranksBox = el('div', 'jp-ddp-Panel-section jp-ddp-Panel-ranks');
    this._ranksBox = ranksBox;
    ranksBox.appendChild(el('h3', '', 'Ranks'));
    this._table = el('table', 'jp-ddp-Ranks');
    const thead = el('thead');
    const hr = el('tr');
    // narrow sidebar: four columns; device, memory and the last output line go on the line below
    for (const [key, h] of [
      ['rank', '#'],
      ['pid', 'pid'],
      ['state', 'state'],
      ['time', 'time']
    ]) {
      hr.appendChild(el('th', `jp-ddp-Rank-${key}`, h));
    }
    thead.appendChild(hr);
    this._table.appendChild(thead);
    this._tbody = el('tbody');
    this._table.appendChild(this._tbody);
    ranksBox.appendChild(this._table);
    this.node.appendChild(ranksBox);

    this._metricsBox = el('div', 'jp-ddp-Panel-section jp-ddp-Metrics');
    this.node.appendChild(this._metricsBox);

    this._env = el('div', 'jp-ddp-Panel-section jp-ddp-Env');
    this.node.appendChild(this._env);

    this._extra = el('div', 'jp-ddp-Panel-section jp-ddp-Panel-extra');
    this.node.appendChild(this._extra);

    tracker.updated.connect(this.refresh, this);
    commands.commandChanged.connect(this._refreshButtons, this);
    this.refresh();
  }

  protected onResize(msg: Widget.ResizeMessage): void {
    super.onResize(msg);
    this._renderMetrics(this._tracker.current ? this._tracker.current.state.metrics : null);
  }

  /** The panel was shown (true) or hidden (false): index.ts keeps that across reloads where no layout restorer does. */
  get shownChanged(): ISignal<this, boolean> {
    return this._shownChanged;
  }

  protected onAfterShow(): void {
    void this._tracker.current?.probe(); // ddp_magic may have been loaded in a way we did not see
    this.refresh();
    this._shownChanged.emit(true);
  }

  protected onAfterHide(): void {
    this._shownChanged.emit(false);
  }

  refresh(): void {
    const conn = this._tracker.current;
    const panel = this._tracker.currentPanel;
    const state = conn ? conn.state : M.initialState();
    const now = Date.now();
    const pool = state.snapshot ? state.snapshot.pool : null;

    this._where.textContent = '';
    this._where.appendChild(words(panel ? `${panel.context.localPath} · kernel ${state.kernelStatus === 'none' ? 'none' : state.kernelStatus}` : 'no notebook'));

    const text = M.statusText(state, now);
    withCommands(
      this._summary,
      text ??
        (!conn
          ? 'Open a notebook to see its pool.'
          : !state.connected
            ? 'ddp_magic is not loaded in this kernel. Run `%load_ext ddp_magic`, then a `%%ddp -n N` cell.'
            : 'No pool is running. A `%%ddp -n N` cell starts one.')
    );
    if (text && pool && pool.queued && pool.queued.length) {
      this._summary.appendChild(document.createTextNode(` · queued behind it: ${pool.queued.join(', ')}`));
    }
    this._summary.dataset.phase = pool ? M.poolPhase(pool, state.receivedAt, now).phase : 'none';
    const last = pool && pool.last_cell && !pool.last_cell.ok ? pool.last_cell : null;
    this._lastCell.textContent = '';
    this._lastCell.appendChild(words(last ? last.text : ''));
    this._lastCell.dataset.recovered = String(!!last && last.recovered);
    this._lastCell.style.display = last ? '' : 'none';
    this._summary.dataset.job = pool && pool.job && pool.job.background ? pool.job.name : '';

    // the message line: pending requests first, then the last reply
    const lines: string[] = [];
    for (const p of state.pending) {
      if (p.op === 'status') {
        continue;
      }
      lines.push(
        p.queued
          ? `${M.OP_LABEL[p.op]}: waits for the running cell — the kernel holds it and runs it when the cell ends`
          : p.waits && state.kernelStatus === 'busy'
            ? `${M.OP_LABEL[p.op]}: waits for the running cell (the kernel handles it when the cell ends)`
            : `${M.OP_LABEL[p.op]}: sent…`
      );
    }
    if (!lines.length && state.lastReply) {
      lines.push(M.replyText(state.lastReply));
    }
    this._message.textContent = '';
    this._message.appendChild(words(lines.join('\n')));
    this._message.dataset.kind = state.pending.length ? 'pending' : state.lastReply && !state.lastReply.ok ? 'error' : 'info';

    // ranks
    this._tbody.textContent = '';
    const rows = M.rankRows(state, now);
    for (const r of rows) {
      const tr = el('tr', `jp-ddp-Rank jp-ddp-Rank-${r.stateClass}`);
      tr.dataset.rank = String(r.rank);
      tr.dataset.lastCause = r.lastCause; // the last cell's failure: "root" on the rank it names
      const cells: Array<[string, string]> = [
        ['rank', String(r.rank)],
        ['pid', r.pid],
        ['state', r.state],
        ['time', r.elapsed]
      ];
      for (const [key, value] of cells) {
        const td = el('td', `jp-ddp-Rank-${key}`, value);
        if (key === 'state' && r.why) {
          td.title = r.why;
        }
        tr.appendChild(td);
      }
      this._tbody.appendChild(tr);
      // the rank's last output line, under its row (the panel is narrow)
      const out = el('tr', `jp-ddp-RankOut jp-ddp-Rank-${r.stateClass}`);
      out.dataset.rank = String(r.rank);
      const td = el('td', 'jp-ddp-Rank-last');
      td.colSpan = cells.length;
      td.title = r.lastLine;
      for (const [key, value] of [
        ['lastNote', r.lastNote],
        ['node', r.node],
        ['device', r.device],
        ['memory', r.memory],
        ['lastText', r.lastLine]
      ]) {
        if (value) {
          td.appendChild(el('span', `jp-ddp-Rank-${key}`, value));
        }
      }
      if (!td.childNodes.length) {
        td.textContent = ' '; // keep the row's height
      }
      out.appendChild(td);
      this._tbody.appendChild(out);
    }
    this._ranksBox.style.display = rows.length ? '' : 'none'; // no pool: no empty "Ranks" heading

    this._renderMetrics(state.metrics);

    // env validation
    this._env.textContent = '';
    const env = M.envSummary(pool);
    if (env) {
      this._env.appendChild(el('h3', '', 'Env validation'));
      const verdict = el('div', 'jp-ddp-Env-verdict', M.envHeadline(env));
      verdict.title = env.verdict;
      verdict.dataset.ok = env.problems.some(c => c.level === 'error') ? 'false' : 'true';
      this._env.appendChild(verdict);
      if (env.problems.length) {
        const ul = el('ul', 'jp-ddp-Env-problems');
        for (const c of env.problems) {
          const li = el('li', `jp-ddp-Check jp-ddp-Check-${c.level}`);
          li.appendChild(el('span', 'jp-ddp-Check-mark', c.mark));
          li.appendChild(el('b', '', ` ${c.name}: `));
          li.appendChild(words(c.detail));
          ul.appendChild(li);
        }
        this._env.appendChild(ul);
      }
      const details = el('details', 'jp-ddp-Env-all');
      details.open = this._envOpen;
      details.addEventListener('toggle', () => (this._envOpen = details.open));
      details.appendChild(el('summary', '', 'all checks'));
      const ul = el('ul');
      for (const c of pool ? pool.checks : []) {
        const li = el('li', `jp-ddp-Check jp-ddp-Check-${c.ok ? 'ok' : c.level}`);
        li.appendChild(el('span', 'jp-ddp-Check-mark', c.mark));
        li.appendChild(el('b', '', ` ${c.name}: `));
        li.appendChild(words(c.detail));
        ul.appendChild(li);
      }
      details.appendChild(ul);
      this._env.appendChild(details);
    }

    // pool facts, names on the workers, notices
    this._extra.textContent = '';
    if (pool) {
      const facts = [
        `MASTER ${pool.master_addr}:${pool.master_port}`,
        `start method ${pool.start_method}${pool.start_method_asked === 'auto' && pool.start_method !== 'auto' ? ' (auto)' : ''}`,
        pool.start_seconds !== null && pool.start_seconds !== undefined ? `pool started in ${M.fmtSeconds(pool.start_seconds)}` : '',
        pool.broken ? `needs restart: ${pool.broken}` : ''
      ].filter(Boolean);
      this._extra.appendChild(prose('div', 'jp-ddp-Panel-facts', facts.join(' · ')));
      if (pool.names && pool.names.length) {
        this._extra.appendChild(prose('div', 'jp-ddp-Panel-names', `names on the workers: ${pool.names.join(', ')}`));
      }
    }
    for (const n of state.notices) {
      this._extra.appendChild(prose('div', 'jp-ddp-Panel-notice', n));
    }
    this._refreshButtons();
  }

  /**
   * The Metrics section: the headline, a legend of the ranks, a chart per metric as wide as the
   * sidebar, and the summary table. Drawn again only when the data or the width changed (refresh
   * runs every second while a cell runs).
   */
  private _renderMetrics(m: M.IMetricsMsg | null): void {
    const box = this._metricsBox;
    if (!m) {
      box.textContent = '';
      box.style.display = 'none';
      this._metricsShown = null;
      return;
    }
    box.style.display = '';
    const avail = box.clientWidth || this.node.clientWidth - 20; // 0 while the panel is hidden: drawn again when shown
    const width = avail > 0 ? Math.max(160, Math.floor(avail)) : 240;
    if (m === this._metricsShown && width === this._metricsWidth) {
      return;
    }
    this._metricsShown = m;
    this._metricsWidth = width;
    box.textContent = '';
    box.dataset.final = String(m.final);
    box.dataset.cell = m.cell;
    box.appendChild(el('h3', '', 'Metrics'));
    box.appendChild(prose('div', 'jp-ddp-Metrics-head', M.metricsHeadline(m)));
    const legend = el('div', 'jp-ddp-Metrics-legend');
    for (const r of m.ranks.slice(0, 16)) {
      const item = el('span', 'jp-ddp-Metrics-rank');
      item.dataset.rank = String(r);
      const swatch = el('span', 'jp-ddp-Metrics-swatch');
      swatch.setAttribute('style', `background: ${M.rankColour(r)}`);
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
      fig.appendChild(chartSvg(M.metricChart(m, name, width, M.CHART.height, measure)));
      box.appendChild(fig);
    }
    box.appendChild(this._metricsTable(m));
  }

  /**
   * The summary table: per metric a line with its name across the table, then its last, min and mean (numbers whole:
   * never wrapped, never cut), then the slowest rank and the ranks' last values. Three columns share the sidebar.
   */
  private _metricsTable(m: M.IMetricsMsg): HTMLTableElement {
    const table = el('table', 'jp-ddp-MetricsTable');
    const hr = el('tr');
    for (const key of ['last', 'min', 'mean']) {
      hr.appendChild(el('th', `jp-ddp-Metrics-${key}`, key));
    }
    table.appendChild(el('thead')).appendChild(hr);
    const body = table.appendChild(el('tbody'));
    for (const r of M.metricRows(m)) {
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

  private _refreshButtons(): void {
    for (const [command, b] of this._buttons) {
      if (!this._commands.hasCommand(command)) {
        continue;
      }
      const enabled = this._commands.isEnabled(command);
      b.disabled = !enabled;
      b.title = this._commands.caption(command);
      const base = b.textContent?.replace(/ \(waits\)$/, '') ?? '';
      const conn = this._tracker.current;
      const op = (Object.keys(CommandIDs) as Array<keyof typeof CommandIDs>).find(k => CommandIDs[k] === command);
      const waits =
        conn && (op === 'restart' || op === 'stop' || op === 'env') ? M.commandPolicy(op, conn.state).mode === 'waits' : false;
      b.textContent = waits ? `${base} (waits)` : base;
    }
  }

  private _tracker: ConnectionTracker;
  private _commands: CommandRegistry;
  private _where: HTMLDivElement;
  private _summary: HTMLDivElement;
  private _lastCell: HTMLDivElement;
  private _message: HTMLDivElement;
  private _table: HTMLTableElement;
  private _ranksBox: HTMLDivElement;
  private _tbody: HTMLTableSectionElement;
  private _env: HTMLDivElement;
  private _metricsBox: HTMLDivElement;
  private _metricsShown: M.IMetricsMsg | null = null;
  private _metricsWidth = 0;
  private _extra: HTMLDivElement;
  private _envOpen = false;
  private _buttons = new Map<string, HTMLButtonElement>();
  private _shownChanged = new Signal<this, boolean>(this);
}
