/**
 * The panel's small DOM helpers: elements, SVG, and text whose words and commands never break inside.
 */

export function el<K extends keyof HTMLElementTagNameMap>(tag: K, cls?: string, text?: string): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (cls) {
    node.className = cls;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

const SVG_NS = 'http://www.w3.org/2000/svg';

export function svg<K extends keyof SVGElementTagNameMap>(tag: K, attrs: Record<string, string | number>, text?: string): SVGElementTagNameMap[K] {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    node.setAttribute(k, String(v));
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/**
 * Text with its commands kept whole: each `...` part becomes a <code> that never wraps (a browser breaks a line after
 * a hyphen, so "%%ddp -n N" with no-break spaces still broke after its "-").
 */
export function withCommands(node: HTMLElement, text: string): void {
  node.textContent = '';
  text.split('`').forEach((part, i) => {
    node.appendChild(i % 2 ? el('code', 'jp-ddp-command', part) : words(part));
  });
}

/**
 * Text whose words are never broken inside: a browser breaks a line after a hyphen or a slash ("--timeout" became
 * "-" / "-timeout"), so each word that holds one is a span that does not wrap; lines break between words only.
 */
export function words(text: string): DocumentFragment {
  const out = document.createDocumentFragment();
  for (const part of text.split(/(\s+)/)) {
    if (part) {
      out.appendChild(/[-/\u2010-\u2014]/.test(part) && !/\s/.test(part) ? el('span', 'jp-ddp-word', part) : document.createTextNode(part));
    }
  }
  return out;
}

/** An element of text made of whole words (see `words`). */
export function prose<K extends keyof HTMLElementTagNameMap>(tag: K, cls: string, text: string): HTMLElementTagNameMap[K] {
  const node = el(tag, cls);
  node.appendChild(words(text));
  return node;
}
