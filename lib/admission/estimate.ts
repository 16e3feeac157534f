/**
 * Token estimates from bytes, where vLLM's own count is not known (yet): what a request reserves
 * when it is admitted, and what a stream without `usage` is charged. docs/operating.md, "Token
 * budgets", gives their measured error.
 */

/** Request body bytes a prompt token is taken to cost. */
const BYTES_PER_TOKEN = 4;
/**
 * vLLM's chat API reads `max_completion_tokens` first, then `max_tokens` (chat_completion/protocol.py:502
 * at 52a31cc). Searched for without the opening quote, checked after: Node's search runs `memchr`
 * on a needle's first byte, and quotes are everywhere in JSON.
 */
const MAX_COMPLETION_TOKENS = Buffer.from('max_completion_tokens"');
const MAX_TOKENS = Buffer.from('max_tokens"');
/** The most digits a count is read with: 15 are exact as a double, and more than any budget. */
export const MAX_DIGITS = 15;

/** The estimate for an answer without `usage`: the prompt at four body bytes a token, one token per stream event (vLLM sends one per decode step). */
export function estimate(requestBytes: number, events: number): number {
  return Math.ceil(requestBytes / BYTES_PER_TOKEN) + events;
}

/**
 * What a request reserves when admitted: its prompt at four body bytes a token, plus the
 * completion it asks for at most (`max_completion_tokens`, else `max_tokens`) when the router
 * holds its body. Settled to vLLM's `usage` (or {@link estimate}) when the answer ends.
 */
export function reservationOf(requestBytes: number, body: Buffer | undefined): number {
  const prompt = Math.ceil(requestBytes / BYTES_PER_TOKEN);
  if (body === undefined) return prompt;
  return prompt + (memberInteger(body, MAX_COMPLETION_TOKENS) ?? memberInteger(body, MAX_TOKENS) ?? 0);
}

/**
 * The first `"name": <integer>` in a JSON body, found by a byte search (no decoding): an unescaped
 * quoted name followed by a colon is a member name wherever it is, and one whose value is not an
 * integer (a schema's property of that name) is passed over.
 */
function memberInteger(body: Buffer, name: Buffer): number | undefined {
  for (let at = body.indexOf(name, 1); at !== -1; at = body.indexOf(name, at + name.length)) {
    if (body[at - 1] !== 0x22) continue;
    let index = skipSpace(body, at + name.length, body.length);
    if (body[index] !== COLON) continue;
    index = skipSpace(body, index + 1, body.length);
    const stop = digitsEnd(body, index, body.length);
    if (stop > index && stop - index <= MAX_DIGITS && !NUMBER_GOES_ON.has(body[stop] ?? 0)) return digitsValue(body, index, stop);
  }
  return undefined;
}

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

const COLON = 0x3a;
/** A number that goes on past its integer digits (`.5`, `e3`) is not an integer. */
const NUMBER_GOES_ON = new Set([0x2e, 0x65, 0x45]);
