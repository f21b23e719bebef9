/**
 * The panel's Ranks section. Up to GROUPED_ABOVE ranks: a table with a row per rank (rank, pid, state, time) and
 * under it the rank's node, device, memory and last output line, fitting the narrow sidebar. Above: the ranks grouped
 * by node, a line per group ("n2 · 510 running · rank 517 failed", a click folds it), in a virtualized list: a
 * scroller of fixed-height rows of which only the visible window (and a few either side) is in the DOM.
 */
import type { IRankRow } from './ranks';
import { GROUPED_ABOVE, type ListItem, listItems, visibleRange } from './groups';
import { el } from './dom';

/** The height of one row of the grouped list, in px (style/base.css .jp-ddp-RankList-item says the same). */
export const ROW_HEIGHT = 22;
/** The grouped list shows at most this many rows at once; it scrolls for the rest. */
const VISIBLE_ROWS = 16;

export class RanksSection {
  readonly node = el('div', 'jp-ddp-Panel-section jp-ddp-Panel-ranks');

  constructor() {
    this.node.appendChild(el('h3', '', 'Ranks'));
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
    this.node.appendChild(this._table);
    this._list = el('div', 'jp-ddp-RankList');
    this._list.setAttribute('role', 'list');
    this._spacer = el('div', 'jp-ddp-RankList-spacer');
    this._list.appendChild(this._spacer);
    this._list.addEventListener(
      'scroll',
      () => {
        this._top = this._list.scrollTop; // read here, where layout is clean: a refresh's redraw reads no layout
        this._schedule();
      },
      { passive: true }
    );
    this._list.addEventListener('click', e => this._toggle(e));
    this.node.appendChild(this._list);
  }

  /** A row per rank, or the grouped list at scale (no rank: the section is hidden, no empty "Ranks" heading). */
  render(rows: IRankRow[]): void {
    this.node.style.display = rows.length ? '' : 'none';
    const grouped = rows.length > GROUPED_ABOVE;
    this._table.style.display = grouped ? 'none' : '';
    this._list.style.display = grouped ? '' : 'none';
    this.node.dataset.grouped = String(grouped);
    if (grouped) {
      this._tbody.textContent = '';
      this._rows = rows;
      this._items = listItems(rows, this._foldedNodes());
      this._draw();
      return;
    }
    this._items = [];
    this._tbody.textContent = '';
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
        if (key === 'state' || key === 'time') {
          td.title = [`rank ${r.rank}: ${r.state}`, key === 'time' ? r.elapsed : '', r.why].filter(Boolean).join('\n'); // whole on hover
        }
        tr.appendChild(td);
      }
      this._tbody.appendChild(tr);
      // the rank's last output line, under its row (the panel is narrow)
      const out = el('tr', `jp-ddp-RankOut jp-ddp-Rank-${r.stateClass}`);
      out.dataset.rank = String(r.rank);
      const td = el('td', 'jp-ddp-Rank-last');
      td.colSpan = cells.length;
      td.title = [r.lastNote, r.node, r.device, r.memory, r.lastLine].filter(Boolean).join(' · '); // cut to the sidebar: all of it on hover
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
  }

  /** Draw the grouped list's visible window on the next frame (a scroll fires many events per frame). */
  private _schedule(): void {
    if (!this._frame) {
      this._frame = requestAnimationFrame(() => {
        this._frame = 0;
        this._draw();
      });
    }
  }

  /**
   * The visible window of the grouped list: only its rows are in the DOM, each at its place in the spacer. A row keeps
   * its element while it stays in the window (its texts are updated in place), so a click is never lost to a redraw.
   */
  private _draw(): void {
    const items = this._items;
    const height = Math.min(items.length, VISIBLE_ROWS) * ROW_HEIGHT;
    this._list.style.height = `${height}px`;
    this._spacer.style.height = `${items.length * ROW_HEIGHT}px`;
    const [first, end] = visibleRange(items.length, this._top, height, ROW_HEIGHT);
    const shown = new Map<string, HTMLDivElement>();
    for (let i = first; i < end; i++) {
      const key = itemKey(items[i]);
      const node = this._shown.get(key) || this._spacer.appendChild(el('div'));
      fillItem(node, items[i]);
      node.style.top = `${i * ROW_HEIGHT}px`;
      shown.set(key, node);
    }
    for (const [key, node] of this._shown) {
      if (!shown.has(key)) {
        node.remove();
      }
    }
    this._shown = shown;
    this._list.dataset.items = String(items.length);
  }

  /** The nodes shown folded: with several nodes each starts folded (a line each), one host's ranks start open. */
  private _foldedNodes(): Set<string> {
    const nodes = [...new Set(this._rows.map(r => r.node))];
    return new Set(nodes.filter(n => (nodes.length > 1) !== this._toggled.has(n)));
  }

  /** A click on a group's line folds or unfolds its ranks. */
  private _toggle(e: Event): void {
    const line = (e.target as HTMLElement).closest('.jp-ddp-RankGroup') as HTMLElement | null;
    if (!line || line.dataset.node === undefined) {
      return;
    }
    const node = line.dataset.node;
    if (this._toggled.has(node)) {
      this._toggled.delete(node);
    } else {
      this._toggled.add(node);
    }
    this._items = listItems(this._rows, this._foldedNodes());
    this._draw();
  }

  private _list: HTMLDivElement;
  private _spacer: HTMLDivElement;
  private _rows: IRankRow[] = [];
  private _items: ListItem[] = [];
  private _toggled = new Set<string>(); // the nodes whose line the user clicked: folded or opened against the default
  private _shown = new Map<string, HTMLDivElement>(); // the rows in the DOM, by item (itemKey)
  private _frame = 0;
  private _top = 0; // the list's scrollTop at its last scroll event
  private _table: HTMLTableElement;
  private _tbody: HTMLTableSectionElement;
}

