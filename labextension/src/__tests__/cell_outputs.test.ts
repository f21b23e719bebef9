import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { applyOutput, type IOutputSink, nextMessages, outputState, SAVED_NOTE, savedView, WIDGET_MIME } from '../cell_outputs';

/** An output area's model as JupyterLab's behaves for what applyOutput uses: consecutive streams of one name join. */
class Sink implements IOutputSink {
  outputs: Record<string, any>[] = [];
  get length(): number {
    return this.outputs.length;
  }
  add(o: Record<string, any>): number {
    const last = this.outputs[this.outputs.length - 1];
    if (o.output_type === 'stream' && last && last.output_type === 'stream' && last.name === o.name) {
      last.text += o.text;
    } else {
      this.outputs.push({ ...o });
    }
    return this.outputs.length;
  }
  set(i: number, o: Record<string, any>): void {
    this.outputs[i] = o;
  }
  clear(): void {
    this.outputs = [];
  }
}

describe('a background cell given back after a reload (cell_outputs.ts)', () => {
  it('applies streams, displays and their updates by display id, as the output area does', () => {
    const sink = new Sink();
    const state = outputState();
    const msgs = [
      { msg_type: 'display_data', content: { data: { 'text/html': 'live' }, metadata: {}, transient: { display_id: 'v' } } },
      { msg_type: 'stream', content: { name: 'stdout', text: '[rank 0] step 1\n' } },
      { msg_type: 'stream', content: { name: 'stdout', text: '[rank 1] step 1\n' } },
      { msg_type: 'update_display_data', content: { data: { 'text/html': 'done' }, metadata: {}, transient: { display_id: 'v' } } },
      { msg_type: 'display_data', content: { data: { 'text/html': 'chart' }, metadata: {} } },
      { msg_type: 'comm_msg', content: {} }
    ];
    msgs.forEach(m => applyOutput(sink, state, m));
    assert.deepEqual(
      sink.outputs.map(o => (o.output_type === 'stream' ? o.text : o.data['text/html'])),
      ['done', '[rank 0] step 1\n[rank 1] step 1\n', 'chart']
    );
  });

  it('clears at once, or with the next output when the clear waits', () => {
    const sink = new Sink();
    const state = outputState();
    applyOutput(sink, state, { msg_type: 'stream', content: { name: 'stdout', text: 'a' } });
    applyOutput(sink, state, { msg_type: 'clear_output', content: { wait: true } });
    assert.equal(sink.length, 1);
    applyOutput(sink, state, { msg_type: 'display_data', content: { data: { 'text/plain': 'b' }, transient: { display_id: 'x' } } });
    assert.deepEqual(sink.outputs.map(o => o.data['text/plain']), ['b']);
    assert.deepEqual(state.ids.get('x'), [0]);
    applyOutput(sink, state, { msg_type: 'clear_output', content: { wait: false } });
    assert.equal(sink.length, 0);
    assert.equal(state.ids.size, 0);
  });

  it('applies the messages after the reply in seq order, none twice, and stops at a gap', () => {
    const m = (seq: number) => ({ seq });
    assert.deepEqual(nextMessages(4, [m(6), m(3), m(5), m(4)]), { apply: [m(5), m(6)], gap: false });
    assert.deepEqual(nextMessages(4, [m(5), m(7)]), { apply: [m(5)], gap: true });
    assert.deepEqual(nextMessages(4, []), { apply: [], gap: false });
  });

  it('opens a status view saved while its cell ran as its HTML form, and leaves every other output as it is', () => {
    const html = "<div class='ddp-status'>cell [3] running</div>";
    const saved = { output_type: 'display_data', metadata: {}, data: { [WIDGET_MIME]: { model_id: 'abc' }, 'text/html': html } };
    const opened = savedView(saved) as Record<string, any>;
    assert.deepEqual(Object.keys(opened.data), ['text/html'], 'no widget reference left');
    assert.ok(opened.data['text/html'].startsWith(html) && opened.data['text/html'].includes(SAVED_NOTE), 'the saved form, and a line that says what it is');
    assert.equal(savedView({ output_type: 'display_data', data: { [WIDGET_MIME]: { model_id: 'x' }, 'text/html': '<b>a user widget</b>' } }), null);
    assert.equal(savedView({ output_type: 'display_data', data: { 'text/html': html } }), null);
    assert.equal(savedView({ output_type: 'stream', name: 'stdout', text: 'x' }), null);
  });
});
