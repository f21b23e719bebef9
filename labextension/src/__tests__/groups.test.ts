import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { type IPoolSnapshot, type IRankSnapshot, PROTOCOL } from '../model';
import { ranksBrief } from '../format';
import { type IRankRow, statusText } from '../ranks';
import { applyMessage, initialState } from '../state';
import { listItems, rankGroups, visibleRange } from '../groups';

function row(rank: number, over: Partial<IRankRow> = {}): IRankRow {
  return {
    rank,
    pid: String(1000 + rank),
    device: 'cpu',
    state: 'running',
    stateClass: 'active',
    why: '',
    elapsed: '3.10 s',
    memory: '',
    lastLine: '',
    lastCause: '',
    lastNote: '',
    node: '',
    ...over
  };
}

/** 1,024 ranks on two nodes of 512, rank 517 failed. */
function big(): IRankRow[] {
  return Array.from({ length: 1024 }, (_, r) =>
    row(r, { node: r < 512 ? 'n1' : 'n2', ...(r === 517 ? { state: 'failed', stateClass: 'bad' } : {}) })
  );
}

describe('the panel at scale: ranks grouped by node', () => {
  it('says each node in one line: the main count, then the failed rank named', () => {
    const groups = rankGroups(big());
    assert.deepEqual(
      groups.map(g => g.text),
      ['n1 · 512 running', 'n2 · 511 running · rank 517 failed']
    );
    assert.deepEqual(groups.map(g => g.bad), [false, true]);
    assert.equal(groups[1].ranks.length, 512);
  });

  it('names a few odd ranks, counts many, and keeps a long failure list short', () => {
    const rows = Array.from({ length: 64 }, (_, r) =>
      row(r, r < 10 ? { state: 'starting' } : r === 20 || r === 22 ? { state: 'aborted', stateClass: 'idle' } : {})
    );
    assert.equal(rankGroups(rows)[0].text, 'this host · 52 running · 10 starting · ranks 20, 22 aborted');
    const failed = Array.from({ length: 64 }, (_, r) => row(r, r % 2 ? { state: 'failed', stateClass: 'bad' } : {}));
    assert.equal(rankGroups(failed)[0].text, 'this host · 32 failed · 32 running');
    const few = Array.from({ length: 64 }, (_, r) => row(r, r % 8 === 1 ? { state: 'failed', stateClass: 'bad' } : {}));
    assert.equal(rankGroups(few)[0].text, 'this host · 56 running · 8 ranks: 1, 9, 17, … failed');
  });

  it("names the last failed cell's root rank once every rank is ready again", () => {
    const rows = Array.from({ length: 256 }, (_, r) =>
      row(r, { state: 'ready', stateClass: 'ok', ...(r === 117 ? { lastCause: 'root', lastNote: 'In[3]: raised' } : {}) })
    );
    const [g] = rankGroups(rows);
    assert.equal(g.text, 'this host · 256 ready · In[3]: rank 117 raised');
    assert.equal(g.bad, true);
  });

  it('lists a line per group and its ranks unless folded', () => {
    const rows = big();
    assert.equal(listItems(rows, new Set()).length, 1024 + 2);
    const folded = listItems(rows, new Set(['n1']));
    assert.equal(folded.length, 1 + 1 + 512);
    assert.equal(folded[0].kind, 'group');
    assert.equal(folded[1].kind, 'group');
    const third = folded[2];
    assert.ok(third.kind === 'rank' && third.row.rank === 512);
  });

  it('shows only the visible window of the list, a few rows either side', () => {
    assert.deepEqual(visibleRange(1026, 0, 352, 22), [0, 20]);
    assert.deepEqual(visibleRange(1026, 22 * 500, 352, 22), [496, 520]);
    assert.deepEqual(visibleRange(1026, 22 * 1026, 352, 22), [1022, 1026]);
    assert.deepEqual(visibleRange(3, 0, 0, 22), [0, 3]);
  });

  it('writes a rank list that stays short at any size', () => {
    assert.equal(ranksBrief([517]), 'rank 517');
    assert.equal(ranksBrief([3, 9, 10, 11]), 'ranks 3, 9-11');
    assert.equal(ranksBrief([1, 3, 5, 7, 9]), '5 ranks: 1, 3, 5, …');
  });

  it('says the failed rank in the status bar of a 1,024-rank pool', () => {
    const ranks: IRankSnapshot[] = Array.from({ length: 1024 }, (_, r) => ({
      rank: r,
      pid: 1000 + r,
      host: 'n1',
      device: 'cuda:0',
      state: r === 517 ? 'failed' : 'running',
      exit_code: null,
      elapsed: 192,
      memory: null,
      last_line: ''
    }));
    const pool = {
      nproc: 1024, world_size: 1024, backend: 'nccl', started: true, broken: null, generation: 1, master_addr: 'n1',
      master_port: 29500, start_method: 'fork', start_seconds: 2, ranks, checks: [], verdict: '', names: []
    } as IPoolSnapshot;
    const snap = { type: 'snapshot', session: 's', seq: 1, version: '0.1.0', protocol: PROTOCOL, pool, notices: [], final: false };
    const state = applyMessage({ ...initialState(), kernelStatus: 'busy' }, snap, 1000);
    assert.equal(statusText(state, 1000), 'DDP 1024×nccl · running 3 m 12 s · rank 517 failed');
  });
});
