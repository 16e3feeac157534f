/**
 * Token estimates from bytes, where vLLM's own count is not known (yet): what a request reserves
 * when it is admitted, and what a stream without `usage` is charged. docs/operating.md, "Token
 * budgets", gives their measured error.
 */
import { decodeField, scanFields } from '../http/json-fields';

/** Request body bytes a prompt token is taken to cost. */
const BYTES_PER_TOKEN = 4;
/**
 * The top-level members a reservation reads, found by the validating scanner (a member nested
 * anywhere else, `vllm_xargs: {"max_tokens": 1}` say, is not vLLM's limit). vLLM's chat API
 * reads `max_completion_tokens` first, then `max_tokens` (chat_completion/protocol.py:502-507 at
 * 52a31cc), and generates up to that many tokens for each of `n` choices (`n`, default 1:
 * chat_completion/protocol.py:199 and completion/protocol.py:59, passed to `SamplingParams` at
 * chat_completion/protocol.py:616 and completion/protocol.py:316).
 */
const NAMES = ['max_completion_tokens', 'max_tokens', 'n'];
const ENCODED_NAMES = NAMES.map((name) => Buffer.from(name));
const MAX_COMPLETION_TOKENS = 0;
const MAX_TOKENS = 1;
const N = 2;
/** The most digits a count is read with: 15 are exact as a double, and more than any budget. */
export const MAX_DIGITS = 15;

/** The estimate for an answer without `usage`: the prompt at four body bytes a token, one token per stream event (vLLM sends one per decode step). */
export function estimate(requestBytes: number, events: number): number {
  return Math.ceil(requestBytes / BYTES_PER_TOKEN) + events;
}

/**
 * What a request reserves when admitted: its prompt at four body bytes a token, plus the
 * completion it asks for at most (`max_completion_tokens`, else `max_tokens`, times `n`) when
 * the router holds its body; `members`, the body already decoded for routing, when it was.
 * Settled to vLLM's `usage` (or {@link estimate}) when the answer ends.
 */
export function reservationOf(requestBytes: number, body: Buffer | undefined, members?: Readonly<Record<string, unknown>>): number {
  const prompt = Math.ceil(requestBytes / BYTES_PER_TOKEN);
  if (body === undefined) return prompt;
  let completion: number | undefined;
  let n: number | undefined;
  if (members !== undefined) {
    completion = countOf(members.max_completion_tokens) ?? countOf(members.max_tokens);
    n = countOf(members.n);
  } else {
    const scan = scanFields(body, ENCODED_NAMES);
    // Not JSON: vLLM answers 400, and the reservation is given back. A member repeated past the
    // scanner's bound is a body built to hide its limit: it reserves the whole budget.
    if (!scan.ok) return scan.repeated ? Infinity : prompt;
    // JSON allows a member twice; Python's decoder, vLLM's, keeps the last. An array or object
    // is no count, and is never decoded (what it would build is not bounded by its bytes).
    const last = (which: number) => {
      const field = scan.fields[which]?.at(-1);
      return field === undefined || body[field.start] === 0x5b || body[field.start] === 0x7b ? undefined : countOf(decodeField(body, field));
    };
    completion = last(MAX_COMPLETION_TOKENS) ?? last(MAX_TOKENS);
    n = last(N);
  }
  return prompt + (completion ?? 0) * Math.max(1, n ?? 1);
}

/**
 * A count as vLLM's request models take it: pydantic's lax mode makes an `int` of `8`, `8.0`,
 * `1e3`, `true` and of a string such as `" 8 "`, `"+8"`, `"1_000"` or `"8.0"` (checked with
 * pydantic 2.13 against `n: int | None`, as declared at chat_completion/protocol.py:199 at
 * 52a31cc), so a limit written in any of these is read; a negative one or anything else, which
 * vLLM refuses, counts as none.
 */
function countOf(value: unknown): number | undefined {
  let count: number;
  if (typeof value === 'number') count = value;
  else if (value === true) count = 1;
  else if (typeof value === 'string' && LAX_INTEGER.test(value)) count = Number(value.replace(/_/g, ''));
  else return undefined;
  return Number.isInteger(count) && count >= 0 ? count : undefined;
}

/** pydantic's integer string: optional space and sign, digits with single underscores between, an optional `.0…`. */
const LAX_INTEGER = /^\s*\+?[0-9](?:_?[0-9])*(?:\.0*)?\s*$/;

/** The index after the decimal digits starting at `index` (`index` itself when there are none), at most `end`. */
export function digitsEnd(bytes: Uint8Array, index: number, end: number): number {
  let at = index;
  while (at < end && bytes[at] >= 0x30 && bytes[at] <= 0x39) at++;
  return at;
}

/** The value of the decimal digits in `[start, stop)`: at most {@link MAX_DIGITS} of them, so exact. */
export function digitsValue(bytes: Uint8Array, start: number, stop: number): number {
  let value = 0;
  for (let at = start; at < stop; at++) value = value * 10 + bytes[at] - 0x30;
  return value;
}

/** The index of the first byte at or after `index` that is not JSON whitespace (`end` if none). */
export function skipSpace(bytes: Uint8Array, index: number, end: number): number {
  let at = index;
  while (at < end) {
    const byte = bytes[at];
    if (byte !== 0x20 && byte !== 0x0a && byte !== 0x0d && byte !== 0x09) break;
    at++;
  }
  return at;
}

