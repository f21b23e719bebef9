/**
 * The panel's ranks at scale (more than GROUPED_ABOVE): grouped by node, each group's states in one line
 * ("n2 · 510 running · rank 517 failed"), laid out as a flat list of fixed-height items that a virtualized list shows
 * a window of (only the visible rows are in the DOM, so 1,024 ranks cost what 30 do).
 *
 * Pure functions of the rank rows (ranks.ts rankRows), unit-tested in node (src/__tests__/groups.test.ts).
 */
import type { IRankRow } from './ranks';
import { ranksBrief } from './format';

/** Up to this many ranks the panel keeps its table of every rank (test_views_agree reads it); above, it groups. */
export const GROUPED_ABOVE = 32;

/** A state named rank by rank in a group's line while it holds at most this many ranks ("ranks 3, 9 aborted"). */
const NAMED_AT_MOST = 3;

export interface IRankGroup {
  /** The node's name (a Slurm pool's n2), or '' on one host. */
  node: string;
  /** What the group's line calls it: the node, or "this host". */
  label: string;
  ranks: number[];
  /** "n2 · 510 running · rank 517 failed": the most common state counted first, the odd ones named. */
  text: string;
  /** A rank of it failed or died (or is the last failed cell's root cause): the line is drawn as a failure. */
  bad: boolean;
}

/** A row of the virtualized list: a group's line, or one rank under it. */
export type ListItem = { kind: 'group'; group: IRankGroup; folded: boolean } | { kind: 'rank'; row: IRankRow };

/** "In[5]: rank 200 raised": the last failed cell's word on the ranks it names that are ready again (lastNote "In[5]: raised"). */
function noteText(note: string, ranks: number[]): string {
  const i = note.indexOf(': ');
  return i > 0 ? `${note.slice(0, i)}: ${ranksBrief(ranks)} ${note.slice(i + 2)}` : `${ranksBrief(ranks)} ${note}`;
}

/**
 * One group's line: "n2 · 510 running · rank 517 failed · 12 starting" (the failures right after the main count),
 * and once the pool recovered "n2 · 512 ready · In[5]: rank 517 raised".
 */
export function groupText(label: string, rows: IRankRow[]): string {
  const byState = new Map<string, IRankRow[]>();
  const byNote = new Map<string, number[]>();
  for (const r of rows) {
    byState.set(r.state, [...(byState.get(r.state) || []), r]);
    if (r.lastNote && r.stateClass !== 'bad') {
      byNote.set(r.lastNote, [...(byNote.get(r.lastNote) || []), r.rank]);
    }
  }
  const bad = (rs: IRankRow[]) => rs.some(r => r.stateClass === 'bad');
  const parts = [...byState.entries()].sort((a, b) => b[1].length - a[1].length || (a[0] < b[0] ? -1 : 1));
  const [main, ...rest] = parts;
  rest.sort((a, b) => Number(bad(b[1])) - Number(bad(a[1]))); // stable: by size within the failures and the others
  const words = rest.map(([state, rs]) =>
    rs.length <= NAMED_AT_MOST || bad(rs) ? `${ranksBrief(rs.map(r => r.rank))} ${state}` : `${rs.length} ${state}`
  );
  const notes = [...byNote.entries()].map(([note, ranks]) => noteText(note, ranks));
  return [label, ...(main ? [`${main[1].length} ${main[0]}`] : []), ...words, ...notes].join(' · ');
}

/** The rows grouped by node (in the order of their first rank), each with its line. */
export function rankGroups(rows: IRankRow[]): IRankGroup[] {
  const byNode = new Map<string, IRankRow[]>();
  for (const r of [...rows].sort((a, b) => a.rank - b.rank)) {
    byNode.set(r.node, [...(byNode.get(r.node) || []), r]);
  }
  return [...byNode.entries()].map(([node, rs]) => {
    const label = node || 'this host';
    return {
      node,
      label,
      ranks: rs.map(r => r.rank),
      text: groupText(label, rs),
      bad: rs.some(r => r.stateClass === 'bad' || r.lastCause === 'root')
    };
  });
}

/** The list the virtualized view scrolls through: each group's line, then its ranks unless it is folded. */
export function listItems(rows: IRankRow[], folded: ReadonlySet<string>): ListItem[] {
  const byRank = new Map(rows.map(r => [r.rank, r]));
  const out: ListItem[] = [];
  for (const g of rankGroups(rows)) {
    const fold = folded.has(g.node);
    out.push({ kind: 'group', group: g, folded: fold });
    if (!fold) {
      for (const rank of g.ranks) {
        out.push({ kind: 'rank', row: byRank.get(rank) as IRankRow });
      }
    }
  }
  return out;
}

/**
 * Which items a scroller of ``height`` px, scrolled to ``top``, shows with rows of ``rowHeight`` px: [first, end)
 * with ``overscan`` rows either side (so a fast scroll does not show a blank edge before the next frame).
 */
export function visibleRange(count: number, top: number, height: number, rowHeight: number, overscan = 4): [number, number] {
  const first = Math.max(0, Math.floor(top / rowHeight) - overscan);
  const end = Math.min(count, Math.ceil((top + Math.max(height, rowHeight)) / rowHeight) + overscan);
  return [Math.min(first, end), end];
}
