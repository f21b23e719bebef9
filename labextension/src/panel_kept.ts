/**
 * The DDP panel's kept pools: after a kernel restart, the pools this notebook kept (%ddp keep, docs/keep.md) that
 * outlived the old kernel, each with an Attach action. Attach puts a `%ddp attach ID --out job` cell below the
 * active one and runs it, so the running job's output and chart go on in a cell, as the magic shows them.
 * The kernel lists them in each snapshot (ddp_magic/ui/labsnap.py kept_dicts) while it has no pool of its own.
 */
import { NotebookActions, NotebookPanel } from '@jupyterlab/notebook';

import * as M from './model';
import { el, words } from './dom';

/** One kept pool of this notebook, as the kernel says it. */
export interface IKeptPool {
  id: string;
  text: string; // the line `%ddp attach --list` prints
  alive: boolean; // false: its lease ended; attaching says why
}

/** What a snapshot carries besides the pool: the kept pools (an empty list while a pool runs here). */
export function keptPools(snapshot: M.ISnapshotMsg | null): IKeptPool[] {
  const kept = snapshot ? (snapshot as M.ISnapshotMsg & { kept?: IKeptPool[] }).kept : undefined;
  return Array.isArray(kept) ? kept : [];
}

/** The code the Attach action runs: the magic, so the job's output lands in that cell. */
export function attachCode(pool: IKeptPool): string {
  return `%ddp attach ${pool.id} --out job`; // the id first: argparse takes no positional after an option here
}

export class KeptSection {
  readonly node = el('div', 'jp-ddp-Panel-kept');

  render(snapshot: M.ISnapshotMsg | null, panel: NotebookPanel | null): void {
    const pools = keptPools(snapshot);
    this.node.textContent = '';
    this.node.style.display = pools.length ? '' : 'none';
    for (const pool of pools) {
      const row = el('div', 'jp-ddp-Panel-keptRow');
      row.dataset.id = pool.id;
      row.appendChild(words(`${pool.alive ? 'kept pool' : 'ended kept pool'} ${pool.text}`));
      const b = el('button', 'jp-ddp-Panel-button jp-ddp-Panel-button-attach', pool.alive ? 'Attach' : 'Why it ended');
      b.type = 'button';
      b.disabled = !panel;
      b.title = `runs ${attachCode(pool)} in a new cell`;
      b.addEventListener('click', () => {
        if (panel) {
          void runBelow(panel, attachCode(pool));
        }
      });
      row.appendChild(b);
      this.node.appendChild(row);
    }
  }
}

/** A new code cell with ``code`` below the active cell of ``panel``, run at once. */
async function runBelow(panel: NotebookPanel, code: string): Promise<void> {
  const notebook = panel.content;
  NotebookActions.insertBelow(notebook);
  const cell = notebook.activeCell;
  if (cell) {
    cell.model.sharedModel.setSource(code);
    await NotebookActions.run(notebook, panel.sessionContext);
  }
}
