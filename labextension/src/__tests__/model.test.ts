/**
 * Unit tests of model.ts: kernel messages in, what the UI shows out.
 * Run with `jlpm test` (tsc -p tsconfig.test.json, then node's built-in test runner).
 */
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';

import { type ICheck, type IJobSnapshot, type IPoolEnd, type ILastCell, type IMetricsMsg, type IPoolSnapshot, type IRankSnapshot, type IReplyMsg, type ISnapshotMsg, type IUIState, type KernelStatus, type Op, PROTOCOL } from '../model';
import { cellName, cleanLine, fmtSeconds, formatBytes, jobText, ranksPhrase } from '../format';
import { endedSummary, poolEnd, poolPhase, queueLine, rankRows, rankStateLabel, statusText, statusTooltip } from '../ranks';
import { applyMessage, disconnected, initialState, withKernelStatus, withRequest } from '../state';
import { commandPolicy, envHeadline, envSummary, replyText, reportColumns, TOAST_CHARS, toastText } from '../commands';
import { CHART, chartBounds, estimateWidth, fmtValue, metricChart, metricRows, metricsHeadline, parseMetrics, RANK_PALETTE, rankColour } from '../metrics';

function rank(r: number, over: Partial<IRankSnapshot> = {}): IRankSnapshot {
  return {
    rank: r,
    state: 'ready',
    pid: 1000 + r,
    device: 'cpu',
    host: 'host',
    exit_code: null,
    elapsed: 0.5,
    memory: null,
    last_line: '',
    ...over
  };
}

function pool(ranks: IRankSnapshot[], over: Partial<IPoolSnapshot> = {}): IPoolSnapshot {
  return {
    nproc: ranks.length,
    world_size: ranks.length,
    backend: 'gloo',
    started: true,
    broken: null,
    generation: 1,
    master_addr: '127.0.0.1',
    master_port: 29500,
    start_method: 'fork',
    start_seconds: 1.2,
    ranks,
    checks: [],
    verdict: 'env ✓',
    names: [],
    ...over
  };
}

function snapshot(p: IPoolSnapshot | null, seq = 1, session = 's1'): ISnapshotMsg {
  return { type: 'snapshot', session, seq, version: '0.1.0', protocol: PROTOCOL, pool: p, notices: [], final: false };
}

function connected(p: IPoolSnapshot | null, status: KernelStatus = 'idle', receivedAt = 1000): IUIState {
  const s = applyMessage({ ...initialState(), kernelStatus: status }, snapshot(p), receivedAt);
  return s;
}

describe('formatting', () => {
  it('formats seconds as the cell view does (status_render.fmt_seconds)', () => {
    assert.equal(fmtSeconds(0), '<1 ms');
    assert.equal(fmtSeconds(0.0355), '36 ms');
    assert.equal(fmtSeconds(10.094), '10.09 s');
    assert.equal(fmtSeconds(2.125), '2.12 s'); // half to even, as Python
    assert.equal(fmtSeconds(65), '1 m 05 s');
    assert.equal(fmtSeconds(3725), '1 h 02 m');
    assert.equal(fmtSeconds(null), '');
  });

  it('formats memory in binary units', () => {
    assert.equal(formatBytes(null), '');
    assert.equal(formatBytes(512), '512 B');
    assert.equal(formatBytes(1536), '1.5 KiB');
    assert.equal(formatBytes(3 * 2 ** 30), '3.0 GiB');
  });

  it('names how a rank died', () => {
    assert.equal(rankStateLabel(rank(0, { state: 'dead', exit_code: -9 })), 'killed (SIGKILL)');
    assert.equal(rankStateLabel(rank(0, { state: 'dead', exit_code: -11 })), 'killed (SIGSEGV)');
    assert.equal(rankStateLabel(rank(0, { state: 'dead', exit_code: -64 })), 'killed (signal 64)');
    assert.equal(rankStateLabel(rank(0, { state: 'dead', exit_code: 3 })), 'died (exit 3)');
    assert.equal(rankStateLabel(rank(0, { state: 'running' })), 'running');
  });

  it('cleans the last output line', () => {
    assert.equal(cleanLine('\x1b[31mred\x1b[0m\tline  '), 'red line');
    assert.equal(cleanLine('x'.repeat(200)).length, 160);
  });
});

describe('a preempted pool', () => {
  const text = 'preempted: saved step 4210 to ckpt/step-000004210-20261206T142651413 (3.1 s); %ddp load ckpt/ on the next allocation';
  const ended: IPoolEnd = { why: 'preempted', text, step: 4210, folder: 'ckpt/', seconds: 3.1, saved: true };
  const after = (p: IPoolSnapshot | null, end: IPoolEnd | null = ended) => applyMessage(initialState(), { ...snapshot(p), ended: end }, 1000);

  it('says the step saved in the status bar and the whole line in the panel while no pool runs', () => {
    const s = after(null);
    assert.deepEqual(poolEnd(s), ended);
    assert.equal(statusText(s, 0), 'DDP preempted · step 4210 saved to ckpt/');
    assert.equal(statusTooltip(s, 0), `${text}\nClick to open the DDP panel.`);
    assert.equal(endedSummary(ended), 'The last pool was preempted: saved step 4210 to ckpt/step-000004210-20261206T142651413 (3.1 s); `%ddp load ckpt/` on the next allocation');
  });

  it('says that nothing was saved, and nothing once a pool runs again or the kernel is gone', () => {
    const none = { ...ended, text: 'preempted (SIGTERM): nothing was saved: x', step: null, saved: false };
    assert.equal(statusText(after(null, none), 0), 'DDP preempted · nothing saved');
    const running = after(pool([rank(0)]));
    assert.equal(poolEnd(running), null);
    assert.match(statusText(running, 0) || '', /^DDP 1×gloo/);
    assert.equal(poolEnd(disconnected(after(null))), null);
    assert.equal(statusText(after(null, null), 0), null);
  });
});

