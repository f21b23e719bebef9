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
 *   {type: "metrics", session, final, cell, names, ranks, rows, series, summary}  (ddp_magic.log's chart data)
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
  'queued',
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
  node?: string; // a Slurm pool's node of the rank (n2)
  /** After a failed %%ddp cell (ddp_magic/ui/labsnap.py): the failure's kind, and whether it is the root cause. */
  kind?: FailureKind;
  cause?: Cause;
}

/** "root": the failure that explains the cell's others; "stopped": ddp_magic interrupted or stopped the rank because of it. */
export type Cause = 'root' | 'stopped';

export interface IPoolSnapshot {
  nproc: number;
  world_size: number;
  backend: string;
  started: boolean;
  broken: string | null;
  generation: number;
  master_addr: string;
  master_port: number;
  start_method: string; // the method used: "fork" for "auto" on Linux
  start_method_asked?: string; // what the spec said ("auto")
  start_seconds: number | null;
  ranks: IRankSnapshot[];
  checks: ICheck[];
  verdict: string;
  names: string[]; // names the workers own
  /** The last %%ddp cell's outcome on this pool (ddp_magic/kernel/ranks.py LastCell.to_dict); null while a cell runs and before the first. */
  last_cell?: ILastCell | null;
  /** The cell that holds the pool's turn now (ddp_magic/ui/labsnap.py job_dict): a background job while one runs. */
  job?: IJobSnapshot | null;
  /** The cells waiting for their turn behind it, first first. */
  queued?: string[];
}

/** A cell holding the pool's turn, as ddp_magic/kernel/turns.py Ticket says it. */
export interface IJobSnapshot {
  name: string; // "cell [12]"
  background: boolean; // %%ddp --bg: it runs while the notebook runs other cells
  elapsed: number | null; // seconds it had run when the snapshot was sent (null: still queued)
  step: number | null; // the last step its ranks logged with ddp_magic.log
  text: string; // the kernel's own words, at the time of the snapshot
}

/** What the kernel keeps of the last %%ddp cell once its ranks are ready again: its prompt number, and who failed. */
export interface ILastCell {
  number: number | null; // the prompt number: In[n]
  ok: boolean;
  headline: string; // its root cause, as the cell's error says it
  recovered: boolean; // it failed, and the pool is whole again (every rank ready, the workers' variables kept)
  root: number[]; // the ranks to blame
  causes: Record<string, { kind: FailureKind; cause: Cause }>;
  text: string; // what %ddp status prints
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
  /** The chart data of the last cell that logged anything with ddp_magic.log (what %ddp metrics gives). */
  metrics: IMetricsMsg | null;
  /** A snapshot showed a cell running since that chart came: live data after its final picture is a new cell's. */
  cellSinceMetrics: boolean;
  /** The pids of the pool the chart was logged on: a snapshot of a pool without any of them (restarted) clears it. */
  metricsPids: number[];
}

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

// ------------------------------------------------------------------ formatting

/**
 * Seconds as the cell's status view writes them (ddp_magic/ui/status_render.py fmt_seconds;
 * tests/labextension/test_model_mirror.py checks the two agree): "<1 ms", "35 ms", "10.09 s", "1 m 05 s", "1 h 02 m".
 */
export function fmtSeconds(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined) {
    return '';
  }
  if (seconds < 0.001) {
    return '<1 ms';
  }
  if (seconds < 1) {
    return `${pyRound(seconds * 1000)} ms`; // Python's f"{x:.0f}": half to even
  }
  if (seconds < 60) {
    return `${pyFixed2(seconds)} s`;
  }
  const total = pyRound(seconds);
  const pad = (n: number) => (n < 10 ? `0${n}` : `${n}`);
  const m = Math.floor(total / 60);
  const sec = total % 60;
  if (m < 60) {
    return `${m} m ${pad(sec)} s`;
  }
  return `${Math.floor(m / 60)} h ${pad(m % 60)} m`;
}

/** A run time as a clock, "0:00:07", "1:02:11": ddp_magic/kernel/turns.py clock_text (tests/labextension/test_model_mirror.py checks). */
export function clockText(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds));
  const pad = (n: number) => (n < 10 ? `0${n}` : `${n}`);
  return `${Math.floor(s / 3600)}:${pad(Math.floor(s / 60) % 60)}:${pad(s % 60)}`;
}

