/**
 * How numbers, times, rank lists and lines are written: each mirrors its Python home (ddp_magic/ui/status_render.py,
 * ddp_magic/plan/words.py, kernel/jobs/turns.py); tests/labextension/test_model_mirror.py compares them.
 */

import type { IJobSnapshot } from './model';


/**
 * Seconds as the cell's status view writes them (ddp_magic/ui/status_render.py fmt_seconds;
 * tests/labextension/test_model_mirror.py checks the two agree): "<1 ms", "35 ms", "10.09 s", "1 m 05 s", "1 h 02 m".
 */
export function fmtSeconds(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined) {
    return '';
  }
  if (seconds < 0.001) {
    return '<1 ms';
  }
  if (seconds < 1) {
    return `${pyRound(seconds * 1000)} ms`; // Python's f"{x:.0f}": half to even
  }
  if (seconds < 60) {
    return `${pyFixed2(seconds)} s`;
  }
  const total = pyRound(seconds);
  const pad = (n: number) => (n < 10 ? `0${n}` : `${n}`);
  const m = Math.floor(total / 60);
  const sec = total % 60;
  if (m < 60) {
    return `${m} m ${pad(sec)} s`;
  }
  return `${Math.floor(m / 60)} h ${pad(m % 60)} m`;
}

/** A run time as a clock, "0:00:07", "1:02:11": ddp_magic/kernel/jobs/turns.py clock_text (tests/labextension/test_model_mirror.py checks). */
export function clockText(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds));
  const pad = (n: number) => (n < 10 ? `0${n}` : `${n}`);
  return `${Math.floor(s / 3600)}:${pad(Math.floor(s / 60) % 60)}:${pad(s % 60)}`;
}

/** 4120 -> "4,120" (Python's f"{n:,}"). */
function grouped(n: number): string {
  return String(Math.trunc(n)).replace(/\B(?=(\d{3})+(?!\d))/g, ',');
}

/**
 * "background: cell [12] running 1:02:11, step 4,120": turns.py Ticket.text, its clock moved on from the
 * snapshot to ``now`` (ms), so the status bar ticks between snapshots as the cell's own view does.
 */
export function jobText(job: IJobSnapshot, receivedAt: number, now: number): string {
  const head = `${job.background ? 'background: ' : ''}${job.name}`;
  if (job.phase === 'starting') {
    return `${head} starting${job.step === null || job.step === undefined ? '' : `, step ${grouped(job.step)}`}`;
  }
  if (job.elapsed === null || job.elapsed === undefined) {
    return `${head} queued`;
  }
  const clock = clockText(job.elapsed + Math.max(0, now - receivedAt) / 1000);
  const step = job.step === null || job.step === undefined ? '' : `, step ${grouped(job.step)}`;
  return `${head} running ${clock}${step}`;
}

/** Python's round() of a float to an int: halves to even. */
function pyRound(x: number): number {
  const f = Math.floor(x);
  const d = x - f;
  return d > 0.5 || (d === 0.5 && f % 2 === 1) ? f + 1 : f;
}

/**
 * Python's f"{x:.2f}". toFixed rounds the exact binary value too, and differs only on exact ties
 * (x a multiple of 1/8, e.g. 0.125), where Python rounds half to even and toFixed up.
 */
function pyFixed2(x: number): string {
  if (Number.isInteger(x * 8) && !Number.isInteger(x * 100)) {
    const scaled = x * 100; // exact for multiples of 1/8
    if (scaled - Math.floor(scaled) === 0.5) {
      return (pyRound(scaled) / 100).toFixed(2);
    }
  }
  return x.toFixed(2);
}

/**
 * Python's f"{x:.{d}f}" (the cell chart's axis labels, metrics_chart.tick_labels): toFixed rounds the exact binary
 * value as Python does, except on an exact tie (0.125 to 2 places), where Python rounds half to even ("0.12") and
 * toFixed up ("0.13"). A tie's exact decimal expansion is short, so toFixed with more places shows it whole.
 */
export function pyFixed(x: number, d: number): string {
  const exact = Math.abs(x).toFixed(Math.min(100, d + 30));
  const dot = exact.indexOf('.');
  const tail = exact.slice(dot + 1 + d);
  const kept = exact.slice(0, dot + 1 + d).replace(/\.$/, '');
  const last = Number(kept[kept.length - 1]);
  if (/^50*$/.test(tail) && last % 2 === 0) {
    return `${x < 0 ? '-' : ''}${kept}`; // a tie, its kept digit even: Python leaves it, toFixed would round up
  }
  return x.toFixed(d);
}

export function formatBytes(n: number | null | undefined): string {
  if (n === null || n === undefined) {
    return '';
  }
  const units: Array<[string, number]> = [
    ['GiB', 2 ** 30],
    ['MiB', 2 ** 20],
    ['KiB', 2 ** 10]
  ];
  for (const [unit, size] of units) {
    if (n >= size) {
      return `${(n / size).toFixed(1)} ${unit}`;
    }
  }
  return `${n} B`;
}


/** "3", "0-3", "0, 2-3": as ddp_magic/plan/words.py rank_list (a test compares them). */
export function rankRuns(ranks: number[]): string {
  const runs: number[][] = [];
  for (const r of [...new Set(ranks)].sort((a, b) => a - b)) {
    const last = runs[runs.length - 1];
    if (last && r === last[last.length - 1] + 1) {
      last.push(r);
    } else {
      runs.push([r]);
    }
  }
  return runs.map(run => (run.length > 1 ? `${run[0]}-${run[run.length - 1]}` : `${run[0]}`)).join(', ');
}

/** "rank 1", "ranks 0, 2-3": as ddp_magic/plan/words.py ranks_phrase. */
export function ranksPhrase(ranks: number[]): string {
  const unique = [...new Set(ranks)];
  return unique.length === 1 ? `rank ${unique[0]}` : `ranks ${rankRuns(unique)}`;
}


/**
 * A rank list that stays one short line at 1,024 ranks: ranksPhrase up to ``runs`` runs ("rank 517", "ranks 3, 9-12"),
 * past that the count and the first runs ("37 ranks: 3, 9, 11-14, …").
 */
export function ranksBrief(ranks: number[], runs = 3): string {
  const unique = [...new Set(ranks)].sort((a, b) => a - b);
  const parts = rankRuns(unique).split(', ');
  return parts.length <= runs ? ranksPhrase(unique) : `${unique.length} ranks: ${parts.slice(0, runs).join(', ')}, …`;
}

/** The prompt a cell ran under, as its tracebacks and %ddp status name it: "In[5]" (or "a cell" without one). */
export function cellName(number: number | string | null | undefined): string {
  const n = typeof number === 'string' ? (number.trim() === '' ? NaN : Number(number)) : number ?? NaN;
  return Number.isInteger(n) ? `In[${n}]` : typeof number === 'string' && number ? `cell ${number}` : 'a cell';
}

// eslint-disable-next-line no-control-regex
const ANSI = /\x1b\[[0-9;?]*[A-Za-z]/g;

export function cleanLine(text: string, limit = 160): string {
  const t = text.replace(ANSI, '').replace(/\t/g, ' ').trim();
  return t.length <= limit ? t : t.slice(0, limit - 1) + '…';
}

/** "1 check", "2 checks": as ddp_magic/plan/words.py plural. */
export function plural(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? '' : 's'}`;
}

