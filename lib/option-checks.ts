/**
 * Small validators for `parseOptions`. Each throws a `TypeError` that names the option
 * and says what would be accepted, so a wrong option fails at start-up, not on traffic.
 */

/** Throws a `TypeError` for option `path`. */
export function fail(path: string, problem: string, fix: string): never {
  throw new TypeError(`express-dp-router: \`${path}\` ${problem}. ${fix}`);
}

/** Renders a received value briefly for an error message. */
export function shown(value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}…` : value);
  if (typeof value === 'function') return 'a function';
  if (Array.isArray(value)) return 'an array';
  if (value === null) return 'null';
  if (typeof value === 'object') return 'an object';
  return String(value);
}

export function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** Rejects keys the option object does not know, suggesting the closest known one. */
export function rejectUnknownKeys(path: string, value: Record<string, unknown>, known: readonly string[]): void {
  for (const key of Object.keys(value)) {
    if (known.includes(key)) continue;
    const suggestion = closest(key, known);
    const where = path ? `${path}.${key}` : key;
    fail(where, 'is not an option', suggestion ? `Did you mean \`${suggestion}\`?` : `Known options: ${known.join(', ')}.`);
  }
}

function closest(word: string, candidates: readonly string[]): string | undefined {
  let best: string | undefined;
  let bestDistance = Math.max(2, Math.floor(word.length / 3)) + 1;
  for (const candidate of candidates) {
    const distance = editDistance(word.toLowerCase(), candidate.toLowerCase());
    if (distance < bestDistance) {
      best = candidate;
      bestDistance = distance;
    }
  }
  return best;
}

function editDistance(a: string, b: string): number {
  let previous = Array.from({ length: b.length + 1 }, (_, index) => index);
  for (let i = 1; i <= a.length; i++) {
    const current = [i];
    for (let j = 1; j <= b.length; j++) {
      current[j] = Math.min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1));
    }
    previous = current;
  }
  return previous[b.length];
}

export function optionalObject(path: string, value: unknown): Record<string, unknown> {
  if (value === undefined) return {};
  if (!isPlainObject(value)) fail(path, `must be an object, got ${shown(value)}`, `Pass e.g. \`${path}: {}\` or leave it out.`);
  return value;
}

export function integerOption(path: string, value: unknown, fallback: number, min: number, max: number): number {
  if (value === undefined) return fallback;
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
    fail(path, `must be an integer from ${min} to ${max}, got ${shown(value)}`, `Use e.g. \`${path}: ${fallback}\`.`);
  }
  return value;
}

export function numberOption(path: string, value: unknown, fallback: number, min: number, max: number): number {
  if (value === undefined) return fallback;
  if (typeof value !== 'number' || !Number.isFinite(value) || value < min || value > max) {
    fail(path, `must be a number from ${min} to ${max}, got ${shown(value)}`, `Use e.g. \`${path}: ${fallback}\`.`);
  }
  return value;
}

export function booleanOption(path: string, value: unknown, fallback: boolean): boolean {
  if (value === undefined) return fallback;
  if (typeof value !== 'boolean') fail(path, `must be true or false, got ${shown(value)}`, `Use \`${path}: ${fallback}\`.`);
  return value;
}

export function oneOf<T extends string>(path: string, value: unknown, allowed: readonly T[], fallback: T): T {
  if (value === undefined) return fallback;
  if (!allowed.includes(value as T)) {
    fail(path, `must be one of ${allowed.map((item) => `'${item}'`).join(', ')}, got ${shown(value)}`, `Use e.g. \`${path}: '${fallback}'\`.`);
  }
  return value as T;
}

/** RFC 9110 token characters: what a header name may be made of. */
const HEADER_NAME = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

/** A header name, lower-cased as Node keys `req.headers`; `false` turns the feature off. */
export function headerNameOption(path: string, value: unknown, fallback: string | false): string | undefined {
  const name = value === undefined ? fallback : value;
  if (name === false) return undefined;
  if (typeof name !== 'string' || !HEADER_NAME.test(name)) {
    fail(path, `must be a header name${fallback === false ? ' or false' : ''}, got ${shown(value)}`, `Use e.g. \`${path}: '${fallback || 'x-session-id'}'\`.`);
  }
  return name.toLowerCase();
}

/** A top-level JSON field name; `false` turns the feature off. */
export function fieldNameOption(path: string, value: unknown, fallback: string | false): string | undefined {
  const name = value === undefined ? fallback : value;
  if (name === false) return undefined;
  if (typeof name !== 'string' || name.length === 0) {
    fail(path, `must be a JSON field name or false, got ${shown(value)}`, `Use e.g. \`${path}: 'data_parallel_rank'\`.`);
  }
  return name;
}
