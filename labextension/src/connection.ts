/**
 * One notebook's link to its kernel's pool: the "ddp_magic" comm, the kernel's
 * status, and the requests in flight. Holds no UI; the status bar and the panel
 * listen to `changed` and render `state` through the pure functions of format.ts, ranks.ts, state.ts, commands.ts.
 *
 * Finding out whether the kernel has ddp_magic loaded costs nothing visible: a
 * comm_info request for our target (the IPython extension keeps one comm of
 * that target registered while it is loaded), sent when a kernel appears, when
 * the panel is shown, and after a cell whose code mentions "ddp" ran, until the
 * comm is open. Kernels without ddp_magic never see a comm_open from us, so they
 * log nothing.
 *
 * After such a cell the next one may already be running (Run All): a request on
 * the main shell would wait for it. When the kernel has subshells (ipykernel ≥ 7)
 * the comm_info request goes over a subshell of our own, answered at once, and
 * the comm itself is opened over JupyterLab's per-target comm subshell (its
 * default since 4.4), so even the first %%ddp cell is followed live. The probe
 * subshell is deleted once the comm is open. While a cell that names ddp_magic runs, the question is asked again and
 * again (busy_probe.ts): that cell's own `%ddp attach` then hears the hello, with what the page holds of kept pools
 * (held.ts; kept past a reload of the page in the tab's storage, held_store.ts).
 */
import { ISessionContext } from '@jupyterlab/apputils';
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { UUID } from '@lumino/coreutils';
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { answeredWithin, BusyProbe, mayLoad, PROBE_TIMEOUT_MS } from './busy_probe';
import { askKeptPools } from './kept_probe';
import type { IKeptPool } from './kept';
import { TargetQuestion } from './target_question';
import { HeldOutput } from './held';
import { HeldStore, storeKey, tabStorage } from './held_store';
import { COMM_TARGET, type ICellOutputMsg, type IFollowReply, type IReplyMsg, type IUIState, type KernelStatus, type Op, PROTOCOL } from './model';
import { applyMessage, disconnected, initialState, withKernelStatus, withRequest } from './state';

export class PoolConnection implements IDisposable {
  constructor(sessionContext: ISessionContext, version: string) {
    this._session = sessionContext;
    this._version = version;
    sessionContext.statusChanged.connect(this._onStatus, this);
    sessionContext.kernelChanged.connect(this._onKernelChanged, this);
    sessionContext.iopubMessage.connect(this._onIopub, this);
    this._store = new HeldStore(tabStorage(), storeKey(sessionContext.path));
    this._held = new HeldOutput(this._store); // what this tab's page held before a reload (docs/keep.md)
    window.addEventListener('pagehide', this._flush);
    sessionContext.ready.then(
      () => {
        this._onStatus(sessionContext, sessionContext.session?.kernel?.status ?? 'unknown');
        void this.probe();
      },
      () => undefined // a notebook closed before its session was ready: there is nothing to follow
    );
  }

