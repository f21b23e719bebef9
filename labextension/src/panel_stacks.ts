/**
 * The panel's Stacks action: every rank's stack now, identical ones once (what `%ddp stacks` prints).
 * The kernel answers it at once, while a foreground cell runs too (ui/labrequests.py, kernel/stacks.py):
 * the request goes over the comm like the others, the reply's `output` is the grouped text.
 */
import { el } from './dom';
import type { PoolConnection } from './connection';

export class StacksSection {
  readonly button: HTMLButtonElement;
  readonly node: HTMLDivElement;

  constructor(current: () => PoolConnection | null) {
    this._current = current;
    this.button = el('button', 'jp-ddp-Panel-button jp-ddp-Panel-button-stacks', 'Stacks');
    this.button.type = 'button';
    this.button.title = "Every rank's stack now, identical ones once (%ddp stacks); works while a cell runs";
    this.button.addEventListener('click', () => void this.show());
    this.node = el('div', 'jp-ddp-Panel-stacks');
    this.node.style.display = 'none';
    this._text = el('pre', 'jp-ddp-Panel-stacksText');
    this._text.style.cssText = 'max-height:24em;overflow:auto;font-size:11px;white-space:pre;margin:4px 0';
    const close = el('button', 'jp-ddp-Panel-button jp-ddp-Panel-stacksClose', 'Hide stacks');
    close.type = 'button';
    close.addEventListener('click', () => {
      this.node.style.display = 'none';
    });
    this.node.append(this._text, close);
  }

  /** Ask the kernel for the stacks and show its grouped text (or why there is none). */
  async show(): Promise<void> {
    const conn = this._current();
    this.node.style.display = '';
    this.node.dataset.state = 'asking';
    this._text.textContent = 'asking every rank for its stack…';
    if (!conn) {
      this._text.textContent = 'Open a notebook whose kernel runs a pool to see its ranks\u2019 stacks.';
      this.node.dataset.state = 'error';
      return;
    }
    try {
      const reply = (await conn.request('stacks')) as { ok: boolean; message: string; error?: string; output?: string };
      this._text.textContent = reply.ok ? reply.output || reply.message : reply.error || 'the kernel could not read the stacks';
      this.node.dataset.state = reply.ok ? 'shown' : 'error';
    } catch (e) {
      this._text.textContent = `the stacks did not come: ${e}`;
      this.node.dataset.state = 'error';
    }
  }

  private _current: () => PoolConnection | null;
  private _text: HTMLPreElement;
}
