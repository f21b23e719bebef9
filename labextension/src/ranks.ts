/**
 * What the panel and the status bar say of the ranks: state words, root causes, the pool's phase, the rows.
 */

import type { Cause, FailureKind, ILastCell, IPoolEnd, IPoolSnapshot, IRankSnapshot, IUIState, RankState } from './model';
import { cellName, cleanLine, fmtSeconds, formatBytes, jobText, ranksBrief } from './format';

const SIGNALS: Record<number, string> = {
  1: 'SIGHUP',
  2: 'SIGINT',
  3: 'SIGQUIT',
  4: 'SIGILL',
  6: 'SIGABRT',
  7: 'SIGBUS',
  8: 'SIGFPE',
  9: 'SIGKILL',
  11: 'SIGSEGV',
  13: 'SIGPIPE',
  15: 'SIGTERM'
};

/** The word shown for a rank's state: "dead" becomes "killed (SIGKILL)" or "died (exit 3)"; stopped by ddp_magic, "stopped". */
export function rankStateLabel(r: IRankSnapshot, cause: Cause | null = r.cause ?? null): string {
  if (r.state === 'failed' && cause === 'stopped') {
    return 'aborted'; // it raised because the root cause broke its collective (a peer went away)
  }
  if (r.state !== 'dead') {
    return r.state;
  }
  if (cause === 'stopped') {
    return 'stopped';
  }
  if (r.exit_code === null || r.exit_code === undefined) {
    return 'died';
  }
  if (r.exit_code < 0) {
    return `killed (${SIGNALS[-r.exit_code] || `signal ${-r.exit_code}`})`;
  }
  return `died (exit ${r.exit_code})`;
}

const ACTIVE: readonly RankState[] = ['queued', 'starting', 'connecting', 'running'];
const BAD: readonly RankState[] = ['failed', 'dead'];
const BY_US_SIGNALS = [-15, -9]; // SIGTERM, SIGKILL: how ddp_magic stops a rank that ignores an interrupt

/**
 * Why each failed rank counts: "root" (the failure that explains the others) or "stopped" (ddp_magic
 * interrupted or stopped it because of that failure). The kernel says so once the cell has ended
 * (rank.cause); while it runs, a rank that raised or died on its own is a root cause, and a rank
 * killed by SIGTERM/SIGKILL beside one is taken as stopped by ddp_magic.
 */
export function rankCauses(ranks: IRankSnapshot[]): Map<number, Cause> {
  const out = new Map<number, Cause>();
  if (ranks.some(r => r.cause)) {
    for (const r of ranks) {
      if (r.cause) {
        out.set(r.rank, r.cause);
      } else if (BAD.indexOf(r.state) >= 0) {
        out.set(r.rank, 'stopped'); // the kernel does not count it among the cell's failures (a rank it released)
      }
    }
    return out;
  }
  const killed = (r: IRankSnapshot) => r.state === 'dead' && r.exit_code !== null && BY_US_SIGNALS.indexOf(r.exit_code) >= 0;
  const own = ranks.filter(r => r.state === 'failed' || (r.state === 'dead' && !killed(r)));
  for (const r of ranks) {
    if (BAD.indexOf(r.state) >= 0) {
      out.set(r.rank, own.length && killed(r) ? 'stopped' : 'root');
    }
  }
  return out;
}

export function isActive(r: IRankSnapshot): boolean {
  return ACTIVE.indexOf(r.state) >= 0;
}

/** Seconds a rank has been in its state, advanced by the time since the snapshot arrived while it is active. */
export function rankElapsed(r: IRankSnapshot, receivedAt: number, now: number): number {
  return r.elapsed + (isActive(r) ? Math.max(0, now - receivedAt) / 1000 : 0);
}

export type Phase = 'queued' | 'starting' | 'running' | 'failed' | 'interrupted' | 'broken' | 'ready' | 'stopped';

export interface IPhase {
  phase: Phase;
  /** Ranks that failed or died, in rank order. */
  bad: number[];
  /** Elapsed seconds of the cell (or the start) while something is active. */
  elapsed: number | null;
}

/** Where the pool is, from its ranks: failures first, then activity, then rest. */
export function poolPhase(pool: IPoolSnapshot, receivedAt: number, now: number): IPhase {
  const ranks = pool.ranks || [];
  const causes = rankCauses(ranks);
  const bad = ranks.filter(r => causes.get(r.rank) === 'root').map(r => r.rank);
  const active = ranks.filter(isActive);
  const elapsed = active.length ? Math.max(...active.map(r => rankElapsed(r, receivedAt, now))) : null;
  if (active.some(r => r.state === 'running')) {
    return { phase: 'running', bad, elapsed };
  }
  if (active.some(r => r.state === 'queued')) {
    return { phase: 'queued', bad, elapsed }; // a Slurm job waits in the queue: no rank process exists yet
  }
  if (active.length) {
    return { phase: 'starting', bad, elapsed };
  }
  if (bad.length) {
    return { phase: 'failed', bad, elapsed: null };
  }
  if (pool.broken) {
    return { phase: 'broken', bad, elapsed: null };
  }
  if (ranks.some(r => r.state === 'interrupted' || causes.get(r.rank) === 'stopped')) {
    return { phase: 'interrupted', bad, elapsed: null };
  }
  if (!pool.started && !ranks.length) {
    return { phase: 'starting', bad, elapsed: null }; // created by a %%ddp cell; its template process is starting
  }
  if (!pool.started || !ranks.length || ranks.every(r => r.state === 'stopped')) {
    return { phase: 'stopped', bad, elapsed: null };
  }
  return { phase: 'ready', bad, elapsed: null };
}

