/**
 * What the panel's Stacks view says around the stacks (pure: src/__tests__/stacks.test.ts): when they were taken,
 * whether they still show the ranks, and why the button cannot ask.
 */
import type { IUIState } from './model';

/** `14:02:11`: the wall clock of a moment (ms since the epoch), in the page's time zone. */
export function clockText(ms: number): string {
  const d = new Date(ms);
  return [d.getHours(), d.getMinutes(), d.getSeconds()].map(n => String(n).padStart(2, '0')).join(':');
}

/** The stamp over the stacks: when they were taken and how long ago, and whether what they show has ended. */
export function stampText(takenAt: number, now: number, stale: string): string {
  const ago = Math.max(0, Math.round((now - takenAt) / 1000));
  return `taken at ${clockText(takenAt)} (${ago} s ago)${stale ? ` · stale: ${stale}` : ''}`;
}

/** Why stacks taken while `job` ran (null: between cells) no longer show the ranks: '' while they still may. */
export function staleWhy(takenJob: string | null, state: IUIState): string {
  const pool = state.snapshot ? state.snapshot.pool : null;
  if (!state.connected || !pool) {
    return 'the pool is gone';
  }
  const job = pool.job ? pool.job.name : null;
  if (takenJob !== null && job !== takenJob) {
    return `${takenJob} has ended; Stacks reads them again`;
  }
  return '';
}

/** Whether the Stacks button can ask: a kernel with ddp_magic and a pool; else why not (its tooltip). */
export function stacksRefusal(state: IUIState): string {
  if (!state.connected) {
    return 'ddp_magic is not loaded in this kernel (%load_ext ddp_magic)';
  }
  return state.snapshot && state.snapshot.pool ? '' : 'no pool is running: a %%ddp -n N cell starts one';
}

