import type { IncomingMessage } from 'node:http';
import { fail, headerNameOption, integerOption, isPlainObject, MAX_TIMER_MS, optionalObject, pathOf, section, shown, type KeysEnum } from '../option-checks';
import { createMemoryTokenStore } from './memory-store';
import { isTokenStore, type TokenStore } from './token-window';

/** Options of `admission`: capacity per endpoint, a fair queue, priorities and token budgets. Off when left out. */
export interface AdmissionOptions {
  /** An endpoint's capacity: requests in flight past it wait in the queue. Default: `32`. */
  maxInflightPerRank?: number;
  /** The waiting room. */
  queue?: AdmissionQueueOptions;
  /**
   * The fairness (and token budget) key: a header honoured for trusted callers only (an
   * untrusted caller is the one default tenant, so fresh ids per request neither fill the queue
   * past `maxPerTenant` nor escape or spend another tenant's budget), or a function of the
   * request (your own rule: a verified API key, say). Default: one tenant for everyone.
   */
  tenant?: AdmissionTenantOptions | ((req: IncomingMessage) => string | undefined);
  /** Priority classes from a header, honoured for trusted callers only. Default: one class, `normal`. */
  priority?: AdmissionPriorityOptions;
  /** A per-tenant token budget counted from vLLM's `usage`. Default: none. */
  tokens?: AdmissionTokenOptions;
}

/** `admission.queue`. */
export interface AdmissionQueueOptions {
  /** Requests waiting in total; past it a newcomer gets 429. Default: `1024`. */
  maxLength?: number;
  /** Requests one tenant may have waiting. Default: half of `maxLength` (rounded up) with a `tenant` key, else `maxLength`. */
  maxPerTenant?: number;
  /** How long a request may wait; past it, 503. Default: `30_000`. */
  timeoutMs?: number;
  /** How often in a row a class with waiters may be passed over for a higher one. Default: `8`. */
  starvationLimit?: number;
}

/** `admission.tenant` as a header. */
export interface AdmissionTenantOptions {
  /** The header naming the tenant. Default: `'x-tenant-id'`. */
  header?: string;
  /** Whose header is honoured, as `hints.trust`: a boolean or a function of the request; everyone else is the default tenant. Default: `hints.trust`. */
  trust?: boolean | ((req: IncomingMessage) => boolean);
}

/** `admission.priority`. */
export interface AdmissionPriorityOptions {
  /** The header naming the class. Removed before proxying, always. Default: `'x-priority'`. */
  header?: string;
  /** Whose header is honoured, as `hints.trust`: a boolean or a function of the request. Default: `hints.trust`. */
  trust?: boolean | ((req: IncomingMessage) => boolean);
  /** Class names, highest first; a request without a valid class from a trusted caller gets the middle one. Default: `['high', 'normal', 'low']`. */
  classes?: readonly string[];
}

/** `admission.tokens`. */
export interface AdmissionTokenOptions {
  /** Tokens (prompt + completion, as vLLM's `usage` reports) each tenant may use in any minute. Required. */
  perMinute: number;
  /** Where usage is kept: `redisTokenStore(client)` to share it across replicas. Default: in this process. */
  store?: TokenStore;
}

/** `admission`, resolved. */
export interface AdmissionSettings {
  readonly maxInflightPerRank: number;
  readonly maxLength: number;
  readonly maxPerTenant: number;
  readonly timeoutMs: number;
  readonly starvationLimit: number;
  /** The tenant header, lower-cased; `undefined` with a function or none. */
  readonly tenantHeader: string | undefined;
  readonly tenantOf: ((req: IncomingMessage) => string | undefined) | undefined;
  /** Whose tenant header is honoured; `undefined`: the rank hints' rule (`hints.trust`), judged once per request. */
  readonly tenantTrust: Trust | undefined;
  readonly priorityHeader: string | undefined;
  /** `undefined`: the rank hints' rule (`hints.trust`), judged once per request. */
  readonly priorityTrust: Trust | undefined;
  readonly classes: readonly string[];
  /** The class of a request without a valid trusted one. */
  readonly defaultClass: number;
  readonly tokensPerMinute: number | undefined;
  readonly store: TokenStore | undefined;
}

/** A trust rule, as `hints.trust`. */
type Trust = boolean | ((req: IncomingMessage) => boolean);

/** The longest tenant key taken: a longer one is refused with 400, never stored or hashed. */
export const MAX_TENANT_LENGTH = 256;

const KEYS: KeysEnum<AdmissionOptions> = { maxInflightPerRank: true, queue: true, tenant: true, priority: true, tokens: true };
const QUEUE_KEYS: KeysEnum<AdmissionQueueOptions> = { maxLength: true, maxPerTenant: true, timeoutMs: true, starvationLimit: true };
const TENANT_KEYS: KeysEnum<AdmissionTenantOptions> = { header: true, trust: true };
const PRIORITY_KEYS: KeysEnum<AdmissionPriorityOptions> = { header: true, trust: true, classes: true };
const TOKEN_KEYS: KeysEnum<AdmissionTokenOptions> = { perMinute: true, store: true };
const CLASS_NAME = /^[a-z0-9_-]{1,32}$/;

