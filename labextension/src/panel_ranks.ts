/**
 * The panel's Ranks section: a table with a row per rank (rank, pid, state, time) and under it the rank's node, device,
 * memory and last output line, fitting the narrow sidebar.
 */
import * as M from './model';
import { el } from './dom';

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
  }

  /** A row per rank (none: the section is hidden, no empty "Ranks" heading). */
  render(rows: M.IRankRow[]): void {
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
    this.node.style.display = rows.length ? '' : 'none';
  }

  private _table: HTMLTableElement;
  private _tbody: HTMLTableSectionElement;
}
