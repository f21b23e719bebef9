/**
 * The panel's Stacks action: every rank's stack now, identical ones once (what `%ddp stacks` prints).
 * The kernel answers it at once, while a foreground cell runs too (ui/labrequests.py, kernel/stacks.py):
 * the request goes over the comm like the others, the reply's `output` is the grouped text.
 * The text wraps at the panel's edge (a frame's words are what matter), under a stamp that says when it was taken
 * (`taken at 14:02:11 (12 s ago)`); once the cell it was taken in has ended, or the pool went, it says it is stale.
 */
import { el } from './dom';
import type { PoolConnection } from './connection';
import type { IUIState } from './model';
import { stacksRefusal, staleWhy, stampText } from './stacks';

const TITLE = "Every rank's stack now, identical ones once (%ddp stacks); works while a cell runs";

export class StacksSection {
  readonly button: HTMLButtonElement;
  readonly node: HTMLDivElement;

  constructor(current: () => PoolConnection | null) {
    this._current = current;
    this.button = el('button', 'jp-ddp-Panel-button jp-ddp-Panel-button-stacks', 'Stacks');
    this.button.type = 'button';
    this.button.title = TITLE;
    this.button.addEventListener('click', () => void this.show());
    this.node = el('div', 'jp-ddp-Panel-stacks');
    this.node.style.display = 'none';
    this._stamp = el('div', 'jp-ddp-Panel-stacksStamp');
    this._text = el('pre', 'jp-ddp-Panel-stacksText');
    const close = el('button', 'jp-ddp-Panel-button jp-ddp-Panel-stacksClose', 'Hide stacks');
    close.type = 'button';
    close.addEventListener('click', () => {
      this.node.style.display = 'none';
      this._takenAt = 0;
    });
    this.node.append(this._stamp, this._text, close);
  }

  /** The button's state and the stamp's clock (the panel calls this on each refresh, and a timer while shown). */
  update(state: IUIState): void {
    const refusal = stacksRefusal(state);
    this.button.disabled = !!refusal;
    this.button.title = refusal ? `Stacks: ${refusal}` : TITLE;
    this._state = state;
    this._stampNow();
  }

  /** Ask the kernel for the stacks and show its grouped text (or why there is none). */
  async show(): Promise<void> {
    const conn = this._current();
    this.node.style.display = '';
    this.node.dataset.state = 'asking';
    this._text.textContent = 'asking every rank for its stack…';
    this._takenAt = 0;
    this._stampNow();
    if (!conn) {
      this._text.textContent = 'Open a notebook whose kernel runs a pool to see its ranks\u2019 stacks.';
      this.node.dataset.state = 'error';
      return;
    }
    const pool = conn.state.snapshot ? conn.state.snapshot.pool : null;
    const job = pool && pool.job ? pool.job.name : null;
    try {
      const reply = (await conn.request('stacks')) as {
        ok: boolean;
        message: string;
        error?: string;
        output?: string;
        job?: string | null; // the cell the kernel read them in: the panel's snapshot may not have caught up with it yet
      };
      this._text.textContent = reply.ok ? reply.output || reply.message : reply.error || 'the kernel could not read the stacks';
      this.node.dataset.state = reply.ok ? 'shown' : 'error';
      this._takenAt = reply.ok ? Date.now() : 0;
      this._takenJob = reply.job !== undefined ? reply.job : job;
    } catch (e) {
      this._text.textContent = `the stacks did not come: ${e}`;
      this.node.dataset.state = 'error';
    }
    this._stampNow();
  }

  private _stampNow(): void {
    window.clearTimeout(this._timer);
    if (!this._takenAt || this.node.style.display === 'none') {
      this._stamp.textContent = '';
      return;
    }
    const stale = this._state ? staleWhy(this._takenJob, this._state) : '';
    this._stamp.textContent = stampText(this._takenAt, Date.now(), stale);
    this.node.dataset.stale = String(!!stale);
    if (stale && this.node.dataset.state === 'shown') {
      this.node.dataset.state = 'stale';
    }
    this._timer = window.setTimeout(() => this._stampNow(), 1000);
  }

  private _current: () => PoolConnection | null;
  private _stamp: HTMLDivElement;
  private _text: HTMLPreElement;
  private _state: IUIState | null = null;
  private _takenAt = 0;
  private _takenJob: string | null = null;
  private _timer = 0;
}
