import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { BUSY_PROBE_MS, BUSY_PROBE_TRIES, BusyProbe, mayLoad } from '../busy_probe';
import { HeldOutput, marksOf } from '../held';
import { FLUSH_MS, HeldStore, IStore, MAX_POOLS, parse, storeKey } from '../held_store';

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

  it('takes nothing a restarted or dead kernel sends after its restart began: no cell shows it', () => {
    const held = new HeldOutput();
    const from = (session: string, out: number) => ({
      header: { msg_type: 'stream', session },
      metadata: { ddp_magic: { pool: 'a1', upto: { '0': [out, 0] } } }
    });
    assert.equal(held.take(from('old', 10)), 'a1');
    held.kernelGone(); // JupyterLab's restart(): the old kernel's futures are gone from here on
    assert.equal(held.take(from('old', 20)), null); // its late lines (two ticks in CI) reached the page, not a cell
    assert.equal(held.fromKernel('old'), false);
    assert.deepEqual(held.message('a1').upto, { '0': [10, 0] }); // attach replays from the last line shown
    assert.equal(held.fromKernel('new'), true);
    assert.equal(held.take(from('new', 30)), 'a1');
    held.kernelGone();
    held.kernelGone(); // 'restarting' then 'autorestarting': the second has no session to end
    assert.equal(held.fromKernel('old'), false);
    assert.equal(held.take(from('new', 40)), null);
    assert.deepEqual(held.message('a1').upto, { '0': [30, 0] });
  });

  it('reads only a stream message with well-formed marks', () => {
    assert.equal(marksOf({ header: { msg_type: 'display_data' }, metadata: { ddp_magic: { pool: 'a', upto: {} } } }), null);
    assert.equal(marksOf(stream({})), null);
    assert.equal(marksOf(stream({ ddp_magic: { pool: 'a' } })), null);
    assert.deepEqual(marksOf(stream({ ddp_magic: { pool: 'a', upto: { '0': [1, 2], '1': [3], '2': ['x', 1] } } })), { pool: 'a', upto: { '0': [1, 2] } });
  });
});

/** A tab's sessionStorage, in memory. */
class MemoryStore implements IStore {
  items = new Map<string, string>();
  writes = 0;
  getItem(key: string): string | null {
    return this.items.has(key) ? (this.items.get(key) as string) : null;
  }
  setItem(key: string, value: string): void {
    this.writes++;
    this.items.set(key, value);
  }
  removeItem(key: string): void {
    this.items.delete(key);
  }
}