describe('status bar text', () => {
  it('shows nothing without a pool or without the comm', () => {
    assert.equal(statusText(initialState(), 0), null);
    assert.equal(statusText(connected(null), 0), null);
    const s = connected(pool([rank(0)]));
    assert.equal(statusText(disconnected(s), 0), null);
  });

  it('shows a background cell by its name, its clock moving between messages, and its last step', () => {
    const job: IJobSnapshot = { name: 'cell [12]', background: true, elapsed: 3729.5, step: 4120, text: '' };
    const ranks = [rank(0, { state: 'running', elapsed: 3729.5 }), rank(1, { state: 'running', elapsed: 3729.5 })];
    const s = connected(pool(ranks, { job, queued: ['cell [13]'] }), 'idle', 1000);
    assert.equal(statusText(s, 1000), 'DDP 2×gloo · background: cell [12] running 1:02:09, step 4,120 · cell [13] queued');
    assert.equal(statusText(s, 3000), 'DDP 2×gloo · background: cell [12] running 1:02:11, step 4,120 · cell [13] queued');
    const noStep = connected(pool(ranks, { job: { ...job, step: null, elapsed: 7 } }), 'idle', 0);
    assert.equal(statusText(noStep, 0), 'DDP 2×gloo · background: cell [12] running 0:00:07');
    const foreground = connected(pool(ranks, { job: { ...job, background: false } }), 'busy', 1000);
    assert.equal(statusText(foreground, 1000), 'DDP 2×gloo · running 1 h 02 m');
    assert.equal(jobText({ ...job, elapsed: null }, 0, 0), 'background: cell [12] queued');
    assert.equal(jobText({ ...job, step: 1234567 }, 0, 0), 'background: cell [12] running 1:02:09, step 1,234,567');
  });

  it('counts a job on the ranks only: while the pool starts for it, no run time', () => {
    const job: IJobSnapshot = { name: 'cell [3]', background: true, phase: 'starting', elapsed: null, step: null, text: '' };
    const starting = [rank(0, { state: 'starting', pid: null, elapsed: 2.4 }), rank(1, { state: 'starting', pid: null, elapsed: 2.4 })];
    const s = connected(pool(starting, { job, started: false }), 'idle', 1000);
    assert.equal(statusText(s, 1000), 'DDP 2×gloo · starting 2.40 s'); // the pool's start clock, not the job's
    assert.equal(jobText(job, 0, 5000), 'background: cell [3] starting'); // no clock of its own until it reaches the ranks
    const running: IJobSnapshot = { ...job, phase: 'running', elapsed: 17.03 };
    assert.equal(jobText(running, 1000, 1000), 'background: cell [3] running 0:00:17'); // the cell's 17.03 s, as a clock
  });

  it('says in the status bar that a cell waits in the queue, and only while it does', () => {
    const ranks = [rank(0, { state: 'running', elapsed: 5 }), rank(1, { state: 'running', elapsed: 5 })];
    const job: IJobSnapshot = { name: 'cell [16]', background: true, phase: 'running', elapsed: 5, step: 40, text: '' };
    const waiting = connected(pool(ranks, { job, queued: ['cell [17]'] }), 'busy', 1000);
    assert.equal(statusText(waiting, 1000), 'DDP 2×gloo · background: cell [16] running 0:00:05, step 40 · cell [17] queued');
    const ran = connected(pool([rank(0), rank(1)], { job: null, queued: [] }), 'idle', 1000);
    assert.equal(statusText(ran, 1000), 'DDP 2×gloo · ready');
  });

  it('shows world size, backend and a running clock that moves between messages', () => {
    const s = connected(pool([rank(0, { state: 'running', elapsed: 10 }), rank(1, { state: 'running', elapsed: 9 })], { world_size: 4, nproc: 4 }), 'busy', 1000);
    assert.equal(statusText(s, 1000), 'DDP 4×gloo · running 10.00 s');
    assert.equal(statusText(s, 3500), 'DDP 4×gloo · running 12.50 s');
  });

  it('never shows a clock go back when a later snapshot took longer on its way, and starts a new cell from 0', () => {
    const at = (ranks: IRankSnapshot[], seq: number, now: number, before: IUIState) => applyMessage(before, snapshot(pool(ranks), seq), now);
    const starting = (elapsed: number) => [rank(0, { state: 'starting', pid: null, elapsed }), rank(1, { state: 'queued', pid: null, elapsed })];
    let s = at(starting(9.1), 1, 1000, { ...initialState(), kernelStatus: 'busy' });
    assert.equal(statusText(s, 2040), 'DDP 2×gloo · queued · waited 10.14 s'); // advanced from its arrival
    s = at(starting(10.1), 2, 2040, s); // sent 1.00 s after the first, arrived 1.04 s after it
    assert.equal(statusText(s, 2040), 'DDP 2×gloo · queued · waited 10.14 s');
    assert.equal(statusText(s, 2290), 'DDP 2×gloo · queued · waited 10.39 s');
    s = at([rank(0, { state: 'connecting', elapsed: 10.5 }), rank(1, { state: 'connecting', elapsed: 10.5 })], 3, 2390, s); // one start clock
    assert.equal(statusText(s, 2390), 'DDP 2×gloo · starting 10.50 s');
    s = at([rank(0, { state: 'running', elapsed: 0.02 }), rank(1, { state: 'running', elapsed: 0.02 })], 4, 2500, s); // the cell's own clock
    assert.equal(statusText(s, 2500), 'DDP 2×gloo · running 20 ms');
    s = at([rank(0, { state: 'running', elapsed: 3 }), rank(1, { state: 'running', elapsed: 3 })], 5, 5500, s);
    s = at([rank(0, { state: 'running', elapsed: 0.1, pid: 77 }), rank(1, { state: 'running', elapsed: 0.1, pid: 78 })], 6, 5600, s); // started again
    assert.equal(statusText(s, 5600), 'DDP 2×gloo · running 100 ms');
  });

  it('never shows a background job\'s clock go back either, and a new job starts from its own', () => {
    const ranks = [rank(0, { state: 'running', elapsed: 5 }), rank(1, { state: 'running', elapsed: 5 })];
    const job = (name: string, elapsed: number): IJobSnapshot => ({ name, background: true, phase: 'running', elapsed, step: 40, text: '' });
    const at = (j: IJobSnapshot, seq: number, now: number, before: IUIState) => applyMessage(before, snapshot(pool(ranks, { job: j }), seq), now);
    let s = at(job('cell [16]', 9.1), 1, 1000, { ...initialState(), kernelStatus: 'idle' });
    assert.equal(statusText(s, 2040), 'DDP 2×gloo · background: cell [16] running 0:00:10, step 40'); // 10.14 s
    s = at(job('cell [16]', 10.1), 2, 2040, s); // sent 1.00 s after the first, arrived 1.04 s after it
    assert.equal(s.snapshot!.pool!.job!.elapsed, 10.14);
    s = at(job('cell [16]', 40), 3, 3000, s); // far ahead (the job ran on): its own
    assert.equal(s.snapshot!.pool!.job!.elapsed, 40);
    s = at(job('cell [17]', 0.5), 4, 3100, s); // another job: from its own clock
    assert.equal(statusText(s, 3100), 'DDP 2×gloo · background: cell [17] running 0:00:00, step 40');
  });

  it('says which rank failed', () => {
    const s = connected(pool([rank(0, { state: 'done' }), rank(1, { state: 'failed' })]));
    assert.equal(statusText(s, 0), 'DDP 2×gloo · rank 1 failed');
    const dead = connected(pool([rank(0, { state: 'dead', exit_code: 3 }), rank(1, { state: 'failed' })], { broken: 'rank 0 died' }));
    assert.equal(statusText(dead, 0), 'DDP 2×gloo · ranks 0-1 failed');
  });

  it('names only the root cause, not the ranks ddp_magic stopped because of it', () => {
    // live: rank 1 raised; the others, stuck in all_reduce, were stopped with SIGTERM
    const live = pool([rank(0, { state: 'dead', exit_code: -15 }), rank(1, { state: 'failed' }), rank(2, { state: 'dead', exit_code: -15 })]);
    assert.equal(statusText(connected(live), 0), 'DDP 3×gloo · rank 1 failed');
    // once the cell has ended the kernel says so itself (ui/labsnap.py)
    const told = pool([
      rank(0, { state: 'interrupted', kind: 'interrupted', cause: 'stopped' }),
      rank(1, { state: 'dead', exit_code: -9, kind: 'died', cause: 'root' }),
      rank(2, { state: 'dead', exit_code: -15, kind: 'killed', cause: 'stopped' })
    ]);
    assert.equal(statusText(connected(told), 0), 'DDP 3×gloo · rank 1 failed');
    const rows = rankRows(connected(told), 0);
    assert.deepEqual(
      rows.map(r => [r.state, r.stateClass]),
      [
        ['interrupted', 'idle'],
        ['killed (SIGKILL)', 'bad'],
        ['stopped', 'idle']
      ]
    );
    assert.match(rows[2].why, /^stopped by ddp_magic \(killed \(SIGTERM\)\) after rank 1 failed$/);
    // a rank whose collective broke because rank 1 went away: a consequence, shown neutral
    const peer = rankRows(connected(pool([rank(0, { state: 'failed', kind: 'error', cause: 'stopped' }), rank(1, { state: 'failed', kind: 'error', cause: 'root' })])), 0);
    assert.deepEqual(peer.map(r => [r.state, r.stateClass]), [['aborted', 'idle'], ['failed', 'bad']]);
    // a failed rank the kernel does not list among the cell's failures (released by it): not a cause either
    const released = connected(pool([rank(0, { state: 'failed' }), rank(1, { state: 'failed', kind: 'error', cause: 'root' })]));
    assert.equal(statusText(released, 0), 'DDP 2×gloo · rank 1 failed');
    assert.deepEqual(rankRows(released, 0).map(r => r.stateClass), ['idle', 'bad']);
  });

  it('keeps running visible while one rank has already failed', () => {
    const s = connected(pool([rank(0, { state: 'running', elapsed: 3 }), rank(1, { state: 'failed' })]));
    assert.equal(statusText(s, 1000), 'DDP 2×gloo · running 3.00 s · rank 1 failed');
  });

  it('shows starting, ready, interrupted, needs restart and stopped', () => {
    assert.equal(statusText(connected(pool([rank(0, { state: 'connecting', elapsed: 2 })])), 1000), 'DDP 1×gloo · starting 2.00 s');
    assert.equal(statusText(connected(pool([rank(0, { state: 'done' })])), 0), 'DDP 1×gloo · ready');
    assert.equal(statusText(connected(pool([rank(0, { state: 'interrupted' })])), 0), 'DDP 1×gloo · interrupted');
    assert.equal(statusText(connected(pool([rank(0, { state: 'done' })], { broken: 'rank 0 died' })), 0), 'DDP 1×gloo · needs restart');
    assert.equal(statusText(connected(pool([rank(0, { state: 'stopped' })], { started: false })), 0), 'DDP 1×gloo · stopped');
    // a pool a %%ddp cell has just created: no ranks yet while its template process starts
    assert.equal(statusText(connected(pool([], { started: false, nproc: 2, world_size: 2 })), 0), 'DDP 2×gloo · starting');
  });

  it('mentions a request that waits for the running cell', () => {
    let s = connected(pool([rank(0, { state: 'running', elapsed: 1 })]), 'busy');
    s = withRequest(s, { id: 'a', op: 'restart', sentAt: 0, waits: true });
    assert.equal(statusText(s, 1000), 'DDP 1×gloo · running 1.00 s · restart waits for the cell');
  });

  it('after a failed cell whose pool is whole again: ready, and the cell and the rank it names', () => {
    const last: ILastCell = {
      number: 5,
      ok: false,
      headline: 'rank 1 raised ValueError: bad shard',
      recovered: true,
      root: [1],
      causes: { '0': { kind: 'interrupted', cause: 'stopped' }, '1': { kind: 'error', cause: 'root' } },
      text: 'last cell In[5]: rank 1 raised ValueError: bad shard; recovered: every rank is ready, the workers\' variables intact'
    };
    const s = connected(pool([rank(0), rank(1)], { last_cell: last }));
    assert.equal(poolPhase(s.snapshot!.pool!, 0, 0).phase, 'ready');
    assert.equal(statusText(s, 0), 'DDP 2×gloo · ready · In[5]: rank 1 failed, recovered');
    assert.match(statusTooltip(s, 0), /^last cell In\[5\]: rank 1 raised ValueError: bad shard; recovered/m);
    const rows = rankRows(s, 0);
    assert.deepEqual(
      rows.map(r => [r.state, r.stateClass, r.lastCause, r.lastNote]),
      [
        ['ready', 'ok', 'stopped', ''],
        ['ready', 'ok', 'root', 'In[5]: raised']
      ]
    );
    assert.equal(rows[1].why, 'In[5]: rank 1 raised ValueError: bad shard; ready again, its variables kept');
    assert.equal(rows[0].why, 'In[5]: released by ddp_magic after rank 1 failed, not a cause; ready again, its variables kept');
    // a timeout: the rank that never arrived is the one named, not the one that waited for it
    const hung = { ...last, headline: 'rank 1 never arrived', root: [1], causes: { '0': { kind: 'interrupted' as const, cause: 'stopped' as const }, '1': { kind: 'timeout' as const, cause: 'root' as const } } };
    const t = connected(pool([rank(0), rank(1)], { last_cell: hung }));
    assert.equal(statusText(t, 0), 'DDP 2×gloo · ready · In[5]: rank 1 failed, recovered');
    assert.deepEqual(rankRows(t, 0).map(r => r.lastNote), ['', 'In[5]: timed out']);
    // Ctrl-C: nobody to blame; a cell that went well leaves nothing to say
    assert.equal(statusText(connected(pool([rank(0)], { last_cell: { ...last, root: [], causes: {}, recovered: true } })), 0), 'DDP 1×gloo · ready · In[5]: interrupted');
    assert.equal(statusText(connected(pool([rank(0)], { last_cell: { ...last, ok: true } })), 0), 'DDP 1×gloo · ready');
    // a rank still failed (the pool is not whole): the rank shows it itself, as before
    const broken = connected(pool([rank(0), rank(1, { state: 'dead', exit_code: -9, kind: 'died', cause: 'root' })], { last_cell: { ...last, recovered: false } }));
    assert.equal(statusText(broken, 0), 'DDP 2×gloo · rank 1 failed');
    assert.deepEqual(rankRows(broken, 0).map(r => r.lastNote), ['', '']);
  });

  it('words rank lists and cells as the kernel does (plan/words.py, the prompt number)', () => {
    assert.equal(ranksPhrase([1]), 'rank 1');
    assert.equal(ranksPhrase([3, 0, 2, 1]), 'ranks 0-3');
    assert.equal(ranksPhrase([0, 2, 3]), 'ranks 0, 2-3');
    assert.equal(ranksPhrase([0, 2]), 'ranks 0, 2');
    assert.equal(cellName(5), 'In[5]');
    assert.equal(cellName('12'), 'In[12]');
    assert.equal(cellName('x'), 'cell x');
    assert.equal(cellName(null), 'a cell');
  });

  it('explains itself in the tooltip', () => {
    const s = connected(pool([rank(0)], { verdict: '! 1 warning (of 19)' }));
    const tip = statusTooltip(s, 0);
    assert.match(tip, /^ddp_magic pool: 1 rank, backend gloo, MASTER_PORT 29500$/m);
    assert.match(tip, /^env checks: ! 1 warning \(of 19\)$/m);
    assert.match(statusTooltip(connected(pool([rank(0), rank(1)])), 0), /^ddp_magic pool: 2 ranks,/);
  });
});

