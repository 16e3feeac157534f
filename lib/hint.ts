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

/** Checks a JSON body field hint: only a JSON integer ≥ 0 (not `"4"`, `-1` or `4.5`). */
export function parseBodyRankHint(value: unknown): RankHintResult {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 0) return MALFORMED;
  return { ok: true, rank: value };
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
