/**
 * Python's `str.strip()` for chat templates. jinja2's `trim` filter and a template's
 * `.strip()`, `.lstrip()`, `.rstrip()` are Python's, which strip what `str.isspace()` holds true:
 * U+001C–U+001F and U+0085 too, but not U+FEFF. @huggingface/jinja uses JavaScript's `trim()`,
 * which is the other way round, so content edged with those characters rendered differently
 * from vLLM. `renderPythonStrip` renders a template with Python's set instead.
 */
import type * as HfJinja from '@huggingface/jinja';

/** The code points for which Python 3's `str.isspace()` is true. */
const PYTHON_SPACE = new Set(
  [
    [0x09, 0x0d],
    [0x1c, 0x20],
    [0x85, 0x85],
    [0xa0, 0xa0],
    [0x1680, 0x1680],
    [0x2000, 0x200a],
    [0x2028, 0x2029],
    [0x202f, 0x202f],
    [0x205f, 0x205f],
    [0x3000, 0x3000],
  ].flatMap(([from, to]) => Array.from({ length: to - from + 1 }, (_, i) => String.fromCharCode(from + i))),
);

type Side = 'both' | 'start' | 'end';

/**
 * `text.strip(chars)`, `.lstrip(chars)` or `.rstrip(chars)` as Python computes it: `chars`
 * undefined strips Python's whitespace, a string strips the code points it holds.
 */
export function pythonStrip(text: string, side: Side = 'both', chars?: string): string {
  const strips = chars === undefined ? PYTHON_SPACE : new Set(Array.from(chars));
  let start = 0;
  let end = text.length;
  if (side !== 'end') {
    while (start < end) {
      const point = String.fromCodePoint(text.codePointAt(start)!);
      if (!strips.has(point)) break;
      start += point.length;
    }
  }
  if (side !== 'start') {
    while (end > start) {
      const low = text.charCodeAt(end - 1);
      const width = end - 2 >= start && low >= 0xdc00 && low <= 0xdfff && isHighSurrogate(text.charCodeAt(end - 2)) ? 2 : 1;
      if (!strips.has(text.slice(end - width, end))) break;
      end -= width;
    }
  }
  return text.slice(start, end);
}

function isHighSurrogate(unit: number): boolean {
  return unit >= 0xd800 && unit <= 0xdbff;
}

const SIDES: Readonly<Record<string, Side>> = { strip: 'both', lstrip: 'start', rstrip: 'end' };

/** The runtime values of @huggingface/jinja this module reads (its classes are not exported). */
interface Value {
  type: string;
  value: unknown;
}
interface Node {
  type: string;
  value?: unknown;
  computed?: boolean;
  object?: Node;
  property?: Node;
  callee?: Node;
  args?: Node[];
}
interface InterpreterInternals {
  evaluate(node: Node, environment: unknown): Value;
  evaluateArguments(args: Node[], environment: unknown): [Value[], Map<string, Value>];
  applyFilter(operand: Value, filter: Node, environment: unknown): Value;
  evaluateCallExpression(expr: Node, environment: unknown): Value;
}

/** A string value of the same class as `like`, a StringValue. */
function stringLike(like: Value, text: string): Value {
  return new (like.constructor as new (value: string) => Value)(text);
}

/**
 * Renders `template` with Python's stripping: the `trim` filter and the `strip`/`lstrip`/`rstrip`
 * methods of strings. The package's interpreter is patched for this call only (rendering is
 * synchronous, so nothing else renders meanwhile), which leaves other users of the package alone.
 */
export function renderPythonStrip(jinja: typeof HfJinja, template: HfJinja.Template, items: Record<string, unknown>): string {
  const proto = jinja.Interpreter.prototype as unknown as InterpreterInternals;
  const { applyFilter, evaluateCallExpression } = proto;
  proto.applyFilter = function (operand, filter, environment) {
    if (filter.type === 'Identifier' && filter.value === 'trim' && operand.type === 'StringValue') {
      return stringLike(operand, pythonStrip(operand.value as string));
    }
    return applyFilter.call(this, operand, filter, environment);
  };
  proto.evaluateCallExpression = function (expr, environment) {
    const callee = expr.callee!;
    const side = callee.type === 'MemberExpression' && !callee.computed && callee.property?.type === 'Identifier' ? SIDES[callee.property.value as string] : undefined;
    if (side !== undefined && Object.hasOwn(SIDES, callee.property!.value as string)) {
      const object = this.evaluate(callee.object!, environment);
      if (object.type === 'StringValue') {
        const [args] = this.evaluateArguments(expr.args ?? [], environment);
        const chars = args[0]?.type === 'StringValue' ? (args[0].value as string) : undefined;
        return stringLike(object, pythonStrip(object.value as string, side, chars));
      }
    }
    return evaluateCallExpression.call(this, expr, environment);
  };
  try {
    return template.render(items);
  } finally {
    proto.applyFilter = applyFilter;
    proto.evaluateCallExpression = evaluateCallExpression;
  }
}
