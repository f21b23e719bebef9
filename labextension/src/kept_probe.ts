/**
 * This notebook's kept pools, asked of a kernel that has not loaded ddp_magic (after a restart, docs/keep.md):
 * a silent execute whose one user expression is ddp_magic/ui/kept_list.py `panel_rows()`. Silent: no output, no
 * history, no execution count, no name in the user's namespace. A kernel without ddp_magic answers an error: none.
 */
import { Kernel, KernelMessage } from '@jupyterlab/services';

import type { IKeptPool } from './kept';

export const KEPT_EXPRESSION = "__import__('ddp_magic.ui.kept_list', fromlist=['_']).panel_rows()";

/** The kept pools the kernel lists (its JSON form), or null when it could not say. */
export async function askKeptPools(kernel: Kernel.IKernelConnection): Promise<IKeptPool[] | null> {
  const future = kernel.requestExecute(
    { code: '', silent: true, store_history: false, allow_stdin: false, stop_on_error: false, user_expressions: { kept: KEPT_EXPRESSION } },
    true
  );
  const reply = (await future.done) as KernelMessage.IExecuteReplyMsg;
  const content = reply.content as { status: string; user_expressions?: Record<string, { status: string; data?: Record<string, unknown> }> };
  const answer = content.status === 'ok' && content.user_expressions ? content.user_expressions.kept : undefined;
  const rows = answer && answer.status === 'ok' && answer.data ? answer.data['application/json'] : undefined;
  return Array.isArray(rows) ? (rows as IKeptPool[]) : null;
}
