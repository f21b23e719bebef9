/**
 * What the kernel tells us about its pool, and what the UI shows for it.
 *
 * Pure functions and plain data only (no JupyterLab imports), so the logic that
 * turns kernel messages into status text, rank rows and command availability is
 * unit-tested with node's own test runner (src/__tests__/model.test.ts).
 *
 * The kernel side is ddp_magic/ui/labcomm.py; its messages on the "ddp_magic" comm:
 *   {type: "snapshot", seq, version, pool: PoolSnapshot | null, notice?, final}
 *   {type: "reply", id, op, ok, message, error?, report?}
 */

/** The comm target the IPython extension registers (ddp_magic/ui/labcomm.py TARGET). */
export const COMM_TARGET = 'ddp_magic';
/** Message format version; the kernel's PROTOCOL must be the same. */
export const PROTOCOL = 1;

export interface ICheck {
  name: string;
  ok: boolean;
  level: string; // error | warning | info
  mark: string; // ✓ ✗ !
  detail: string;
}

/** The states a rank goes through, in order: the same names as ddp_magic/states.py RankState (a test checks). */
export const RANK_STATES = [
  'starting',
  'connecting',
  'ready',
  'running',
  'done',
  'failed',
  'interrupted',
  'dead',
  'stopped'
] as const;
export type RankState = (typeof RANK_STATES)[number];

/** Why a rank counts as failed: the same names as ddp_magic/states.py FailureKind (a test checks). */
export const FAILURE_KINDS = ['error', 'interrupted', 'died', 'killed', 'init', 'timeout'] as const;
export type FailureKind = (typeof FAILURE_KINDS)[number];

export interface IRankSnapshot {
  rank: number;
  state: RankState;
  pid: number | null;
  device: string;
  host: string;
  exit_code: number | null;
  elapsed: number; // seconds, at the time the snapshot was sent
  memory: number | null; // bytes
  last_line: string;
}

export interface IPoolSnapshot {
  nproc: number;
  world_size: number;
  backend: string;
  started: boolean;
  broken: string | null;
  generation: number;
  master_addr: string;
  master_port: number;
  start_method: string;
  start_seconds: number | null;
  ranks: IRankSnapshot[];
  checks: ICheck[];
  verdict: string;
  names: string[]; // names the workers own
}

export interface ISnapshotMsg {
  type: 'snapshot';
  session: string; // one per loaded extension in the kernel; seq counts within it
  seq: number;
  version: string;
  protocol: number;
  pool: IPoolSnapshot | null;
  notices: string[];
  final: boolean;
}

export interface IEnvReport {
  title?: string;
  ok?: boolean;
  verdict?: string;
  ranks?: Array<Record<string, string | null>>;
  checks?: ICheck[];
  [key: string]: unknown;
}

export interface IReplyMsg {
  type: 'reply';
  id: string;
  op: Op;
  ok: boolean;
  message: string;
  error?: string;
  report?: IEnvReport;
}

/** The kernel took a request that must wait for the running cell (it runs on the main thread when the cell ends). */
export interface IQueuedMsg {
  type: 'queued';
  id: string;
  op: Op;
  reason: string;
}

export type Op = 'restart' | 'stop' | 'env' | 'status';

/** Kernel statuses as JupyterLab names them (Kernel.Status), plus our own "none". */
export type KernelStatus =
  | 'unknown'
  | 'starting'
  | 'idle'
  | 'busy'
  | 'terminating'
  | 'restarting'
  | 'autorestarting'
  | 'dead'
  | 'none';

export interface IPending {
  id: string;
  op: Op;
  sentAt: number; // ms
  /** The kernel was busy when the request was sent: it is handled when the running cell ends. */
  waits: boolean;
  /** The kernel confirmed that it holds the request until the running cell ends. */
  queued?: boolean;
}

/** Everything the UI needs for one notebook's kernel. */
export interface IUIState {
  connected: boolean;
  kernelStatus: KernelStatus;
  snapshot: ISnapshotMsg | null;
  receivedAt: number; // ms, when the snapshot arrived (elapsed times advance from there)
  pending: IPending[];
  lastReply: IReplyMsg | null;
  notices: string[];
}

export function initialState(): IUIState {
  return {
    connected: false,
    kernelStatus: 'none',
    snapshot: null,
    receivedAt: 0,
    pending: [],
    lastReply: null,
    notices: []
  };
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
    const notices = snap.notices && snap.notices.length ? snap.notices.slice(-5) : state.notices;
    return { ...state, connected: true, snapshot: snap, receivedAt: now, notices };
  }
  if (msg.type === 'queued') {
    const q = data as IQueuedMsg;
    return {
      ...state,
      pending: state.pending.map(p => (p.id === q.id ? { ...p, waits: true, queued: true } : p))
    };
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

export function disconnected(state: IUIState): IUIState {
  return { ...state, connected: false, snapshot: null, pending: [] };
}

// ------------------------------------------------------------------ formatting

/** 12 -> "0:12", 75 -> "1:15", 3725 -> "1:02:05". */
export function formatClock(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds));
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const sec = s % 60;
  const pad = (n: number) => (n < 10 ? `0${n}` : `${n}`);
  return h > 0 ? `${h}:${pad(m)}:${pad(sec)}` : `${m}:${pad(sec)}`;
}

