import type { IncomingMessage } from 'node:http';
import { getHeapStatistics } from 'node:v8';
import { register, type Registry } from 'prom-client';
import {
  booleanOption,
  fail,
  fieldNameOption,
  headerNameOption,
  integerOption,
  isPlainObject,
  numberOption,
  oneOf,
  optionalObject,
  rejectUnknownKeys,
  shown,
} from './option-checks';
import { BodyBudget } from './body-budget';
import { POLICY_NAMES, policyByName, type PolicySettings } from './policies/by-name';
import { parseLogger, type RouterLogger } from './logger';
import { createTracing, type Tracing } from './tracing';
import type { KvEventsSource } from './kv-events/exact-routing';
import { parseKvEvents, parseTokenizer } from './kv-events/options';
import type { PromptTokenizer } from './kv-events/tokenizer';
import type { Options, Policy, PolicyName, RankHeaderMode } from './types';

/** One upstream, resolved. */
export interface UpstreamConfig {
  readonly name: string;
  readonly url: string;
  readonly startRank: number;
  readonly dataParallelSize: number;
  /** The global ranks routed to, ascending. */
  readonly ranks: readonly number[];
  readonly rankHeader: RankHeaderMode;
  /** How often the ranks are learned from the upstream's `/metrics`; `undefined` when not. */
  readonly discoverIntervalMs: number | undefined;
  /** Where its engines publish KV events; `undefined` when not given. */
  readonly kvEvents?: KvEventsSource;
}

/** The options, validated and resolved once at creation. */
export interface Configuration {
  readonly upstreams: readonly UpstreamConfig[];
  readonly policy: Policy;
  /** `true`/`false` when fixed, else asked per request. */
  readonly trust: boolean | ((req: IncomingMessage) => boolean);
  readonly onInvalid: 'reassign' | 'reject';
  readonly hintHeader: string;
  readonly hintBodyField: string | undefined;
  /** The outgoing rank header, lower-cased. */
  readonly header: string;
  readonly metrics: { readonly registry: Registry; readonly prefix: string } | undefined;
  readonly affinityHeader: string | undefined;
  readonly affinityBodyField: string | undefined;
  readonly connectTimeoutMs: number;
  readonly firstByteTimeoutMs: number;
  readonly maxBodyBytes: number;
  /** Time for a request body to arrive in full. */
  readonly bodyTimeoutMs: number;
  /** The router's one body budget (`maxBufferedBytes`), shared by all its requests. */
  readonly bodyBudget: BodyBudget;
  readonly exposeDecision: boolean;
  /** `'replace'` for `xfwd: true`; `false` when off. */
  readonly xfwd: false | 'replace' | 'append';
  /** Passive ejection settings; `undefined` when off. */
  readonly outlierDetection: OutlierDetectionConfig | undefined;
  /** Active health check settings; `undefined` when off. */
  readonly healthCheck: HealthCheckConfig | undefined;
  /** Tries per request, the first included (1: no retries). */
  readonly retryAttempts: number;
  /** Largest declared body buffered so that it can be replayed on a retry. */
  readonly retryMaxBodyBytes: number;
  /** Engine load polling; `undefined` when off. */
  readonly loadFeedback: LoadFeedbackConfig | undefined;
  readonly logger: RouterLogger;
  /** OpenTelemetry reports, live when `@opentelemetry/api` is installed. */
  readonly tracing: Tracing;
  /** The model's tokenizer for exact prefix routing (`prefixAware.tokenizer`), for the built-in prefix-aware policy only. */
  readonly tokenizer: PromptTokenizer | undefined;
}

/** `loadFeedback`, resolved. */
export interface LoadFeedbackConfig {
  readonly intervalMs: number;
  readonly timeoutMs: number;
  readonly weight: number;
}

/** `outlierDetection`, resolved. */
export interface OutlierDetectionConfig {
  readonly consecutiveFailures: number;
  readonly baseEjectionMs: number;
  readonly maxEjectionMs: number;
  readonly maxEjectionPercent: number;
  readonly minimumClients: number;
}

/** `healthCheck`, resolved. */
export interface HealthCheckConfig {
  readonly path: string;
  readonly intervalMs: number;
  readonly timeoutMs: number;
  readonly unhealthyThreshold: number;
  readonly healthyThreshold: number;
}

