/**
 * %%ddp cells in the editor. JupyterLab already highlights every cell of a
 * Python notebook as (I)Python, so the body of a %%ddp cell is Python; Python's
 * grammar reads the magic line itself as stray operators, so this marks that
 * line as a magic (class cm-ddp-magicLine, the "%%ddp" word cm-ddp-magic) and
 * leaves the Python highlighting of the rest untouched.
 */
import { RangeSetBuilder } from '@codemirror/state';
import { Decoration, DecorationSet, EditorView, ViewPlugin, ViewUpdate } from '@codemirror/view';

const MAGIC = /^%%ddp(?=\s|$)/;
const lineDeco = Decoration.line({ class: 'cm-ddp-magicLine' });
const wordDeco = Decoration.mark({ class: 'cm-ddp-magic' });
const argsDeco = Decoration.mark({ class: 'cm-ddp-magicArgs' });

function build(view: EditorView): DecorationSet {
  const doc = view.state.doc;
  if (doc.lines < 1) {
    return Decoration.none;
  }
  const first = doc.line(1);
  const m = MAGIC.exec(first.text);
  if (!m) {
    return Decoration.none;
  }
  const b = new RangeSetBuilder<Decoration>();
  b.add(first.from, first.from, lineDeco);
  b.add(first.from, first.from + m[0].length, wordDeco);
  if (first.to > first.from + m[0].length) {
    b.add(first.from + m[0].length, first.to, argsDeco);
  }
  return b.finish();
}

export const ddpMagicLine = ViewPlugin.fromClass(
  class {
    decorations: DecorationSet;
    constructor(view: EditorView) {
      this.decorations = build(view);
    }
    update(u: ViewUpdate): void {
      if (u.docChanged) {
        this.decorations = build(u.view);
      }
    }
  },
  { decorations: v => v.decorations }
);