/** "queued: job 1234 pending (Resources)": what the kernel says of a Slurm job still in the queue (every queued rank says it). */
export function queueLine(pool: IPoolSnapshot): string {
  const queued = (pool.ranks || []).find(r => r.state === 'queued');
  return queued && queued.last_line ? cleanLine(queued.last_line, 120) : 'queued';
}

const rankList = ranksBrief; // the status bar, the summary: one short line at any size

/**
 * What the last %%ddp cell left to say once its pool is ready again: "In[5]: rank 1 failed" (null when it went
 * well, or while ranks still show the failure themselves). The rank named is the kernel's root cause.
 */
export function lastCellNote(pool: IPoolSnapshot): string | null {
  const last = pool.last_cell;
  if (!last || last.ok) {
    return null;
  }
  if (last.cancelled) {
    return `${cellName(last.number)}: cancelled`; // job.cancel(): nobody failed, nobody pressed Ctrl-C
  }
  if (!last.root.length) {
    return `${cellName(last.number)}: interrupted`; // Ctrl-C: nobody to blame, nothing to recover from
  }
  return `${cellName(last.number)}: ${rankList(last.root)} failed${last.recovered ? ', recovered' : ''}`;
}

/**
 * The status-bar text: null (show nothing) when the kernel has no pool, else
 * "DDP 4×gloo · running 0:12", "DDP 2×gloo · rank 1 failed", "DDP 2×gloo · ready", and while a background
 * cell runs "DDP 2×gloo · background: cell [12] running 1:02:11, step 4,120".
 */
export function statusText(state: IUIState, now: number): string | null {
  const pool = state.connected && state.snapshot ? state.snapshot.pool : null;
  if (!pool) {
    return endedText(state);
  }
  const head = `DDP ${pool.world_size}×${pool.backend}`;
  const p = poolPhase(pool, state.receivedAt, now);
  let tail: string;
  switch (p.phase) {
    case 'running':
      tail = pool.job && pool.job.background ? jobText(pool.job, state.receivedAt, now) : `running ${fmtSeconds(p.elapsed || 0)}`;
      if (p.bad.length) {
        tail += ` · ${rankList(p.bad)} failed`;
      }
      break;
    case 'starting':
      tail = p.elapsed === null ? 'starting' : `starting ${fmtSeconds(p.elapsed)}`;
      break;
    case 'queued':
      tail = `${queueLine(pool)} · waited ${fmtSeconds(p.elapsed || 0)}`;
      break;
    case 'failed':
      tail = `${rankList(p.bad)} failed`;
      break;
    case 'broken':
      tail = 'needs restart';
      break;
    default:
      tail = p.phase;
  }
  const note = p.phase === 'ready' || p.phase === 'interrupted' ? lastCellNote(pool) : null;
  if (note) {
    tail += ` · ${note}`;
  }
  if (pool.queued && pool.queued.length && (p.phase === 'running' || p.phase === 'starting')) {
    tail += ` · ${pool.queued.join(', ')} queued`; // cells that wait their turn behind the one that runs
  }
  const waiting = state.pending.filter(q => q.op !== 'status' && q.op !== 'stacks'); // answered at once, even while a cell runs
  if (waiting.length) {
    tail += ` · ${waiting[0].op} ${waiting[0].waits ? 'waits for the cell' : 'pending'}`;
  }
  return `${head} · ${tail}`;
}

/** The last pool's end by preemption while no pool runs: the kernel's snapshot says it (IPoolEnd), or null. */
export function poolEnd(state: IUIState): IPoolEnd | null {
  const snap = state.connected ? state.snapshot : null;
  return snap && !snap.pool && snap.ended ? snap.ended : null;
}

/** The status bar's word for a preempted pool: "DDP preempted · step 4210 saved to ckpt/", or null. */
function endedText(state: IUIState): string | null {
  const end = poolEnd(state);
  if (!end) {
    return null;
  }
  const saved = !end.saved ? 'nothing saved' : end.step !== null ? `step ${end.step} saved to ${end.folder}` : `saved to ${end.folder}`;
  return `DDP preempted · ${saved}`;
}

/** The panel's summary for a preempted pool: the cell's line, its `%ddp load` as a command (between backticks). */
export function endedSummary(end: IPoolEnd): string {
  const load = `%ddp load ${end.folder}`;
  return `The last pool was ${end.text.replace(load, '`' + load + '`')}`;
}

