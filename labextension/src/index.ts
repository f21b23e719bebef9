/**
 * ddp-magic: the %%ddp worker pool of the current notebook's kernel, in JupyterLab.
 *
 * - a status-bar item ("DDP 4×gloo · running 0:12"; nothing without a pool),
 * - a right-sidebar panel with every rank and the pool's env validation,
 * - commands (palette, Kernel menu, a notebook toolbar menu): restart the pool,
 *   stop it, show %ddp_env; interrupting stays the kernel's own interrupt,
 * - the %%ddp line of a cell marked as a magic (the body is highlighted as Python).
 *
 * The kernel side is ddp_magic/ui/labcomm.py, registered by `%load_ext ddp_magic`.
 * Without this extension the magics work the same (VS Code, Notebook 7, IPython).
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Dialog, ICommandPalette, Notification, showDialog } from '@jupyterlab/apputils';
import { EditorExtensionRegistry, IEditorExtensionRegistry } from '@jupyterlab/codemirror';
import { DocumentRegistry } from '@jupyterlab/docregistry';
import { IMainMenu } from '@jupyterlab/mainmenu';
import { INotebookModel, INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon, listIcon, stopIcon, ToolbarButton } from '@jupyterlab/ui-components';
import { DisposableDelegate, IDisposable } from '@lumino/disposable';
import { Menu, Widget } from '@lumino/widgets';

import { PoolConnection } from './connection';
import { ddpMagicLine } from './highlight';
import type { IEnvReport, IReplyMsg } from './model';
import { plural } from './format';
import { commandPolicy, type ICommandPolicy, OP_LABEL, reportColumns, toastText } from './commands';
import { CommandIDs, PoolPanel } from './panel';
import { PoolStatusItem } from './statusbar';
import { ConnectionTracker } from './tracker';
import { VERSION } from './version';

const ICON_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 16 16">
  <g class="jp-icon3" fill="#616161">
    <circle cx="8" cy="3" r="2"/><circle cx="3" cy="12" r="2"/><circle cx="13" cy="12" r="2"/>
    <path d="M7.4 4.6 3.6 10.4l.8.5 3.8-5.8zm1.2 0-.8.5 3.8 5.8.8-.5zM5 11.5h6v1H5z"/>
  </g>
</svg>`;

export const ddpIcon = new LabIcon({ name: 'ddp-magic:pool', svgstr: ICON_SVG });

function envReportWidget(report: IEnvReport): Widget {
  const node = document.createElement('div');
  node.className = 'jp-ddp-EnvReport';
  const verdict = document.createElement('div');
  verdict.className = 'jp-ddp-EnvReport-verdict';
  verdict.textContent = `${report.verdict ?? ''}${report.ok === false ? ' — some checks failed' : ''}`;
  node.appendChild(verdict);
  const checks = document.createElement('ul');
  checks.className = 'jp-ddp-EnvReport-checks';
  for (const c of report.checks ?? []) {
    const li = document.createElement('li');
    li.className = `jp-ddp-Check jp-ddp-Check-${c.ok ? 'ok' : c.level}`;
    const mark = document.createElement('span');
    mark.className = 'jp-ddp-Check-mark';
    mark.textContent = c.mark;
    const name = document.createElement('b');
    name.textContent = ` ${c.name}: `;
    li.appendChild(mark);
    li.appendChild(name);
    li.appendChild(document.createTextNode(c.detail));
    checks.appendChild(li);
  }
  node.appendChild(checks);
  const cols = reportColumns(report);
  if (cols.length) {
    const table = document.createElement('table');
    table.className = 'jp-ddp-EnvReport-table';
    const hr = document.createElement('tr');
    for (const c of cols) {
      const th = document.createElement('th');
      th.textContent = c;
      hr.appendChild(th);
    }
    table.appendChild(hr);
    for (const row of report.ranks ?? []) {
      const tr = document.createElement('tr');
      for (const c of cols) {
        const td = document.createElement('td');
        td.textContent = row[c] === null || row[c] === undefined ? '' : String(row[c]);
        tr.appendChild(td);
      }
      table.appendChild(tr);
    }
    node.appendChild(table);
  }
  return new Widget({ node });
}

const VERB: Record<string, string> = { restart: 'Restart', stop: 'Stop', env: 'Show' };

/** Run a pool command on the current notebook's kernel, saying whether it runs, waits or is refused. */
async function runOp(tracker: ConnectionTracker, op: 'restart' | 'stop' | 'env'): Promise<IReplyMsg | null> {
  const conn: PoolConnection | null = tracker.current;
  const label = OP_LABEL[op];
  if (!conn) {
    Notification.warning(`${label}: refused — open a notebook first`, { autoClose: 6000 });
    return null;
  }
  let policy = commandPolicy(op, conn.state);
  if (policy.mode === 'refused') {
    Notification.warning(`${label}: refused — ${policy.reason}`, { autoClose: 8000 });
    return null;
  }
  const pool = conn.state.snapshot?.pool;
  const names = pool?.names ?? [];
  const loses = (op === 'restart' || op === 'stop') && names.length > 0;
  if (policy.mode === 'waits' || loses) {
    const lines: string[] = [];
    if (policy.mode === 'waits') {
      lines.push(policy.reason);
    }
    if (loses) {
      const them = names.length === 1 ? 'it' : 'them';
      lines.push(`The workers hold ${plural(names.length, 'name')} defined in %%ddp cells (${names.slice(0, 8).join(', ')}${names.length > 8 ? ', …' : ''}); a ${op} loses ${them}.`);
    }
    const buttons = [Dialog.cancelButton()];
    if (policy.mode === 'waits') {
      buttons.push(Dialog.warnButton({ label: 'Interrupt the cell', accept: false, actions: ['interrupt'] }));
    }
    buttons.push(
      (op === 'env' ? Dialog.okButton : Dialog.warnButton)({ label: policy.mode === 'waits' ? `${VERB[op]} after the cell` : VERB[op] })
    );
    const result = await showDialog({ title: `${label}?`, body: lines.join('\n\n'), buttons });
    if (result.button.actions.indexOf('interrupt') >= 0) {
      await conn.interrupt();
      return null;
    }
    if (!result.button.accept) {
      return null;
    }
    policy = commandPolicy(op, conn.state); // things may have moved while the dialog was open
    if (policy.mode === 'refused') {
      Notification.warning(`${label}: refused — ${policy.reason}`, { autoClose: 8000 });
      return null;
    }
  }
  const progress = new Progress(policy.mode === 'waits' ? `${label}: waits for the running cell to end…` : `${label}…`);
  try {
    const reply = await conn.request(op);
    progress.done(toastText(reply), reply.ok ? 'success' : reply.refused ? 'warning' : 'error', reply.ok ? 4000 : 10000);
    if (op === 'env' && reply.ok && reply.report) {
      void showDialog({
        title: reply.report.title ?? '%ddp_env',
        body: envReportWidget(reply.report),
        buttons: [Dialog.okButton({ label: 'Close' })]
      });
    }
    return reply;
  } catch (e) {
    progress.done(`${label}: ${(e as Error).message}`, 'error', 10000);
    return null;
  }
}

