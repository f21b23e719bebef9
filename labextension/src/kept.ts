/**
 * A kept pool of this notebook as the DDP panel says it (pure: no JupyterLab import; src/__tests__/kept.test.ts):
 * its facts from the kernel (ddp_magic/kernel/keep/attach.py Found.fields), the lines of its row, Attach's code.
 */
import type * as M from './model';

/** One kept pool of this notebook, as the kernel says it (ddp_magic/kernel/keep/attach.py Found.fields). */
export interface IKeptPool {
  id: string;
  text: string; // the lines `%ddp attach --list` prints: the row's tooltip
  alive: boolean; // false: its lease ended; attaching says why
  notebook?: string; // its file name
  ranks?: string; // "2 ranks"
  job?: string; // "job running on ranks 0-1", "idle"
  kernel?: string; // "no kernel since 04:28", "attached to pid 4242 since 04:30"
  lease?: string; // "ends at most at 06:14", "ends at 04:58 unless a kernel attaches"
  why?: string; // an ended pool: "ended: …"
}

/** What a snapshot carries besides the pool: the kept pools (an empty list while a pool runs here). */
export function keptPools(snapshot: M.ISnapshotMsg | null): IKeptPool[] {
  const kept = snapshot ? (snapshot as M.ISnapshotMsg & { kept?: IKeptPool[] }).kept : undefined;
  return Array.isArray(kept) ? kept : [];
}

/** The code the Attach action runs: the magic (loaded first if it is not), so the job's output lands in that cell. */
export function attachCode(pool: IKeptPool, loaded = true): string {
  const attach = `%ddp attach ${pool.id} --out job`; // the id first: argparse takes no positional after an option here
  return loaded ? attach : `%load_ext ddp_magic\n${attach}`;
}

/** A kept pool's row: its facts, each once, in short lines (its id first; the button in a column of its own). */
export function keptLines(pool: IKeptPool): string[] {
  const head = [pool.id, pool.notebook, pool.ranks].filter(Boolean).join(' · ');
  if (!pool.alive || pool.why) {
    return [head, pool.why || 'ended'].filter(Boolean);
  }
  return [head, pool.job || '', [pool.kernel, pool.lease].filter(Boolean).join(' · ')].filter(Boolean);
}

/** The note's words: before an attach, and once a kernel attached the pool in cell [N]. */
export function keptNote(pool: string, name: string, continuedIn: number | null): string {
  return continuedIn === null
    ? `kept: ${name}'s job runs on in the kept pool ${pool} without a kernel; attach it to follow (the DDP panel's Attach, or %ddp attach --out job)`
    : `kept: ${name}'s job ran on in the kept pool ${pool}; its output is continued in cell [${continuedIn}]`;
}
