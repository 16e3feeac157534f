import { OptionError } from './errors';
import { isRecord } from './guards';
import type { Policy } from './types';

export { OptionError } from './errors';

/**
 * Small validators for every part's option parser. Each throws an {@link OptionError} that
 * names the option and says what would be accepted, so a wrong option fails at start-up, not
 * on traffic.
 */

/** Node's setTimeout ceiling; larger delays fire at once. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/** Throws an {@link OptionError} for option `path`. */
export function fail(path: string, problem: string, fix: string): never {
  throw new OptionError(path, problem, fix);
}

/**
 * Every key of an options type, as an object the compiler keeps complete: adding an option to
 * the type without adding it here fails the type check (express-rate-limit's `KeysEnum`).
 */
export type KeysEnum<T> = { readonly [K in keyof Required<T>]: true };

/** The path of `key` inside the option at `path` (`''` for the top level). */
export function pathOf(path: string, key: string): string {
  return path ? `${path}.${key}` : key;
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

/** An object that is not an array (the options' sections). */
export const isPlainObject = isRecord;

/** Rejects keys the option object does not know, suggesting the closest known one. */
export function rejectUnknownKeys(path: string, value: Record<string, unknown>, keys: KeysEnum<object>): void {
  const known = Object.keys(keys);
  for (const key of Object.keys(value)) {
    if (known.includes(key)) continue;
    const suggestion = closest(key, known);
    fail(pathOf(path, key), 'is not an option', suggestion ? `Did you mean \`${suggestion}\`?` : `Known options: ${known.join(', ')}.`);
  }
}

/**
 * Rejects the options that only the proxy uses, for `dpRank()`: it leaves the proxying to the
 * caller, so they would do nothing there.
 */
export function rejectProxyOnly(path: string, value: Record<string, unknown>, proxyOnly: KeysEnum<object>): void {
  for (const key of Object.keys(proxyOnly)) {
    if (Object.hasOwn(value, key)) {
      fail(pathOf(path, key), 'is an option of dpRouter(), which proxies; dpRank() leaves the proxying to you', "Remove it from dpRank()'s options and set the equivalent on your own proxy, or use dpRouter().");
    }
  }
}

/** An option object whose keys are all known; `{}` when left out. */
export function section(path: string, value: unknown, keys: KeysEnum<object>): Record<string, unknown> {
  const object = optionalObject(path, value);
  rejectUnknownKeys(path, object, keys);
  return object;
}

/** A `boolean | { … }` option: `undefined` when off, else its object (`{}` for `true`). */
export function toggle(path: string, value: unknown, keys: KeysEnum<object>, onByDefault: boolean): Record<string, unknown> | undefined {
  if (value === false || (value === undefined && !onByDefault)) return undefined;
  return value === true ? {} : section(path, value, keys);
}

/** A {@link Policy} object: a `name` and a `pick(candidates, ctx)`. */
export function isPolicy(value: unknown): value is Policy {
  return isPlainObject(value) && typeof value.name === 'string' && typeof value.pick === 'function';
}

/** An optional policy object (a policy's `fallback`). */
export function policyObjectOption(path: string, value: unknown): Policy | undefined {
  if (value === undefined || isPolicy(value)) return value;
  return fail(path, `must be a policy object with \`name\` and \`pick(candidates, ctx)\`, got ${shown(value)}`, `Use e.g. \`${path}: leastOutstanding()\`, or leave it out.`);
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

/** A header name, lower-cased as Node keys `req.headers`; where `offable`, `false` turns the feature off (`undefined`). */
export function headerNameOption(path: string, value: unknown, fallback: string, offable: true): string | undefined;
export function headerNameOption(path: string, value: unknown, fallback: string, offable?: false): string;
export function headerNameOption(path: string, value: unknown, fallback: string, offable = false): string | undefined {
  const name = value === undefined ? fallback : value;
  if (offable && name === false) return undefined;
  if (typeof name !== 'string' || !HEADER_NAME.test(name)) {
    fail(path, `must be a header name${offable ? ' or false' : ''}, got ${shown(value)}`, `Use e.g. \`${path}: '${fallback}'\`.`);
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