export function formatBytes(n: number | null | undefined): string {
  if (n === null || n === undefined) {
    return '';
  }
  const units: Array<[string, number]> = [
    ['GiB', 2 ** 30],
    ['MiB', 2 ** 20],
    ['KiB', 2 ** 10]
  ];
  for (const [unit, size] of units) {
    if (n >= size) {
      return `${(n / size).toFixed(1)} ${unit}`;
    }
  }
  return `${n} B`;
}

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

/** The word shown for a rank's state: "dead" becomes "killed (SIGKILL)" or "died (exit 3)". */
export function rankStateLabel(r: IRankSnapshot): string {
  if (r.state !== 'dead') {
    return r.state;
  }
  if (r.exit_code === null || r.exit_code === undefined) {
    return 'died';
  }
  if (r.exit_code < 0) {
    return `killed (${SIGNALS[-r.exit_code] || `signal ${-r.exit_code}`})`;
  }
  return `died (exit ${r.exit_code})`;
}

const ACTIVE: readonly RankState[] = ['starting', 'connecting', 'running'];
const BAD: readonly RankState[] = ['failed', 'dead'];

export function isActive(r: IRankSnapshot): boolean {
  return ACTIVE.indexOf(r.state) >= 0;
}

/** Seconds a rank has been in its state, advanced by the time since the snapshot arrived while it is active. */
export function rankElapsed(r: IRankSnapshot, receivedAt: number, now: number): number {
  return r.elapsed + (isActive(r) ? Math.max(0, now - receivedAt) / 1000 : 0);
}

