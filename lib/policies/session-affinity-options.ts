import { fieldNameOption, headerNameOption, integerOption, numberOption, pathOf, policyObjectOption, section, type KeysEnum } from '../option-checks';
import type { Policy } from '../types';
import { leastOutstanding } from './least-outstanding';

/** The bounds of the `session-affinity` policy, for {@link sessionAffinity} and the router's `affinity` option. */
export interface SessionAffinitySettings {
  /**
   * In-flight guard `c`: a request whose session's endpoint has a load above
   * `max(⌈c × mean load⌉, least load + loadSlack)` goes, this once, to the next endpoint of the
   * session's hash order that is within that bound; the session keeps its endpoint. At least 1.
   * Default: `1.25`.
   */
  loadFactor?: number;
  /**
   * The in-flight guard's absolute slack: the session's endpoint keeps its requests while its
   * load is at most this much above the least loaded candidate's, whatever the ratio says (as
   * SGLang's `balance_abs_threshold`). At low load a ratio alone is noise: with 8 requests in
   * flight on 8 endpoints the mean is 1, so two other sessions' requests would push a session
   * away from its cache although nothing queues. A hot session still spills once its endpoint
   * is this far ahead. `0` leaves only the ratio. Default: `4` (with 8 sessions in flight on
   * 8 endpoints, about 1 follow-up turn in 2000 spills).
   */
  loadSlack?: number;
  /**
   * Key balance `c_k`: a new session is assigned to the first endpoint of its hash order that
   * holds fewer than `⌈c_k × (sessions + 1) / endpoints⌉` of the remembered sessions
   * (consistent hashing with bounded loads, Mirrokni, Thorup and Zadimoghaddam 2018). `1`
   * keeps the session counts within one of each other, which is what balances a few long
   * conversations; larger values let more sessions land on their first-choice endpoint, so
   * router replicas and forgotten sessions agree more often. At least 1. Default: `1`.
   */
  keyLoadFactor?: number;
  /**
   * The memory bound: how many sessions are remembered, least recently used first out. Each
   * is a 32-bit hash of the key and an endpoint number in a `Map` (about 50 bytes; ~3 MiB for
   * the default), whatever the key's length. A forgotten session that returns is assigned
   * anew (most often to the same endpoint). Two keys whose hashes collide share an
   * assignment, which costs nothing but a little balance. Default: `65536`.
   */
  maxSessions?: number;
}

/** Options of {@link sessionAffinity}. */
export interface SessionAffinityOptions extends SessionAffinitySettings {
  /** The policy for requests without a session key. Default: `leastOutstanding()`. */
  fallback?: Policy;
}

/** Where the `session-affinity` policy finds a request's key (the router's `affinity` option), and its bounds. */
export interface AffinityOptions extends SessionAffinitySettings {
  /** Header holding the session key, or `false`. Default: `'x-session-id'`. */
  header?: string | false;
  /** Top-level JSON body field holding the key, or `false`. Default: `'user'`. */
  bodyField?: string | false;
}

/** The bounds, resolved. */
export interface SessionAffinityConfig {
  readonly loadFactor: number;
  readonly loadSlack: number;
  readonly keyLoadFactor: number;
  readonly maxSessions: number;
}

/** `affinity`, resolved: where the key is found, and the policy's bounds. */
export interface AffinityConfig extends SessionAffinityConfig {
  /** Lower-cased; `undefined` when off. */
  readonly header: string | undefined;
  /** `undefined` when off. */
  readonly bodyField: string | undefined;
}

/** Default `loadFactor`: also the load bound of prefix-aware's placement of new prefixes. */
export const DEFAULT_LOAD_FACTOR = 1.25;
/** Default `loadSlack`: also the load bound of prefix-aware's placement of new prefixes. */
export const DEFAULT_LOAD_SLACK = 4;
const KEY_LOAD_FACTOR = 1;
const MAX_SESSIONS = 65_536;
const HEADER = 'x-session-id';
const BODY_FIELD = 'user';

const SETTINGS_KEYS: KeysEnum<SessionAffinitySettings> = { loadFactor: true, loadSlack: true, keyLoadFactor: true, maxSessions: true };
const POLICY_KEYS: KeysEnum<SessionAffinityOptions> = { ...SETTINGS_KEYS, fallback: true };
const AFFINITY_KEYS: KeysEnum<AffinityOptions> = { ...SETTINGS_KEYS, header: true, bodyField: true };

function parseSettings(path: string, settings: Record<string, unknown>): SessionAffinityConfig {
  return {
    loadFactor: numberOption(pathOf(path, 'loadFactor'), settings.loadFactor, DEFAULT_LOAD_FACTOR, 1, 1000),
    loadSlack: numberOption(pathOf(path, 'loadSlack'), settings.loadSlack, DEFAULT_LOAD_SLACK, 0, 1_000_000),
    keyLoadFactor: numberOption(pathOf(path, 'keyLoadFactor'), settings.keyLoadFactor, KEY_LOAD_FACTOR, 1, 1000),
    maxSessions: integerOption(pathOf(path, 'maxSessions'), settings.maxSessions, MAX_SESSIONS, 1, 2 ** 24),
  };
}

/** The router's `affinity` option: checked whatever the policy. */
export function parseAffinity(path: string, value: unknown): AffinityConfig {
  const affinity = section(path, value, AFFINITY_KEYS);
  return {
    header: headerNameOption(pathOf(path, 'header'), affinity.header, HEADER, true),
    bodyField: fieldNameOption(pathOf(path, 'bodyField'), affinity.bodyField, BODY_FIELD),
    ...parseSettings(path, affinity),
  };
}

/** {@link sessionAffinity}'s own options, by the same rules as the router's `affinity`. */
export function parseSessionAffinity(path: string, value: unknown): SessionAffinityConfig & { readonly fallback: Policy } {
  const options = section(path, value, POLICY_KEYS);
  return { ...parseSettings(path, options), fallback: policyObjectOption(pathOf(path, 'fallback'), options.fallback) ?? leastOutstanding() };
}
