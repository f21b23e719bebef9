/**
 * The env checks in one line, and whether each command runs now, waits for the running cell, or is refused.
 */

import type { ICheck, IEnvReport, IPoolSnapshot, IReplyMsg, IUIState, Op } from './model';
import { plural } from './format';

export interface IEnvSummary {
  verdict: string;
  problems: ICheck[]; // failed checks first, then warnings
  passed: number;
  total: number;
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
  status: 'Refresh the DDP pool status',
  stacks: 'Show every rank\'s stack now'
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
  const job = pool && pool.job && pool.job.background && pool.job.phase !== 'queued' ? pool.job : null;
  if (job && op !== 'status') {
    // the kernel would refuse it (kernel/jobs/turns.py check_idle): say so before asking anything, in a toast's 140 characters
    return { mode: 'refused', reason: `${job.name} holds the pool (background job): job.cancel() or %ddp wait first` };
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
    return `${reply.op} ${reply.refused ? 'refused' : 'failed'}: ${reply.error || reply.message || 'unknown error'}`;
  }
  return reply.message || `${reply.op}: done`;
}

/** JupyterLab cuts a toast's message at 140 characters. */
export const TOAST_CHARS = 140;

/**
 * A reply as a toast: replyText whole when it fits, else its first clause and where the rest is (the panel's message
 * line shows replyText whole), never a message cut off in the middle.
 */
export function toastText(reply: IReplyMsg): string {
  const text = replyText(reply);
  if (text.length <= TOAST_CHARS) {
    return text;
  }
  const more = ' … (the DDP panel shows it whole)';
  const room = TOAST_CHARS - more.length;
  const cut = Math.max(text.lastIndexOf(';', room), text.lastIndexOf(':', room), text.lastIndexOf('(', room) - 1);
  return `${text.slice(0, cut > 20 ? cut : room).trimEnd()}${more}`;
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