function itemKey(item: ListItem): string {
  return item.kind === 'group' ? `group:${item.group.node}` : `rank:${item.row.rank}`;
}

/** The element's spans, made on its first fill and refilled in place after (the same kind per key). */
function spans(node: HTMLDivElement, classes: string[]): HTMLSpanElement[] {
  if (node.childElementCount !== classes.length) {
    node.textContent = '';
    for (const c of classes) {
      node.appendChild(el('span', c));
    }
  }
  return Array.from(node.children) as HTMLSpanElement[];
}

function setText(node: HTMLElement, text: string): void {
  if (node.textContent !== text) {
    node.textContent = text;
  }
}

/** One row of the grouped list: a group's line, or a rank's (rank, state, time, pid, device, memory, last line). */
function fillItem(node: HTMLDivElement, item: ListItem): void {
  if (item.kind === 'group') {
    const g = item.group;
    node.className = `jp-ddp-RankList-item jp-ddp-RankGroup${g.bad ? ' jp-ddp-RankGroup-bad' : ''}`;
    node.dataset.node = g.node;
    node.dataset.ranks = String(g.ranks.length);
    node.setAttribute('role', 'button');
    node.setAttribute('aria-expanded', String(!item.folded));
    node.title = `${g.text}\n(click to ${item.folded ? 'show' : 'hide'} its ${g.ranks.length} ranks)`;
    const [fold, text] = spans(node, ['jp-ddp-RankGroup-fold', 'jp-ddp-RankGroup-text']);
    setText(fold, item.folded ? '▸' : '▾');
    setText(text, g.text);
    return;
  }
  const r = item.row;
  node.className = `jp-ddp-RankList-item jp-ddp-RankItem jp-ddp-Rank-${r.stateClass}`;
  node.setAttribute('role', 'listitem');
  node.dataset.rank = String(r.rank);
  node.dataset.lastCause = r.lastCause;
  const rest = [r.lastNote, r.pid ? `pid ${r.pid}` : '', r.device, r.memory, r.lastLine].filter(Boolean).join(' · ');
  const texts = [String(r.rank), r.state, r.elapsed, rest];
  spans(node, ['jp-ddp-Rank-rank', 'jp-ddp-Rank-state', 'jp-ddp-Rank-time', 'jp-ddp-RankItem-rest']).forEach((sp, i) => setText(sp, texts[i]));
  node.title = [`rank ${r.rank}: ${r.state}`, r.why, rest].filter(Boolean).join('\n');
}
