/**
 * What a chat request's template arguments cost to render, weighed before rendering: the
 * template engine converts every value it is given (`tools`, `documents`,
 * `chat_template_kwargs`, a message's `tool_calls`) into its own values, and a template writes
 * tools out with `tojson`, all on the event loop, read or not: 18,000 tools (851 KiB) took
 * 0.5–1.1 s, a tool nested 2,000 deep ~100 ms (issue 46). Weighed here, they count against the
 * tokenizer's budget like new text, so that no request costs more than the budget promises.
 *
 * The walk stops as soon as the weight passes `limit`: weighing costs at most what it allows.
 */
import { isRecord } from '../../guards';

/** A value's own cost, beyond its characters: converting it, writing its punctuation. */
const NODE_WEIGHT = 8;
/**
 * Deeper than this is refused outright (the weight is `Infinity`): renderers recurse per level,
 * and no tool schema or document comes near it.
 */
export const MAX_ARGUMENT_DEPTH = 64;

/**
 * The weight of `body`'s template arguments: each value `NODE_WEIGHT` plus its depth (a deeper
 * value costs more in a recursive renderer), each string and key its length; `Infinity` past
 * `limit` or {@link MAX_ARGUMENT_DEPTH}.
 */
export function argumentWeight(body: Readonly<Record<string, unknown>>, limit: number): number {
  const stack: unknown[] = [];
  const depths: number[] = [];
  const push = (value: unknown, depth: number) => {
    if (value === undefined || value === null) return;
    stack.push(value);
    depths.push(depth);
  };
  push(body.tools, 1);
  push(body.documents, 1);
  push(body.chat_template_kwargs, 1);
  if (Array.isArray(body.messages)) {
    for (const message of body.messages) {
      if (!isRecord(message)) continue;
      push(message.tool_calls, 2);
      push(message.tools, 2);
    }
  }
  let weight = 0;
  while (stack.length > 0) {
    const value = stack.pop();
    const depth = depths.pop()!;
    if (depth > MAX_ARGUMENT_DEPTH) return Infinity;
    weight += NODE_WEIGHT + depth;
    if (typeof value === 'string') weight += value.length;
    else if (Array.isArray(value)) for (const item of value) push(item, depth + 1);
    else if (isRecord(value)) {
      for (const key in value) {
        weight += key.length;
        push(value[key], depth + 1);
      }
    }
    if (weight > limit) return Infinity;
  }
  return weight;
}