/** 4120 -> "4,120" (Python's f"{n:,}"). */
function grouped(n: number): string {
  return String(Math.trunc(n)).replace(/\B(?=(\d{3})+(?!\d))/g, ',');
}

/**
 * "background: cell [12] running 1:02:11, step 4,120": turns.py Ticket.text, its clock moved on from the
 * snapshot to ``now`` (ms), so the status bar ticks between snapshots as the cell's own view does.
 */
export function jobText(job: IJobSnapshot, receivedAt: number, now: number): string {
  const head = `${job.background ? 'background: ' : ''}${job.name}`;
  if (job.elapsed === null || job.elapsed === undefined) {
    return `${head} queued`;
  }
  const clock = clockText(job.elapsed + Math.max(0, now - receivedAt) / 1000);
  const step = job.step === null || job.step === undefined ? '' : `, step ${grouped(job.step)}`;
  return `${head} running ${clock}${step}`;
}

/** Python's round() of a float to an int: halves to even. */
function pyRound(x: number): number {
  const f = Math.floor(x);
  const d = x - f;
  return d > 0.5 || (d === 0.5 && f % 2 === 1) ? f + 1 : f;
}

/**
 * Python's f"{x:.2f}". toFixed rounds the exact binary value too, and differs only on exact ties
 * (x a multiple of 1/8, e.g. 0.125), where Python rounds half to even and toFixed up.
 */
