/** Python's str.isspace() set, which int() strips: JS `\s` minus U+FEFF plus U+001C–U+001F and U+0085. */
const PY_SPACE = '[\\t\\n\\v\\f\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]';
const PY_STRIP = new RegExp(`^${PY_SPACE}+|${PY_SPACE}+$`, 'gu');
/** Optional sign, then decimal digits (any script) with single underscores between them. */
const PY_INT = /^([+-]?)(\p{Nd}(?:_?\p{Nd})*)$/u;
const ASCII_INT = /^[0-9]{1,15}$/;
const DECIMAL_DIGIT = /^\p{Nd}$/u;
/** CPython's default sys.get_int_max_str_digits(): longer strings make int() raise ValueError. */
const MAX_STR_DIGITS = 4300;

/**
 * Parses a string the way Python's `int(s)` does (base 10), as vLLM's Python server reads
 * `X-data-parallel-rank`; `null` where `int()` would raise ValueError.
 */
export function parsePythonInt(raw: string): bigint | null {
  if (ASCII_INT.test(raw)) return BigInt(raw);
  const match = PY_INT.exec(raw.replace(PY_STRIP, ''));
  if (!match) return null;
  let digits = '';
  for (const char of match[2]) {
    if (char !== '_') digits += asciiDigit(char);
  }
  if (digits.length > MAX_STR_DIGITS) return null;
  const magnitude = BigInt(digits);
  return match[1] === '-' ? -magnitude : magnitude;
}

/** Unicode keeps every decimal-digit run contiguous and ordered 0–9, so a digit's value is its offset in its run. */
function asciiDigit(char: string): string {
  let codePoint = char.codePointAt(0)!;
  if (codePoint <= 0x39) return char;
  const original = codePoint;
  while (DECIMAL_DIGIT.test(String.fromCodePoint(codePoint - 1))) codePoint--;
  return String((original - codePoint) % 10);
}
