/**
 * The panel's sections under the ranks and the chart: the env validation (the problems spelled out, every check
 * behind a fold) and the pool's facts (MASTER address, start method, start time), the names the workers own, the
 * notices of the last %%ddp cell.
 */
import type { IPoolSnapshot, IUIState } from './model';
import { fmtSeconds } from './format';
import { envHeadline, envSummary } from './commands';
import { el, prose, words } from './dom';

export class PoolFacts {
  readonly env = el('div', 'jp-ddp-Panel-section jp-ddp-Env');
  readonly extra = el('div', 'jp-ddp-Panel-section jp-ddp-Panel-extra');

  render(state: IUIState, pool: IPoolSnapshot | null): void {
    // env validation
    this.env.textContent = '';
    const env = envSummary(pool);
    if (env) {
      this.env.appendChild(el('h3', '', 'Env validation'));
      const verdict = el('div', 'jp-ddp-Env-verdict', envHeadline(env));
      verdict.title = env.verdict;
      verdict.dataset.ok = env.problems.some(c => c.level === 'error') ? 'false' : 'true';
      this.env.appendChild(verdict);
      if (env.problems.length) {
        const ul = el('ul', 'jp-ddp-Env-problems');
        for (const c of env.problems) {
          const li = el('li', `jp-ddp-Check jp-ddp-Check-${c.level}`);
          li.appendChild(el('span', 'jp-ddp-Check-mark', c.mark));
          li.appendChild(el('b', '', ` ${c.name}: `));
          li.appendChild(words(c.detail));
          ul.appendChild(li);
        }
        this.env.appendChild(ul);
      }
      const details = el('details', 'jp-ddp-Env-all');
      details.open = this._envOpen;
      details.addEventListener('toggle', () => (this._envOpen = details.open));
      details.appendChild(el('summary', '', 'all checks'));
      const ul = el('ul');
      for (const c of pool ? pool.checks : []) {
        const li = el('li', `jp-ddp-Check jp-ddp-Check-${c.ok ? 'ok' : c.level}`);
        li.appendChild(el('span', 'jp-ddp-Check-mark', c.mark));
        li.appendChild(el('b', '', ` ${c.name}: `));
        li.appendChild(words(c.detail));
        ul.appendChild(li);
      }
      details.appendChild(ul);
      this.env.appendChild(details);
    }

    // pool facts, names on the workers, notices
    this.extra.textContent = '';
    if (pool) {
      const facts = [
        // before any rank exists the address and port are the plan's placeholder (a queued Slurm job's is not chosen)
        pool.planned ? 'planned: MASTER address and port are set when the ranks start' : `MASTER ${pool.master_addr}:${pool.master_port}`,
        `start method ${pool.start_method}${pool.start_method_asked === 'auto' && pool.start_method !== 'auto' ? ' (auto)' : ''}`,
        pool.start_seconds !== null && pool.start_seconds !== undefined ? `pool started in ${fmtSeconds(pool.start_seconds)}` : '',
        pool.broken ? `needs restart: ${pool.broken}` : ''
      ].filter(Boolean);
      this.extra.appendChild(prose('div', 'jp-ddp-Panel-facts', facts.join(' · ')));
      if (pool.names && pool.names.length) {
        this.extra.appendChild(prose('div', 'jp-ddp-Panel-names', `names on the workers: ${pool.names.join(', ')}`));
      }
    }
    for (const n of state.notices) {
      this.extra.appendChild(prose('div', 'jp-ddp-Panel-notice', n));
    }
  }

  private _envOpen = false;
}
