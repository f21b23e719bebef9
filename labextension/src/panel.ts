/**
 * The DDP panel (right sidebar): the current notebook's pool, one row per rank
 * (pid, device, state, time, memory, last output line), the pool's env
 * validation, the live chart of what the ranks log with ddp_magic.log, and
 * buttons for the pool commands. It only presents: every decision comes from
 * the pure modules (ranks.ts, commands.ts, state.ts), every action is a command.
 */
import { CommandRegistry } from '@lumino/commands';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { endedSummary, poolEnd, poolPhase, rankRows, statusText } from './ranks';
import { initialState } from './state';
import { commandPolicy, OP_LABEL, replyText } from './commands';
import { el, withCommands, words } from './dom';
import { PoolFacts } from './panel_facts';
import { keptPools } from './kept';
import { KeptSection } from './panel_kept';
import { MetricsSection } from './panel_metrics';
import { RanksSection } from './panel_ranks';
import { StacksSection } from './panel_stacks';
import { ConnectionTracker } from './tracker';

export const CommandIDs = {
  restart: 'ddp-magic:restart-pool',
  stop: 'ddp-magic:stop-pool',
  env: 'ddp-magic:show-env',
  panel: 'ddp-magic:show-panel',
  interrupt: 'ddp-magic:interrupt-kernel'
};

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
    actions.appendChild(this._stacks.button);
    this.node.appendChild(actions);

    this._message = el('div', 'jp-ddp-Panel-message');
    this.node.appendChild(this._message);
    this.node.appendChild(this._kept.node); // after a kernel restart: this notebook's kept pools, to attach
    this.node.appendChild(this._stacks.node);

    this.node.appendChild(this._ranks.node);
    this.node.appendChild(this._metrics.node);
    this.node.appendChild(this._facts.env);
    this.node.appendChild(this._facts.extra);

    tracker.updated.connect(this.refresh, this);
    commands.commandChanged.connect(this._refreshButtons, this);
    this.refresh();
  }

  protected onResize(msg: Widget.ResizeMessage): void {
    super.onResize(msg);
    this._metrics.render(this._tracker.current ? this._tracker.current.state.metrics : null, () => this.node.clientWidth - 20);
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
    const t0 = performance.now();
    const conn = this._tracker.current;
    const panel = this._tracker.currentPanel;
    const state = conn ? conn.state : initialState();
    const now = Date.now();
    const pool = state.snapshot ? state.snapshot.pool : null;

    this._where.textContent = '';
    this._where.appendChild(words(panel ? `${panel.context.localPath} · kernel ${state.kernelStatus === 'none' ? 'none' : state.kernelStatus}` : 'no notebook'));

    const end = poolEnd(state); // no pool since a preemption ended the last: the cell's line, not the status bar's short word
    const text = end ? endedSummary(end) : statusText(state, now);
    const kept = state.connected ? keptPools(state.snapshot) : conn ? conn.keptWithoutMagic : [];
    withCommands(
      this._summary,
      text ??
        (!conn
          ? 'Open a notebook to see its pool.'
          : !state.connected && kept.some(k => k.alive)
            ? 'ddp_magic is not loaded in this kernel; this notebook kept a pool (below): Attach loads ddp_magic and takes it on.'
          : !state.connected
            ? 'ddp_magic is not loaded in this kernel. Run `%load_ext ddp_magic`, then a `%%ddp -n N` cell.'
            : 'No pool is running. A `%%ddp -n N` cell starts one.')
    );
    this._summary.dataset.phase = pool ? poolPhase(pool, state.receivedAt, now).phase : end ? 'preempted' : 'none';
    const last = pool && pool.last_cell && !pool.last_cell.ok ? pool.last_cell : null;
    this._lastCell.textContent = '';
    this._lastCell.appendChild(words(last ? last.text : ''));
    this._lastCell.dataset.recovered = String(!!last && last.recovered);
    this._lastCell.style.display = last ? '' : 'none';
    this._summary.dataset.job = pool && pool.job && pool.job.background ? pool.job.name : '';

    // the message line: pending requests first, then the last reply
    const lines: string[] = [];
    for (const p of state.pending) {
      if (p.op === 'status' || p.op === 'stacks') {
        continue;
      }
      lines.push(
        p.queued
          ? `${OP_LABEL[p.op]}: waits for the running cell — the kernel holds it and runs it when the cell ends`
          : p.waits && state.kernelStatus === 'busy'
            ? `${OP_LABEL[p.op]}: waits for the running cell (the kernel handles it when the cell ends)`
            : `${OP_LABEL[p.op]}: sent…`
      );
    }
    if (!lines.length && state.lastReply) {
      lines.push(replyText(state.lastReply));
    }
    this._message.textContent = '';
    this._message.appendChild(words(lines.join('\n')));
    this._message.dataset.kind = state.pending.length ? 'pending' : state.lastReply && !state.lastReply.ok ? 'error' : 'info';

    this._kept.render(kept, panel, state.connected);
    this._ranks.render(rankRows(state, now));
    this._metrics.render(state.metrics, () => this.node.clientWidth - 20); // a width read only with a chart: no forced layout
    this._facts.render(state, pool);
    this._stacks.update(state);
    this._refreshButtons();
    this.node.dataset.renderMs = (performance.now() - t0).toFixed(2); // what one refresh cost (ui-tests/test_scale_ui.py reads it)
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
        conn && (op === 'restart' || op === 'stop' || op === 'env') ? commandPolicy(op, conn.state).mode === 'waits' : false;
      b.textContent = waits ? `${base} (waits)` : base;
    }
  }

  private _tracker: ConnectionTracker;
  private _commands: CommandRegistry;
  private _where: HTMLDivElement;
  private _summary: HTMLDivElement;
  private _lastCell: HTMLDivElement;
  private _message: HTMLDivElement;
  private _kept = new KeptSection();
  private _ranks = new RanksSection();
  private _stacks = new StacksSection(() => this._tracker.current);
  private _metrics = new MetricsSection();
  private _facts = new PoolFacts();
  private _buttons = new Map<string, HTMLButtonElement>();
  private _shownChanged = new Signal<this, boolean>(this);
}