describe('messages', () => {
  it('takes snapshots, ignores stale ones, accepts a new session', () => {
    let s = applyMessage(initialState(), snapshot(pool([rank(0)]), 5), 1);
    assert.equal(s.connected, true);
    const stale = applyMessage(s, snapshot(pool([rank(0), rank(1)]), 4), 2);
    assert.equal(stale, s);
    s = applyMessage(s, snapshot(pool([rank(0), rank(1)]), 1, 's2'), 3);
    assert.equal(s.snapshot?.pool?.nproc, 2);
    assert.equal(s.receivedAt, 3);
  });

  it('ignores what it does not know', () => {
    const s = initialState();
    assert.equal(applyMessage(s, null, 0), s);
    assert.equal(applyMessage(s, 'text', 0), s);
    assert.equal(applyMessage(s, { type: 'future-thing' }, 0), s);
  });

  it('drops the last reply once a later cell or start runs', () => {
    let s = connected(pool([rank(0)]));
    s = applyMessage(s, { type: 'reply', id: 'x', op: 'restart', ok: true, message: 'pool of 1 ready' }, 1);
    assert.equal(s.lastReply?.message, 'pool of 1 ready');
    s = applyMessage(s, snapshot(pool([rank(0, { state: 'running' })]), 5), 2);
    assert.equal(s.lastReply, null);
  });

  it('matches replies to pending requests', () => {
    let s = connected(pool([rank(0)]));
    s = withRequest(s, { id: 'r1', op: 'restart', sentAt: 0, waits: false });
    s = withRequest(s, { id: 'r2', op: 'env', sentAt: 0, waits: false });
    const reply: IReplyMsg = { type: 'reply', id: 'r1', op: 'restart', ok: true, message: 'pool of 1 (gloo) ready in 0.40s, pids [7]' };
    s = applyMessage(s, reply, 1);
    assert.deepEqual(
      s.pending.map(p => p.id),
      ['r2']
    );
    assert.equal(replyText(s.lastReply!), 'pool of 1 (gloo) ready in 0.40s, pids [7]');
    assert.equal(replyText({ ...reply, ok: false, error: 'no pool to restart' }), 'restart failed: no pool to restart');
  });

  it('marks a request the kernel queued until the running cell ends', () => {
    let s = connected(pool([rank(0, { state: 'running', elapsed: 1 })]), 'busy');
    s = withRequest(s, { id: 'r1', op: 'restart', sentAt: 0, waits: false });
    s = applyMessage(s, { type: 'queued', id: 'r1', op: 'restart', reason: 'a cell is running' }, 1);
    assert.deepEqual(
      s.pending.map(p => [p.id, p.waits, p.queued]),
      [['r1', true, true]]
    );
    assert.match(statusText(s, 1)!, /restart waits for the cell$/);
  });

  it('forgets everything when the kernel restarts or dies', () => {
    let s = connected(pool([rank(0)]), 'busy');
    s = withRequest(s, { id: 'r1', op: 'stop', sentAt: 0, waits: true });
    const r = withKernelStatus(s, 'restarting');
    assert.equal(r.connected, false);
    assert.equal(r.snapshot, null);
    assert.deepEqual(r.pending, []);
    assert.equal(statusText(r, 0), null);
    assert.equal(withKernelStatus(s, 'busy'), s);
    assert.equal(withKernelStatus(s, 'idle').connected, true);
  });

  it('keeps the last notices', () => {
    const snap = { ...snapshot(pool([rank(0)])), notices: ['a', 'b', 'c', 'd', 'e', 'f'] };
    const s = applyMessage(initialState(), snap, 0);
    assert.deepEqual(s.notices, ['b', 'c', 'd', 'e', 'f']);
  });
});