  /** The ids of the comms this connection opened, oldest first (what a test tells apart from other front ends' comms). */
  get commIds(): readonly string[] {
    return this._commIds;
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** A followed background cell's next output message (rebind.ts applies it). */
  get cellOutput(): ISignal<this, ICellOutputMsg> {
    return this._cellOutput;
  }

  /** This page's connection to the kernel (the session of the execute requests it sends); '' without a kernel. */
  get clientId(): string {
    return this._kernel()?.clientId ?? '';
  }

  get state(): IUIState {
    return this._state;
  }

  /** This notebook's kept pools, as a kernel without ddp_magic loaded lists them (kept_probe.ts); none once loaded. */
  get keptWithoutMagic(): IKeptPool[] {
    return this._comm ? [] : this._keptOffline;
  }

  get sessionContext(): ISessionContext {
    return this._session;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._busy.stop();
    this._store.flush();
    window.removeEventListener('pagehide', this._flush);
    void this._question.drop(this._kernel());
    this._closeComm();
    this._rejectAll('the notebook was closed');
    Signal.clearData(this);
  }

  /**
   * Ask the kernel whether ddp_magic is loaded; open the comm if it is.
   * overSubshell: ask over a kernel subshell (answered while a cell runs) when the kernel has them.
   */
  async probe(overSubshell = false): Promise<void> {
    const kernel = this._kernel();
    if (!kernel || this._comm || this._disposed) {
      return;
    }
    // A question on the main shell waits for the running cells (Run All: all of them); one over a
    // subshell is answered at once. So one of each may be in flight: a main-shell question asked
    // before Run All must not hold back the subshell question asked after its %load_ext cell.
    const way: 'main' | 'sub' = overSubshell && kernel.supportsSubshells ? 'sub' : 'main';
    if (this._asking[way]) {
      this._reprobe = this._reprobe === null ? overSubshell : this._reprobe || overSubshell; // ask again once answered
      return;
    }
    this._asking[way] = true;
    const round = this._probeRound;
    try {
      const asked = this._question.hasTarget(kernel, way === 'sub');
      // a subshell answers at once; one that does not (the kernel restarted meanwhile) must not block the next question
      const found = way === 'sub' ? await answeredWithin(asked, PROBE_TIMEOUT_MS) : await asked;
      if (found && round === this._probeRound && kernel === this._kernel() && !this._comm && !this._disposed) {
        this._openComm(kernel);
        void this._question.drop(this._kernel());
      } else if (!found && round === this._probeRound && way === 'main') {
        void this._listKept(kernel, round); // not loaded: the kept pools this notebook can attach, all the same
      }
    } catch (e) {
      // a kernel that went away while we asked: the next status change probes again
    } finally {
      if (round === this._probeRound) {
        this._asking[way] = false;
      }
    }
    const again = this._reprobe;
    this._reprobe = null;
    if (again !== null && !this._comm && round === this._probeRound) {
      await this.probe(again);
    }
  }

  /**
   * Send a request to the kernel. Resolves with the kernel's reply; rejects when
   * the comm closes or the kernel restarts before it answers. Check
   * commandPolicy first: this does not refuse anything itself.
   */
  request(op: Op, args: Record<string, unknown> = {}): Promise<IReplyMsg> {
    const comm = this._comm;
    if (!comm) {
      return Promise.reject(new Error('ddp_magic is not connected to this kernel'));
    }
    const id = UUID.uuid4();
    const waits = this._state.kernelStatus === 'busy';
    this._set(withRequest(this._state, { id, op, sentAt: Date.now(), waits }));
    return new Promise<IReplyMsg>((resolve, reject) => {
      this._waiters.set(id, { resolve, reject });
      try {
        comm.send({ type: 'request', id, op, args } as any);
      } catch (e) {
        this._waiters.delete(id);
        this._set({ ...this._state, pending: this._state.pending.filter(p => p.id !== id) });
        reject(e);
      }
    });
  }

  /**
   * Follow a background cell another page ran (ddp_magic/ui/transcripts.py): resolves with its outputs now and their
   * seq; each later message comes as `cellOutput`. Not a command: nothing pending is shown.
   */
  follow(msgId: string): Promise<IFollowReply> {
    const comm = this._comm;
    if (!comm) {
      return Promise.reject(new Error('ddp_magic is not connected to this kernel'));
    }
    const id = UUID.uuid4();
    return new Promise<IFollowReply>((resolve, reject) => {
      // the page shows the cell's outputs once the reply is applied: its kept lines count as received (held.ts)
      const took = (r: IReplyMsg) => (this._held.takeShown((r as unknown as IFollowReply).shown), resolve(r as unknown as IFollowReply));
      this._waiters.set(id, { resolve: took, reject });
      comm.send({ type: 'request', id, op: 'follow', args: { msg_id: msgId } } as any);
    });
  }

  /** Interrupt the kernel: the running %%ddp cell interrupts every rank (KeyboardInterrupt in each). */
  async interrupt(): Promise<void> {
    const kernel = this._kernel();
    if (kernel) {
      await this._sayInterrupting(); // a cell it takes out of the queue names the panel, not Ctrl-C (kernel/interrupts.py)
      await kernel.interrupt();
    }
  }

  // ---------------------------------------------------------------- internals
  /** Tell the kernel the next interrupt is the panel's; at most 1 s (a kernel without subshells hears it after the cell). */
  private _sayInterrupting(): Promise<void> {
    const comm = this._comm;
    if (!comm) {
      return Promise.resolve();
    }
    const id = UUID.uuid4();
    return new Promise<void>(resolve => {
      const done = () => {
        window.clearTimeout(timer);
        this._noted.delete(id);
        resolve();
      };
      const timer = window.setTimeout(done, 1000);
      this._noted.set(id, done);
      try {
        comm.send({ type: 'interrupting', id } as any);
      } catch (e) {
        done();
      }
    });
  }

  private _kernel(): Kernel.IKernelConnection | null {
    return this._session.session?.kernel ?? null;
  }

  private _set(state: IUIState): void {
    if (state !== this._state) {
      this._state = state;
      this._changed.emit();
    }
  }

  private _openComm(kernel: Kernel.IKernelConnection): void {
    const comm = kernel.createComm(COMM_TARGET);
    this._comm = comm;
    this._commIds.push(comm.commId);
    comm.onMsg = msg => {
      if (this._comm !== comm) {
        return;
      }
      const data = msg.content.data as unknown;
      const kind = data && typeof data === 'object' ? (data as { type?: string; op?: string }) : {};
      if (kind.type === 'interrupt_noted') {
        this._noted.get((data as { id: string }).id)?.();
        return;
      }
      if (kind.type === 'cell_output') {
        const out = data as ICellOutputMsg & { metadata?: unknown };
        this._held.take({ header: { msg_type: out.msg_type }, metadata: out.metadata }); // its kept lines' marks
        this._cellOutput.emit(data as ICellOutputMsg);
        return;
      }
      if (kind.type !== 'reply' || kind.op !== 'follow') {
        this._set(applyMessage(this._state, data, Date.now()));
      }
      if (kind.type === 'snapshot') {
        this._keptHere = this._held.heardSnapshot(data, this._keptHere); // a kept pool that ended is forgotten
      }
      if (data && (data as IReplyMsg).type === 'reply') {
        const reply = data as IReplyMsg;
        const waiter = this._waiters.get(reply.id);
        if (waiter) {
          this._waiters.delete(reply.id);
          waiter.resolve(reply);
        }
      }
    };
    comm.onClose = () => {
      if (this._comm !== comm) {
        return;
      }
      this._comm = null;
      this._rejectAll('ddp_magic closed its connection (the extension was unloaded, or the kernel went away)');
      this._set(disconnected(this._state));
    };
    void this._open(kernel, comm);
  }

  /** Open the comm, over its subshell when JupyterLab sends comms over subshells (so it is handled while a cell runs). */
  private async _open(kernel: Kernel.IKernelConnection, comm: Kernel.IComm): Promise<void> {
    const c = comm as Kernel.IComm & { subshellStarted?: Promise<void>; commsOverSubshells?: string };
    if (kernel.supportsSubshells && c.subshellStarted && c.commsOverSubshells && c.commsOverSubshells !== 'disabled') {
      // before its subshell exists, open() would go to the main shell and wait for the running cell, or for the one
      // Run All starts a moment later (whether one runs cannot be known in time: wait for the subshell always)
      let timer = 0;
      await Promise.race([c.subshellStarted.catch(() => undefined), new Promise(resolve => (timer = window.setTimeout(resolve, 3000)))]);
      window.clearTimeout(timer);
    }
    if (this._comm !== comm || comm.isDisposed || kernel.isDisposed) {
      return;
    }
    try {
      comm.open({ type: 'hello', protocol: PROTOCOL, version: this._version, shown: this._held.all() } as any);
    } catch (e) {
      this._comm = null;
    }
  }

  /** Ask a kernel without ddp_magic for this notebook's kept pools (once per negative answer on the main shell). */
  private async _listKept(kernel: Kernel.IKernelConnection, round: number): Promise<void> {
    let rows: IKeptPool[] | null = null;
    try {
      rows = await askKeptPools(kernel);
    } catch (e) {
      console.debug('ddp_magic: could not list the kept pools', e); // the kernel went away meanwhile
    }
    if (rows && round === this._probeRound && kernel === this._kernel() && !this._comm && !this._disposed) {
      this._keptOffline = rows;
      this._changed.emit();
    }
  }

  private _closeComm(): void {
    const comm = this._comm;
    this._comm = null;
    if (comm && !comm.isDisposed) {
      try {
        comm.close();
      } catch (e) {
        // the kernel is gone already
      }
    }
  }

  private _rejectAll(why: string): void {
    for (const [, w] of this._waiters) {
      w.reject(new Error(why));
    }
    this._waiters.clear();
  }

  private _onKernelChanged(): void {
    this._comm = null; // the old kernel's comm is gone with it
    this._keptOffline = [];
    this._keptHere = null;
    this._busy.stop();
    this._question.forget();
    this._probeRound++;
    this._asking = { main: false, sub: false };
    this._mainBusy = false;
    this._sessionStatus = this._kernel()?.status ?? 'unknown';
    this._rejectAll('the kernel changed');
    this._set(withKernelStatus(disconnected(this._state), this._kernel() ? 'unknown' : 'none'));
    void this.probe();
  }

  /**
   * The kernel's status as the commands need it: "busy" while the main shell runs a cell.
   * JupyterLab's own status also follows subshell requests (our probe, comms over
   * subshells), which can read "idle" in the middle of a running cell.
   */
  private _effective(): KernelStatus {
    const status = (this._kernel() ? this._sessionStatus : 'none') as KernelStatus;
    if (status === 'idle' || status === 'busy') {
      return this._mainBusy ? 'busy' : 'idle';
    }
    return status;
  }

  private _onStatus(_: ISessionContext, status: Kernel.Status): void {
    const before = this._state.kernelStatus;
    this._sessionStatus = status;
    if (status === 'restarting' || status === 'autorestarting' || status === 'dead' || status === 'starting') {
      this._mainBusy = false;
    }
    const next = this._effective();
    if (next === 'restarting' || next === 'autorestarting' || next === 'dead') {
      this._held.kernelGone(); // JupyterLab has dropped its cells' futures (the same tick): its later lines show nowhere
      this._comm = null;
      this._question.forget(); // a restarted kernel has no subshells
      this._probeRound++; // a question in flight is never answered by the new kernel
      this._asking = { main: false, sub: false };
      this._reprobe = null;
      this._keptHere = null;
      this._keptOffline = [];
      this._busy.stop();
      this._rejectAll(`the kernel is ${next === 'dead' ? 'dead' : 'restarting'}`);
    }
    this._set(withKernelStatus(this._state, next));
    if (next === 'idle' && (before === 'restarting' || before === 'autorestarting' || before === 'starting' || before === 'unknown')) {
      void this.probe(); // a kernel that loads ddp_magic from its config has it already
    }
  }

  private _onIopub(_: ISessionContext, msg: KernelMessage.IMessage): void {
    if (!this._held.fromKernel(msg.header.session)) {
      return; // a restarted or dead kernel's late message: JupyterLab shows it in no cell, and nothing here is its
    }
    if ((msg.parent_header as Partial<KernelMessage.IHeader>)?.session === this.clientId) {
      // what this page holds of kept pools' output (the next kernel hears it in the comm's hello): only what it shows,
      // its own cells' lines; another page's cell shows here only when followed (its cell_output messages, above)
      this._held.take(msg);
    }
    const parentHeader = msg.parent_header as Partial<KernelMessage.IHeader> & { subshell_id?: string | null };
    if (msg.header.msg_type === 'status' && parentHeader && parentHeader.msg_type === 'execute_request' && !parentHeader.subshell_id) {
      const busy = (msg.content as KernelMessage.IStatusMsg['content']).execution_state === 'busy';
      if (busy !== this._mainBusy) {
        this._mainBusy = busy;
        this._set(withKernelStatus(this._state, this._effective()));
      }
    }
    if (this._comm) {
      this._ddpCells.clear();
      this._busy.stop();
      return;
    }
    const parent = msg.parent_header as Partial<KernelMessage.IHeader>;
    if (msg.header.msg_type === 'execute_input') {
      const code = (msg.content as KernelMessage.IExecuteInputMsg['content']).code || '';
      if (/ddp/.test(code) && parent && parent.msg_id) {
        this._ddpCells.add(parent.msg_id); // e.g. %load_ext ddp_magic, %%ddp, %reload_ext ddp_magic
        if (mayLoad(code) && this._kernel()?.supportsSubshells) {
          this._busy.start(parent.msg_id); // found while it runs: its own %ddp attach hears the hello (busy_probe.ts)
        }
      }
      return;
    }
    if (msg.header.msg_type !== 'status' || !parent || !parent.msg_id || !this._ddpCells.has(parent.msg_id)) {
      return;
    }
    if ((msg.content as KernelMessage.IStatusMsg['content']).execution_state === 'idle') {
      this._ddpCells.delete(parent.msg_id);
      this._busy.stop(parent.msg_id);
      // That cell may have loaded ddp_magic. Ask over a subshell: answered at once, whether or not the next cell
      // has started (Run All sends them all; under load it may start later than any guess), where the main shell
      // would answer only after every cell queued before the question.
      setTimeout(() => void this.probe(true), 150);
    }
  }

  private _session: ISessionContext;
  private _version: string;
  private _state: IUIState = initialState();
  private _changed = new Signal<this, void>(this);
  private _cellOutput = new Signal<this, ICellOutputMsg>(this);
  private _comm: Kernel.IComm | null = null;
  private _asking = { main: false, sub: false }; // a comm_info question in flight on the main shell, over a subshell
  private _probeRound = 0; // bumped when the kernel restarts or changes: questions in flight are abandoned
  private _reprobe: boolean | null = null; // a probe asked for while one was in flight (over a subshell?)
  private _sessionStatus: Kernel.Status = 'unknown';
  private _mainBusy = false; // the main shell runs an execute_request (from iopub status messages)
  private _question = new TargetQuestion(); // the comm_info question, and the subshell it is asked over
  private _ddpCells = new Set<string>();
  private _commIds: string[] = [];
  private _store: HeldStore;
  private _held: HeldOutput; // kept across this page's kernels and reloads: the next kernel replays from it
  private _keptOffline: IKeptPool[] = []; // before ddp_magic is loaded (kept_probe.ts)
  private _keptHere: string | null = null; // the kept pool this kernel runs (its snapshots say)
  private _busy = new BusyProbe(() => this.probe(true), () => this._comm !== null || this._disposed);
  private _flush = () => this._store.flush(); // the page goes away (a reload): what it held is written now
  private _disposed = false;
  private _noted = new Map<string, () => void>(); // interrupt notes the kernel has not acknowledged yet
  private _waiters = new Map<string, { resolve: (r: IReplyMsg) => void; reject: (e: Error) => void }>();
}
