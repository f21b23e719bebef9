/**
 * The question "is ddp_magic loaded?" as connection.ts asks it: a comm_info request for our target (the IPython
 * extension keeps one comm of it registered while loaded), over a kernel subshell of our own when the kernel has
 * them (answered while a cell runs), else on the main shell (answered between cells). The subshell is made at the
 * first question and deleted once the comm is open.
 */
import { Kernel, KernelMessage } from '@jupyterlab/services';

import { COMM_TARGET } from './model';

export class TargetQuestion {
  /** Whether `kernel` has our comm target; `overSubshell`: asked over a subshell of ours (answered while a cell runs). */
  async hasTarget(kernel: Kernel.IKernelConnection, overSubshell: boolean): Promise<boolean> {
    const found = (content: KernelMessage.ICommInfoReplyMsg['content']) =>
      content.status === 'ok' && Object.keys(content.comms || {}).length > 0;
    if (overSubshell && kernel.supportsSubshells) {
      try {
        const subshellId = await this._for(kernel);
        const msg = KernelMessage.createMessage<KernelMessage.ICommInfoRequestMsg>({
          msgType: 'comm_info_request',
          channel: 'shell',
          session: kernel.clientId,
          username: kernel.username,
          subshellId,
          content: { target_name: COMM_TARGET }
        });
        const reply = (await kernel.sendShellMessage(msg, true, true).done) as KernelMessage.ICommInfoReplyMsg;
        return found(reply.content);
      } catch (e) {
        // no subshell after all: ask on the main shell (answered between cells)
      }
    }
    const reply = await kernel.requestCommInfo({ target_name: COMM_TARGET });
    return found(reply.content as KernelMessage.ICommInfoReplyMsg['content']);
  }

  private async _for(kernel: Kernel.IKernelConnection): Promise<string> {
    if (this._subshell && this._subshell.kernel === kernel) {
      return this._subshell.id;
    }
    const reply = await kernel.requestCreateSubshell({}).done;
    const content = reply.content as { status: string; subshell_id?: string };
    if (content.status !== 'ok' || !content.subshell_id) {
      throw new Error('no subshell');
    }
    this._subshell = { kernel, id: content.subshell_id };
    return content.subshell_id;
  }

  /** Delete the subshell (the comm is open: no more questions), if it belongs to `current`, the kernel now. */
  async drop(current: Kernel.IKernelConnection | null): Promise<void> {
    const sub = this._subshell;
    this._subshell = null;
    if (sub && !sub.kernel.isDisposed && sub.kernel === current) {
      try {
        await sub.kernel.requestDeleteSubshell({ subshell_id: sub.id }).done;
      } catch (e) {
        // the kernel went away: so did the subshell
      }
    }
  }

  /** The kernel restarted or changed: its subshells are gone with it. */
  forget(): void {
    this._subshell = null;
  }

  private _subshell: { kernel: Kernel.IKernelConnection; id: string } | null = null;
}