/**
 * `admission`: `undefined` when left out (nothing waits, nothing is limited). `hintsTrust`, the
 * rank hints' rule, is what a left-out `tenant.trust` stands for.
 */
export function parseAdmission(path: string, value: unknown, hintsTrust: Trust = false): AdmissionSettings | undefined {
  if (value === undefined || value === false) return undefined;
  const options = section(path, value, KEYS);
  const queue = section(pathOf(path, 'queue'), options.queue, QUEUE_KEYS);
  const maxLength = integerOption(pathOf(path, 'queue.maxLength'), queue.maxLength, 1024, 0, 1_000_000);
  const tenant = parseTenant(pathOf(path, 'tenant'), options.tenant);
  // A header nobody is trusted to send keys nothing: every request is the default tenant.
  const keyed = tenant.of !== undefined || (tenant.header !== undefined && (tenant.trust ?? hintsTrust) !== false);
  const share = keyed ? Math.ceil(maxLength / 2) : maxLength;
  const priority = section(pathOf(path, 'priority'), options.priority, PRIORITY_KEYS);
  const classes = options.priority === undefined ? ['normal'] : parseClasses(pathOf(path, 'priority.classes'), priority.classes);
  const tokens = parseTokens(pathOf(path, 'tokens'), options.tokens);
  return {
    maxInflightPerRank: integerOption(pathOf(path, 'maxInflightPerRank'), options.maxInflightPerRank, 32, 1, 1_000_000),
    maxLength,
    maxPerTenant: integerOption(pathOf(path, 'queue.maxPerTenant'), queue.maxPerTenant, share, Math.min(1, maxLength), Math.max(maxLength, 1)),
    timeoutMs: integerOption(pathOf(path, 'queue.timeoutMs'), queue.timeoutMs, 30_000, 1, MAX_TIMER_MS),
    starvationLimit: integerOption(pathOf(path, 'queue.starvationLimit'), queue.starvationLimit, 8, 1, 1_000_000),
    tenantHeader: tenant.header,
    tenantOf: tenant.of,
    tenantTrust: tenant.trust,
    priorityHeader: options.priority === undefined ? undefined : headerNameOption(pathOf(path, 'priority.header'), priority.header, 'x-priority'),
    priorityTrust: parseTrust(pathOf(path, 'priority.trust'), priority.trust),
    classes,
    defaultClass: Math.floor((classes.length - 1) / 2),
    tokensPerMinute: tokens?.perMinute,
    store: tokens?.store,
  };
}

function parseTenant(path: string, value: unknown): { header: string | undefined; of: AdmissionSettings['tenantOf']; trust: Trust | undefined } {
  if (value === undefined) return { header: undefined, of: undefined, trust: undefined };
  if (typeof value === 'function') return { header: undefined, of: value as AdmissionSettings['tenantOf'], trust: undefined };
  if (!isPlainObject(value)) {
    fail(path, `must be { header, trust } or a function of the request, got ${shown(value)}`, `Use e.g. \`${path}: { header: 'x-tenant-id', trust: (req) => req.socket.remoteAddress === '10.0.0.1' }\`.`);
  }
  const tenant = section(path, value, TENANT_KEYS);
  return { header: headerNameOption(pathOf(path, 'header'), tenant.header, 'x-tenant-id'), of: undefined, trust: parseTrust(pathOf(path, 'trust'), tenant.trust) };
}

function parseClasses(path: string, value: unknown): string[] {
  if (value === undefined) return ['high', 'normal', 'low'];
  if (!Array.isArray(value) || value.length === 0 || value.length > 16 || !value.every((name) => typeof name === 'string' && CLASS_NAME.test(name))) {
    fail(path, `must be 1 to 16 lower-case names (letters, digits, _ and -), highest first, got ${shown(value)}`, `Use e.g. \`${path}: ['high', 'normal', 'low']\`.`);
  }
  if (new Set(value).size !== value.length) fail(path, 'names a class twice', 'Give each class once.');
  return [...(value as string[])];
}

function parseTrust(path: string, value: unknown): Trust | undefined {
  if (value === undefined) return undefined;
  if (typeof value === 'boolean' || typeof value === 'function') return value as Trust;
  return fail(path, `must be true, false or a function of the request, got ${shown(value)}`, `Use e.g. \`${path}: (req) => req.socket.remoteAddress === '10.0.0.1'\`.`);
}

function parseTokens(path: string, value: unknown): { perMinute: number; store: TokenStore } | undefined {
  if (value === undefined) return undefined;
  const tokens = optionalObject(path, value);
  section(path, tokens, TOKEN_KEYS);
  if (tokens.perMinute === undefined) fail(pathOf(path, 'perMinute'), 'is required', `Use e.g. \`${pathOf(path, 'perMinute')}: 200_000\`.`);
  const perMinute = integerOption(pathOf(path, 'perMinute'), tokens.perMinute, 200_000, 1, Number.MAX_SAFE_INTEGER);
  if (tokens.store !== undefined && !isTokenStore(tokens.store)) {
    fail(pathOf(path, 'store'), `must be a token store, got ${shown(tokens.store)}`, `Use \`redisTokenStore(client)\`, or leave it out for the in-memory store.`);
  }
  return { perMinute, store: (tokens.store as TokenStore | undefined) ?? createMemoryTokenStore() };
}
