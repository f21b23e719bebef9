/**
 * Unit tests of model.ts: kernel messages in, what the UI shows out.
 * Run with `jlpm test` (tsc -p tsconfig.test.json, then node's built-in test runner).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import * as M from '../model';

function rank(r: number, over: Partial<M.IRankSnapshot> = {}): M.IRankSnapshot {
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

function pool(ranks: M.IRankSnapshot[], over: Partial<M.IPoolSnapshot> = {}): M.IPoolSnapshot {
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

function snapshot(p: M.IPoolSnapshot | null, seq = 1, session = 's1'): M.ISnapshotMsg {
  return { type: 'snapshot', session, seq, version: '0.1.0', protocol: M.PROTOCOL, pool: p, notices: [], final: false };
}

function connected(p: M.IPoolSnapshot | null, status: M.KernelStatus = 'idle', receivedAt = 1000): M.IUIState {
  const s = M.applyMessage({ ...M.initialState(), kernelStatus: status }, snapshot(p), receivedAt);
  return s;
}

describe('formatting', () => {
  it('formats clocks like a stopwatch', () => {
    assert.equal(M.formatClock(0), '0:00');
    assert.equal(M.formatClock(12.7), '0:12');
    assert.equal(M.formatClock(75), '1:15');
    assert.equal(M.formatClock(3725), '1:02:05');
    assert.equal(M.formatClock(-3), '0:00');
  });

  it('formats memory in binary units', () => {
    assert.equal(M.formatBytes(null), '');
    assert.equal(M.formatBytes(512), '512 B');
    assert.equal(M.formatBytes(1536), '1.5 KiB');
    assert.equal(M.formatBytes(3 * 2 ** 30), '3.0 GiB');
  });

  it('names how a rank died', () => {
    assert.equal(M.rankStateLabel(rank(0, { state: 'dead', exit_code: -9 })), 'killed (SIGKILL)');
    assert.equal(M.rankStateLabel(rank(0, { state: 'dead', exit_code: -11 })), 'killed (SIGSEGV)');
    assert.equal(M.rankStateLabel(rank(0, { state: 'dead', exit_code: -64 })), 'killed (signal 64)');
    assert.equal(M.rankStateLabel(rank(0, { state: 'dead', exit_code: 3 })), 'died (exit 3)');
    assert.equal(M.rankStateLabel(rank(0, { state: 'running' })), 'running');
  });

  it('cleans the last output line', () => {
    assert.equal(M.cleanLine('\x1b[31mred\x1b[0m\tline  '), 'red line');
    assert.equal(M.cleanLine('x'.repeat(200)).length, 160);
  });
});

describe('status bar text', () => {
  it('shows nothing without a pool or without the comm', () => {
    assert.equal(M.statusText(M.initialState(), 0), null);
    assert.equal(M.statusText(connected(null), 0), null);
    const s = connected(pool([rank(0)]));
    assert.equal(M.statusText(M.disconnected(s), 0), null);
  });

  it('shows world size, backend and a running clock that moves between messages', () => {
    const s = connected(pool([rank(0, { state: 'running', elapsed: 10 }), rank(1, { state: 'running', elapsed: 9 })], { world_size: 4, nproc: 4 }), 'busy', 1000);
    assert.equal(M.statusText(s, 1000), 'DDP 4×gloo · running 0:10');
    assert.equal(M.statusText(s, 3500), 'DDP 4×gloo · running 0:12');
  });

  it('says which rank failed', () => {
    const s = connected(pool([rank(0, { state: 'done' }), rank(1, { state: 'failed' })]));
    assert.equal(M.statusText(s, 0), 'DDP 2×gloo · rank 1 failed');
    const dead = connected(pool([rank(0, { state: 'dead', exit_code: -9 }), rank(1, { state: 'failed' })], { broken: 'rank 0 was killed' }));
    assert.equal(M.statusText(dead, 0), 'DDP 2×gloo · ranks 0,1 failed');
  });

  it('keeps running visible while one rank has already failed', () => {
    const s = connected(pool([rank(0, { state: 'running', elapsed: 3 }), rank(1, { state: 'failed' })]));
    assert.equal(M.statusText(s, 1000), 'DDP 2×gloo · running 0:03 · rank 1 failed');
  });

  it('shows starting, ready, interrupted, needs restart and stopped', () => {
    assert.equal(M.statusText(connected(pool([rank(0, { state: 'connecting', elapsed: 2 })])), 1000), 'DDP 1×gloo · starting 0:02');
    assert.equal(M.statusText(connected(pool([rank(0, { state: 'done' })])), 0), 'DDP 1×gloo · ready');
    assert.equal(M.statusText(connected(pool([rank(0, { state: 'interrupted' })])), 0), 'DDP 1×gloo · interrupted');
    assert.equal(M.statusText(connected(pool([rank(0, { state: 'done' })], { broken: 'rank 0 died' })), 0), 'DDP 1×gloo · needs restart');
    assert.equal(M.statusText(connected(pool([rank(0, { state: 'stopped' })], { started: false })), 0), 'DDP 1×gloo · stopped');
    // a pool a %%ddp cell has just created: no ranks yet while its template process starts
    assert.equal(M.statusText(connected(pool([], { started: false, nproc: 2, world_size: 2 })), 0), 'DDP 2×gloo · starting');
  });

  it('mentions a request that waits for the running cell', () => {
    let s = connected(pool([rank(0, { state: 'running', elapsed: 1 })]), 'busy');
    s = M.withRequest(s, { id: 'a', op: 'restart', sentAt: 0, waits: true });
    assert.equal(M.statusText(s, 1000), 'DDP 1×gloo · running 0:01 · restart waits for the cell');
  });

  it('explains itself in the tooltip', () => {
    const s = connected(pool([rank(0)], { verdict: 'env ! 1 warning' }));
    const tip = M.statusTooltip(s, 0);
    assert.match(tip, /1 rank\(s\), backend gloo, MASTER_PORT 29500/);
    assert.match(tip, /env: env ! 1 warning/);
  });
});

describe('messages', () => {
  it('takes snapshots, ignores stale ones, accepts a new session', () => {
    let s = M.applyMessage(M.initialState(), snapshot(pool([rank(0)]), 5), 1);
    assert.equal(s.connected, true);
    const stale = M.applyMessage(s, snapshot(pool([rank(0), rank(1)]), 4), 2);
    assert.equal(stale, s);
    s = M.applyMessage(s, snapshot(pool([rank(0), rank(1)]), 1, 's2'), 3);
    assert.equal(s.snapshot?.pool?.nproc, 2);
    assert.equal(s.receivedAt, 3);
  });

  it('ignores what it does not know', () => {
    const s = M.initialState();
    assert.equal(M.applyMessage(s, null, 0), s);
    assert.equal(M.applyMessage(s, 'text', 0), s);
    assert.equal(M.applyMessage(s, { type: 'future-thing' }, 0), s);
  });

  it('matches replies to pending requests', () => {
    let s = connected(pool([rank(0)]));
    s = M.withRequest(s, { id: 'r1', op: 'restart', sentAt: 0, waits: false });
    s = M.withRequest(s, { id: 'r2', op: 'env', sentAt: 0, waits: false });
    const reply: M.IReplyMsg = { type: 'reply', id: 'r1', op: 'restart', ok: true, message: 'pool of 1 (gloo) ready in 0.40s, pids [7]' };
    s = M.applyMessage(s, reply, 1);
    assert.deepEqual(
      s.pending.map(p => p.id),
      ['r2']
    );
    assert.equal(M.replyText(s.lastReply!), 'pool of 1 (gloo) ready in 0.40s, pids [7]');
    assert.equal(M.replyText({ ...reply, ok: false, error: 'no pool to restart' }), 'restart failed: no pool to restart');
  });

  it('marks a request the kernel queued until the running cell ends', () => {
    let s = connected(pool([rank(0, { state: 'running', elapsed: 1 })]), 'busy');
    s = M.withRequest(s, { id: 'r1', op: 'restart', sentAt: 0, waits: false });
    s = M.applyMessage(s, { type: 'queued', id: 'r1', op: 'restart', reason: 'a cell is running' }, 1);
    assert.deepEqual(
      s.pending.map(p => [p.id, p.waits, p.queued]),
      [['r1', true, true]]
    );
    assert.match(M.statusText(s, 1)!, /restart waits for the cell$/);
  });

  it('forgets everything when the kernel restarts or dies', () => {
    let s = connected(pool([rank(0)]), 'busy');
    s = M.withRequest(s, { id: 'r1', op: 'stop', sentAt: 0, waits: true });
    const r = M.withKernelStatus(s, 'restarting');
    assert.equal(r.connected, false);
    assert.equal(r.snapshot, null);
    assert.deepEqual(r.pending, []);
    assert.equal(M.statusText(r, 0), null);
    assert.equal(M.withKernelStatus(s, 'busy'), s);
    assert.equal(M.withKernelStatus(s, 'idle').connected, true);
  });

  it('keeps the last notices', () => {
    const snap = { ...snapshot(pool([rank(0)])), notices: ['a', 'b', 'c', 'd', 'e', 'f'] };
    const s = M.applyMessage(M.initialState(), snap, 0);
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
    const rows = M.rankRows(s, 1000);
    assert.deepEqual(
      rows.map(r => [r.rank, r.pid, r.device, r.state, r.stateClass, r.elapsed, r.memory, r.lastLine]),
      [
        [0, '10', 'cuda:0', 'done', 'ok', '0:04', '1.0 MiB', ''],
        [1, '11', 'cpu', 'running', 'active', '0:03', '', 'step 3']
      ]
    );
  });

  it('marks failed and dead ranks', () => {
    const s = connected(pool([rank(0, { state: 'failed' }), rank(1, { state: 'dead', exit_code: -9, pid: null })]));
    const rows = M.rankRows(s, 0);
    assert.deepEqual(
      rows.map(r => [r.state, r.stateClass, r.pid]),
      [
        ['failed', 'bad', '1000'],
        ['killed (SIGKILL)', 'bad', '']
      ]
    );
  });

  it('summarises env validation with failures before warnings', () => {
    const checks: M.ICheck[] = [
      { name: 'port', ok: true, level: 'error', mark: '✓', detail: 'free' },
      { name: 'omp', ok: false, level: 'warning', mark: '!', detail: 'oversubscribed' },
      { name: 'gpus', ok: false, level: 'error', mark: '✗', detail: 'none' }
    ];
    const sum = M.envSummary(pool([rank(0)], { checks, verdict: 'env ✗ 1 failed' }))!;
    assert.equal(sum.verdict, 'env ✗ 1 failed');
    assert.deepEqual(
      sum.problems.map(c => c.name),
      ['gpus', 'omp']
    );
    assert.equal(sum.passed, 1);
    assert.equal(sum.total, 3);
    assert.equal(M.envSummary(null), null);
    assert.equal(M.envHeadline(sum), '✗ 1 failed · ! 1 warning (of 3)');
    assert.equal(M.envHeadline(M.envSummary(pool([rank(0)], { checks: [checks[0]] }))!), '✓ all 1 checks passed');
  });

  it('lists report columns in first-seen order', () => {
    assert.deepEqual(M.reportColumns({ ranks: [{ RANK: '0', WORLD_SIZE: '2' }, { RANK: '1', EXTRA: 'x' }] }), ['RANK', 'WORLD_SIZE', 'EXTRA']);
    assert.deepEqual(M.reportColumns({}), []);
  });
});

describe('command policy', () => {
  const idle = connected(pool([rank(0)], { names: ['model'] }), 'idle');

  it('runs now when the kernel is idle', () => {
    for (const op of ['restart', 'stop', 'env'] as M.Op[]) {
      assert.equal(M.commandPolicy(op, idle).mode, 'now');
    }
  });

  it('waits for the running cell when the kernel is busy, and says why', () => {
    const busy = M.withKernelStatus(idle, 'busy');
    for (const op of ['restart', 'stop', 'env'] as M.Op[]) {
      const p = M.commandPolicy(op, busy);
      assert.equal(p.mode, 'waits');
      assert.match(p.reason, /A cell is running/);
      assert.match(p.reason, /between cells/);
    }
    assert.match(M.commandPolicy('restart', busy).reason, /interrupt the kernel/);
  });

  it('refuses without a kernel, while it restarts, or when it is dead', () => {
    assert.match(M.commandPolicy('restart', M.initialState()).reason, /no kernel/);
    for (const ks of ['restarting', 'autorestarting', 'starting', 'dead', 'terminating'] as M.KernelStatus[]) {
      const s = { ...idle, kernelStatus: ks };
      assert.equal(M.commandPolicy('restart', s).mode, 'refused', ks);
    }
  });

  it('refuses when ddp_magic is not loaded, saying how to load it', () => {
    const s = { ...M.initialState(), kernelStatus: 'idle' as M.KernelStatus };
    const p = M.commandPolicy('env', s);
    assert.equal(p.mode, 'refused');
    assert.match(p.reason, /%load_ext ddp_magic/);
  });

  it('refuses restart, stop and env without a pool', () => {
    const s = connected(null, 'idle');
    assert.match(M.commandPolicy('restart', s).reason, /no pool to restart/);
    assert.match(M.commandPolicy('stop', s).reason, /no pool to stop/);
    assert.match(M.commandPolicy('env', s).reason, /%ddp_env -n N/);
  });

  it('refuses a second request of the same kind while one is pending', () => {
    const s = M.withRequest(idle, { id: 'x', op: 'restart', sentAt: 0, waits: false });
    assert.equal(M.commandPolicy('restart', s).mode, 'refused');
    assert.match(M.commandPolicy('restart', s).reason, /already pending/);
    assert.equal(M.commandPolicy('env', s).mode, 'now');
  });
});

describe('phase', () => {
  it('puts activity before failures and failures before rest', () => {
    const p = (ranks: M.IRankSnapshot[], over = {}) => M.poolPhase(pool(ranks, over), 0, 0).phase;
    assert.equal(p([rank(0, { state: 'running' }), rank(1, { state: 'failed' })]), 'running');
    assert.equal(p([rank(0, { state: 'starting' })]), 'starting');
    assert.equal(p([rank(0, { state: 'done' }), rank(1, { state: 'failed' })]), 'failed');
    assert.equal(p([rank(0, { state: 'done' })], { broken: 'x' }), 'broken');
    assert.equal(p([]), 'stopped');
    assert.equal(p([], { started: false }), 'starting');
    assert.equal(p([rank(0, { state: 'ready' })]), 'ready');
  });
});
