import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { HeldOutput, marksOf } from '../held';

const stream = (metadata: unknown) => ({ header: { msg_type: 'stream' }, metadata });

describe('what the page holds of a kept pool (held.ts)', () => {
  it('keeps the highest offsets per pool, rank and stream', () => {
    const held = new HeldOutput();
    assert.equal(held.take(stream({ ddp_magic: { pool: 'a1', upto: { '0': [10, 0], '1': [12, 3] } } })), 'a1');
    assert.equal(held.take(stream({ ddp_magic: { pool: 'a1', upto: { '0': [20, 0] } } })), 'a1');
    assert.equal(held.take(stream({ ddp_magic: { pool: 'a1', upto: { '1': [11, 3] } } })), null); // older: nothing grows
    assert.equal(held.take(stream({ ddp_magic: { pool: 'b2', upto: { '0': [5, 5] } } })), 'b2');
    assert.deepEqual(held.message('a1'), { type: 'shown', pool: 'a1', upto: { '0': [20, 0], '1': [12, 3] } });
    assert.deepEqual(held.all().map(m => m.pool), ['a1', 'b2']);
  });

  it('reads only a stream message with well-formed marks', () => {
    assert.equal(marksOf({ header: { msg_type: 'display_data' }, metadata: { ddp_magic: { pool: 'a', upto: {} } } }), null);
    assert.equal(marksOf(stream({})), null);
    assert.equal(marksOf(stream({ ddp_magic: { pool: 'a' } })), null);
    assert.deepEqual(marksOf(stream({ ddp_magic: { pool: 'a', upto: { '0': [1, 2], '1': [3], '2': ['x', 1] } } })), { pool: 'a', upto: { '0': [1, 2] } });
  });
});