describe('what the page holds survives a reload (held_store.ts)', () => {
  it('a new page of the tab starts from what the last one held, per notebook', () => {
    const tab = new MemoryStore();
    const first = new HeldOutput(new HeldStore(tab, storeKey('a.ipynb')));
    first.take(stream({ ddp_magic: { pool: 'a1', upto: { '0': [10, 0], '1': [12, 3] } } }));
    first.take(stream({ ddp_magic: { pool: 'a1', upto: { '0': [20, 0] } } }));
    new HeldStore(tab, storeKey('a.ipynb')).flush(); // nothing to write: no harm
    assert.equal(tab.getItem(storeKey('a.ipynb')), null, 'written at the flush, not at each message');
    (first as unknown as { _store: HeldStore })._store.flush(); // the page goes away (pagehide)
    const reloaded = new HeldOutput(new HeldStore(tab, storeKey('a.ipynb')));
    assert.deepEqual(reloaded.all(), [{ type: 'shown', pool: 'a1', upto: { '0': [20, 0], '1': [12, 3] } }]);
    assert.deepEqual(new HeldOutput(new HeldStore(tab, storeKey('b.ipynb'))).all(), [], "another notebook's page held nothing");
  });

  it('writes at most once per FLUSH_MS while lines come, and merges with what another connection wrote', async () => {
    const tab = new MemoryStore();
    const held = new HeldOutput(new HeldStore(tab, storeKey('a.ipynb')));
    for (let i = 1; i <= 50; i++) {
      held.take(stream({ ddp_magic: { pool: 'a1', upto: { '0': [i, 0] } } }));
    }
    const other = new HeldStore(tab, storeKey('a.ipynb'));
    other.put('a1', { '1': [7, 7] });
    other.flush();
    await new Promise(resolve => setTimeout(resolve, FLUSH_MS + 100));
    assert.equal(tab.writes, 2);
    assert.deepEqual(parse(tab.getItem(storeKey('a.ipynb'))).get('a1')?.upto, { '0': [50, 0], '1': [7, 7] });
  });

  it('a reloaded page takes what the background cell it shows again holds (the follow reply)', () => {
    const held = new HeldOutput(new HeldStore(new MemoryStore(), storeKey('a.ipynb')));
    held.take(stream({ ddp_magic: { pool: 'a1', upto: { '0': [10, 0] } } })); // before the reload
    assert.deepEqual(held.takeShown([{ type: 'shown', pool: 'a1', upto: { '0': [30, 4], '1': [25, 0] } }, { pool: 'x' }, 'junk']), ['a1']);
    assert.deepEqual(held.takeShown(null), []);
    assert.deepEqual(held.message('a1').upto, { '0': [30, 4], '1': [25, 0] });
  });

  it('forgets a pool when it ends, and keeps only the newest MAX_POOLS', () => {
    let now = 0;
    const tab = new MemoryStore();
    const store = new HeldStore(tab, storeKey('a.ipynb'), () => ++now);
    const held = new HeldOutput(store);
    for (let i = 0; i < MAX_POOLS + 3; i++) {
      held.take(stream({ ddp_magic: { pool: `p${i}`, upto: { '0': [1, 0] } } }));
      store.flush();
    }
    const kept = [...parse(tab.getItem(storeKey('a.ipynb'))).keys()].sort();
    assert.equal(kept.length, MAX_POOLS);
    assert.ok(!kept.includes('p0') && kept.includes(`p${MAX_POOLS + 2}`), kept.join());
    // the kernel ran p9; its next snapshot has no pool (stopped): forgotten, here and in the tab
    assert.equal(held.heardSnapshot({ type: 'snapshot', pool: { kept_id: 'p9' } }, null), 'p9');
    assert.equal(held.heardSnapshot({ type: 'snapshot', pool: null }, 'p9'), null);
    held.heardSnapshot({ type: 'snapshot', pool: null, kept: [{ id: 'p8', alive: false }, { id: 'p7', alive: true }] }, null);
    store.flush();
    assert.ok(!held.pools.includes('p9') && !held.pools.includes('p8') && held.pools.includes('p7'), held.pools.join());
    const left = parse(tab.getItem(storeKey('a.ipynb')));
    assert.ok(!left.has('p9') && !left.has('p8') && left.has('p7'));
  });

  it('a storage that refuses or holds junk leaves the page as before', () => {
    const full: IStore = { getItem: () => '{not json', setItem: () => { throw new Error('QuotaExceededError'); }, removeItem: () => undefined };
    const held = new HeldOutput(new HeldStore(full, storeKey('a.ipynb')));
    assert.deepEqual(held.all(), []);
    held.take(stream({ ddp_magic: { pool: 'a1', upto: { '0': [3, 0] } } }));
    new HeldStore(full, 'k').flush();
    (held as unknown as { _store: HeldStore })._store.flush(); // throws inside: caught
    assert.deepEqual(held.message('a1').upto, { '0': [3, 0] });
    assert.deepEqual([...parse('{"a":{"upto":{"0":[1,2],"1":[-1,0]},"at":5},"b":null,"c":{"upto":3}}').entries()], [['a', { upto: { '0': [1, 2] }, at: 5 }]]);
    assert.deepEqual(new HeldOutput(new HeldStore(null, 'k')).all(), []);
  });
});

describe('finding ddp_magic while the cell that loads it runs (busy_probe.ts)', () => {
  it('asks every BUSY_PROBE_MS while the cell runs, until the comm is open', async () => {
    let asked = 0;
    let open = false;
    const busy = new BusyProbe(async () => {
      asked++;
      open = asked === 3;
    }, () => open);
    busy.start('m1');
    await new Promise(resolve => setTimeout(resolve, BUSY_PROBE_MS * 6 + 200));
    assert.equal(asked, 3, 'no question once the comm is open');
    assert.ok(mayLoad('%load_ext ddp_magic\n%ddp attach --out job') && mayLoad('%reload_ext ddp_magic') && !mayLoad('%%ddp -n 2\nprint(1)'));
  });

  it('stops when its cell ends, not when another does', async () => {
    let asked = 0;
    const busy = new BusyProbe(async () => void asked++, () => false);
    busy.start('m1');
    busy.stop('other');
    await new Promise(resolve => setTimeout(resolve, BUSY_PROBE_MS * 2 + 100));
    busy.stop('m1');
    const then = asked;
    assert.ok(then >= 1);
    await new Promise(resolve => setTimeout(resolve, BUSY_PROBE_MS * 2 + 100));
    assert.equal(asked, then);
    assert.ok(BUSY_PROBE_TRIES * BUSY_PROBE_MS >= 10000, 'a slow %load_ext on a loaded machine is still found');
  });
});
