/**
 * Find ddp_magic while the cell that loads it still runs. A cell with both `%load_ext ddp_magic` and
 * `%ddp attach` (what a user pastes after a kernel restart) attaches before the cell ends, and the attach replays
 * each kept rank from what the page says it holds (the comm's hello, held.ts): a comm that opens only after the
 * cell is too late. So while a cell whose code names ddp_magic runs, the connection asks over a kernel subshell
 * (answered while the cell runs) whether the target is there, every BUSY_PROBE_MS, at most BUSY_PROBE_TRIES times,
 * until the comm opens or the cell ends; the attach waits a moment for the hello (ddp_magic/ui/lab_hello.py).
 * A question costs the kernel a comm_info reply on the subshell's thread. Kernels without subshells are not asked:
 * there the question would wait for the cell. Pure: no JupyterLab.
 */

/** How long a comm_info question over a subshell may go unanswered before the next one may be asked. */
export const PROBE_TIMEOUT_MS = 10000;

/**
 * What `question` answers, or false when it has not answered within `ms`. The timer goes with the answer, and a
 * late rejection is caught: neither may surface as an uncaught error in the page's console.
 */
export function answeredWithin(question: Promise<boolean>, ms: number): Promise<boolean> {
  return new Promise<boolean>((resolve, reject) => {
    const timer = setTimeout(() => resolve(false), ms);
    question.then(
      found => {
        clearTimeout(timer);
        resolve(found);
      },
      (e: unknown) => {
        clearTimeout(timer);
        reject(e);
      }
    );
  });
}

/** Between two questions while such a cell runs. */
export const BUSY_PROBE_MS = 250;
/** The most questions for one cell (BUSY_PROBE_MS apart: a slow `%load_ext` on a loaded machine has 15 s). */
export const BUSY_PROBE_TRIES = 60;

/** Whether a cell's code may load ddp_magic (`%load_ext ddp_magic`, `%reload_ext ddp_magic`, `import ddp_magic`). */
export function mayLoad(code: string): boolean {
  return /\bddp_magic\b/.test(code);
}

/** Asks `probe` again and again while one such cell runs; one cell at a time (the kernel runs one). */
export class BusyProbe {
  /** `probe`: one question over a subshell (it opens the comm when the answer is yes); `done`: the comm is open. */
  constructor(probe: () => Promise<void>, done: () => boolean) {
    this._probe = probe;
    this._done = done;
  }

  /** The cell whose request is `msgId` started (its execute_input came). */
  start(msgId: string): void {
    this.stop();
    this._cell = msgId;
    this._tries = 0;
    this._next(BUSY_PROBE_MS);
  }

  /** The cell ended (`msgId`), or the kernel went: no more questions. */
  stop(msgId?: string): void {
    if (msgId !== undefined && msgId !== this._cell) {
      return;
    }
    if (this._timer !== null) {
      clearTimeout(this._timer);
    }
    this._timer = null;
    this._cell = null;
  }

  /** The questions asked for the running cell (what a test reads). */
  get tries(): number {
    return this._tries;
  }

  private _next(ms: number): void {
    this._timer = setTimeout(() => void this._ask(), ms);
  }

  private async _ask(): Promise<void> {
    this._timer = null;
    const cell = this._cell;
    if (cell === null || this._done() || this._tries >= BUSY_PROBE_TRIES) {
      this._cell = null;
      return;
    }
    this._tries++;
    try {
      await this._probe();
    } catch (e) {
      // the kernel went away: its status change stops us
    }
    if (this._cell === cell && this._timer === null) {
      this._next(BUSY_PROBE_MS);
    }
  }

  private _probe: () => Promise<void>;
  private _done: () => boolean;
  private _cell: string | null = null;
  private _tries = 0;
  private _timer: ReturnType<typeof setTimeout> | null = null;
}
