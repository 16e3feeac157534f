/** Why a hint was not used. */
export type HintRejection = 'malformed';

/** The result of checking one hint value's grammar. */
export type RankHintResult = { ok: true; rank: number } | { ok: false; reason: HintRejection };

/**
 * The only spelling the gateway accepts: a plain ASCII decimal without sign, padding or
 * separators. vLLM's Python server would take `" 3"`, `"+3"` or `"1_0"` through `int()`;
 * accepting less than it does means a hint can never mean one thing here and another there.
 */
const RANK_GRAMMAR = /^(?:0|[1-9][0-9]{0,9})$/;

const MALFORMED: RankHintResult = Object.freeze({ ok: false, reason: 'malformed' });

/**
 * Checks one rank header value's grammar. The range check needs the configuration and
 * happens in the router.
 *
 * @example parseRankHint('3') // { ok: true, rank: 3 }
 * @example parseRankHint('+3') // { ok: false, reason: 'malformed' }
 */
export function parseRankHint(raw: unknown): RankHintResult {
  if (typeof raw !== 'string' || !RANK_GRAMMAR.test(raw)) return MALFORMED;
  return { ok: true, rank: Number(raw) };
}

/**
 * Checks a JSON body field hint as written: `token` is the member value's raw text, which must
 * be the integer literal `0|[1-9][0-9]*` (at most 10 digits). Decoding would lose what was
 * written: `2.0`, `2e0` and `-0` all decode to a valid-looking number, and each decoder
 * upstream may read them differently; `"2"`, `-1`, `4.5` are malformed too.
 *
 * @example parseBodyRankHint('2') // { ok: true, rank: 2 }
 * @example parseBodyRankHint('2.0') // { ok: false, reason: 'malformed' }
 */
export function parseBodyRankHint(token: string): RankHintResult {
  return parseRankHint(token);
}

/** Node's header line limit when `server.maxHeadersCount` is unset: its parser keeps 2000 raw entries. */
const NODE_DEFAULT_HEADER_LINES = 1000;

/**
 * Whether Node may have dropped header lines of this request: it keeps only about
 * `server.maxHeadersCount` lines (1000 when unset; 0 means no limit), silently, so a second hint
 * line past them would be invisible. A request with `lines` at or over the limit cannot be
 * judged to carry exactly one hint.
 */
export function atHeaderLimit(lines: number, maxHeadersCount: number | null | undefined): boolean {
  const limit = typeof maxHeadersCount === 'number' ? maxHeadersCount : NODE_DEFAULT_HEADER_LINES;
  return limit > 0 && lines >= limit;
}

/**
 * Counts how often a header name occurs in Node's `rawHeaders` (name, value, name, value…).
 * Node joins repeated lines of unknown headers with `", "`, so the joined string cannot tell
 * `"1, 2"` sent once from two lines; the raw list can.
 */
export function countHeaderLines(rawHeaders: readonly string[], lowerCaseName: string): number {
  let count = 0;
  for (let index = 0; index < rawHeaders.length; index += 2) {
    const name = rawHeaders[index];
    if (name.length === lowerCaseName.length && name.toLowerCase() === lowerCaseName) count++;
  }
  return count;
}
