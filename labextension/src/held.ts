/**
 * What this page holds of each kept pool's output (ddp_magic/kernel/output/kept_output.py, docs/keep.md): every
 * stream message with a kept pool's rank lines carries `metadata.ddp_magic = {pool, upto: {rank: [stdout, stderr]}}`,
 * each rank's spool offsets up to which its lines have been sent, in that message or before it. The page keeps the
 * highest it received per pool and rank, across its kernel's restarts and deaths, and tells each kernel its comm
 * opens to, in the comm's hello: `%ddp attach` replays each rank from there, so a line the dead kernel's last message
 * carried shows once, whether or not that message got out. Only then: a message sent later on a comm whose kernel has
 * just died reaches the next kernel, which knows no such comm. Pure: no JupyterLab.
 */

/** Per rank (its number as a string), the [stdout, stderr] offsets received. */
export type Upto = Record<string, [number, number]>;

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
  /** Take a message's marks in; the pool whose offsets grew, or null. */
  take(msg: { header: { msg_type: string }; metadata?: unknown }): string | null {
    const marks = marksOf(msg);
    if (!marks) {
      return null;
    }
    const held = this._pools.get(marks.pool) ?? {};
    let grew = false;
    for (const [rank, [out, err]] of Object.entries(marks.upto)) {
      const had = held[rank] ?? [0, 0];
      if (out > had[0] || err > had[1]) {
        held[rank] = [Math.max(out, had[0]), Math.max(err, had[1])];
        grew = true;
      }
    }
    this._pools.set(marks.pool, held);
    return grew ? marks.pool : null;
  }

  /** What to tell a kernel of one pool. */
  message(pool: string): IShownMsg {
    return { type: 'shown', pool, upto: { ...(this._pools.get(pool) ?? {}) } };
  }

  /** What to tell a kernel whose comm just opened: every pool. */
  all(): IShownMsg[] {
    return [...this._pools.keys()].map(pool => this.message(pool));
  }

  private _pools = new Map<string, Upto>();
}
