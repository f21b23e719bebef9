/**
 * What a page holds of each kept pool's output (held.ts), kept past a reload of the page: the browser tab's
 * sessionStorage, one key per notebook. A reload empties the page's memory, and with it the offsets the next kernel
 * needs to replay each rank after the last line this page received (docs/keep.md, "Shown exactly once"); the tab's
 * storage survives the reload and is gone with the tab, as the page's output is. A page reloaded while its kernel
 * lives then learns the rest from the kernel's copy of the background cell it shows again (ui/transcripts.py: the
 * `follow` reply's `shown`), a page reloaded after the kernel died shows what the notebook file kept.
 *
 * Bounded: at most MAX_POOLS pools a notebook, the ones updated last; a pool is dropped when it ends (`forget`).
 * Writes are coalesced (at most one per FLUSH_MS) and flushed when the page goes away (`pagehide`). A storage that
 * refuses (a quota, a private window) leaves the page as before: its word lives in memory only. Pure: no JupyterLab.
 */

/** Per rank (its number as a string), the [stdout, stderr] offsets received. */
export type Upto = Record<string, [number, number]>;

/** The pools kept per notebook: a page that ran many kept pools keeps the latest. */
export const MAX_POOLS = 8;
/** The most often the store is written while kept lines come. */
export const FLUSH_MS = 250;

/** The part of the Web Storage API used here (a test passes a Map-backed one). */
export interface IStore {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
  removeItem(key: string): void;
}

/** One pool as stored: its offsets and when they last grew (ms, for the bound). */
interface IEntry {
  upto: Upto;
  at: number;
}

/** The key of a notebook's held offsets in the tab's storage. */
export function storeKey(notebook: string): string {
  return `ddp-magic:held:${notebook}`;
}

/** The pools a stored value holds; malformed parts are dropped (an older page's format, a hand edit). */
export function parse(raw: string | null): Map<string, IEntry> {
  const out = new Map<string, IEntry>();
  let data: unknown;
  try {
    data = raw ? JSON.parse(raw) : null;
  } catch (e) {
    return out;
  }
  if (!data || typeof data !== 'object') {
    return out;
  }
  for (const [pool, entry] of Object.entries(data as Record<string, unknown>)) {
    const e = entry as { upto?: unknown; at?: unknown } | null;
    if (!e || typeof e !== 'object' || !e.upto || typeof e.upto !== 'object') {
      continue;
    }
    const upto: Upto = {};
    for (const [rank, pair] of Object.entries(e.upto as Record<string, unknown>)) {
      if (Array.isArray(pair) && pair.length === 2 && pair.every(n => typeof n === 'number' && n >= 0)) {
        upto[rank] = [pair[0], pair[1]];
      }
    }
    out.set(pool, { upto, at: typeof e.at === 'number' ? e.at : 0 });
  }
  return out;
}

/** The newest MAX_POOLS pools, serialized. */
export function serialize(pools: Map<string, IEntry>): string {
  const newest = [...pools.entries()].sort((a, b) => b[1].at - a[1].at).slice(0, MAX_POOLS);
  return JSON.stringify(Object.fromEntries(newest));
}

/** One notebook's held offsets in a storage: read at the page's start, written as they grow. */
export class HeldStore {
  constructor(store: IStore | null, key: string, now: () => number = Date.now) {
    this._store = store;
    this._key = key;
    this._now = now;
  }

  /** What an earlier page of this tab held (before a reload). */
  load(): Map<string, Upto> {
    const out = new Map<string, Upto>();
    for (const [pool, entry] of this._read()) {
      out.set(pool, entry.upto);
    }
    return out;
  }

  /** A pool's offsets grew: written at the next flush. */
  put(pool: string, upto: Upto): void {
    this._dirty.set(pool, { ...upto });
    this._schedule();
  }

  /** A pool that ended: nothing to tell a next kernel of it. */
  forget(pool: string): void {
    this._dirty.delete(pool);
    this._gone.add(pool);
    this._schedule();
  }

  /** Write what changed now (the page is going away, or the timer ran). */
  flush(): void {
    if (this._timer !== null) {
      clearTimeout(this._timer);
      this._timer = null;
    }
    if (!this._store || (!this._dirty.size && !this._gone.size)) {
      return;
    }
    const pools = this._read(); // another connection of this tab may have written the same key: merge, never overwrite
    const at = this._now();
    for (const [pool, upto] of this._dirty) {
      const had = pools.get(pool)?.upto ?? {};
      const merged: Upto = { ...had };
      for (const [rank, [out, err]] of Object.entries(upto)) {
        const was = had[rank] ?? [0, 0];
        merged[rank] = [Math.max(out, was[0]), Math.max(err, was[1])];
      }
      pools.set(pool, { upto: merged, at });
    }
    for (const pool of this._gone) {
      pools.delete(pool);
    }
    this._dirty.clear();
    this._gone.clear();
    try {
      if (pools.size) {
        this._store.setItem(this._key, serialize(pools));
      } else {
        this._store.removeItem(this._key);
      }
    } catch (e) {
      // a full or refused storage: the page's word lives in memory only, as before (docs/keep.md)
    }
  }

  private _read(): Map<string, IEntry> {
    try {
      return this._store ? parse(this._store.getItem(this._key)) : new Map();
    } catch (e) {
      return new Map();
    }
  }

  private _schedule(): void {
    if (this._timer === null && this._store) {
      this._timer = setTimeout(() => this.flush(), FLUSH_MS);
    }
  }

  private _store: IStore | null;
  private _key: string;
  private _now: () => number;
  private _dirty = new Map<string, Upto>();
  private _gone = new Set<string>();
  private _timer: ReturnType<typeof setTimeout> | null = null;
}

/** The tab's sessionStorage, or null where the page may not use it. */
export function tabStorage(): IStore | null {
  try {
    return (globalThis as { sessionStorage?: IStore }).sessionStorage ?? null;
  } catch (e) {
    return null;
  }
}
