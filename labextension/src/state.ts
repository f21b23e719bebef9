/**
 * The UI's state for one notebook's kernel, and how each kernel message (and kernel status) changes it.
 *
 * Pure functions (no JupyterLab imports): unit-tested in node (src/__tests__/model.test.ts).
 */

import type { IJobSnapshot, IPending, IPoolSnapshot, IQueuedMsg, IRankSnapshot, IReplyMsg, ISnapshotMsg, IUIState, KernelStatus } from './model';
import { parseMetrics, takesOver } from './metrics';
import { isActive, rankElapsed } from './ranks';

export function initialState(): IUIState {
  return {
    connected: false,
    kernelStatus: 'none',
    snapshot: null,
    receivedAt: 0,
    pending: [],
    lastReply: null,
    notices: [],
    metrics: null,
    cellSinceMetrics: false,
    metricsPids: []
  };
}

function pidsOf(pool: IPoolSnapshot | null): number[] {
  return pool ? (pool.ranks || []).map(r => r.pid).filter((p): p is number => typeof p === 'number') : [];
}

/**
 * The chart after a snapshot: kept while the pool it was logged on runs (a rank replaced alone keeps it), gone once
 * the pool stopped or restarted (no pid of the chart's pool left, or every rank starting anew).
 */
function chartAfter(state: IUIState, pool: IPoolSnapshot | null): Pick<IUIState, 'metrics' | 'metricsPids'> {
  if (!state.metrics) {
    return { metrics: null, metricsPids: [] };
  }
  const pids = pidsOf(pool);
  const ranks = pool ? pool.ranks || [] : [];
  const anew = ranks.length > 0 && ranks.every(r => r.state === 'starting' || r.state === 'connecting') && !pids.some(p => state.metricsPids.includes(p));
  if (!pool || anew || (pids.length && state.metricsPids.length && !pids.some(p => state.metricsPids.includes(p)))) {
    return { metrics: null, metricsPids: [] };
  }
  return { metrics: state.metrics, metricsPids: [...new Set([...state.metricsPids, ...pids])] };
}

const START_STATES = ['queued', 'starting', 'connecting'];
const JITTER_S = 1; // a clock that reads less than what was shown by up to this much: a later snapshot's longer trip, not a new clock

/**
 * The ranks of ``next`` with no clock behind what the page showed of ``prev`` at ``now``. A snapshot's elapsed times are
 * the kernel's as it sent it; the page advances them from their arrival, so one that took longer on its way than the one
 * before reads a few ms behind what was on screen. The same clock: the same rank in its start (queued, starting,
 * connecting: one start clock) or in the same state with the same process. A new cell's clock starts from 0 anew.
 */
function steadyClocks(prev: IPoolSnapshot | null, next: IPoolSnapshot, shownAt: number, now: number): IPoolSnapshot {
  const before = new Map((prev && prev.ranks ? prev.ranks : []).map(r => [r.rank, r]));
  const same = (a: IRankSnapshot, b: IRankSnapshot) =>
    (START_STATES.includes(a.state) && START_STATES.includes(b.state)) || (a.state === b.state && a.pid === b.pid);
  const ranks = (next.ranks || []).map(r => {
    const p = before.get(r.rank);
    const shown = p && isActive(p) && isActive(r) && same(p, r) ? rankElapsed(p, shownAt, now) : null;
    return shown !== null && r.elapsed < shown && shown - r.elapsed < JITTER_S ? { ...r, elapsed: shown } : r;
  });
  const job = steadyJob(prev ? prev.job : null, next.job, shownAt, now);
  return job === next.job ? { ...next, ranks } : { ...next, ranks, job };
}

/** A background job's run clock (the status bar's "running 1:02:11") as ``steadyClocks`` keeps a rank's: the same job
 * (its cell's name) running in both snapshots never reads less than what was shown. */
function steadyJob(prev: IJobSnapshot | null | undefined, next: IJobSnapshot | null | undefined, shownAt: number, now: number) {
  if (!prev || !next || prev.name !== next.name || typeof prev.elapsed !== 'number' || typeof next.elapsed !== 'number') {
    return next;
  }
  const shown = prev.elapsed + Math.max(0, now - shownAt) / 1000;
  return next.elapsed < shown && shown - next.elapsed < JITTER_S ? { ...next, elapsed: shown } : next;
}

// ------------------------------------------------------------------ reducers

/** Apply one message from the kernel's comm. Unknown messages leave the state as it is. */
export function applyMessage(state: IUIState, data: unknown, now: number): IUIState {
  if (!data || typeof data !== 'object') {
    return state;
  }
  const msg = data as { type?: string };
  if (msg.type === 'snapshot') {
    const snap = data as ISnapshotMsg;
    const prev = state.snapshot;
    if (prev && prev.session === snap.session && snap.seq < prev.seq) {
      return state; // an older snapshot overtaken by a newer one
    }
    const notices = (snap.notices || []).slice(-5); // the kernel's own list: it forgets a notice when the next %%ddp cell runs
    // a cell (or a start) after the last reply: that reply's message is history, not the news
    const running = !!snap.pool && (snap.pool.ranks || []).some(isActive);
    const lastReply = running ? null : state.lastReply;
    const cellSinceMetrics = state.cellSinceMetrics || running;
    const steady = prev && prev.session === snap.session && snap.pool ? { ...snap, pool: steadyClocks(prev.pool, snap.pool, state.receivedAt, now) } : snap;
    return { ...state, connected: true, snapshot: steady, receivedAt: now, notices, lastReply, cellSinceMetrics, ...chartAfter(state, snap.pool) };
  }
  if (msg.type === 'queued') {
    const q = data as IQueuedMsg;
    return {
      ...state,
      pending: state.pending.map(p => (p.id === q.id ? { ...p, waits: true, queued: true } : p))
    };
  }
  if (msg.type === 'metrics') {
    const m = parseMetrics(data);
    if (!m || !takesOver(state.metrics, m, state.cellSinceMetrics)) {
      return state;
    }
    return { ...state, metrics: m, cellSinceMetrics: false, metricsPids: pidsOf(state.snapshot ? state.snapshot.pool : null) };
  }
  if (msg.type === 'reply') {
    const reply = data as IReplyMsg;
    return {
      ...state,
      pending: state.pending.filter(p => p.id !== reply.id),
      lastReply: reply
    };
  }
  return state;
}

export function withKernelStatus(state: IUIState, status: KernelStatus): IUIState {
  if (status === state.kernelStatus) {
    return state;
  }
  const gone = status === 'restarting' || status === 'autorestarting' || status === 'dead' || status === 'none' || status === 'terminating';
  if (gone) {
    // A restarted or dead kernel has no pool and no comm; pending requests will never be answered.
    return { ...initialState(), kernelStatus: status };
  }
  return { ...state, kernelStatus: status };
}

export function withRequest(state: IUIState, pending: IPending): IUIState {
  return { ...state, pending: [...state.pending, pending] };
}

/** The comm closed or the kernel changed: what the kernel told us is gone with it (the chart too: %ddp metrics is). */
export function disconnected(state: IUIState): IUIState {
  return { ...state, connected: false, snapshot: null, pending: [], metrics: null, metricsPids: [] };
}

