/**
 * The UI's state for one notebook's kernel, and how each kernel message (and kernel status) changes it.
 *
 * Pure functions (no JupyterLab imports): unit-tested in node (src/__tests__/model.test.ts).
 */

import type { IPending, IPoolSnapshot, IQueuedMsg, IReplyMsg, ISnapshotMsg, IUIState, KernelStatus } from './model';
import { parseMetrics, takesOver } from './metrics';
import { isActive } from './ranks';

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
    return { ...state, connected: true, snapshot: snap, receivedAt: now, notices, lastReply, cellSinceMetrics, ...chartAfter(state, snap.pool) };
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