describe('panel rows', () => {
  it('has one row per rank, in rank order, with pid, device, state, memory and last line', () => {
    const s = connected(
      pool([
        rank(1, { state: 'running', elapsed: 2, last_line: 'step 3', pid: 11 }),
        rank(0, { state: 'done', elapsed: 4, memory: 2 ** 20, pid: 10, device: 'cuda:0' })
      ]),
      'busy',
      0
    );
    const rows = rankRows(s, 1000);
    assert.deepEqual(
      rows.map(r => [r.rank, r.pid, r.device, r.state, r.stateClass, r.elapsed, r.memory, r.lastLine]),
      [
        [0, '10', 'cuda:0', 'done', 'ok', '4.00 s', '1.0 MiB', ''],
        [1, '11', 'cpu', 'running', 'active', '3.00 s', '', 'step 3']
      ]
    );
  });

  it('marks failed and dead ranks', () => {
    const s = connected(pool([rank(0, { state: 'failed' }), rank(1, { state: 'dead', exit_code: -9, pid: null })]));
    const rows = rankRows(s, 0);
    assert.deepEqual(
      rows.map(r => [r.state, r.stateClass, r.pid]),
      [
        ['failed', 'bad', '1000'],
        ['stopped', 'idle', ''] // SIGKILL beside a rank that raised: taken as stopped by ddp_magic
      ]
    );
    const alone = rankRows(connected(pool([rank(0, { state: 'done' }), rank(1, { state: 'dead', exit_code: -9 })])), 0);
    assert.deepEqual(alone.map(r => [r.state, r.stateClass]), [['done', 'ok'], ['killed (SIGKILL)', 'bad']]);
  });

  it('summarises env validation with failures before warnings', () => {
    const checks: ICheck[] = [
      { name: 'port', ok: true, level: 'error', mark: '✓', detail: 'free' },
      { name: 'omp', ok: false, level: 'warning', mark: '!', detail: 'oversubscribed' },
      { name: 'gpus', ok: false, level: 'error', mark: '✗', detail: 'none' }
    ];
    const sum = envSummary(pool([rank(0)], { checks, verdict: 'env ✗ 1 failed' }))!;
    assert.equal(sum.verdict, 'env ✗ 1 failed');
    assert.deepEqual(
      sum.problems.map(c => c.name),
      ['gpus', 'omp']
    );
    assert.equal(sum.passed, 1);
    assert.equal(sum.total, 3);
    assert.equal(envSummary(null), null);
    assert.equal(envHeadline(sum), 'env ✗ 1 failed', "the kernel's own line (checks_verdict), as the cell says it");
    assert.equal(envHeadline({ ...sum, verdict: '' }), '✗ 1 of 3 checks failed');
    assert.equal(envHeadline(envSummary(pool([rank(0)], { checks: [checks[0]], verdict: '' }))!), '✓ 1 check passed');
    assert.equal(envHeadline(envSummary(pool([rank(0)], { checks: checks.slice(0, 2), verdict: '' }))!), '! 1 warning, 1 check passed');
  });

  it('lists report columns in first-seen order', () => {
    assert.deepEqual(reportColumns({ ranks: [{ RANK: '0', WORLD_SIZE: '2' }, { RANK: '1', EXTRA: 'x' }] }), ['RANK', 'WORLD_SIZE', 'EXTRA']);
    assert.deepEqual(reportColumns({}), []);
  });
});

