/**
 * A cell's output messages applied to its outputs as JupyterLab's OutputArea applies them (its `_onIOPub`): streams
 * and displays added (the model joins consecutive streams itself), a display update set on every output its
 * display_id named, a clear (a waiting one at the next output, which the model does itself).
 *
 * The rebinder (rebind.ts) uses it for a background cell whose execute request another page sent (before a reload):
 * no future of this page listens to it, so the kernel's copy of its messages (ddp_magic/ui/transcripts.py) is applied
 * here. Pure (no JupyterLab imports): unit-tested in node.
 */
import type { IOutputMsg } from './model';

/** What of an output area's model this needs (IOutputAreaModel has all of it). */
export interface IOutputSink {
  readonly length: number;
  add(output: Record<string, any>): number;
  set(index: number, output: Record<string, any>): void;
  clear(wait?: boolean): void;
}

/** What the output area keeps besides its outputs: display_id -> the indices it names, and a clear that waits. */
export interface IOutputState {
  ids: Map<string, number[]>;
  clearNext: boolean;
}

export function outputState(): IOutputState {
  return { ids: new Map(), clearNext: false };
}

const ADDED = ['execute_result', 'display_data', 'stream', 'error'];

function displayId(content: Record<string, any>): string | null {
  const transient = content && typeof content.transient === 'object' && content.transient ? content.transient : {};
  return typeof transient.display_id === 'string' ? transient.display_id : null;
}

/** Apply one output message to `sink`; `state` keeps the display ids and a waiting clear as the output area does. */
export function applyOutput(sink: IOutputSink, state: IOutputState, msg: IOutputMsg): void {
  const content = msg.content || {};
  const id = displayId(content);
  const ids = state.ids;
  if (msg.msg_type === 'clear_output') {
    state.clearNext = !!content.wait;
    if (!content.wait) {
      sink.clear();
      ids.clear();
    }
    return;
  }
  if (msg.msg_type === 'update_display_data') {
    const output = { ...content, output_type: 'display_data' };
    for (const index of (id && ids.get(id)) || []) {
      sink.set(index, output);
    }
    return;
  }
  if (ADDED.indexOf(msg.msg_type) < 0) {
    return;
  }
  if (state.clearNext) {
    state.clearNext = false;
    sink.clear();
    ids.clear();
  }
  sink.add({ ...content, output_type: msg.msg_type });
  if (id && msg.msg_type === 'display_data') {
    ids.set(id, [...(ids.get(id) || []), sink.length - 1]);
  }
}

/**
 * Which of the messages that came before the follow reply, or after it, the page applies: those after `seq`, in
 * order; `gap` when one is missing (the page then asks again: nothing lost, nothing twice).
 */
export function nextMessages<T extends { seq: number }>(seq: number, pending: T[]): { apply: T[]; gap: boolean } {
  const apply: T[] = [];
  let last = seq;
  for (const m of [...pending].sort((a, b) => a.seq - b.seq)) {
    if (m.seq <= last) {
      continue;
    }
    if (m.seq !== last + 1) {
      return { apply, gap: true };
    }
    apply.push(m);
    last = m.seq;
  }
  return { apply, gap: false };
}

/** The MIME type of an ipywidgets view: a reference to a widget model that lives in the kernel that made it. */
export const WIDGET_MIME = 'application/vnd.jupyter.widget-view+json';

/** What a status view saved while its cell ran says under its HTML form, which shows the cell's first moments. */
export const SAVED_NOTE = 'saved while the cell ran: its view as the cell began, and the lines saved with it; how it ended is not in this notebook';

/**
 * A %%ddp status view saved while its cell ran (JupyterLab autosaves every 120 s) holds its live widget's reference
 * beside its HTML form; opened after the job ended (or in another kernel), the widget renderer would win and say
 * "Error displaying widget: model not found". Such an output as it opens: its HTML form, which is the view as the
 * cell began, and a line that says so (SAVED_NOTE); null: not one. A job still running in this kernel, or ended
 * while the kernel kept its outputs, gets its view back from the kernel's copy of the cell (rebind.ts).
 */
export function savedView(output: Record<string, any>): Record<string, any> | null {
  const data = output && typeof output.data === 'object' && output.data ? output.data : null;
  const html = data ? data['text/html'] : null;
  const text = Array.isArray(html) ? html.join('') : html;
  if (!data || !data[WIDGET_MIME] || typeof text !== 'string' || !/class=['"]ddp-status\b/.test(text)) {
    return null;
  }
  const rest: Record<string, any> = { ...data };
  delete rest[WIDGET_MIME];
  const note = `<div class='ddp-status-saved' style='font-size:var(--jp-ui-font-size0,11px);opacity:0.8'>${SAVED_NOTE}</div>`;
  return { ...output, data: { ...rest, 'text/html': text + note } };
}