/**
 * A progress toast that never outlives its result. It appears only if the reply takes longer than
 * PROGRESS_DELAY_MS (a fast reply shows just the result), and the result is a new toast with the
 * spinning one dismissed: updating a toast in place can be lost when the reply races the toast's
 * first render, which left it spinning after the result had arrived.
 */
const PROGRESS_DELAY_MS = 400;

class Progress {
  constructor(message: string) {
    this._timer = window.setTimeout(() => {
      this._id = Notification.emit(message, 'in-progress', { autoClose: false });
    }, PROGRESS_DELAY_MS);
  }

  done(message: string, type: 'success' | 'warning' | 'error', autoClose: number): void {
    window.clearTimeout(this._timer);
    if (this._id !== null) {
      Notification.dismiss(this._id);
      this._id = null;
    }
    Notification.emit(message, type, { autoClose });
  }

  private _timer: number;
  private _id: string | null = null;
}

class ToolbarMenu implements DocumentRegistry.IWidgetExtension<NotebookPanel, INotebookModel> {
  constructor(app: JupyterFrontEnd, tracker: ConnectionTracker) {
    this._app = app;
    this._tracker = tracker;
  }

  createNew(panel: NotebookPanel): IDisposable {
    const conn = this._tracker.connectionFor(panel);
    const menu = new Menu({ commands: this._app.commands });
    menu.addClass('jp-ddp-Menu');
    for (const command of [CommandIDs.restart, CommandIDs.stop, CommandIDs.env, CommandIDs.panel]) {
      menu.addItem({ command });
    }
    const button = new ToolbarButton({
      className: 'jp-ddp-ToolbarButton',
      icon: ddpIcon,
      label: 'DDP',
      tooltip: 'ddp_magic pool: restart, stop, %ddp_env, panel',
      onClick: () => {
        this._app.shell.activateById(panel.id);
        const rect = button.node.getBoundingClientRect();
        menu.open(rect.left, rect.bottom);
      }
    });
    // once this notebook's kernel had ddp_magic, or lists a kept pool, the button stays (a restart does not hide it:
    // its commands say why they are refused until ddp_magic is loaded again)
    let seen = false;
    const update = () => {
      seen = seen || conn.state.connected || conn.keptWithoutMagic.some(k => k.alive);
      button.setHidden(!seen);
    };
    conn.changed.connect(update);
    update();
    panel.toolbar.insertItem(10, 'ddp-magic', button);
    return new DisposableDelegate(() => {
      conn.changed.disconnect(update);
      button.dispose();
      menu.dispose();
    });
  }