const TOP_LEVEL_KEYS = [
  'upstreams',
  'policy',
  'hints',
  'header',
  'metrics',
  'affinity',
  'timeouts',
  'maxBodyBytes',
  'maxBufferedBytes',
  'exposeDecision',
  'xfwd',
  'outlierDetection',
  'healthCheck',
  'retries',
  'prefixAware',
  'loadFeedback',
  'logger',
] as const;
const UPSTREAM_KEYS = ['url', 'name', 'dataParallelSize', 'startRank', 'ranks', 'rankHeader', 'discover', 'kvEvents'] as const;
const RANK_HEADER_MODES: readonly RankHeaderMode[] = ['global', 'local', 'none'];
/** Node's setTimeout ceiling; larger delays fire at once. */
const MAX_TIMER_MS = 2 ** 31 - 1;
const MAX_RANK = 9_999_999_999;
const METRIC_PREFIX = /^(?:[a-zA-Z_:][a-zA-Z0-9_:]*)?$/;

/** Validates `options` and resolves every default. Throws `TypeError` on the first wrong option. */
export function parseOptions(options: Options): Configuration {
  if (!isPlainObject(options)) {
    fail('options', `must be an object, got ${shown(options)}`, "Pass e.g. `dpRouter({ upstreams: [{ url: 'http://127.0.0.1:8000' }] })`.");
  }
  rejectUnknownKeys('', options, TOP_LEVEL_KEYS);
  const hints = optionalObject('hints', options.hints);
  rejectUnknownKeys('hints', hints, ['trust', 'onInvalid', 'header', 'bodyField']);
  const affinity = optionalObject('affinity', options.affinity);
  rejectUnknownKeys('affinity', affinity, ['header', 'bodyField', 'loadFactor', 'loadSlack', 'keyLoadFactor', 'maxSessions']);
  const timeouts = optionalObject('timeouts', options.timeouts);
  rejectUnknownKeys('timeouts', timeouts, ['connectMs', 'firstByteMs', 'bodyMs']);

  const sessionAffinity = {
    loadFactor: numberOption('affinity.loadFactor', affinity.loadFactor, 1.25, 1, 1000),
    loadSlack: numberOption('affinity.loadSlack', affinity.loadSlack, 4, 0, 1_000_000),
    keyLoadFactor: numberOption('affinity.keyLoadFactor', affinity.keyLoadFactor, 1, 1, 1000),
    maxSessions: integerOption('affinity.maxSessions', affinity.maxSessions, 65_536, 1, 2 ** 24),
  };
  // In this order, so that the first wrong option is reported first.
  const upstreams = parseUpstreams(options.upstreams);
  const { tokenizer, ...prefixAware } = parsePrefixAware(options.prefixAware);
  const policy = parsePolicy(options.policy, { sessionAffinity, prefixAware });
  return {
    upstreams,
    policy,
    trust: parseTrust(hints.trust),
    onInvalid: oneOf('hints.onInvalid', hints.onInvalid, ['reassign', 'reject'], 'reassign'),
    hintHeader: headerNameOption('hints.header', hints.header, 'x-data-parallel-rank')!,
    hintBodyField: fieldNameOption('hints.bodyField', hints.bodyField, false),
    header: headerNameOption('header', options.header, 'X-data-parallel-rank')!,
    metrics: parseMetrics(options.metrics),
    affinityHeader: headerNameOption('affinity.header', affinity.header, 'x-session-id'),
    affinityBodyField: fieldNameOption('affinity.bodyField', affinity.bodyField, 'user'),
    connectTimeoutMs: integerOption('timeouts.connectMs', timeouts.connectMs, 10_000, 1, MAX_TIMER_MS),
    firstByteTimeoutMs: integerOption('timeouts.firstByteMs', timeouts.firstByteMs, 600_000, 1, MAX_TIMER_MS),
    maxBodyBytes: integerOption('maxBodyBytes', options.maxBodyBytes, 16 * 1024 * 1024, 1, 2 ** 31),
    bodyTimeoutMs: integerOption('timeouts.bodyMs', timeouts.bodyMs, 60_000, 1, MAX_TIMER_MS),
    bodyBudget: new BodyBudget(integerOption('maxBufferedBytes', options.maxBufferedBytes, defaultBufferedBytes(), 1, Number.MAX_SAFE_INTEGER)),
    exposeDecision: booleanOption('exposeDecision', options.exposeDecision, false),
    xfwd: parseXfwd(options.xfwd),
    outlierDetection: parseOutlierDetection(options.outlierDetection),
    healthCheck: parseHealthCheck(options.healthCheck),
    ...parseRetries(options.retries),
    loadFeedback: parseLoadFeedback(options.loadFeedback),
    logger: parseLogger(options.logger),
    tracing: createTracing(policy.name),
    tokenizer: options.policy === 'prefix-aware' ? parseTokenizer('prefixAware.tokenizer', tokenizer) : undefined,
  };
}