describe('command policy', () => {
  const idle = connected(pool([rank(0)], { names: ['model'] }), 'idle');

  it('runs now when the kernel is idle', () => {
    for (const op of ['restart', 'stop', 'env'] as Op[]) {
      assert.equal(commandPolicy(op, idle).mode, 'now');
    }
  });

  it('waits for the running cell when the kernel is busy, and says why', () => {
    const busy = withKernelStatus(idle, 'busy');
    for (const op of ['restart', 'stop', 'env'] as Op[]) {
      const p = commandPolicy(op, busy);
      assert.equal(p.mode, 'waits');
      assert.match(p.reason, /A cell is running/);
      assert.match(p.reason, /between cells/);
    }
    assert.match(commandPolicy('restart', busy).reason, /interrupt the kernel/);
  });

  it('refuses without a kernel, while it restarts, or when it is dead', () => {
    assert.match(commandPolicy('restart', initialState()).reason, /no kernel/);
    for (const ks of ['restarting', 'autorestarting', 'starting', 'dead', 'terminating'] as KernelStatus[]) {
      const s = { ...idle, kernelStatus: ks };
      assert.equal(commandPolicy('restart', s).mode, 'refused', ks);
    }
  });

  it('says a cancelled job was cancelled, not interrupted', () => {
    const text = 'cancelled by job.cancel(): ranks 0-1 stopped at step 40; state kept';
    const last: ILastCell = { number: 6, ok: false, headline: text, recovered: true, root: [], causes: {}, text: `last cell In[6]: ${text}`, cancelled: true };
    const s = connected(pool([rank(0), rank(1)], { last_cell: last }), 'idle', 1000);
    assert.equal(statusText(s, 1000), 'DDP 2×gloo · ready · In[6]: cancelled');
  });

  it('refuses Restart, Stop and %ddp_env while a background job holds the pool, before asking anything', () => {
    const job: IJobSnapshot = { name: 'cell [12]', background: true, phase: 'running', elapsed: 30, step: 120, text: '' };
    const ranks = [rank(0, { state: 'running' }), rank(1, { state: 'running' })];
    const s = connected(pool(ranks, { job, names: Array.from({ length: 12 }, (_, i) => `n${i}`) }), 'idle', 1000);
    for (const op of ['restart', 'stop', 'env'] as Op[]) {
      const p = commandPolicy(op, s);
      assert.equal(p.mode, 'refused', op);
      assert.equal(p.reason, 'cell [12] holds the pool (background job): job.cancel() or %ddp wait first');
      assert.ok(`Restart the DDP pool: refused — ${p.reason}`.length <= TOAST_CHARS); // the toast is whole
    }
    const queued = connected(pool(ranks, { job: { ...job, phase: 'queued', elapsed: null } }), 'idle', 1000);
    assert.equal(commandPolicy('restart', queued).mode, 'now'); // a job still in line holds nothing
    const done = connected(pool([rank(0), rank(1)], { job: null }), 'idle', 1000);
    assert.equal(commandPolicy('restart', done).mode, 'now');
  });

  it('calls a refusal a refusal, and keeps a toast whole within JupyterLab\'s 140 characters', () => {
    const kernelSaid =
      'the pool was not restarted: cell [12] runs on the pool now (background: cell [12] running 0:00:12, step 40); ' +
      'job.wait() or %ddp wait, or job.cancel() to stop it, then try again';
    const reply: IReplyMsg = { type: 'reply', id: 'x', op: 'restart', ok: false, refused: true, message: '', error: kernelSaid };
    assert.equal(replyText(reply), `restart refused: ${kernelSaid}`);
    const toast = toastText(reply);
    assert.ok(toast.length <= TOAST_CHARS, toast);
    assert.ok(!/failed/.test(toast) && toast.startsWith('restart refused: the pool was not restarted'), toast);
    assert.ok(toast.endsWith('(the DDP panel shows it whole)'), toast);
    const failed: IReplyMsg = { ...reply, refused: false, error: 'StartError: no torch' };
    assert.equal(toastText(failed), 'restart failed: StartError: no torch');
  });

  it('refuses when ddp_magic is not loaded, saying how to load it', () => {
    const s = { ...initialState(), kernelStatus: 'idle' as KernelStatus };
    const p = commandPolicy('env', s);
    assert.equal(p.mode, 'refused');
    assert.match(p.reason, /%load_ext ddp_magic/);
  });

  it('refuses restart, stop and env without a pool', () => {
    const s = connected(null, 'idle');
    assert.match(commandPolicy('restart', s).reason, /no pool to restart/);
    assert.match(commandPolicy('stop', s).reason, /no pool to stop/);
    assert.match(commandPolicy('env', s).reason, /%ddp_env -n N/);
  });

  it('refuses a second request of the same kind while one is pending', () => {
    const s = withRequest(idle, { id: 'x', op: 'restart', sentAt: 0, waits: false });
    assert.equal(commandPolicy('restart', s).mode, 'refused');
    assert.match(commandPolicy('restart', s).reason, /already pending/);
    assert.equal(commandPolicy('env', s).mode, 'now');
  });
});

