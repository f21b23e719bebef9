/**
 * What the kernel tells us about its pool: the messages' types (and the plain data the UI keeps of them, IUIState).
 * No functions and no imports: every module imports these types from here and what else it uses from the module that
 * defines it (format, ranks, state, commands, metrics, groups), so the imports form no circle
 * (tests/labextension/test_import_cycles.py checks it).
 *
 * The kernel side is ddp_magic/ui/labcomm.py; its messages on the "ddp_magic" comm:
 *   {type: "snapshot", seq, version, pool: PoolSnapshot | null, notice?, final}
 *   {type: "reply", id, op, ok, message, error?, report?}
 *   {type: "metrics", session, final, cell, names, ranks, rows, series, summary}  (ddp_magic.log's chart data)
 *   {type: "cell_output", msg_id, seq, msg_type, content}  (a followed background cell's output: ui/transcripts.py)
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
  kept_id?: string | null; // the kept pool's id (%ddp keep), null when not kept
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
  /** The pool has not started: no rank exists, MASTER and the env are the plan's (a queued Slurm job's port is not chosen). */
  planned?: boolean;
}

/** A cell holding the pool's turn, as ddp_magic/kernel/jobs/turns.py Ticket says it. */
export interface IJobSnapshot {
  name: string; // "cell [12]"
  background: boolean; // %%ddp --bg: it runs while the notebook runs other cells
  /** queued (waits for the turn), starting (holds it; the pool starts, the cell has not reached the ranks), running. */
  phase?: 'queued' | 'starting' | 'running';
  elapsed: number | null; // seconds on the ranks when the snapshot was sent (the cell's run clock, job.elapsed); null before
  step: number | null; // the last step its ranks logged with ddp_magic.log
  text: string; // the kernel's own words, at the time of the snapshot
}

/** What the kernel keeps of the last %%ddp cell once its ranks are ready again: its prompt number, and who failed. */
export interface ILastCell {
  number: number | null; // the prompt number: In[n]
  ok: boolean;
  headline: string; // its root cause, as the cell's error says it
  recovered: boolean; // it failed, and the pool is whole again (every rank ready, the workers' variables kept)
  cancelled?: boolean; // a background job's job.cancel() ended it: headline says "cancelled by job.cancel(): …"
  root: number[]; // the ranks to blame
  causes: Record<string, { kind: FailureKind; cause: Cause }>;
  text: string; // what %ddp status prints
}

/** (step, value); a value the kernel could not put in JSON (NaN, ±inf) is null. */
export type MetricPoint = [number, number | null];

/** One metric over the ranks (ddp_magic/kernel/results/metrics.py MetricSummary). */
export interface IMetricSummary {
  name: string;
  last: number | null; // mean over the ranks of each rank's last value
  last_lo: number | null;
  last_hi: number | null;
  min: number | null;
  mean: number | null;
  slowest: number | null; // the rank that reached the latest common step last (null: none stands out)
  lag: number | null; // how much later than the first rank, seconds
  /** What named the slowest rank (kernel/results/metrics.py StragglerMeasure): the logged steps, or --profile's collectives. */
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

export interface ISnapshotMsg {
  type: 'snapshot';
  session: string; // one per loaded extension in the kernel; seq counts within it
  seq: number;
  version: string;
  protocol: number;
  pool: IPoolSnapshot | null;
  notices: string[];
  final: boolean;
  /** The background cells whose outputs the kernel keeps (ddp_magic/ui/transcripts.py): a page that did not run one follows it. */
  cells?: ICellBrief[];
  /** How the last pool ended, while no pool runs since: a preemption (ddp_magic/ui/preempt.py ``ended``). */
  ended?: IPoolEnd | null;
}

/** The last pool's end by preemption (--save-on-preempt): the line its cell said, and the step it saved. */
export interface IPoolEnd {
  why: 'preempted';
  text: string; // "preempted: saved step 4210 to ckpt/step-… (3.1 s); %ddp load ckpt/ on the next allocation"
  step: number | null; // null: nothing was saved (or a snapshot with no step)
  folder: string;
  seconds: number;
  saved: boolean;
}

/** A background cell the kernel keeps the outputs of (ddp_magic/ui/transcripts.py Transcript.brief). */
export interface ICellBrief {
  msg_id: string; // its execute request's: the parent of all its outputs
  cell_id: string; // the notebook's id of the cell (the request's metadata.cellId)
  client: string; // the page that ran it (its kernel connection's clientId): that page routes the cell's outputs itself
  name: string; // "cell [12]"
  ended: boolean;
}

/** One output message of a background cell, as its output area receives it (iopub's msg_type and content). */
export interface IOutputMsg {
  msg_type: string;
  content: Record<string, any>;
}

/** A followed cell's next output message (seq: one more than the last the page has). */
export interface ICellOutputMsg extends IOutputMsg {
  type: 'cell_output';
  msg_id: string;
  seq: number;
  metadata?: unknown; // a stream of kept lines: its message's {ddp_magic: {pool, upto}} (held.ts)
}

/** The reply to {op: "follow"}: what the cell shows now, and the seq its next message will follow. */
export interface IFollowReply {
  type: 'reply';
  id: string;
  op: 'follow';
  ok: boolean;
  error?: string;
  msg_id: string;
  cell_id: string;
  seq: number;
  ended: boolean;
  outputs: IOutputMsg[];
  shown?: unknown; // the kept pools' marks of the lines these outputs hold: [{type: "shown", pool, upto}] (held.ts)
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
  /** The kernel refused it (a UsageError: a background job holds the pool), rather than trying and failing. */
  refused?: boolean;
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

export type Op = 'restart' | 'stop' | 'env' | 'status' | 'stacks';

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