  private _app: JupyterFrontEnd;
  private _tracker: ConnectionTracker;
}

/** Where the panel's open state is kept: the browser's storage for this server (a key per app: Lab, Notebook 7). */
function panelKey(app: JupyterFrontEnd): string {
  return `ddp-magic:panel-open:${app.name}:${window.location.origin}`;
}

/**
 * The panel stays open across reloads. JupyterLab's layout restorer brings the sidebar back; Notebook 7 restores no
 * sidebar (it closed the panel on every reload), so the panel keeps whether it was open in the browser's storage and
 * opens itself once the app is restored.
 */
function keepOpenAcrossReloads(app: JupyterFrontEnd, panel: PoolPanel): void {
  const key = panelKey(app);
  const store = (open: boolean) => {
    try {
      window.localStorage.setItem(key, open ? '1' : '0');
    } catch (e) {
      // no storage (a private window's quota): the panel opens when asked, as before
    }
  };
  let restored = false;
  panel.shownChanged.connect((_, open) => {
    if (restored) {
      store(open);
    }
  });
  void app.restored.then(() => {
    restored = true;
    let saved: string | null = null;
    try {
      saved = window.localStorage.getItem(key);
    } catch (e) {
      saved = null;
    }
    if (saved === '1' && !panel.isVisible) {
      app.shell.activateById(panel.id);
    } else if (panel.isVisible) {
      store(true);
    }
  });
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'ddp-magic:plugin',
  description: 'The %%ddp worker pool at a glance (status bar, rank panel) and its controls.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar, ICommandPalette, IMainMenu, ILayoutRestorer, IEditorExtensionRegistry],
  activate: (
    app: JupyterFrontEnd,
    notebooks: INotebookTracker,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    mainMenu: IMainMenu | null,
    restorer: ILayoutRestorer | null,
    editorExtensions: IEditorExtensionRegistry | null
  ) => {
    const tracker = new ConnectionTracker(notebooks, VERSION);
    const { commands } = app;

    const policyOf = (op: 'restart' | 'stop' | 'env'): ICommandPolicy =>
      tracker.current ? commandPolicy(op, tracker.current.state) : { mode: 'refused', reason: 'open a notebook first' };
    const caption = (op: 'restart' | 'stop' | 'env', what: string) => {
      const p = policyOf(op);
      return p.mode === 'now' ? what : p.mode === 'waits' ? `${what}. ${p.reason}` : `${what} — unavailable: ${p.reason}`;
    };

    commands.addCommand(CommandIDs.restart, {
      label: () => (policyOf('restart').mode === 'waits' ? 'Restart DDP Pool (waits for the running cell)' : 'Restart DDP Pool'),
      caption: () => caption('restart', 'Restart every rank of the pool (fresh processes and port; names on the workers are lost)'),
      icon: ddpIcon,
      isEnabled: () => policyOf('restart').mode !== 'refused',
      execute: () => runOp(tracker, 'restart')
    });
    commands.addCommand(CommandIDs.stop, {
      label: () => (policyOf('stop').mode === 'waits' ? 'Stop DDP Pool (waits for the running cell)' : 'Stop DDP Pool'),
      caption: () => caption('stop', 'Stop every rank of the pool; the next %%ddp -n N cell starts a new one'),
      icon: stopIcon,
      isEnabled: () => policyOf('stop').mode !== 'refused',
      execute: () => runOp(tracker, 'stop')
    });
    commands.addCommand(CommandIDs.env, {
      label: () => (policyOf('env').mode === 'waits' ? 'Show %ddp_env (waits for the running cell)' : 'Show %ddp_env'),
      caption: () => caption('env', 'The env each rank sees, read live from the workers, with its checks'),
      icon: listIcon,
      isEnabled: () => policyOf('env').mode !== 'refused',
      execute: () => runOp(tracker, 'env')
    });

    const panel = new PoolPanel(tracker, commands);
    panel.title.icon = ddpIcon;
    commands.addCommand(CommandIDs.panel, {
      label: 'Show DDP Pool Panel',
      caption: 'Every rank of the pool, its env validation and the pool commands',
      icon: ddpIcon,
      execute: () => {
        if (!panel.isAttached) {
          app.shell.add(panel, 'right', { rank: 900 });
        }
        app.shell.activateById(panel.id);
      }
    });
    commands.addCommand(CommandIDs.interrupt, {
      label: 'Interrupt the Kernel (every rank of a running %%ddp cell)',
      caption: 'The kernel interrupt: a running %%ddp cell interrupts every rank',
      isEnabled: () => !!tracker.current && tracker.current.state.kernelStatus === 'busy',
      execute: () => tracker.current?.interrupt()
    });
    app.shell.add(panel, 'right', { rank: 900 });
    if (restorer) {
      restorer.add(panel, 'ddp-magic-panel');
    }
    keepOpenAcrossReloads(app, panel);

    // commands' enabled state and labels follow the current notebook's kernel
    tracker.updated.connect(() => {
      for (const id of [CommandIDs.restart, CommandIDs.stop, CommandIDs.env, CommandIDs.interrupt]) {
        commands.notifyCommandChanged(id);
      }
    });

    if (statusBar) {
      const item = new PoolStatusItem(tracker, () => void commands.execute(CommandIDs.panel));
      statusBar.registerStatusItem('ddp-magic:status', {
        item,
        align: 'left',
        rank: 4,
        isActive: () => item.text !== null,
        activeStateChanged: tracker.updated
      });
    }

    if (palette) {
      const category = 'DDP (ddp_magic)';
      for (const command of [CommandIDs.restart, CommandIDs.stop, CommandIDs.env, CommandIDs.panel]) {
        palette.addItem({ command, category });
      }
    }

    if (mainMenu) {
      mainMenu.kernelMenu.addGroup([{ command: CommandIDs.restart }, { command: CommandIDs.stop }, { command: CommandIDs.env }], 100);
    }

    app.docRegistry.addWidgetExtension('Notebook', new ToolbarMenu(app, tracker));

    if (editorExtensions) {
      editorExtensions.addExtension({
        name: 'ddp-magic:magic-line',
        factory: () => EditorExtensionRegistry.createImmutableExtension(ddpMagicLine)
      });
    }

    // for tests and the curious: the current notebook's pool state
    (app as any).ddpMagic = { tracker, version: VERSION };
  }
};

export default plugin;
