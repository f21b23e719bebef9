/**
 * A background cell's output area, given back to a page that did not run it (after a reload, or a notebook reopened
 * while its kernel ran on).
 *
 * JupyterLab routes an output message to a cell by the execute request this page sent for it; after a reload no
 * request of this page is the cell's, so its later rank lines, its status view's updates, its chart and its error
 * would reach the page and go nowhere (the cell would look stopped). The kernel keeps each background cell's
 * outputs (ddp_magic/ui/transcripts.py) and lists them in every snapshot (`cells`: the cell's id, the page that ran
 * it). For each listed cell of this notebook that another page ran, this asks the kernel to `follow` it: the reply
 * holds the cell's outputs now, which replace what the notebook had saved, and each later output message comes over
 * the comm with the next seq (cell_outputs.ts applies them as the output area would). Messages that arrive before
 * the reply wait for it; a gap in the seqs asks again. Running the cell again ends the following: the new run's
 * request is this page's.
 */
import type { ICodeCellModel } from '@jupyterlab/cells';
import { NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import { IDisposable } from '@lumino/disposable';
import { Signal } from '@lumino/signaling';

import { applyOutput, IOutputSink, IOutputState, nextMessages, outputState, savedView } from './cell_outputs';
import type { ICellBrief, ICellOutputMsg } from './model';
import { PoolConnection } from './connection';

interface IBinding {
  cell: ICodeCellModel;
  seq: number; // the last seq applied (-1: the follow reply has not come yet)
  pending: ICellOutputMsg[]; // messages that came before the reply
  state: IOutputState;
}

export class CellRebinder implements IDisposable {
  constructor(panel: NotebookPanel, conn: PoolConnection) {
    this._panel = panel;
    this._conn = conn;
    conn.changed.connect(this._check, this);
    conn.cellOutput.connect(this._onOutput, this);
    NotebookActions.executionScheduled.connect(this._onScheduled, this);
    panel.context.ready.then(
      () => this._openSaved(),
      () => undefined
    );
  }

  /** The msg_ids of the cells this page follows now (what a test reads). */
  get following(): string[] {
    return [...this._bound.keys()];
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._bound.clear();
    NotebookActions.executionScheduled.disconnect(this._onScheduled, this);
    Signal.clearData(this);
  }

  /** The notebook as it opens: a status view saved while its cell ran shows its HTML form (cell_outputs.ts savedView). */
  private _openSaved(): void {
    const model = this._panel.content.model;
    for (let i = 0; model && i < model.cells.length; i++) {
      const cell = model.cells.get(i);
      if (cell.type !== 'code') {
        continue;
      }
      const outputs = (cell as ICodeCellModel).outputs;
      for (let j = 0; j < outputs.length; j++) {
        const settled = savedView(outputs.get(j).toJSON() as Record<string, any>);
        if (settled) {
          outputs.set(j, settled as any);
        }
      }
    }
  }

  private _check(): void {
    const state = this._conn.state;
    if (!state.connected || !state.snapshot) {
      this._bound.clear(); // the comm is gone: the kernel follows for it no more; a new comm follows anew
      return;
    }
    const model = this._panel.content.model;
    const client = this._conn.clientId;
    if (!model || !client) {
      return;
    }
    const newest = new Map<string, ICellBrief>(); // a cell run again shows its last run
    for (const brief of state.snapshot.cells || []) {
      newest.set(brief.cell_id, brief);
    }
    for (const brief of newest.values()) {
      if (!brief.cell_id || brief.client === client || this._bound.has(brief.msg_id) || this._left.has(brief.msg_id)) {
        continue;
      }
      let cell: ICodeCellModel | null = null;
      for (let i = 0; i < model.cells.length; i++) {
        const c = model.cells.get(i);
        if (c.id === brief.cell_id && c.type === 'code') {
          cell = c as ICodeCellModel;
        }
      }
      if (cell) {
        void this._follow(brief, cell);
      }
    }
  }

  private async _follow(brief: ICellBrief, cell: ICodeCellModel): Promise<void> {
    const binding: IBinding = { cell, seq: -1, pending: [], state: outputState() };
    this._bound.set(brief.msg_id, binding);
    let reply;
    try {
      reply = await this._conn.follow(brief.msg_id);
    } catch (e) {
      reply = null;
    }
    if (this._bound.get(brief.msg_id) !== binding) {
      return; // unbound meanwhile (the cell ran again, the comm closed)
    }
    if (!reply || !reply.ok) {
      this._bound.delete(brief.msg_id);
      this._left.add(brief.msg_id); // no longer kept by the kernel: the notebook's saved outputs stay
      return;
    }
    const sink = cell.outputs as unknown as IOutputSink;
    sink.clear();
    for (const out of reply.outputs) {
      applyOutput(sink, binding.state, out);
    }
    binding.seq = reply.seq;
    const pending = binding.pending;
    binding.pending = [];
    this._applyAll(brief.msg_id, binding, pending);
  }

  private _onOutput(_: PoolConnection, msg: ICellOutputMsg): void {
    const binding = this._bound.get(msg.msg_id);
    if (!binding) {
      return;
    }
    if (binding.seq < 0) {
      binding.pending.push(msg);
      return;
    }
    this._applyAll(msg.msg_id, binding, [msg]);
  }

  private _applyAll(msgId: string, binding: IBinding, msgs: ICellOutputMsg[]): void {
    const { apply, gap } = nextMessages(binding.seq, msgs);
    const sink = binding.cell.outputs as unknown as IOutputSink;
    for (const m of apply) {
      applyOutput(sink, binding.state, m);
      binding.seq = m.seq;
    }
    if (gap) {
      this._bound.delete(msgId); // a message went missing: follow again, from the kernel's copy
      this._check();
    }
  }

  private _onScheduled(_: unknown, args: { notebook: unknown; cell: { model: { id: string } } }): void {
    if (args.notebook !== this._panel.content) {
      return;
    }
    for (const [msgId, b] of this._bound) {
      if (b.cell.id === args.cell.model.id) {
        this._bound.delete(msgId); // run again: its new request is this page's own
        this._left.add(msgId);
      }
    }
  }

  private _panel: NotebookPanel;
  private _conn: PoolConnection;
  private _bound = new Map<string, IBinding>();
  private _left = new Set<string>(); // cells this page stopped following (run again here, or no longer kept)
  private _disposed = false;
}
