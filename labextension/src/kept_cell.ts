/**
 * A kept job's own cell when its kernel goes (docs/keep.md): the job runs on in its kept pool, but the cell's widgets
 * (its status view, its chart) were the old kernel's models, and without them a notebook shows broken-widget icons
 * around a view frozen at its last second, with nothing that says where the output goes on.
 *
 * While a kept pool runs a background job here, this remembers the job's cell (the snapshot's `cells` and `job`).
 * When the kernel restarts or dies, that cell's widget outputs give way to one static note (text/plain and
 * text/html, so a saved notebook says it too): `kept: …runs on without a kernel; Attach … follows it`. Once a kernel
 * has attached that pool, the note says `continued in cell [N]`, the cell that ran `%ddp attach`. The note's
 * metadata (`ddp_magic.kept_note`: the pool's id) finds it again, across saves and reloads.
 */
import type { ICodeCellModel } from '@jupyterlab/cells';
import type { NotebookPanel } from '@jupyterlab/notebook';
import { IDisposable } from '@lumino/disposable';
import { Signal } from '@lumino/signaling';

import { WIDGET_MIME } from './cell_outputs';
import type { PoolConnection } from './connection';
import { keptNote } from './kept';

const GONE = new Set(['restarting', 'autorestarting', 'dead']);

interface IKeptJob {
  pool: string;
  cellId: string;
  name: string; // "cell [12]"
}

function noteOutput(pool: string, name: string, continuedIn: number | null): Record<string, any> {
  const text = keptNote(pool, name, continuedIn);
  const html = `<div class='ddp-kept-note' data-pool='${pool}' style='font-size:var(--jp-ui-font-size1,13px);padding:2px 0'>${text}</div>`;
  return {
    output_type: 'display_data',
    data: { 'text/plain': text, 'text/html': html },
    metadata: { ddp_magic: { kept_note: pool, name, continued_in: continuedIn } }
  };
}

export class KeptCellNotes implements IDisposable {
  constructor(panel: NotebookPanel, conn: PoolConnection) {
    this._panel = panel;
    this._conn = conn;
    conn.changed.connect(this._check, this);
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  dispose(): void {
    this._disposed = true;
    Signal.clearData(this);
  }

  private _check(): void {
    const state = this._conn.state;
    const snap = state.snapshot;
    const pool = snap && snap.pool;
    if (GONE.has(state.kernelStatus)) {
      this._gone = this._job || this._gone;
      this._job = null;
      return;
    }
    if (this._gone && state.kernelStatus === 'idle') {
      // once the next kernel is up: a restarted kernel closes its widgets' comms as it goes, and a view removed before
      // that closes its model's comm here first (the page then logs "Comm not found" for each of the kernel's closes)
      this._mark(this._gone);
      this._gone = null;
    }
    if (!pool) {
      return;
    }
    const kept = pool.kept_id || null;
    const job = pool.job;
    const brief = job && job.background ? (snap.cells || []).find(c => c.name === job.name && !c.ended) : undefined;
    this._job = kept && job && brief && brief.cell_id ? { pool: kept, cellId: brief.cell_id, name: job.name } : null;
    if (kept && state.connected && this._waiting.has(kept)) {
      this._continued(kept);
    }
  }

  /** The job's cell: its widgets (dead with the kernel) out, the note in the first one's place. */
  private _mark(job: IKeptJob): void {
    const cell = this._cells().find(c => c.id === job.cellId);
    if (!cell) {
      return;
    }
    const outputs = cell.outputs.toJSON() as Record<string, any>[];
    const at = outputs.findIndex(o => o.data && o.data[WIDGET_MIME]);
    const kept = outputs.filter(o => !(o.data && o.data[WIDGET_MIME]) && !isNote(o));
    kept.splice(at < 0 ? kept.length : Math.min(at, kept.length), 0, noteOutput(job.pool, job.name, null));
    cell.outputs.fromJSON(kept as any);
    this._waiting.add(job.pool);
    this._before = new Map(this._cells().map(c => [c, c.executionCount]));
  }

  /** A kernel runs the kept pool again: each note of it not yet pointing on says the cell that attached it (one that
   * ran since the note was written: an attach cell of an earlier kernel keeps its old number until run again). */
  private _continued(pool: string): void {
    const cells = this._cells();
    const attach = cells
      .filter(c => /%ddp\s+attach\b/.test(c.sharedModel.getSource()) && typeof c.executionCount === 'number')
      .filter(c => this._before.get(c) !== c.executionCount)
      .sort((a, b) => (b.executionCount ?? 0) - (a.executionCount ?? 0))[0];
    if (!attach) {
      return;
    }
    for (const cell of cells) {
      for (let j = 0; j < cell.outputs.length; j++) {
        const out = cell.outputs.get(j).toJSON() as Record<string, any>;
        const meta = isNote(out) ? out.metadata.ddp_magic : null;
        if (meta && meta.kept_note === pool && meta.continued_in === null && cell !== attach) {
          cell.outputs.set(j, noteOutput(pool, String(meta.name), attach.executionCount as number) as any);
        }
      }
    }
    this._waiting.delete(pool);
  }

  private _cells(): ICodeCellModel[] {
    const model = this._panel.content.model;
    const out: ICodeCellModel[] = [];
    for (let i = 0; model && i < model.cells.length; i++) {
      const cell = model.cells.get(i);
      if (cell.type === 'code') {
        out.push(cell as ICodeCellModel);
      }
    }
    return out;
  }

  private _panel: NotebookPanel;
  private _conn: PoolConnection;
  private _job: IKeptJob | null = null;
  private _gone: IKeptJob | null = null; // the job whose kernel went: its cell is marked once the next kernel is idle
  private _waiting = new Set<string>(); // the pools whose notes wait for an attach
  private _before = new Map<ICodeCellModel, number | null>(); // each cell's prompt number when the note was written
  private _disposed = false;
}

function isNote(out: Record<string, any>): boolean {
  return !!(out && out.metadata && out.metadata.ddp_magic && out.metadata.ddp_magic.kept_note);
}