/** 512 MiB, or a quarter of V8's heap limit where that is less (small containers). */
function defaultBufferedBytes(): number {
  return Math.min(512 * 1024 * 1024, Math.floor(getHeapStatistics().heap_size_limit / 4));
}

function parseXfwd(value: unknown): Configuration['xfwd'] {
  if (value === undefined || value === false) return false;
  if (value === true) return 'replace';
  if (value === 'append') return 'append';
  fail('xfwd', `must be true or false, or 'append', got ${shown(value)}`, "Use `xfwd: true` to set the gateway's own view, or `xfwd: 'append'` behind a trusted proxy.");
}

function parseLoadFeedback(value: unknown): LoadFeedbackConfig | undefined {
  if (value === undefined || value === false) return undefined;
  const feedback = value === true ? {} : optionalObject('loadFeedback', value);
  rejectUnknownKeys('loadFeedback', feedback, ['intervalMs', 'timeoutMs', 'weight']);
  return {
    intervalMs: integerOption('loadFeedback.intervalMs', feedback.intervalMs, 1_000, 10, MAX_TIMER_MS),
    timeoutMs: integerOption('loadFeedback.timeoutMs', feedback.timeoutMs, 1_000, 1, MAX_TIMER_MS),
    weight: numberOption('loadFeedback.weight', feedback.weight, 0.5, 0, 1),
  };
}

function parseDiscover(path: string, value: unknown): number | undefined {
  if (value === undefined || value === false) return undefined;
  const discover = value === true ? {} : optionalObject(path, value);
  rejectUnknownKeys(path, discover, ['intervalMs']);
  return integerOption(`${path}.intervalMs`, discover.intervalMs, 10_000, 10, MAX_TIMER_MS);
}

function parseOutlierDetection(value: unknown): OutlierDetectionConfig | undefined {
  if (value === false) return undefined;
  const outlier = value === true ? {} : optionalObject('outlierDetection', value);
  rejectUnknownKeys('outlierDetection', outlier, ['consecutiveFailures', 'baseEjectionMs', 'maxEjectionMs', 'maxEjectionPercent', 'minimumClients']);
  const baseEjectionMs = integerOption('outlierDetection.baseEjectionMs', outlier.baseEjectionMs, 10_000, 1, MAX_TIMER_MS);
  const maxEjectionMs = integerOption('outlierDetection.maxEjectionMs', outlier.maxEjectionMs, Math.max(300_000, baseEjectionMs), 1, MAX_TIMER_MS);
  if (maxEjectionMs < baseEjectionMs) {
    fail('outlierDetection.maxEjectionMs', `is ${maxEjectionMs}, below baseEjectionMs (${baseEjectionMs})`, 'Make it at least `baseEjectionMs`, or leave it out.');
  }
  return {
    consecutiveFailures: integerOption('outlierDetection.consecutiveFailures', outlier.consecutiveFailures, 5, 1, 1_000_000),
    baseEjectionMs,
    maxEjectionMs,
    maxEjectionPercent: numberOption('outlierDetection.maxEjectionPercent', outlier.maxEjectionPercent, 50, 0, 100),
    minimumClients: integerOption('outlierDetection.minimumClients', outlier.minimumClients, 3, 1, 1000),
  };
}