/** A longer explanation for the status bar's tooltip. */
export function statusTooltip(state: IUIState, now: number): string {
  const pool = state.snapshot ? state.snapshot.pool : null;
  if (!pool) {
    const end = poolEnd(state);
    return end ? `${end.text}\nClick to open the DDP panel.` : '';
  }
  const p = poolPhase(pool, state.receivedAt, now);
  const last = pool.last_cell && !pool.last_cell.ok ? pool.last_cell.text : '';
  const lines = [
    `ddp_magic pool: ${pool.nproc} rank${pool.nproc === 1 ? '' : 's'}, backend ${pool.backend}, MASTER_PORT ${pool.master_port}`,
    `state: ${p.phase}${pool.broken ? ` (${pool.broken})` : ''}`,
    `env checks: ${pool.verdict || 'not run'}`,
    ...(last ? [last] : []),
    'Click to open the DDP panel.'
  ];
  return lines.join('\n');
}

export interface IRankRow {
  rank: number;
  pid: string;
  device: string;
  state: string;
  stateClass: string; // css modifier: active | ok | bad | warn | idle
  /** Why the state is what it is, for a tooltip ("stopped by ddp_magic (SIGTERM) after rank 1 failed"). */
  why: string;
  elapsed: string;
  memory: string;
  lastLine: string;
  /** The last cell's word on a rank that is ready again: "root" (it failed), "stopped" (released because of it), "". */
  lastCause: Cause | '';
  /** "In[5]: raised" on the rank the last cell's failure names ('' otherwise). */
  lastNote: string;
  node: string; // a Slurm pool's node (n2); empty on one host
}

/** What a rank did in a failed cell, by its failure's kind (states.py FailureKind). */
const KIND_WORDS: Record<FailureKind, string> = {
  error: 'raised',
  interrupted: 'interrupted',
  died: 'died',
  killed: 'stopped by ddp_magic',
  init: 'failed to start',
  timeout: 'timed out'
};

export function stateClass(r: IRankSnapshot, cause: Cause | null = r.cause ?? null): string {
  if (cause === 'stopped') {
    return 'idle'; // ddp_magic stopped it: neutral, the root cause is the failure
  }
  if (BAD.indexOf(r.state) >= 0) {
    return 'bad';
  }
  if (r.state === 'queued') {
    return 'warn'; // waiting for the scheduler, not running
  }
  if (isActive(r)) {
    return 'active';
  }
  if (r.state === 'interrupted') {
    return 'warn';
  }
  if (r.state === 'done' || r.state === 'ready') {
    return 'ok';
  }
  return 'idle';
}

/** One row per rank for the panel's table. */
export function rankRows(state: IUIState, now: number): IRankRow[] {
  const pool = state.snapshot ? state.snapshot.pool : null;
  if (!pool) {
    return [];
  }
  const ranks = pool.ranks || [];
  const causes = rankCauses(ranks);
  const roots = ranks.filter(r => causes.get(r.rank) === 'root').map(r => r.rank);
  const last = pool.last_cell && !pool.last_cell.ok ? pool.last_cell : null;
  return [...ranks]
    .sort((a, b) => a.rank - b.rank)
    .map(r => {
      const was = last && !causes.has(r.rank) ? last.causes[String(r.rank)] : undefined;
      const why = causes.get(r.rank) === 'stopped' ? stoppedWhy(r, roots) : '';
      return {
        rank: r.rank,
        pid: r.pid === null || r.pid === undefined ? '' : String(r.pid),
        device: r.device || '',
        state: rankStateLabel(r, causes.get(r.rank) ?? null),
        stateClass: stateClass(r, causes.get(r.rank) ?? null),
        why: was && last ? lastCellWhy(r, was, last) : why,
        elapsed: fmtSeconds(rankElapsed(r, state.receivedAt, now)),
        memory: formatBytes(r.memory),
        lastLine: cleanLine(r.last_line || ''),
        lastCause: was ? was.cause : '',
        lastNote: was && last && was.cause === 'root' ? `${cellName(last.number)}: ${KIND_WORDS[was.kind] || 'failed'}` : '',
        node: r.node || ''
      };
    });
}

/** The tooltip of a rank that is ready again after the last cell failed. */
function lastCellWhy(r: IRankSnapshot, was: { kind: FailureKind; cause: Cause }, last: ILastCell): string {
  const where = cellName(last.number);
  const again = last.recovered ? `; ${r.state} again, its variables kept` : '';
  if (was.cause === 'root') {
    return `${where}: ${last.headline || `rank ${r.rank} ${KIND_WORDS[was.kind] || 'failed'}`}${again}`;
  }
  const after = last.root.length ? ` after ${rankList(last.root)} failed` : '';
  return `${where}: released by ddp_magic${after}, not a cause${again}`;
}

/** The tooltip of a rank that failed only because of another one. */
function stoppedWhy(r: IRankSnapshot, roots: number[]): string {
  const after = roots.length ? ` after ${rankList(roots)} failed` : '';
  if (r.state === 'failed') {
    return `its collective broke${after}: a consequence, not the cause`;
  }
  return `stopped by ddp_magic (${rankStateLabel(r, null)})${after}`;
}

