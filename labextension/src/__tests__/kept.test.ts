import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { attachCode, keptLines, keptNote, keptPools } from '../kept';
import { stacksRefusal, staleWhy, stampText } from '../stacks';
import type { IUIState } from '../model';

const POOL = {
  id: '3fa9c2e1',
  text: '3fa9c2e1  train.ipynb  2 ranks  cell [2] running on ranks 0-1',
  alive: true,
  notebook: 'train.ipynb',
  ranks: '2 ranks',
  job: 'cell [2] running on ranks 0-1',
  kernel: 'no kernel since 04:28:10',
  lease: 'ends at most at 04:27:49'
};

describe('a kept pool in the panel (kept.ts)', () => {
  it('says each fact once, in short lines', () => {
    assert.deepEqual(keptLines(POOL), ['3fa9c2e1 · train.ipynb · 2 ranks', 'cell [2] running on ranks 0-1', 'no kernel since 04:28:10 · ends at most at 04:27:49']);
    assert.deepEqual(keptLines({ ...POOL, alive: false, why: 'ended: its lease ran out' }), ['3fa9c2e1 · train.ipynb · 2 ranks', 'ended: its lease ran out']);
  });
  it('attaches with the magic, loading it first where the kernel has not', () => {
    assert.equal(attachCode(POOL), '%ddp attach 3fa9c2e1 --out job');
    assert.equal(attachCode(POOL, false), '%load_ext ddp_magic\n%ddp attach 3fa9c2e1 --out job');
  });
  it('reads the snapshot list, and none from a snapshot without it', () => {
    assert.deepEqual(keptPools(null), []);
    assert.deepEqual(keptPools({ kept: [POOL] } as any), [POOL]);
  });
  it("says where a kept job's cell goes on", () => {
    assert.match(keptNote('3fa9c2e1', 'cell [2]', null), /^kept: .*attach it to follow/);
    assert.match(keptNote('3fa9c2e1', 'cell [2]', 4), /continued in cell \[4\]$/);
  });
});

function state(connected: boolean, job: string | null, pool = true): IUIState {
  const snap = pool ? { pool: { job: job === null ? null : { name: job } } } : { pool: null };
  return { connected, snapshot: snap } as unknown as IUIState;
}

describe("the Stacks view's stamp (stacks.ts)", () => {
  it('says when the stacks were taken and how long ago', () => {
    const at = new Date(2026, 0, 1, 4, 5, 6).getTime();
    assert.equal(stampText(at, at + 12_400, ''), 'taken at 04:05:06 (12 s ago)');
    assert.equal(stampText(at, at, 'the pool is gone'), 'taken at 04:05:06 (0 s ago) · stale: the pool is gone');
  });
  it('goes stale when the cell it was taken in ended, or the pool went', () => {
    assert.equal(staleWhy('cell [3]', state(true, 'cell [3]')), '');
    assert.match(staleWhy('cell [3]', state(true, null)), /cell \[3\] has ended/);
    assert.match(staleWhy(null, state(true, null, false)), /the pool is gone/);
    assert.match(staleWhy(null, state(false, null)), /the pool is gone/);
  });
  it('cannot ask without ddp_magic or a pool', () => {
    assert.match(stacksRefusal(state(false, null, false)), /not loaded/);
    assert.match(stacksRefusal(state(true, null, false)), /no pool/);
    assert.equal(stacksRefusal(state(true, null)), '');
  });
});
