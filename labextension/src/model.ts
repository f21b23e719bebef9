/**
 * What the kernel tells us about its pool (the messages' types, here), and what the UI shows for it (the modules
 * re-exported at the end, one per concern: format, ranks, state, commands, metrics; `import * as M from './model'`
 * gives all of it).
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

import type { IMetricsMsg } from './metrics';

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

export * from './format';
export * from './ranks';
export * from './state';
export * from './commands';
export * from './metrics';
export * from './groups';
