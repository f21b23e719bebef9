/**
 * One PoolConnection per open notebook, and which one is current (the notebook
 * the user last worked in). `updated` fires when the current notebook changes,
 * when its pool state changes, and once a second while its pool is active (so
 * elapsed times move without any message from the kernel).
 */
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ISignal, Signal } from '@lumino/signaling';

import { PoolConnection } from './connection';
import { KeptCellNotes } from './kept_cell';
import { CellRebinder } from './rebind';
import { poolPhase } from './ranks';

export class ConnectionTracker {
  constructor(notebooks: INotebookTracker, version: string) {
    this._notebooks = notebooks;
    this._version = version;
    notebooks.widgetAdded.connect((_, panel) => this.connectionFor(panel), this);
    notebooks.currentChanged.connect(this._onCurrent, this);
    notebooks.forEach(panel => this.connectionFor(panel));
    this._onCurrent();
    this._timer = window.setInterval(() => this._tick(), 1000);
  }

  get updated(): ISignal<this, void> {
    return this._updated;
  }

  get current(): PoolConnection | null {
    return this._current;
  }

  /** The rebinder of a notebook panel (rebind.ts), once its connection exists. */
  rebinderFor(panel: NotebookPanel): CellRebinder | null {
    return this._rebinders.get(panel) ?? null;
  }

  /** Every open notebook's connection. */
  get connections(): PoolConnection[] {
    return [...this._connections.values()];
  }

  get currentPanel(): NotebookPanel | null {
    return this._notebooks.currentWidget;
  }

  /** The connection of a notebook panel (created on first use, disposed with the panel). */
  connectionFor(panel: NotebookPanel): PoolConnection {
    let conn = this._connections.get(panel);
    if (!conn) {
      conn = new PoolConnection(panel.sessionContext, this._version);
      this._connections.set(panel, conn);
      const rebinder = new CellRebinder(panel, conn); // a background cell another page ran (before a reload) gets its outputs back
      this._rebinders.set(panel, rebinder);
      const notes = new KeptCellNotes(panel, conn); // a kept job's cell says where it goes on when its kernel goes
      conn.changed.connect(() => {
        if (conn === this._current) {
          this._updated.emit();
        }
      }, this);
      panel.disposed.connect(() => {
        this._rebinders.get(panel)?.dispose();
        this._rebinders.delete(panel);
        notes.dispose();
        this._connections.get(panel)?.dispose();
        this._connections.delete(panel);
        if (this._current === conn) {
          this._current = null;
          this._updated.emit();
        }
      }, this);
    }
    return conn;
  }

  dispose(): void {
    window.clearInterval(this._timer);
    this._connections.forEach(c => c.dispose());
    this._connections.clear();
    Signal.clearData(this);
  }

  private _onCurrent(): void {
    const panel = this._notebooks.currentWidget;
    const conn = panel ? this.connectionFor(panel) : null;
    if (conn !== this._current) {
      this._current = conn;
      this._updated.emit();
    }
  }

  private _tick(): void {
    const conn = this._current;
    const pool = conn?.state.snapshot?.pool;
    if (!conn || !pool) {
      return;
    }
    const phase = poolPhase(pool, conn.state.receivedAt, Date.now()).phase;
    if (phase === 'running' || phase === 'starting' || conn.state.pending.length) {
      this._updated.emit();
    }
  }

  private _notebooks: INotebookTracker;
  private _version: string;
  private _connections = new Map<NotebookPanel, PoolConnection>();
  private _rebinders = new Map<NotebookPanel, CellRebinder>();
  private _current: PoolConnection | null = null;
  private _updated = new Signal<this, void>(this);
  private _timer: number;
}