export type Phase = 'starting' | 'running' | 'failed' | 'interrupted' | 'broken' | 'ready' | 'stopped';

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
  const bad = ranks.filter(r => BAD.indexOf(r.state) >= 0).map(r => r.rank);
  const active = ranks.filter(isActive);
  const elapsed = active.length ? Math.max(...active.map(r => rankElapsed(r, receivedAt, now))) : null;
  if (active.some(r => r.state === 'running')) {
    return { phase: 'running', bad, elapsed };
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
  if (ranks.some(r => r.state === 'interrupted')) {
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

function rankList(ranks: number[]): string {
  return ranks.length === 1 ? `rank ${ranks[0]}` : `ranks ${ranks.join(',')}`;
}

/**
 * The status-bar text: null (show nothing) when the kernel has no pool, else
 * "DDP 4×gloo · running 0:12", "DDP 2×gloo · rank 1 failed", "DDP 2×gloo · ready".
 */
export function statusText(state: IUIState, now: number): string | null {
  const pool = state.connected && state.snapshot ? state.snapshot.pool : null;
  if (!pool) {
    return null;
  }
  const head = `DDP ${pool.world_size}×${pool.backend}`;
  const p = poolPhase(pool, state.receivedAt, now);
  let tail: string;
  switch (p.phase) {
    case 'running':
      tail = `running ${formatClock(p.elapsed || 0)}`;
      if (p.bad.length) {
        tail += ` · ${rankList(p.bad)} failed`;
      }
      break;
    case 'starting':
      tail = p.elapsed === null ? 'starting' : `starting ${formatClock(p.elapsed)}`;
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
  const waiting = state.pending.filter(q => q.op !== 'status');
  if (waiting.length) {
    tail += ` · ${waiting[0].op} ${waiting[0].waits ? 'waits for the cell' : 'pending'}`;
  }
  return `${head} · ${tail}`;
}

/** A longer explanation for the status bar's tooltip. */
export function statusTooltip(state: IUIState, now: number): string {
  const pool = state.snapshot ? state.snapshot.pool : null;
  if (!pool) {
    return '';
  }
  const p = poolPhase(pool, state.receivedAt, now);
  const lines = [
    `ddp_magic pool: ${pool.nproc} rank(s), backend ${pool.backend}, MASTER_PORT ${pool.master_port}`,
    `state: ${p.phase}${pool.broken ? ` (${pool.broken})` : ''}`,
    `env: ${pool.verdict || 'not checked'}`,
    'Click to open the DDP panel.'
  ];
  return lines.join('\n');
}

export interface IRankRow {
  rank: number;
  pid: string;
  device: string;
  state: string;
  stateClass: string; // css modifier: active | ok | bad | idle
  elapsed: string;
  memory: string;
  lastLine: string;
}

export function stateClass(r: IRankSnapshot): string {
  if (BAD.indexOf(r.state) >= 0) {
    return 'bad';
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
  return [...(pool.ranks || [])]
    .sort((a, b) => a.rank - b.rank)
    .map(r => ({
      rank: r.rank,
      pid: r.pid === null || r.pid === undefined ? '' : String(r.pid),
      device: r.device || '',
      state: rankStateLabel(r),
      stateClass: stateClass(r),
      elapsed: formatClock(rankElapsed(r, state.receivedAt, now)),
      memory: formatBytes(r.memory),
      lastLine: cleanLine(r.last_line || '')
    }));
}

// eslint-disable-next-line no-control-regex
const ANSI = /\x1b\[[0-9;?]*[A-Za-z]/g;

export function cleanLine(text: string, limit = 160): string {
  const t = text.replace(ANSI, '').replace(/\t/g, ' ').trim();
  return t.length <= limit ? t : t.slice(0, limit - 1) + '…';
}

export interface IEnvSummary {
  verdict: string;
  problems: ICheck[]; // failed checks first, then warnings
  passed: number;
  total: number;
}

/** "✓ all 19 checks passed", "✗ 1 failed · ! 2 warnings (of 19)". */
export function envHeadline(sum: IEnvSummary): string {
  const failed = sum.problems.filter(c => c.level === 'error').length;
  const warned = sum.problems.length - failed;
  if (!sum.problems.length) {
    return `✓ all ${sum.total} checks passed`;
  }
  const parts: string[] = [];
  if (failed) {
    parts.push(`✗ ${failed} failed`);
  }
  if (warned) {
    parts.push(`! ${warned} warning${warned > 1 ? 's' : ''}`);
  }
  return `${parts.join(' · ')} (of ${sum.total})`;
}

export function envSummary(pool: IPoolSnapshot | null): IEnvSummary | null {
  if (!pool || !pool.checks) {
    return null;
  }
  const failed = pool.checks.filter(c => !c.ok && c.level === 'error');
  const warned = pool.checks.filter(c => !c.ok && c.level !== 'error');
  const passed = pool.checks.filter(c => c.ok).length;
  return { verdict: pool.verdict || '', problems: [...failed, ...warned], passed, total: pool.checks.length };
}

// ------------------------------------------------------------------ commands

export type Availability = 'now' | 'waits' | 'refused';

export interface ICommandPolicy {
  mode: Availability;
  /** Why: shown as the command's caption, in the panel and in notifications. */
  reason: string;
}

export const OP_LABEL: Record<Op, string> = {
  restart: 'Restart the DDP pool',
  stop: 'Stop the DDP pool',
  env: 'Show %ddp_env',
  status: 'Refresh the DDP pool status'
};

/**
 * Whether a command can run now, waits for the running cell, or is refused, and why.
 *
 * The kernel handles comm messages on its shell channel, between cells: while a
 * cell runs, a request sent now is handled when that cell (and any cells queued
 * before the request) ends. Restart/stop never stop a running cell; interrupting
 * the kernel does that.
 */
export function commandPolicy(op: Op, state: IUIState): ICommandPolicy {
  const ks = state.kernelStatus;
  if (ks === 'none') {
    return { mode: 'refused', reason: 'no kernel: this notebook has no running kernel' };
  }
  if (ks === 'dead' || ks === 'terminating') {
    return { mode: 'refused', reason: `the kernel is ${ks === 'dead' ? 'dead' : 'shutting down'}` };
  }
  if (ks === 'restarting' || ks === 'autorestarting' || ks === 'starting') {
    return { mode: 'refused', reason: `the kernel is ${ks === 'starting' ? 'starting' : 'restarting'}; try again when it is idle` };
  }
  if (!state.connected) {
    return {
      mode: 'refused',
      reason: 'ddp_magic is not loaded in this kernel: run %load_ext ddp_magic (and %%ddp -n N) first'
    };
  }
  const pool = state.snapshot ? state.snapshot.pool : null;
  if ((op === 'restart' || op === 'stop') && !pool) {
    return { mode: 'refused', reason: `no pool to ${op}: start one with %%ddp -n N` };
  }
  if (op === 'env' && !pool) {
    return { mode: 'refused', reason: 'no pool is running: %ddp_env -n N in a cell shows a planned env' };
  }
  if (state.pending.some(p => p.op === op)) {
    return { mode: 'refused', reason: `a ${op} request is already pending` };
  }
  if (ks === 'busy') {
    const what =
      op === 'restart'
        ? 'The restart waits for the running cell to end (the kernel handles requests between cells); it does not stop the cell — interrupt the kernel for that.'
        : op === 'stop'
          ? 'Stopping waits for the running cell to end (the kernel handles requests between cells); it does not stop the cell — interrupt the kernel for that.'
          : 'The report waits for the running cell to end (the kernel handles requests between cells).';
    return { mode: 'waits', reason: `A cell is running. ${what}` };
  }
  return { mode: 'now', reason: '' };
}

/** One line for a reply: what happened, or why it did not. */
export function replyText(reply: IReplyMsg): string {
  if (!reply.ok) {
    return `${reply.op} failed: ${reply.error || reply.message || 'unknown error'}`;
  }
  return reply.message || `${reply.op}: done`;
}

/** Columns of an env report's rank table: every key any rank has, DIST vars first in the kernel's order. */
export function reportColumns(report: IEnvReport): string[] {
  const cols: string[] = [];
  for (const row of report.ranks || []) {
    for (const k of Object.keys(row)) {
      if (cols.indexOf(k) < 0) {
        cols.push(k);
      }
    }
  }
  return cols;
}