describe('phase', () => {
  it('puts activity before failures and failures before rest', () => {
    const p = (ranks: IRankSnapshot[], over = {}) => poolPhase(pool(ranks, over), 0, 0).phase;
    assert.equal(p([rank(0, { state: 'running' }), rank(1, { state: 'failed' })]), 'running');
    assert.equal(p([rank(0, { state: 'starting' })]), 'starting');
    assert.equal(p([rank(0, { state: 'done' }), rank(1, { state: 'failed' })]), 'failed');
    assert.equal(p([rank(0, { state: 'done' })], { broken: 'x' }), 'broken');
    assert.equal(p([]), 'stopped');
    assert.equal(p([], { started: false }), 'starting');
    assert.equal(p([rank(0, { state: 'ready' })]), 'ready');
  });

  it('says a Slurm job waiting in the queue is queued, with Slurm\'s reason and the time waited', () => {
    const line = 'queued: job 1234 pending (Resources)';
    const queued = pool([rank(0, { state: 'queued', pid: null, last_line: line, elapsed: 12.5 }), rank(1, { state: 'queued', pid: null, last_line: line, elapsed: 12.5 })], {
      started: false
    });
    assert.equal(poolPhase(queued, 0, 0).phase, 'queued');
    assert.equal(queueLine(queued), line);
    const s = connected(queued, 'busy', 1000);
    assert.equal(statusText(s, 3000), `DDP 2×gloo · ${line} · waited 14.50 s`); // the clock runs on while queued
    const rows = rankRows(s, 1000);
    assert.deepEqual(
      rows.map(r => [r.state, r.stateClass, r.lastLine]),
      [
        ['queued', 'warn', line],
        ['queued', 'warn', line]
      ]
    );
  });

  it('names each rank\'s Slurm node in the panel', () => {
    const s = connected(pool([rank(0, { node: 'n1' }), rank(1, { node: 'n2' }), rank(2)]));
    assert.deepEqual(
      rankRows(s, 1000).map(r => r.node),
      ['n1', 'n2', '']
    );
  });
});

// ------------------------------------------------------------------ metrics (ddp_magic.log's chart)
function metrics(over: Partial<IMetricsMsg> = {}): IMetricsMsg {
  return {
    type: 'metrics',
    session: 's1',
    final: false,
    cell: '3',
    names: ['loss', 'lr'],
    ranks: [0, 1],
    rows: 5,
    series: {
      loss: {
        '0': [
          [0, 1.0],
          [1, 0.5],
          [2, 0.0]
        ],
        '1': [
          [0, 1.0],
          [1, null],
          [2, 0.25]
        ]
      },
      lr: { '0': [[0, 0.1]] }
    },
    summary: [
      { name: 'loss', last: 0.125, last_lo: 0, last_hi: 0.25, min: 0, mean: 0.55, slowest: 1, lag: 0.0123, steps: [0, 2] },
      { name: 'lr', last: 0.1, last_lo: 0.1, last_hi: 0.1, min: 0.1, mean: 0.1, slowest: null, lag: 0, steps: [0, 0] }
    ],
    ...over
  };
}

