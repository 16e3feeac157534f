/**
 * Python's `str.strip`, `lstrip`, `rstrip` and `split` for the mock's chat templates, written
 * here and not taken from the router (lib/exact-prefix/tokenizer/python-strip.ts), so that the
 * mock's `/tokenize` is an independent oracle, as a real vLLM is. vLLM renders templates with
 * jinja2, whose `trim` filter is `str.strip(chars)`, and whose string methods are Python's;
 * @huggingface/jinja uses JavaScript's `trim()` and a `\s` regex, which disagree with Python
 * on U+001C–U+001F and U+0085 (whitespace to Python) and U+FEFF (whitespace to JavaScript).
 *
 * The template's syntax tree is rewritten once, when it is loaded: `x | trim`, `x | trim(c)`,
 * `x.strip(…)`, `x.lstrip(…)`, `x.rstrip(…)` and `x.split(…)` become calls of functions passed
 * in with the render's variables.
 */

// What `str.isspace()` is true for (CPython: bidirectional class WS, B or S, or category Zs).
const WHITESPACE = new Set<number>([
  0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x85, 0xa0, 0x1680,
  0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a,
  0x2028, 0x2029, 0x202f, 0x205f, 0x3000,
]);

/** `str.isspace()` for one code point. */
export function isPythonSpace(point: number): boolean {
  return WHITESPACE.has(point);
}

type Side = 'both' | 'left' | 'right';

/** `text.strip(chars)` (`lstrip`, `rstrip` by `side`); `chars` null: whitespace. */
export function strip(text: string, chars: string | null = null, side: Side = 'both'): string {
  const points = Array.from(text);
  const drop = chars === null ? (point: string) => isPythonSpace(point.codePointAt(0) as number) : (point: string) => chars.includes(point);
  let start = 0;
  let end = points.length;
  if (side !== 'right') while (start < end && drop(points[start])) start++;
  if (side !== 'left') while (end > start && drop(points[end - 1])) end--;
  return points.slice(start, end).join('');
}

/** `text.split(sep, maxsplit)`: `sep` null splits on runs of whitespace and drops empty ends. */
export function split(text: string, sep: string | null = null, maxsplit = -1): string[] {
  if (sep !== null) {
    if (sep === '') throw new Error('ValueError: empty separator');
    const parts: string[] = [];
    let rest = text;
    while (maxsplit < 0 || parts.length < maxsplit) {
      const at = rest.indexOf(sep);
      if (at < 0) break;
      parts.push(rest.slice(0, at));
      rest = rest.slice(at + sep.length);
    }
    parts.push(rest);
    return parts;
  }
  const points = Array.from(text);
  const space = (i: number) => isPythonSpace(points[i].codePointAt(0) as number);
  const parts: string[] = [];
  let i = 0;
  for (;;) {
    while (i < points.length && space(i)) i++;
    if (i === points.length) return parts;
    if (maxsplit >= 0 && parts.length === maxsplit) {
      // The rest, with its leading whitespace gone and its trailing whitespace kept.
      parts.push(points.slice(i).join(''));
      return parts;
    }
    const start = i;
    while (i < points.length && !space(i)) i++;
    parts.push(points.slice(start, i).join(''));
  }
}

/** A node of @huggingface/jinja's syntax tree, as far as this rewrite reads it. */
interface Node {
  type?: string;
  value?: unknown;
  computed?: boolean;
  operand?: Node;
  filter?: Node;
  callee?: Node;
  object?: Node;
  property?: Node;
  args?: Node[];
  [key: string]: unknown;
}

const METHODS = new Set(['strip', 'lstrip', 'rstrip', 'split']);
const PREFIX = '__python_str_';

const call = (name: string, args: Node[]): Node => ({ type: 'CallExpression', callee: { type: 'Identifier', value: PREFIX + name }, args });

/** Rewrites `tree` (a Template's `parsed`) in place so that trimming and splitting call the functions of `pythonStrFunctions`. */
export function rewriteForPython(tree: unknown): void {
  visit(tree);
}

function visit(node: unknown): unknown {
  if (Array.isArray(node)) {
    for (let i = 0; i < node.length; i++) node[i] = visit(node[i]);
    return node;
  }
  if (typeof node !== 'object' || node === null) return node;
  const n = node as Node;
  for (const key of Object.keys(n)) n[key] = visit(n[key]);
  if (n.type === 'FilterExpression' && n.operand !== undefined && n.filter !== undefined) {
    const filter = n.filter;
    if (filter.type === 'Identifier' && filter.value === 'trim') return call('strip', [n.operand]);
    if (filter.type === 'CallExpression' && filter.callee?.type === 'Identifier' && filter.callee.value === 'trim') return call('strip', [n.operand, ...(filter.args ?? [])]);
  }
  if (n.type === 'CallExpression' && n.callee?.type === 'MemberExpression' && n.callee.computed !== true) {
    const { object, property } = n.callee;
    if (object !== undefined && property?.type === 'Identifier' && METHODS.has(property.value as string)) return call(property.value as string, [object, ...(n.args ?? [])]);
  }
  return n;
}

/** A call's arguments as the template passes them: positional ones, then keyword ones as a Map. */
function argsOf(raw: unknown[], names: readonly string[]): unknown[] {
  const last = raw[raw.length - 1];
  const keywords = last instanceof Map ? (last as Map<string, unknown>) : null;
  const positional = keywords === null ? raw : raw.slice(0, -1);
  // Keyword arguments reach a function as the package's runtime values: their `value` is the JS one.
  const keyword = (name: string) => (keywords!.get(name) as { value?: unknown }).value;
  return names.map((name, at) => (keywords?.has(name) ? keyword(name) : positional[at]) ?? null);
}

function stringOf(value: unknown, method: string): string {
  if (typeof value !== 'string') throw new Error(`'${method}' of something that is not a string`);
  return value;
}

/** The functions the rewritten template calls, to pass with the render's variables. */
export const pythonStrFunctions: Readonly<Record<string, (...args: unknown[]) => unknown>> = {
  [`${PREFIX}strip`]: (text, ...rest) => strip(stringOf(text, 'strip'), argsOf(rest, ['chars'])[0] as string | null, 'both'),
  [`${PREFIX}lstrip`]: (text, ...rest) => strip(stringOf(text, 'lstrip'), argsOf(rest, ['chars'])[0] as string | null, 'left'),
  [`${PREFIX}rstrip`]: (text, ...rest) => strip(stringOf(text, 'rstrip'), argsOf(rest, ['chars'])[0] as string | null, 'right'),
  [`${PREFIX}split`]: (text, ...rest) => {
    const [sep, maxsplit] = argsOf(rest, ['sep', 'maxsplit']);
    return split(stringOf(text, 'split'), sep as string | null, maxsplit === null ? -1 : (maxsplit as number));
  },
};