function pyFixed2(x: number): string {
  if (Number.isInteger(x * 8) && !Number.isInteger(x * 100)) {
    const scaled = x * 100; // exact for multiples of 1/8
    if (scaled - Math.floor(scaled) === 0.5) {
      return (pyRound(scaled) / 100).toFixed(2);
    }
  }
  return x.toFixed(2);
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

/** "3", "0-3", "0, 2-3": as ddp_magic/plan/words.py rank_list (a test compares them). */
export function rankRuns(ranks: number[]): string {
  const runs: number[][] = [];
  for (const r of [...new Set(ranks)].sort((a, b) => a - b)) {
    const last = runs[runs.length - 1];
    if (last && r === last[last.length - 1] + 1) {
      last.push(r);
    } else {
      runs.push([r]);
    }
  }
  return runs.map(run => (run.length > 1 ? `${run[0]}-${run[run.length - 1]}` : `${run[0]}`)).join(', ');
}

/** "rank 1", "ranks 0, 2-3": as ddp_magic/plan/words.py ranks_phrase. */
export function ranksPhrase(ranks: number[]): string {
  const unique = [...new Set(ranks)];
  return unique.length === 1 ? `rank ${unique[0]}` : `ranks ${rankRuns(unique)}`;
}

const rankList = ranksPhrase;

/** The prompt a cell ran under, as its tracebacks and %ddp status name it: "In[5]" (or "a cell" without one). */
export function cellName(number: number | string | null | undefined): string {
  const n = typeof number === 'string' ? (number.trim() === '' ? NaN : Number(number)) : number ?? NaN;
  return Number.isInteger(n) ? `In[${n}]` : typeof number === 'string' && number ? `cell ${number}` : 'a cell';
}

/**
 * What the last %%ddp cell left to say once its pool is ready again: "In[5]: rank 1 failed" (null when it went
 * well, or while ranks still show the failure themselves). The rank named is the kernel's root cause.
 */
export function lastCellNote(pool: IPoolSnapshot): string | null {
  const last = pool.last_cell;
  if (!last || last.ok) {
    return null;
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
    return null;
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

/** "1 check", "2 checks": as ddp_magic/plan/words.py plural. */
export function plural(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? '' : 's'}`;
}

/**
 * The checks in one line, in the kernel's words (plan/check.py checks_verdict; the cell's view and %ddp_env say the
 * same): "✓ 19 checks passed", "✗ 2 of 19 checks failed", "! 1 warning, 18 checks passed". The kernel's own line
 * when it sent one; counted here the same way when not.
 */
export function envHeadline(sum: IEnvSummary): string {
  if (sum.verdict) {
    return sum.verdict;
  }
  const failed = sum.problems.filter(c => c.level === 'error').length;
  const warned = sum.problems.length - failed;
  if (failed) {
    return `✗ ${failed} of ${plural(sum.total, 'check')} failed`;
  }
  if (warned) {
    return `! ${plural(warned, 'warning')}, ${plural(sum.passed, 'check')} passed`;
  }
  return `✓ ${plural(sum.passed, 'check')} passed`;
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

// ------------------------------------------------------------------ metrics: ddp_magic.log's chart

/** (step, value); a value the kernel could not put in JSON (NaN, ±inf) is null. */
export type MetricPoint = [number, number | null];

/** One metric over the ranks (ddp_magic/kernel/metrics.py MetricSummary). */
export interface IMetricSummary {
  name: string;
  last: number | null; // mean over the ranks of each rank's last value
  last_lo: number | null;
  last_hi: number | null;
  min: number | null;
  mean: number | null;
  slowest: number | null; // the rank that reached the latest common step last (null: none stands out)
  lag: number | null; // how much later than the first rank, seconds
  /** What named the slowest rank (kernel/metrics.py StragglerMeasure): the logged steps, or --profile's collectives. */
  slowest_by?: 'steps' | 'profile';
  steps: [number, number];
}

/** ui/labcomm.py metrics(): the kernel's CellMetrics.payload, at most once a second while a cell logs, once more with final. */
export interface IMetricsMsg {
  type: 'metrics';
  session: string;
  final: boolean;
  cell: string;
  names: string[];
  ranks: number[];
  rows: number;
  series: Record<string, Record<string, MetricPoint[]>>; // metric -> rank (a string, JSON's keys) -> points
  summary: IMetricSummary[];
}

const num = (x: unknown): number | null => (typeof x === 'number' && isFinite(x) ? x : null);

/** A metrics message, checked and cleaned (points that are not [number, number|null] dropped); null if it is not one. */
export function parseMetrics(data: unknown): IMetricsMsg | null {
  const d = data as Record<string, unknown> | null;
  if (!d || d.type !== 'metrics' || !Array.isArray(d.names) || !d.names.every(n => typeof n === 'string')) {
    return null;
  }
  const names = d.names as string[];
  const rawSeries = d.series && typeof d.series === 'object' ? (d.series as Record<string, unknown>) : {};
  const series: IMetricsMsg['series'] = {};
  for (const name of names) {
    const lines = rawSeries[name] && typeof rawSeries[name] === 'object' ? (rawSeries[name] as Record<string, unknown>) : {};
    series[name] = {};
    for (const [rank, pts] of Object.entries(lines)) {
      if (Array.isArray(pts)) {
        series[name][rank] = pts
          .filter(p => Array.isArray(p) && num(p[0]) !== null)
          .map(p => [p[0] as number, num(p[1])] as MetricPoint);
      }
    }
  }
  const summary: IMetricSummary[] = (Array.isArray(d.summary) ? d.summary : [])
    .filter(s => s && typeof s === 'object' && typeof (s as IMetricSummary).name === 'string')
    .map(s => {
      const r = s as Record<string, unknown>;
      const steps = Array.isArray(r.steps) ? r.steps : [];
      return {
        name: r.name as string,
        last: num(r.last),
        last_lo: num(r.last_lo),
        last_hi: num(r.last_hi),
        min: num(r.min),
        mean: num(r.mean),
        slowest: num(r.slowest),
        lag: num(r.lag),
        ...(r.slowest_by === 'steps' || r.slowest_by === 'profile' ? { slowest_by: r.slowest_by } : {}),
        steps: [num(steps[0]) ?? 0, num(steps[1]) ?? 0]
      } as IMetricSummary;
    });
  return {
    type: 'metrics',
    session: String(d.session ?? ''),
    final: d.final === true,
    cell: String(d.cell ?? ''),
    names,
    ranks: (Array.isArray(d.ranks) ? d.ranks : []).filter(r => num(r) !== null) as number[],
    rows: num(d.rows) ?? 0,
    series,
    summary
  };
}

/**
 * Whether a metrics message replaces the chart shown: the last cell that logged anything stays (as
 * %ddp metrics does), so a message with nothing logged never wipes it; a live message of a cell whose
 * final picture is shown (a redraw that overtook the end), or of an earlier cell, is late. Without a
 * cell label (the kernel may send "") live data after a final picture is a new cell's only once a
 * snapshot has shown a cell running since (`cellRan`).
 */
export function takesOver(prev: IMetricsMsg | null, next: IMetricsMsg, cellRan = false): boolean {
  if (!next.names.length) {
    return false;
  }
  if (!prev || prev.session !== next.session) {
    return true;
  }
  const [a, b] = [Number(prev.cell), Number(next.cell)];
  if (isFinite(a) && isFinite(b) && b < a) {
    return false;
  }
  if (prev.final && !next.final) {
    return prev.cell || next.cell ? prev.cell !== next.cell : cellRan;
  }
  return true;
}

/** ddp_magic/ui/metrics_chart.py PALETTE: a rank's line has the same colour in the panel as in the cell's chart (a test checks). */
export const RANK_PALETTE = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2', '#7f7f7f', '#bcbd22', '#17becf'];

/** A rank's colour, as metrics_chart.rank_color: a theme may set --ddp-magic-rank-N; else the palette. */
export function rankColour(rank: number): string {
  return `var(--ddp-magic-rank-${rank}, ${RANK_PALETTE[((rank % RANK_PALETTE.length) + RANK_PALETTE.length) % RANK_PALETTE.length]})`;
}

/** Python's f"{x:.{p}g}" (except on exact decimal ties, which Python rounds half to even). */
function pyG(x: number, p: number): string {
  if (x === 0) {
    return '0';
  }
  const [mant, expText] = x.toExponential(p - 1).split('e');
  const e = Number(expText);
  const strip = (t: string) => (t.indexOf('.') >= 0 ? t.replace(/0+$/, '').replace(/\.$/, '') : t);
  if (e < -4 || e >= p) {
    return `${strip(mant)}e${e < 0 ? '-' : '+'}${Math.abs(e) < 10 ? '0' : ''}${Math.abs(e)}`;
  }
  return strip(x.toFixed(Math.max(0, p - 1 - e)));
}

/** The units of fmtValue, largest first: a value of 10,000 and up is written in the largest one it reaches. */
const UNITS: Array<[number, string]> = [
  [1e12, 'T'],
  [1e9, 'G'],
  [1e6, 'M'],
  [1e3, 'k']
];

/**
 * Short numbers as the cell's chart writes them (metrics_chart.fmt): 4 significant digits below 10,000
 * ("5963", "0.0002628"), 3 significant digits and a unit from 10,000 up ("15.9k" is 15,900; "2.5M", "3.2G",
 * "1.5T"); a value that rounds up to the next unit takes it ("999,999" is "1M", never "1e+03k").
 */
export function fmtValue(x: number | null | undefined): string {
  if (x === null || x === undefined || !isFinite(x)) {
    return '-';
  }
  if (Math.abs(Number(x.toPrecision(4))) < 1e4) {
    return pyG(x, 4);
  }
  for (let i = UNITS.length - 1; i >= 0; i--) {
    const [div, suffix] = UNITS[i];
    const bigger = UNITS[i - 1];
    const m = Number((x / div).toPrecision(3));
    if (Math.abs(m) < 1000 || !bigger) {
      return Math.abs(m) < 1000 ? `${pyG(m, 3)}${suffix}` : pyG(x, 3);
    }
  }
  return pyG(x, 3);
}

/** The line over a chart: what was logged, by how many ranks, over which steps, and whether the cell still runs. */
export function metricsHeadline(m: IMetricsMsg): string {
  const steps = m.summary.reduce<number[]>((acc, s) => acc.concat(s.steps), []);
  const span = steps.length ? `, steps ${Math.min(...steps)}-${Math.max(...steps)}` : '';
  const ranks = `${m.ranks.length} rank${m.ranks.length === 1 ? '' : 's'}`;
  return `${m.cell ? `${cellName(m.cell)}: ` : ''}${m.names.join(', ')} from ${ranks}${span}${m.final ? '' : ' (live)'}`;
}

/**
 * The chart's box (pixels): the plot sits inside it, leaving room for the value labels at the left (as wide as the
 * widest label needs, `left` at least) and the steps below.
 */
export const CHART = { height: 96, left: 28, right: 6, top: 6, bottom: 16, gap: 4 };

/** A label's width in pixels when nothing can measure it: digits of the panel's small font are about 6.5 px. */
export function estimateWidth(text: string): number {
  return text.length * 6.5;
}

export interface IChartLine {
  rank: number;
  colour: string;
  points: string; // an SVG polyline's points
}

export interface IChart {
  name: string;
  width: number;
  height: number;
  plot: { x0: number; x1: number; y0: number; y1: number }; // the plot area, in pixels
  yTicks: Array<{ y: number; label: string }>; // the bottom, middle and top values, with a grid line each
  xTicks: Array<{ x: number; label: string; anchor: 'start' | 'end' }>; // the first and last step
  lines: IChartLine[]; // one per rank that logged the metric, in rank order
}

/** The data range of some lines (metrics_chart._bounds): a single step or a flat line is widened so it can be drawn. */
export function chartBounds(lines: Record<string, MetricPoint[]>): [number, number, number, number] {
  const pts = Object.values(lines).reduce<MetricPoint[]>((acc, p) => acc.concat(p.filter(q => q[1] !== null)), []);
  if (!pts.length) {
    return [0, 1, 0, 1];
  }
  let [x0, x1] = [Math.min(...pts.map(p => p[0])), Math.max(...pts.map(p => p[0]))];
  let [y0, y1] = [Math.min(...pts.map(p => p[1] as number)), Math.max(...pts.map(p => p[1] as number))];
  if (x1 === x0) {
    [x0, x1] = [x0 - 1, x1 + 1];
  }
  if (y1 === y0) {
    const pad = Math.abs(y0) * 0.05 || 1;
    [y0, y1] = [y0 - pad, y1 + pad];
  }
  return [x0, x1, y0, y1];
}

/**
 * One metric's chart, `width` pixels wide: a polyline per rank (points with no value skipped), step on x. `measure`
 * gives a label's width in pixels (the panel measures its font): the plot starts right of the widest value label.
 */
export function metricChart(m: IMetricsMsg, name: string, width: number, height = CHART.height, measure = estimateWidth): IChart {
  const lines = m.series[name] || {};
  const [x0, x1, y0, y1] = chartBounds(lines);
  const values = [0, 0.5, 1].map(f => y0 + f * (y1 - y0));
  const left = Math.max(CHART.left, Math.ceil(Math.max(...values.map(v => measure(fmtValue(v))))) + CHART.gap + 2);
  const plot = { x0: left, x1: width - CHART.right, y0: CHART.top, y1: height - CHART.bottom };
  const px = (x: number) => plot.x0 + ((x - x0) / (x1 - x0)) * (plot.x1 - plot.x0);
  const py = (y: number) => plot.y0 + ((y1 - y) / (y1 - y0)) * (plot.y1 - plot.y0);
  const out: IChartLine[] = [];
  for (const rank of Object.keys(lines).sort((a, b) => Number(a) - Number(b))) {
    const points = lines[rank]
      .filter(p => p[1] !== null)
      .map(([x, y]) => `${px(x).toFixed(1)},${py(y as number).toFixed(1)}`)
      .join(' ');
    if (points) {
      out.push({ rank: Number(rank), colour: rankColour(Number(rank)), points });
    }
  }
  return {
    name,
    width,
    height,
    plot,
    yTicks: values.map(v => ({ y: py(v), label: fmtValue(v) })),
    xTicks: [
      { x: px(x0), label: fmtValue(x0), anchor: 'start' },
      { x: px(x1), label: fmtValue(x1), anchor: 'end' }
    ],
    lines: out
  };
}

export interface IMetricRow {
  name: string;
  last: string;
  range: string; // the ranks' last values, lowest to highest, when they differ ('' when not)
  min: string;
  mean: string;
  slowest: string;
  /** The line under the row (the sidebar is narrow): the slowest rank, and the ranks' last values when they differ. */
  note: string;
}

/** The summary table's rows (metrics_chart.table_html): last (mean over ranks), min, mean, slowest rank. */
export function metricRows(m: IMetricsMsg): IMetricRow[] {
  return m.summary.map(s => {
    const range = s.last_lo !== s.last_hi ? `${fmtValue(s.last_lo)} to ${fmtValue(s.last_hi)}` : '';
    const by = s.slowest_by === 'profile' ? ', the others waited for it' : '';
    const slowest = s.slowest !== null ? `rank ${s.slowest} (+${fmtSeconds(s.lag ?? 0)}${by})` : 'none stands out';
    const note = `slowest${m.final ? '' : ' so far'}: ${slowest}${range ? ` · last per rank: ${range}` : ''}`;
    return { name: s.name, last: fmtValue(s.last), range, min: fmtValue(s.min), mean: fmtValue(s.mean), slowest, note };
  });
}