describe('metrics messages', () => {
  it('parses the kernel message and keeps it across snapshots', () => {
    let s = connected(pool([rank(0)]));
    s = applyMessage(s, JSON.parse(JSON.stringify(metrics())), 0);
    assert.deepEqual(s.metrics, metrics());
    s = applyMessage(s, snapshot(pool([rank(0, { state: 'done' })]), 2), 0);
    assert.deepEqual(s.metrics, metrics(), 'a snapshot leaves the chart as it is');
  });

  it('drops what is not a metric point, and ignores what is not a metrics message', () => {
    const raw = {
      ...metrics(),
      series: { loss: { '0': [[0, 1], ['x', 2], [1, 'NaN'], 5] }, lr: 'junk' },
      summary: [{ name: 'loss', last: null, steps: [0] }, 'junk']
    };
    const m = parseMetrics(raw)!;
    assert.deepEqual(m.series, {
      loss: {
        '0': [
          [0, 1],
          [1, null]
        ]
      },
      lr: {}
    });
    assert.deepEqual(m.summary, [{ name: 'loss', last: null, last_lo: null, last_hi: null, min: null, mean: null, slowest: null, lag: null, steps: [0, 0] }]);
    assert.equal(parseMetrics({ type: 'metrics', names: [1] }), null);
    assert.equal(parseMetrics(null), null);
    const s = connected(null);
    assert.equal(applyMessage(s, { type: 'metrics', names: 'loss' }, 0), s);
  });

  it('keeps the last cell that logged anything, as %ddp metrics does', () => {
    let s = applyMessage(connected(null), metrics({ final: true }), 0);
    const shown = s.metrics;
    // a cell that logs nothing sends nothing; a message with nothing logged would not wipe the chart either
    s = applyMessage(s, metrics({ cell: '4', names: [], series: {}, summary: [], final: true }), 0);
    assert.equal(s.metrics, shown);
    // a live redraw that overtook the cell's end, and a message of an earlier cell, are late
    assert.equal(applyMessage(s, metrics({ final: false }), 0).metrics, shown);
    assert.equal(applyMessage(s, metrics({ cell: '2' }), 0).metrics, shown);
    // the next cell that logs replaces it, live first
    s = applyMessage(s, metrics({ cell: '5', rows: 1 }), 0);
    assert.equal(s.metrics!.cell, '5');
    assert.equal(s.metrics!.final, false);
    s = applyMessage(s, metrics({ cell: '5', final: true }), 0);
    assert.equal(s.metrics!.final, true);
    // a new extension session (%reload_ext) counts its cells anew
    assert.equal(applyMessage(s, metrics({ session: 's2', cell: '1' }), 0).metrics!.session, 's2');
  });

  it('without cell labels, takes live data after a final picture once a snapshot showed a cell running', () => {
    let s = applyMessage(connected(pool([rank(0, { state: 'running' })]), 'busy'), metrics({ cell: '' }), 0);
    s = applyMessage(s, snapshot(pool([rank(0, { state: 'running' })]), 2), 0);
    s = applyMessage(s, metrics({ cell: '', final: true, rows: 9 }), 0);
    assert.equal(s.metrics!.final, true);
    s = applyMessage(s, snapshot(pool([rank(0, { state: 'done' })]), 3), 0);
    const shown = s.metrics;
    assert.equal(applyMessage(s, metrics({ cell: '', rows: 8 }), 0).metrics, shown, 'a redraw that overtook the end is late');
    s = applyMessage(s, snapshot(pool([rank(0, { state: 'running' })]), 4), 0); // the next cell runs
    s = applyMessage(s, metrics({ cell: '', rows: 1 }), 0);
    assert.equal(s.metrics!.rows, 1);
    assert.equal(s.metrics!.final, false);
  });

  it("keeps the chart while its pool runs, and forgets the old pool's chart once it restarted or stopped", () => {
    let s = applyMessage(connected(pool([rank(0), rank(1)])), metrics({ final: true }), 0);
    const shown = s.metrics;
    // a cell that logs nothing, a rank replaced alone (pid 1001 stays): the same pool, the same chart
    s = applyMessage(s, snapshot(pool([rank(0, { state: 'done' }), rank(1)]), 2), 0);
    s = applyMessage(s, snapshot(pool([rank(0, { pid: 2000 }), rank(1)]), 3), 0);
    assert.equal(s.metrics, shown);
    // a restart: new pids everywhere (the panel's Restart shows no starting ranks at all)
    assert.equal(applyMessage(s, snapshot(pool([rank(0, { pid: 3000 }), rank(1, { pid: 3001 })]), 4), 0).metrics, null);
    // a new pool starting (%%ddp -n 4): every rank starting, no pid yet
    const starting = pool([0, 1, 2, 3].map(r => rank(r, { state: 'starting', pid: null })), { started: false });
    assert.equal(applyMessage(s, snapshot(starting, 4), 0).metrics, null);
    // %ddp stop
    assert.equal(applyMessage(s, snapshot(null, 4), 0).metrics, null);
    // a reload: the kernel sends the pool, then its last chart
    let r = applyMessage(connected(pool([rank(0), rank(1)])), metrics({ final: true }), 0);
    r = applyMessage(r, snapshot(pool([rank(0), rank(1)]), 2), 0);
    assert.notEqual(r.metrics, null);
  });

  it("shows the kernel's notices as it lists them (it forgets them when the next %%ddp cell runs)", () => {
    let s = applyMessage(initialState(), { ...snapshot(pool([rank(0)])), notices: ['-n 2 -> 4: the pool restarts'] }, 0);
    assert.deepEqual(s.notices, ['-n 2 -> 4: the pool restarts']);
    s = applyMessage(s, snapshot(pool([rank(0)]), 2), 0);
    assert.deepEqual(s.notices, []);
  });

  it('forgets the chart when the kernel restarts or goes away', () => {
    const s = applyMessage(connected(pool([rank(0)])), metrics({ final: true }), 0);
    assert.notEqual(s.metrics, null);
    assert.equal(withKernelStatus(s, 'busy').metrics, s.metrics);
    assert.equal(withKernelStatus(s, 'restarting').metrics, null);
    assert.equal(withKernelStatus(s, 'dead').metrics, null);
    assert.equal(disconnected(s).metrics, null);
  });
});

