/**
 * The DDP panel's kept pools: after a kernel restart, the pools this notebook kept (%ddp keep, docs/keep.md) that
 * outlived the old kernel, each with an Attach action. Attach puts a `%ddp attach ID --out job` cell below the
 * active one (with `%load_ext ddp_magic` first where the kernel has not loaded it) and runs it, so the running job's
 * output and chart go on in a cell, as the magic shows them. The kernel lists them in each snapshot
 * (ddp_magic/ui/labsnap.py kept_dicts) while it has no pool of its own, and before ddp_magic is loaded the connection
 * asks for them (kept_probe.ts). Each is a row laid out as the rank rows are: its id, short facts, the button.
 */
import { NotebookActions, NotebookPanel } from '@jupyterlab/notebook';

import { el, words } from './dom';
import { attachCode, type IKeptPool, keptLines } from './kept';

export class KeptSection {
  readonly node = el('div', 'jp-ddp-Panel-kept');

  /** `loaded`: ddp_magic is loaded in the kernel (else Attach loads it first). */
  render(pools: IKeptPool[], panel: NotebookPanel | null, loaded: boolean): void {
    this.node.textContent = '';
    this.node.style.display = pools.length ? '' : 'none';
    if (pools.length) {
      this.node.appendChild(el('div', 'jp-ddp-Panel-keptTitle', pools.length === 1 ? 'kept pool of this notebook' : 'kept pools of this notebook'));
    }
    for (const pool of pools) {
      const row = el('div', `jp-ddp-Panel-keptRow${pool.alive ? '' : ' jp-ddp-Panel-keptRow-ended'}`);
      row.dataset.id = pool.id;
      row.title = pool.text;
      const facts = el('span', 'jp-ddp-Panel-keptFacts');
      for (const line of keptLines(pool)) {
        facts.appendChild(el('span', 'jp-ddp-Panel-keptLine')).appendChild(words(line)); // "ranks 0-1" never split
      }
      row.appendChild(facts);
      const b = el('button', 'jp-ddp-Panel-button jp-ddp-Panel-button-attach', pool.alive ? 'Attach' : 'Why it ended');
      b.type = 'button';
      b.disabled = !panel;
      const code = attachCode(pool, loaded);
      b.title = `runs ${code.replace('\n', '; ')} in a new cell`;
      b.addEventListener('click', () => {
        if (panel) {
          void runBelow(panel, code);
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
