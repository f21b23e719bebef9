/**
 * The status-bar item: nothing when the current notebook's kernel has no pool,
 * else "DDP 4×gloo · running 0:12" / "DDP 2×gloo · rank 1 failed"; "DDP preempted ·
 * step 4210 saved to ckpt/" while no pool runs since a preemption ended the last.
 * Clicking it opens the DDP panel.
 */
import { Widget } from '@lumino/widgets';

import { poolEnd, poolPhase, statusText, statusTooltip } from './ranks';
import { ConnectionTracker } from './tracker';

export class PoolStatusItem extends Widget {
  constructor(tracker: ConnectionTracker, onClick: () => void) {
    super();
    this._tracker = tracker;
    this.addClass('jp-ddp-StatusItem');
    this.node.setAttribute('role', 'button');
    this.node.addEventListener('click', onClick);
    tracker.updated.connect(this.refresh, this);
    this.refresh();
  }

  /** What the item shows now (null: hidden). */
  get text(): string | null {
    const conn = this._tracker.current;
    return conn ? statusText(conn.state, Date.now()) : null;
  }

  refresh(): void {
    const conn = this._tracker.current;
    const now = Date.now();
    const text = conn ? statusText(conn.state, now) : null;
    this.node.textContent = text ?? '';
    this.node.title = conn && text ? statusTooltip(conn.state, now) : '';
    const pool = conn?.state.snapshot?.pool;
    this.node.dataset.phase = pool && conn ? poolPhase(pool, conn.state.receivedAt, now).phase : conn && poolEnd(conn.state) ? 'preempted' : 'none';
  }

  private _tracker: ConnectionTracker;
}