function parseHealthCheck(value: unknown): HealthCheckConfig | undefined {
  if (value === undefined || value === false) return undefined;
  const check = value === true ? {} : optionalObject('healthCheck', value);
  rejectUnknownKeys('healthCheck', check, ['path', 'intervalMs', 'timeoutMs', 'unhealthyThreshold', 'healthyThreshold']);
  const path = check.path ?? '/health';
  // The path is joined to every upstream URL: no scheme, host, whitespace or control characters.
  if (typeof path !== 'string' || !/^\/[\x21-\x7e]*$/.test(path)) {
    fail('healthCheck.path', `must be a path starting with '/', got ${shown(check.path)}`, "Use e.g. `path: '/health'`.");
  }
  return {
    path,
    intervalMs: integerOption('healthCheck.intervalMs', check.intervalMs, 5_000, 1, MAX_TIMER_MS),
    timeoutMs: integerOption('healthCheck.timeoutMs', check.timeoutMs, 2_000, 1, MAX_TIMER_MS),
    unhealthyThreshold: integerOption('healthCheck.unhealthyThreshold', check.unhealthyThreshold, 2, 1, 1000),
    healthyThreshold: integerOption('healthCheck.healthyThreshold', check.healthyThreshold, 1, 1, 1000),
  };
}

function parseRetries(value: unknown): Pick<Configuration, 'retryAttempts' | 'retryMaxBodyBytes'> {
  if (value === false) return { retryAttempts: 1, retryMaxBodyBytes: 0 };
  const retries = value === true ? {} : optionalObject('retries', value);
  rejectUnknownKeys('retries', retries, ['attempts', 'maxBodyBytes']);
  return {
    retryAttempts: integerOption('retries.attempts', retries.attempts, 2, 1, 10),
    retryMaxBodyBytes: integerOption('retries.maxBodyBytes', retries.maxBodyBytes, 1024 * 1024, 0, 2 ** 31),
  };
}

/** Validates an upstream list (creation and `setUpstreams()`). Throws `TypeError`. */
export function parseUpstreams(value: unknown): UpstreamConfig[] {
  if (!Array.isArray(value) || value.length === 0) {
    fail('upstreams', `must be a non-empty array, got ${shown(value)}`, "Pass e.g. `upstreams: [{ url: 'http://127.0.0.1:8000', dataParallelSize: 8 }]`.");
  }
  const names = new Set<string>();
  return value.map((upstream, index) => {
    const config = parseUpstream(`upstreams[${index}]`, upstream);
    if (names.has(config.name)) {
      fail(`upstreams[${index}].name`, `repeats the name '${config.name}'`, 'Give each upstream its own `name`: it labels the metrics.');
    }
    names.add(config.name);
    return config;
  });
}

function parseUpstream(path: string, value: unknown): UpstreamConfig {
  if (!isPlainObject(value)) fail(path, `must be an object, got ${shown(value)}`, "Use e.g. `{ url: 'http://127.0.0.1:8000' }`.");
  rejectUnknownKeys(path, value, UPSTREAM_KEYS);
  const url = parseUrl(`${path}.url`, value.url);
  const name = value.name === undefined ? url.origin : value.name;
  // The name travels in metric labels and the decision header: printable ASCII only.
  if (typeof name !== 'string' || !/^[\x20-\x7e]{1,128}$/.test(name)) {
    fail(`${path}.name`, `must be 1 to 128 printable ASCII characters, got ${shown(value.name)}`, "Use e.g. `name: 'node-a'`.");
  }
  const dataParallelSize = integerOption(`${path}.dataParallelSize`, value.dataParallelSize, 1, 1, 65_536);
  const startRank = integerOption(`${path}.startRank`, value.startRank, 0, 0, MAX_RANK - dataParallelSize + 1);
  const ranks = parseRanks(`${path}.ranks`, value.ranks, startRank, dataParallelSize);
  return {
    name,
    url: url.href.replace(/\/$/, ''),
    startRank,
    dataParallelSize,
    ranks,
    rankHeader: oneOf(`${path}.rankHeader`, value.rankHeader, RANK_HEADER_MODES, 'global'),
    discoverIntervalMs: parseDiscover(`${path}.discover`, value.discover),
    kvEvents: parseKvEvents(`${path}.kvEvents`, value.kvEvents, ranks),
  };
}

