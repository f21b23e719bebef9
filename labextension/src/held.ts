/**
 * What this page holds of each kept pool's output (ddp_magic/kernel/output/kept_output.py, docs/keep.md): every
 * stream message with a kept pool's rank lines carries `metadata.ddp_magic = {pool, upto: {rank: [stdout, stderr]}}`,
 * each rank's spool offsets up to which its lines have been sent, in that message or before it. The page keeps the
 * highest it received per pool and rank, across its kernel's restarts and deaths, and tells each kernel its comm
 * opens to, in the comm's hello: `%ddp attach` replays each rank from there, so a line the dead kernel's last message
 * carried shows once, whether or not that message got out. Only then: a message sent later on a comm whose kernel has
 * just died reaches the next kernel, which knows no such comm. Kept past a reload of the page (held_store.ts), and
 * told what a reloaded page shows again of a background cell (the `follow` reply's `shown`, ui/transcripts.py).
 * Only what the page shows counts: once its kernel restarts or dies, JupyterLab drops the old kernel's cells' futures
 * (its `_clearKernelState`), so a message that kernel sent later reaches the page but no cell; its marks are not
 * taken (`kernelGone`, `fromKernel`), or `%ddp attach` would replay after lines the page never showed.
 * Pure: no JupyterLab.
 */
import type { HeldStore, Upto } from './held_store';

export type { Upto };

/** The comm message that says it (ddp_magic/kernel/keep/front.py). */
export interface IShownMsg {
  type: 'shown';
  pool: string;
  upto: Upto;
}

/** The kept pool and offsets a message carries, or null when it carries none. */
export function marksOf(msg: { header: { msg_type: string }; metadata?: unknown }): { pool: string; upto: Upto } | null {
  if (msg.header.msg_type !== 'stream' || !msg.metadata || typeof msg.metadata !== 'object') {
    return null;
  }
  const meta = (msg.metadata as Record<string, unknown>)['ddp_magic'] as { pool?: unknown; upto?: unknown } | undefined;
  if (!meta || typeof meta.pool !== 'string' || !meta.upto || typeof meta.upto !== 'object') {
    return null;
  }
  const upto: Upto = {};
  for (const [rank, pair] of Object.entries(meta.upto as Record<string, unknown>)) {
    if (Array.isArray(pair) && pair.length === 2 && pair.every(n => typeof n === 'number' && n >= 0)) {
      upto[rank] = [pair[0], pair[1]];
    }
  }
  return { pool: meta.pool, upto };
}

/** Each pool's highest offsets per rank and stream. */
export class HeldOutput {
  /** `store`: where they outlive a reload of the page; what an earlier page of the tab held is read from it now. */
  constructor(store: HeldStore | null = null) {
    this._store = store;
    for (const [pool, upto] of store ? store.load() : []) {
      this._pools.set(pool, upto);
    }
  }

  /**
   * An iopub message came from the kernel session `session` (its header's): whether a cell can still show it, i.e.
   * that session's kernel has not restarted or died since. The latest session heard is the one `kernelGone` ends.
   */
  fromKernel(session: string): boolean {
    if (this._gone.has(session)) {
      return false;
    }
    this._session = session;
    return true;
  }

  /** The page's kernel restarts or died: what its session sends from now on reaches no cell. */
  kernelGone(): void {
    if (this._session) {
      this._gone.add(this._session);
      this._session = '';
    }
  }

  /** Take a message's marks in (one a cell shows); the pool whose offsets grew, or null. */
  take(msg: { header: { msg_type: string; session?: string }; metadata?: unknown }): string | null {
    if (msg.header.session !== undefined && !this.fromKernel(msg.header.session)) {
      return null;
    }
    const marks = marksOf(msg);
    return marks ? this._grow(marks.pool, marks.upto) : null;
  }

  /**
   * What a `follow` reply says the background cell a reloaded page shows again holds (a list of `shown` messages,
   * ui/transcripts.py): the page now shows those lines. The pools whose offsets grew.
   */
  takeShown(shown: unknown): string[] {
    const grown: string[] = [];
    for (const said of Array.isArray(shown) ? shown : []) {
      const marks = marksOf({ header: { msg_type: 'stream' }, metadata: { ddp_magic: said } });
      const pool = marks ? this._grow(marks.pool, marks.upto) : null;
      if (pool) {
        grown.push(pool);
      }
    }
    return grown;
  }

  /** A pool that ended (or is no longer kept): nothing to tell a next kernel of it. */
  forget(pool: string): void {
    this._pools.delete(pool);
    this._store?.forget(pool);
  }

  /**
   * A snapshot came (ddp_magic/ui/labsnap.py): a kept pool that ended is forgotten, and so is the one this kernel ran
   * (`before`) once it runs it no more (stopped, no longer kept). The kept pool the kernel runs now, or null.
   */
  heardSnapshot(snapshot: unknown, before: string | null): string | null {
    const snap = (snapshot && typeof snapshot === 'object' ? snapshot : {}) as {
      pool?: { kept_id?: unknown } | null;
      kept?: unknown;
    };
    const now = snap.pool && typeof snap.pool.kept_id === 'string' ? snap.pool.kept_id : null;
    if (before !== null && before !== now) {
      this.forget(before);
    }
    for (const pool of Array.isArray(snap.kept) ? snap.kept : []) {
      if (pool && typeof pool.id === 'string' && pool.alive === false) {
        this.forget(pool.id); // its lease ended: no kernel will replay it
      }
    }
    return now;
  }

  /** The pools held (what a test reads). */
  get pools(): string[] {
    return [...this._pools.keys()];
  }

  /** What to tell a kernel of one pool. */
  message(pool: string): IShownMsg {
    return { type: 'shown', pool, upto: { ...(this._pools.get(pool) ?? {}) } };
  }

  /** What to tell a kernel whose comm just opened: every pool. */
  all(): IShownMsg[] {
    return [...this._pools.keys()].map(pool => this.message(pool));
  }

  private _grow(pool: string, upto: Upto): string | null {
    const held = this._pools.get(pool) ?? {};
    let grew = false;
    for (const [rank, [out, err]] of Object.entries(upto)) {
      const had = held[rank] ?? [0, 0];
      if (out > had[0] || err > had[1]) {
        held[rank] = [Math.max(out, had[0]), Math.max(err, had[1])];
        grew = true;
      }
    }
    this._pools.set(pool, held);
    if (grew) {
      this._store?.put(pool, held);
    }
    return grew ? pool : null;
  }

  private _store: HeldStore | null;
  private _session = ''; // the kernel session heard last
  private _gone = new Set<string>(); // sessions of kernels restarted or dead: their messages reach no cell
  private _pools = new Map<string, Upto>();
}
