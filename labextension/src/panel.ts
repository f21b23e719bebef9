/**
 * The DDP panel (right sidebar): the current notebook's pool, one row per rank
 * (pid, device, state, time, memory, last output line), the pool's env
 * validation, and buttons for the pool commands. It only presents: every
 * decision comes from model.ts, every action is a command.
 */
import { CommandRegistry } from '@lumino/commands';
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

    const ranksBox = el('div', 'jp-ddp-Panel-section');
    ranksBox.appendChild(el('h3', '', 'Ranks'));
    this._table = el('table', 'jp-ddp-Ranks');
    const thead = el('thead');
    const hr = el('tr');
    for (const [key, h] of [
      ['rank', '#'],
      ['pid', 'pid'],
      ['device', 'device'],
      ['state', 'state'],
      ['time', 'time'],
      ['memory', 'memory']
    ]) {
      hr.appendChild(el('th', `jp-ddp-Rank-${key}`, h));
    }
    thead.appendChild(hr);
    this._table.appendChild(thead);
    this._tbody = el('tbody');
    this._table.appendChild(this._tbody);
    ranksBox.appendChild(this._table);
    this.node.appendChild(ranksBox);

    this._env = el('div', 'jp-ddp-Panel-section jp-ddp-Env');
    this.node.appendChild(this._env);

    this._extra = el('div', 'jp-ddp-Panel-section jp-ddp-Panel-extra');
    this.node.appendChild(this._extra);

    tracker.updated.connect(this.refresh, this);
    commands.commandChanged.connect(this._refreshButtons, this);
    this.refresh();
  }

  protected onAfterShow(): void {
    void this._tracker.current?.probe(); // ddp_magic may have been loaded in a way we did not see
    this.refresh();
  }

  refresh(): void {
    const conn = this._tracker.current;
    const panel = this._tracker.currentPanel;
    const state = conn ? conn.state : M.initialState();
    const now = Date.now();
    const pool = state.snapshot ? state.snapshot.pool : null;

    this._where.textContent = panel ? `${panel.context.localPath} · kernel ${state.kernelStatus === 'none' ? 'none' : state.kernelStatus}` : 'no notebook';

    const text = M.statusText(state, now);
    this._summary.textContent =
      text ??
      (!conn
        ? 'Open a notebook to see its pool.'
        : !state.connected
          ? 'ddp_magic is not loaded in this kernel. Run %load_ext ddp_magic, then a %%ddp -n N cell.'
          : 'No pool is running. A %%ddp -n N cell starts one.');
    this._summary.dataset.phase = pool ? M.poolPhase(pool, state.receivedAt, now).phase : 'none';

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
    this._message.textContent = lines.join('\n');
    this._message.dataset.kind = state.pending.length ? 'pending' : state.lastReply && !state.lastReply.ok ? 'error' : 'info';

    // ranks
    this._tbody.textContent = '';
    const rows = M.rankRows(state, now);
    for (const r of rows) {
      const tr = el('tr', `jp-ddp-Rank jp-ddp-Rank-${r.stateClass}`);
      tr.dataset.rank = String(r.rank);
      const cells: Array<[string, string]> = [
        ['rank', String(r.rank)],
        ['pid', r.pid],
        ['device', r.device],
        ['state', r.state],
        ['time', r.elapsed],
        ['memory', r.memory]
      ];
      for (const [key, value] of cells) {
        tr.appendChild(el('td', `jp-ddp-Rank-${key}`, value));
      }
      this._tbody.appendChild(tr);
      // the rank's last output line, under its row (the panel is narrow)
      const out = el('tr', `jp-ddp-RankOut jp-ddp-Rank-${r.stateClass}`);
      out.dataset.rank = String(r.rank);
      const td = el('td', 'jp-ddp-Rank-last', r.lastLine || ' ');
      td.colSpan = cells.length;
      td.title = r.lastLine;
      out.appendChild(td);
      this._tbody.appendChild(out);
    }
    this._table.style.display = rows.length ? '' : 'none';
    this._table.dataset.memory = rows.some(r => r.memory) ? 'shown' : 'none'; // CPU ranks report none

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
          li.appendChild(document.createTextNode(c.detail));
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
        li.appendChild(document.createTextNode(c.detail));
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
        `start method ${pool.start_method}`,
        pool.start_seconds !== null && pool.start_seconds !== undefined ? `started in ${pool.start_seconds.toFixed(2)} s` : '',
        pool.broken ? `needs restart: ${pool.broken}` : ''
      ].filter(Boolean);
      this._extra.appendChild(el('div', 'jp-ddp-Panel-facts', facts.join(' · ')));
      if (pool.names && pool.names.length) {
        this._extra.appendChild(el('div', 'jp-ddp-Panel-names', `names on the workers: ${pool.names.join(', ')}`));
      }
    }
    for (const n of state.notices) {
      this._extra.appendChild(el('div', 'jp-ddp-Panel-notice', n));
    }
    this._refreshButtons();
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
  private _message: HTMLDivElement;
  private _table: HTMLTableElement;
  private _tbody: HTMLTableSectionElement;
  private _env: HTMLDivElement;
  private _extra: HTMLDivElement;
  private _envOpen = false;
  private _buttons = new Map<string, HTMLButtonElement>();
}