function parseUrl(path: string, value: unknown): URL {
  let url: URL | undefined;
  if (typeof value === 'string') {
    try {
      url = new URL(value);
    } catch {
      url = undefined;
    }
  }
  if (!url || (url.protocol !== 'http:' && url.protocol !== 'https:')) {
    fail(path, `must be an http: or https: URL, got ${shown(value)}`, "Use e.g. `url: 'http://127.0.0.1:8000'`.");
  }
  return url;
}

function parseRanks(path: string, value: unknown, startRank: number, size: number): number[] {
  const last = startRank + size - 1;
  if (value === undefined) return Array.from({ length: size }, (_, offset) => startRank + offset);
  if (!Array.isArray(value) || value.length === 0) {
    fail(path, `must be a non-empty array of global ranks, got ${shown(value)}`, `Use ranks from ${startRank} to ${last}, e.g. \`ranks: [${startRank}]\`, or leave it out.`);
  }
  const ranks = new Set<number>();
  for (const rank of value) {
    if (typeof rank !== 'number' || !Number.isInteger(rank) || rank < startRank || rank > last) {
      fail(path, `holds ${shown(rank)}, which this upstream does not serve`, `It serves global ranks ${startRank} to ${last} (startRank … startRank + dataParallelSize − 1).`);
    }
    if (ranks.has(rank)) fail(path, `lists rank ${rank} twice`, 'List each rank once.');
    ranks.add(rank);
  }
  return [...ranks].sort((a, b) => a - b);
}

function parsePolicy(value: unknown, settings: PolicySettings): Policy {
  if (value === undefined) return policyByName('least-outstanding', settings);
  if (typeof value === 'string') {
    if (!POLICY_NAMES.includes(value as PolicyName)) {
      fail('policy', `is ${shown(value)}, not a known policy`, `Use one of ${POLICY_NAMES.map((name) => `'${name}'`).join(', ')}, or a Policy object.`);
    }
    return policyByName(value as PolicyName, settings);
  }
  if (isPlainObject(value) && typeof value.name === 'string' && typeof value.pick === 'function') return value as unknown as Policy;
  return fail('policy', `must be a policy name or an object with \`name\` and \`pick(candidates, ctx)\`, got ${shown(value)}`, "Use e.g. `policy: 'least-outstanding'`.");
}

function parseTrust(value: unknown): boolean | ((req: IncomingMessage) => boolean) {
  if (value === undefined) return false;
  if (typeof value === 'boolean' || typeof value === 'function') return value as boolean | ((req: IncomingMessage) => boolean);
  return fail('hints.trust', `must be a boolean or a function (req) => boolean, got ${shown(value)}`, 'Use e.g. `trust: (req) => req.socket.remoteAddress === "127.0.0.1"`.');
}

function parseMetrics(value: unknown): Configuration['metrics'] {
  if (value === false) return undefined;
  const metrics = optionalObject('metrics', value);
  rejectUnknownKeys('metrics', metrics, ['registry', 'prefix']);
  const registry = metrics.registry ?? register;
  if (!isPlainObject(registry) || typeof (registry as { getSingleMetric?: unknown }).getSingleMetric !== 'function') {
    fail('metrics.registry', `must be a prom-client Registry, got ${shown(metrics.registry)}`, 'Pass `new Registry()` from prom-client, or leave it out for the global registry.');
  }
  const prefix = metrics.prefix ?? 'dp_router_';
  if (typeof prefix !== 'string' || !METRIC_PREFIX.test(prefix)) {
    fail('metrics.prefix', `must be a valid Prometheus metric name prefix, got ${shown(metrics.prefix)}`, "Use e.g. `prefix: 'dp_router_'`.");
  }
  return { registry: registry as unknown as Registry, prefix };
}

/** The policy validates the values; unknown names are caught here, with the option path. */
function parsePrefixAware(value: unknown): Record<string, unknown> {
  const settings = optionalObject('prefixAware', value);
  rejectUnknownKeys('prefixAware', settings, ['blockChars', 'maxBlocksPerEndpoint', 'maxBlocksPerRequest', 'contentBalance', 'tokenizer']);
  return settings;
}