describe('metrics chart', () => {
  it('formats numbers as the cell chart does (metrics_chart.fmt)', () => {
    const cases: Array<[number | null, string]> = [
      [0, '0'],
      [0.5, '0.5'],
      [0.6523, '0.6523'],
      [1.23456, '1.235'],
      [5963, '5963'],
      [9999.4, '9999'],
      [9999.6, '10k'],
      [12345.6, '12.3k'],
      [15900, '15.9k'],
      [19134.2, '19.1k'],
      [-15900, '-15.9k'],
      [999999, '1M'],
      [1e-5, '1e-05'],
      [0.00012345, '0.0001234'],
      [0.0002628, '0.0002628'],
      [-3.5, '-3.5'],
      [2.5e6, '2.5M'],
      [3.2e9, '3.2G'],
      [100, '100'],
      [0.1 + 0.2, '0.3'],
      [1e-4, '0.0001'],
      [123456789012, '123G'],
      [1.5e12, '1.5T'],
      [7, '7'],
      [null, '-'],
      [NaN, '-'],
      [Infinity, '-']
    ];
    for (const [x, want] of cases) {
      assert.equal(fmtValue(x), want, String(x));
    }
  });

  it('writes every value so that reading it back gives the value, within the digits shown', () => {
    const units: Record<string, number> = { '': 1, k: 1e3, M: 1e6, G: 1e9, T: 1e12 };
    const parse = (text: string): number => {
      const m = /^(-?\d+(?:\.\d+)?(?:e[-+]\d+)?)([kMGT]?)$/.exec(text);
      assert.ok(m, `${JSON.stringify(text)} is a number with an optional k, M, G or T`);
      return Number(m![1]) * units[m![2]];
    };
    // the digits a text shows: the last one is worth half its place at most
    const halfUlp = (text: string): number => {
      const m = /^-?(\d+)(?:\.(\d+))?(?:e([-+]\d+))?([kMGT]?)$/.exec(text)!;
      return 0.5 * 10 ** (Number(m[3] || 0) - (m[2] || '').length) * units[m[4]];
    };
    let checked = 0;
    for (let e = -6; e <= 12; e++) {
      for (const mant of [1, 1.0004, 1.23456, 1.5, 2.5, 3.14159, 4.99951, 5.963, 7.77777, 9.9994, 9.99951, 9.99999]) {
        for (const sign of [1, -1]) {
          const x = sign * mant * 10 ** e;
          const text = fmtValue(x);
          const back = parse(text);
          assert.ok(Math.abs(back - x) <= halfUlp(text) * (1 + 1e-9), `${x} written ${text} reads ${back}`);
          assert.ok(Math.abs(x) < 1e4 || Math.abs(back) >= 1e3 || /e/.test(text), `${x}: ${text} keeps its magnitude`);
          assert.ok(text.replace(/e.*$/, '').replace(/[^0-9]/g, '').replace(/^0+/, '').length <= 4, `${text}: at most 4 significant digits`);
          checked++;
        }
      }
    }
    assert.equal(fmtValue(0), '0');
    assert.equal(fmtValue(-0), '0');
    assert.ok(checked > 400);
  });

  it('draws one polyline per rank over the data range, skipping missing values', () => {
    const c = metricChart(metrics(), 'loss', 200, 96);
    const { left, right, top, bottom } = CHART;
    assert.deepEqual(c.plot, { x0: left, x1: 200 - right, y0: top, y1: 96 - bottom });
    assert.deepEqual(
      c.lines.map(l => l.rank),
      [0, 1]
    );
    // steps 0..2 span the plot's width, values 0..1 its height (1 at the top)
    const w = 200 - right - left;
    const h = 96 - bottom - top;
    const pt = (x: number, y: number) => `${(left + (x / 2) * w).toFixed(1)},${(top + (1 - y) * h).toFixed(1)}`;
    assert.equal(c.lines[0].points, [pt(0, 1), pt(1, 0.5), pt(2, 0)].join(' '));
    assert.equal(c.lines[1].points, [pt(0, 1), pt(2, 0.25)].join(' '), 'the null at step 1 is skipped');
    assert.equal(c.lines[1].colour, 'var(--ddp-magic-rank-1, #ff7f0e)');
    assert.deepEqual(
      c.yTicks.map(t => t.label),
      ['0.0', '0.5', '1.0']
    );
    assert.deepEqual(
      c.xTicks.map(t => [t.label, t.anchor]),
      [
        ['0', 'start'],
        ['2', 'end']
      ]
    );
    for (const l of c.lines) {
      for (const p of l.points.split(' ')) {
        const [x, y] = p.split(',').map(Number);
        assert.ok(x >= left && x <= 200 - right && y >= top && y <= 96 - bottom, `${p} inside the plot`);
      }
    }
  });

  it('starts the plot right of its widest value label: no label is cut at the left', () => {
    const tiny = metrics({ series: { loss: { '0': [[0, 0.0002628], [1, 0.00031]] } } });
    const c = metricChart(tiny, 'loss', 240, 96);
    assert.deepEqual(
      c.yTicks.map(t => t.label),
      ['0.0002628', '0.0002864', '0.0003100']
    );
    const widest = Math.max(...c.yTicks.map(t => estimateWidth(t.label)));
    assert.ok(c.plot.x0 - CHART.gap - widest >= 0, `the labels end at x=${c.plot.x0 - CHART.gap}, ${widest}px wide`);
    // a measurer that says each character is 10 px: the plot moves right with it
    const wide = metricChart(tiny, 'loss', 240, 96, t => t.length * 10);
    assert.ok(wide.plot.x0 - CHART.gap >= 90, String(wide.plot.x0));
    assert.equal(metricChart(metrics(), 'loss', 200, 96).plot.x0, CHART.left, 'short labels keep the narrow margin');
  });

  it('widens a single step and a flat line, and draws nothing without values', () => {
    assert.deepEqual(chartBounds({ '0': [[5, 2]] }), [4, 6, 1.9, 2.1]);
    assert.deepEqual(chartBounds({ '0': [[5, 0]] }), [4, 6, -1, 1]);
    assert.deepEqual(chartBounds({ '0': [[5, null]] }), [0, 1, 0, 1]);
    assert.deepEqual(metricChart(metrics({ series: { loss: { '0': [[0, null]] } } }), 'loss', 200).lines, []);
    assert.deepEqual(metricChart(metrics(), 'unknown', 200).lines, []);
  });

  it('gives a rank the colour of its line in the cell chart (ddp_magic/ui/metrics_chart.py PALETTE)', () => {
    const py = fs.readFileSync(path.resolve(__dirname, '../../../ddp_magic/ui/metrics_chart.py'), 'utf8');
    const line = /^PALETTE = \(([^)]*)\)/m.exec(py);
    assert.ok(line, 'metrics_chart.py has a PALETTE tuple');
    assert.deepEqual(RANK_PALETTE, line![1].split(',').map(s => s.trim().replace(/^"|"$/g, '')));
    assert.equal(rankColour(12), 'var(--ddp-magic-rank-12, #2ca02c)');
  });

  it('sums up each metric in a row, and says what the chart shows', () => {
    assert.deepEqual(metricRows(metrics()), [
      {
        name: 'loss',
        last: '0.125',
        range: '0 to 0.25',
        min: '0',
        mean: '0.55',
        slowest: 'rank 1 (+12 ms)',
        note: 'slowest so far: rank 1 (+12 ms) · last per rank: 0 to 0.25'
      },
      { name: 'lr', last: '0.1', range: '', min: '0.1', mean: '0.1', slowest: 'none stands out', note: 'slowest so far: none stands out' }
    ]);
    assert.equal(metricRows(metrics({ final: true }))[0].note, 'slowest: rank 1 (+12 ms) · last per rank: 0 to 0.25');
    const profiled = metrics({ summary: [{ ...metrics().summary[0], lag: 0.35, slowest_by: 'profile' }] });
    assert.equal(metricRows(profiled)[0].slowest, 'rank 1 (+350 ms, the others waited for it)');
    assert.equal(parseMetrics(JSON.parse(JSON.stringify(profiled)))!.summary[0].slowest_by, 'profile');
    assert.equal(metricsHeadline(metrics()), 'In[3]: loss, lr from 2 ranks, steps 0-2 (live)');
    assert.equal(metricsHeadline(metrics({ final: true, ranks: [0] })), 'In[3]: loss, lr from 1 rank, steps 0-2');
    assert.equal(metricsHeadline(metrics({ cell: '' })), 'loss, lr from 2 ranks, steps 0-2 (live)');
  });
});
