import type { AdmissionOptions, AdmissionPriorityOptions, AdmissionQueueOptions, AdmissionTenantOptions } from '../lib/admission/options';
import type { SloOptions } from '../lib/slo/options';
import { getHeapStatistics } from 'node:v8';
import { describe, expect, it } from '@jest/globals';
import { Registry } from 'prom-client';
import { parseOptions } from '../lib/options';
import type { VerdictsOptions } from '../lib/verdicts/options';
import { thrownOptionError } from './helpers/option-error';
import {
  dpRank,
  OptionError,
  type AffinityOptions,
  type DisaggregationOptions,
  type DiscoverOptions,
  type DpRouterOptions,
  type HealthCheckOptions,
  type HintOptions,
  type LoadFeedbackOptions,
  type Logger,
  type MetricsOptions,
  type Options,
  type OutlierDetectionOptions,
  type KvEventsOptions,
  type PrefixAwareRouterSettings,
  type ReceiptsOptions,
  type RetryOptions,
  type RequestBufferingOptions,
  type TimeoutOptions,
  type UpstreamOptions,
} from '../lib';

const url = 'http://127.0.0.1:8000';
const parse = (options: unknown) => parseOptions(options as Options);

describe('parseOptions', () => {
  it('resolves every default', () => {
    const config = parse({ upstreams: [{ url }] });
    expect(config).toMatchObject({
      upstreams: [{ name: 'http://127.0.0.1:8000', url, startRank: 0, dataParallelSize: 1, ranks: [0], rankHeader: 'local', discoverIntervalMs: undefined }],
      hints: { trust: false, onInvalid: 'reassign', header: 'x-data-parallel-rank', bodyField: undefined },
      header: 'x-data-parallel-rank',
      affinity: { header: 'x-session-id', bodyField: 'user', loadFactor: 1.25, loadSlack: 4, keyLoadFactor: 1, maxSessions: 65_536 },
      prefixAware: { blockChars: 64, maxBlocksPerEndpoint: 32_768, maxBlocksPerRequest: 16_384, tokenizer: undefined },
      timeouts: { connectMs: 10_000, firstByteMs: 600_000, bodyMs: 60_000 },
      maxBodyBytes: 16 * 1024 * 1024,
      exposeDecision: false,
      xfwd: false,
      requestBuffering: { maxBytes: 1024 * 1024 },
    });
    expect(config.policy).toBe('least-outstanding');
    expect(Object.isFrozen(config)).toBe(true);
    expect(config.metrics?.prefix).toBe('dp_router_');
    expect(config.maxBufferedBytes).toBe(Math.min(512 * 1024 * 1024, Math.floor(getHeapStatistics().heap_size_limit / 4)));
    expect(parse({ upstreams: [{ url }], maxBufferedBytes: 1024 }).maxBufferedBytes).toBe(1024);
  });

  it('is shaped like the options: one frozen part per option, nothing else', () => {
    const config = parse({ upstreams: [{ url }], hints: { trust: true }, timeouts: { connectMs: 5 }, retries: { attempts: 3 }, requestBuffering: { maxBytes: 10 } });
    const optionKeys = ['upstreams', 'policy', 'hints', 'header', 'metrics', 'affinity', 'prefixAware', 'timeouts', 'maxBodyBytes', 'maxBufferedBytes', 'exposeDecision', 'loadFeedback', 'logger'];
    const proxyKeys = ['xfwd', 'outlierDetection', 'healthCheck', 'retries', 'disaggregation', 'admission', 'requestBuffering', 'peers', 'receipts', 'slo', 'verdicts'];
    expect(Object.keys(config).sort()).toEqual([...optionKeys, ...proxyKeys].sort());
    expect(Object.keys(parseOptions({ upstreams: [{ url }] }, 'dpRank')).sort()).toEqual([...optionKeys, ...proxyKeys].sort());
    expect(config).toMatchObject({ hints: { trust: true }, timeouts: { connectMs: 5 }, retries: { attempts: 3 }, requestBuffering: { maxBytes: 10 } });
    for (const part of [config.upstreams, config.upstreams[0], config.hints, config.affinity, config.prefixAware, config.timeouts, config.retries, config.requestBuffering, config.metrics, config.outlierDetection]) {
      expect(Object.isFrozen(part)).toBe(true);
    }
    // The user's own objects are kept as given, not frozen.
    const registry = new Registry();
    expect(Object.isFrozen(parse({ upstreams: [{ url }], metrics: { registry } }).metrics!.registry)).toBe(false);
  });

  it('resolves the failure-handling defaults: ejection and retries on, health checks off', () => {
    expect(parse({ upstreams: [{ url }] })).toMatchObject({
      outlierDetection: { consecutiveFailures: 5, baseEjectionMs: 10_000, maxEjectionMs: 300_000, maxEjectionPercent: 50 },
      healthCheck: undefined,
      retries: { attempts: 2, maxBodyBytes: 1024 * 1024 },
    });
    const off = parse({ upstreams: [{ url }], outlierDetection: false, retries: false, healthCheck: false });
    expect(off).toMatchObject({ outlierDetection: undefined, healthCheck: undefined, retries: { attempts: 1, maxBodyBytes: 0 } });
    expect(parse({ upstreams: [{ url }], healthCheck: true }).healthCheck).toEqual({
      path: '/health',
      intervalMs: 5_000,
      timeoutMs: 2_000,
      unhealthyThreshold: 2,
      healthyThreshold: 1,
    });
    expect(parse({ upstreams: [{ url }], outlierDetection: { baseEjectionMs: 600_000 } }).outlierDetection?.maxEjectionMs).toBe(600_000);
  });

  it('derives the routable ranks from startRank, dataParallelSize and ranks', () => {
    const config = parse({
      upstreams: [
        { url, name: 'a', dataParallelSize: 8, ranks: [6, 0, 4, 2] },
        { url: 'https://10.0.0.5:8000/', name: 'b', dataParallelSize: 4, startRank: 4, rankHeader: 'local' },
      ],
    });
    expect(config.upstreams[0].ranks).toEqual([0, 2, 4, 6]);
    expect(config.upstreams[1]).toMatchObject({ url: 'https://10.0.0.5:8000', ranks: [4, 5, 6, 7], rankHeader: 'local' });
  });

  it.each([
    [true, 'replace'],
    ['append', 'append'],
    [false, false],
  ])('resolves xfwd: %j to %j', (xfwd, resolved) => {
    expect(parse({ upstreams: [{ url }], xfwd }).xfwd).toBe(resolved);
  });

  it('keeps a custom registry, prefix and policy object', () => {
    const registry = new Registry();
    const policy = { name: 'mine', pick: (candidates: readonly unknown[]) => candidates[0] };
    const config = parse({ upstreams: [{ url }], metrics: { registry, prefix: 'gw_' }, policy });
    expect(config.metrics).toEqual({ registry, prefix: 'gw_' });
    expect(config.policy).toBe(policy);
    expect(parse({ upstreams: [{ url }], metrics: false }).metrics).toBeUndefined();
  });

  const wrong: Array<[string, unknown, RegExp]> = [
    ['no options', undefined, /`options` must be an object/],
    ['no upstreams', {}, /`upstreams` must be a non-empty array/],
    ['empty upstreams', { upstreams: [] }, /`upstreams` must be a non-empty array/],
    ['a misspelt option', { upstreams: [{ url }], polcy: 'random' }, /`polcy` is not an option\. Did you mean `policy`\?/],
    ['a misspelt upstream option', { upstreams: [{ url, dataParalelSize: 8 }] }, /`upstreams\[0\]\.dataParalelSize` is not an option\. Did you mean `dataParallelSize`\?/],
    ['an unknown hint option', { upstreams: [{ url }], hints: { trusted: true } }, /`hints\.trusted` is not an option\. Did you mean `trust`\?/],
    ['a non-URL', { upstreams: [{ url: 'not a url' }] }, /`upstreams\[0\]\.url` must be an http: or https: URL/],
    ['no upstreams', { upstreams: [] }, /`upstreams` must be a non-empty array, got an empty array\./],
    ['a number of retries', { upstreams: [{ url }], retries: 3 }, /`retries` must be true, false or an object, got 3\. Did you mean `retries: \{ attempts: 3 \}`\?/],
    ['a health check interval', { upstreams: [{ url }], healthCheck: 5000 }, /`healthCheck` must be true, false or an object, got 5000\. Did you mean `healthCheck: \{ intervalMs: 5000 \}`\?/],
    ['a load feedback interval', { upstreams: [{ url }], loadFeedback: 1000 }, /Did you mean `loadFeedback: \{ intervalMs: 1000 \}`\?/],
    ['a failure count', { upstreams: [{ url }], outlierDetection: 5 }, /Did you mean `outlierDetection: \{ consecutiveFailures: 5 \}`\?/],
    ['a discovery interval', { upstreams: [{ url, discover: 5000 }] }, /`upstreams\[0\]\.discover` must be true, false or an object, got 5000\. Did you mean `discover: \{ intervalMs: 5000 \}`\?/],
    ['a ws URL', { upstreams: [{ url: 'ws://127.0.0.1' }] }, /`upstreams\[0\]\.url` must be an http: or https: URL/],
    ['a zero size', { upstreams: [{ url, dataParallelSize: 0 }] }, /`upstreams\[0\]\.dataParallelSize` must be an integer from 1/],
    ['a fractional start', { upstreams: [{ url, startRank: 1.5 }] }, /`upstreams\[0\]\.startRank` must be an integer/],
    ['a rank not served', { upstreams: [{ url, dataParallelSize: 4, startRank: 4, ranks: [3] }] }, /`upstreams\[0\]\.ranks` holds 3, which this upstream does not serve\. It serves global ranks 4 to 7/],
    ['a repeated rank', { upstreams: [{ url, dataParallelSize: 4, ranks: [1, 1] }] }, /lists rank 1 twice/],
    ['empty ranks', { upstreams: [{ url, ranks: [] }] }, /`upstreams\[0\]\.ranks` must be a non-empty array/],
    ['a wrong header mode', { upstreams: [{ url, rankHeader: 'relative' }] }, /`upstreams\[0\]\.rankHeader` must be one of 'global', 'local', 'none'/],
    ['a name with a newline', { upstreams: [{ url, name: 'a\nb' }] }, /`upstreams\[0\]\.name` must be 1 to 128 printable ASCII characters/],
    ['a repeated name', { upstreams: [{ url }, { url }] }, /`upstreams\[1\]\.name` repeats the name/],
    ['an unknown policy', { upstreams: [{ url }], policy: 'fastest' }, /`policy` is "fastest", not a known policy\. Use one of 'least-outstanding'/],
    ['a policy without pick', { upstreams: [{ url }], policy: { name: 'x' } }, /`policy` must be a policy name or an object/],
    ['a string trust', { upstreams: [{ url }], hints: { trust: 'yes' } }, /`hints\.trust` must be a boolean or a function/],
    ['a wrong onInvalid', { upstreams: [{ url }], hints: { onInvalid: 'drop' } }, /`hints\.onInvalid` must be one of 'reassign', 'reject'/],
    ['a header with a space', { upstreams: [{ url }], header: 'x rank' }, /`header` must be a header name/],
    ['a non-registry', { upstreams: [{ url }], metrics: { registry: {} } }, /`metrics\.registry` must be a prom-client Registry/],
    ['a bad prefix', { upstreams: [{ url }], metrics: { prefix: 'dp-router' } }, /`metrics\.prefix` must be a valid Prometheus metric name prefix/],
    ['a negative timeout', { upstreams: [{ url }], timeouts: { connectMs: -1 } }, /`timeouts\.connectMs` must be an integer from 1/],
    ['a zero body limit', { upstreams: [{ url }], maxBodyBytes: 0 }, /`maxBodyBytes` must be an integer from 1/],
    ['a fractional body budget', { upstreams: [{ url }], maxBufferedBytes: 1.5 }, /`maxBufferedBytes` must be an integer from 1/],
    ['a zero body timeout', { upstreams: [{ url }], timeouts: { bodyMs: 0 } }, /`timeouts\.bodyMs` must be an integer from 1/],
    ['a misspelt body timeout', { upstreams: [{ url }], timeouts: { bodyTimeoutMs: 5 } }, /`timeouts\.bodyTimeoutMs` is not an option/],
    ['a string exposeDecision', { upstreams: [{ url }], exposeDecision: 'yes' }, /`exposeDecision` must be true or false/],
    ['a string xfwd', { upstreams: [{ url }], xfwd: 'yes' }, /`xfwd` must be true or false/],
    ['a misspelt xfwd mode', { upstreams: [{ url }], xfwd: 'appended' }, /`xfwd` must be true or false, or 'append'.*xfwd: 'append'/],
    ['a zero failure count', { upstreams: [{ url }], outlierDetection: { consecutiveFailures: 0 } }, /`outlierDetection\.consecutiveFailures` must be an integer from 1/],
    ['a misspelt outlier option', { upstreams: [{ url }], outlierDetection: { consecutive5xx: 3 } }, /`outlierDetection\.consecutive5xx` is not an option/],
    ['a max ejection below the base', { upstreams: [{ url }], outlierDetection: { baseEjectionMs: 5000, maxEjectionMs: 1000 } }, /`outlierDetection\.maxEjectionMs` is 1000, below baseEjectionMs/],
    ['a percent over 100', { upstreams: [{ url }], outlierDetection: { maxEjectionPercent: 150 } }, /`outlierDetection\.maxEjectionPercent` must be a number from 0 to 100/],
    ['a health path without a slash', { upstreams: [{ url }], healthCheck: { path: 'health' } }, /`healthCheck\.path` must be a path starting with '\/'/],
    ['a health path with a space', { upstreams: [{ url }], healthCheck: { path: '/he alth' } }, /`healthCheck\.path` must be a path/],
    ['a string health check', { upstreams: [{ url }], healthCheck: 'on' }, /`healthCheck` must be an object/],
    ['a zero interval', { upstreams: [{ url }], healthCheck: { intervalMs: 0 } }, /`healthCheck\.intervalMs` must be an integer from 1/],
    ['a misspelt health option', { upstreams: [{ url }], healthCheck: { interval: 1000 } }, /`healthCheck\.interval` is not an option\. Did you mean `intervalMs`\?/],
    ['zero attempts', { upstreams: [{ url }], retries: { attempts: 0 } }, /`retries\.attempts` must be an integer from 1 to 10/],
    ['a misspelt retry option', { upstreams: [{ url }], retries: { maxRetries: 3 } }, /`retries\.maxRetries` is not an option/],
    ['a session balance below 1', { upstreams: [{ url }], affinity: { keyLoadFactor: 0.9 } }, /`affinity\.keyLoadFactor` must be a number from 1/],
    ['a misspelt prefixAware option', { upstreams: [{ url }], prefixAware: { blockChar: 64 } }, /`prefixAware\.blockChar` is not an option\. Did you mean `blockChars`\?/],
    ['a logger without warn', { upstreams: [{ url }], logger: { info: () => undefined } }, /`logger` must have a warn\(message\) method/],
    ['a discover interval of 0', { upstreams: [{ url, discover: { intervalMs: 0 } }] }, /`upstreams\[0\]\.discover\.intervalMs` must be an integer from 10/],
    ['a feedback weight above 1', { upstreams: [{ url }], loadFeedback: { weight: 2 } }, /`loadFeedback\.weight` must be a number from 0 to 1/],
    ['a load factor below 1', { upstreams: [{ url }], affinity: { loadFactor: 0.5 } }, /`affinity\.loadFactor` must be a number from 1/],
  ];

  it.each(wrong)('throws a TypeError naming the option for %s', (_label, options, message) => {
    expect(() => parse(options)).toThrow(TypeError);
    expect(() => parse(options)).toThrow(message);
  });
});

/** A wrong value for every key of an options type: the compiler asks for a row per key. */
type WrongValues<T> = { [K in keyof Required<T>]: unknown };

/** Every option's path with a wrong value; each must be reported at that path. */
const wrongValues: Array<[path: string, value: unknown]> = [
  ...rows('', {
    upstreams: 'http://127.0.0.1:8000',
    policy: 'fastest',
    hints: 'trusted',
    header: 'x rank',
    metrics: 'on',
    affinity: 'x-session-id',
    prefixAware: 64,
    timeouts: 1000,
    maxBodyBytes: 0,
    maxBufferedBytes: -1,
    exposeDecision: 'yes',
    loadFeedback: 'on',
    logger: { info: () => undefined },
    xfwd: 'yes',
    outlierDetection: 'on',
    healthCheck: 'on',
    retries: 3,
    disaggregation: 'on',
    admission: 'on',
    requestBuffering: 'on',
    peers: 'on',
    receipts: 'on',
    slo: 'on',
    verdicts: 3,
  } satisfies WrongValues<DpRouterOptions>),
  ...rows('slo', { trust: 'yes', ttftMs: 1.5, tpotMs: -1, shed: 'yes' } satisfies WrongValues<SloOptions>),
  ...rows('verdicts', { minSources: 0 } satisfies WrongValues<VerdictsOptions>),
  ...rows('receipts', {
    kvEvents: 'yes',
    usage: 'yes',
    askStreamUsage: 1,
    usageEvery: 0,
    window: 0,
    minReceipts: 0,
    elsewhereShare: 1,
    missShare: 0,
    unseenAfterMs: 0,
    probeEvery: 0,
    maxPending: 0,
  } satisfies WrongValues<ReceiptsOptions>),
  ...rows('requestBuffering', { maxBytes: 0 } satisfies WrongValues<RequestBufferingOptions>),
  ...rows('admission', { maxInflightPerRank: 0, queue: 5, tenant: 'x-tenant', priority: 'high', tokens: 5 } satisfies WrongValues<AdmissionOptions>),
  ...rows('admission.queue', { maxLength: -1, maxPerTenant: 0.5, timeoutMs: 0, starvationLimit: 0 } satisfies WrongValues<AdmissionQueueOptions>),
  ...rows('admission.priority', { header: 'a b', trust: 'yes', classes: ['High'] } satisfies WrongValues<AdmissionPriorityOptions>),
  ...rows('admission.tenant', { header: 'a b', trust: 'yes' } satisfies WrongValues<AdmissionTenantOptions>),
  ...rows('admission.tokens', { perMinute: 0 }),
  ...rows('upstreams[0]', {
    url: 'ftp://127.0.0.1',
    name: '',
    dataParallelSize: 0,
    startRank: -1,
    ranks: [1],
    rankHeader: 'relative',
    discover: 'yes',
    kvEvents: 'tcp://10.0.0.5:5557',
    models: [''],
    role: 'leader',
    bootstrapPort: 0,
  } satisfies WrongValues<UpstreamOptions>),
  ...rows('upstreams[0].kvEvents', { endpoint: 'tcp://*:5557', replayEndpoint: ['tcp://h:1', 'tcp://h:2'], topic: 7 } satisfies WrongValues<KvEventsOptions>),
  ...rows('upstreams[0].discover', { intervalMs: 5 } satisfies WrongValues<DiscoverOptions>),
  ...rows('hints', { trust: 'yes', onInvalid: 'drop', header: 'a b', bodyField: '' } satisfies WrongValues<HintOptions>),
  ...rows('affinity', {
    header: 'a b',
    bodyField: 7,
    loadFactor: 0.5,
    loadSlack: -1,
    keyLoadFactor: 0.9,
    maxSessions: 1.5,
  } satisfies WrongValues<AffinityOptions>),
  ...rows('prefixAware', { blockChars: 0, maxBlocksPerEndpoint: 1.5, maxBlocksPerRequest: 0, contentBalance: -1, placementSlack: -1, tokenizer: 42, chatTemplateKwargs: '{"enable_thinking": false}', tierWeights: 'CPU' } satisfies WrongValues<PrefixAwareRouterSettings>),
  ...rows('prefixAware.tierWeights', { CPU: 1.5, GPU: 0.5, STORAGE: '0.25' }),
  ...rows('timeouts', { connectMs: 0, firstByteMs: 2 ** 31, bodyMs: '60s' } satisfies WrongValues<TimeoutOptions>),
  ...rows('metrics', { registry: {}, prefix: 'dp-router' } satisfies WrongValues<MetricsOptions>),
  ...rows('outlierDetection', {
    consecutiveFailures: 0,
    baseEjectionMs: 0,
    maxEjectionMs: 0,
    maxEjectionPercent: 101,
    minimumClients: 0,
  } satisfies WrongValues<OutlierDetectionOptions>),
  ...rows('healthCheck', { path: 'health', intervalMs: 0, timeoutMs: 0, unhealthyThreshold: 0, healthyThreshold: 1001 } satisfies WrongValues<HealthCheckOptions>),
  ...rows('retries', { attempts: 11, maxBodyBytes: -1 } satisfies WrongValues<RetryOptions>),
  ...rows('disaggregation', { connector: 'rdma', prefillPolicy: 'fastest', onPrefillFailure: 'retry', kvLeaseMs: 0 } satisfies WrongValues<DisaggregationOptions>),
  ...rows('loadFeedback', { intervalMs: 1, timeoutMs: 0, weight: 2 } satisfies WrongValues<LoadFeedbackOptions>),
  // `warn` is what makes a logger: without it the whole `logger` is wrong.
  ...rows('logger', { warn: 'no', info: 'no', debug: 'no', error: 'no', isLevelEnabled: 'no' } satisfies WrongValues<Logger>).map(
    ([path, value]): [string, unknown] => (path === 'logger.warn' ? ['logger', { warn: value }] : [path, value]),
  ),
];

/** Every option object, for the unknown-key check. */
const sections = ['', 'upstreams[0]', 'upstreams[0].discover', 'upstreams[0].kvEvents', 'hints', 'affinity', 'prefixAware', 'timeouts', 'metrics', 'outlierDetection', 'healthCheck', 'retries', 'loadFeedback', 'disaggregation', 'receipts'];

function rows(section: string, values: Record<string, unknown>): Array<[string, unknown]> {
  return Object.entries(values).map(([key, value]) => [section ? `${section}.${key}` : key, value]);
}

/** Valid base options with `value` set at `path` (`a.b`, `a[0].b`), the logger's other methods filled in. */
function withOption(path: string, value: unknown): Record<string, unknown> {
  const options: Record<string, unknown> = { upstreams: [{ url }] };
  const keys = path.split(/\.|\[(\d+)\]/).filter((key) => key !== undefined && key !== '');
  let at: Record<string, unknown> = options;
  for (const key of keys.slice(0, -1)) {
    at[key] ??= key === 'logger' ? { warn: () => undefined } : {};
    at = at[key] as Record<string, unknown>;
  }
  at[keys[keys.length - 1]] = value;
  return options;
}


describe('every option', () => {
  it.each(wrongValues)('reports a wrong `%s` at its path, as an OptionError with a fix', (path, value) => {
    const error = thrownOptionError(() => parse(withOption(path, value)));
    expect(error).toBeInstanceOf(OptionError);
    expect(error).toBeInstanceOf(TypeError);
    expect(error.path).toBe(path);
    expect(error.fix.length).toBeGreaterThan(0);
    expect(error.message.startsWith(`express-dp-router: \`${path}\` `)).toBe(true);
    expect(error.message.endsWith(error.fix)).toBe(true);
  });

  it.each(sections)('rejects an unknown key in `%s`', (section) => {
    const path = section ? `${section}.bogusOption` : 'bogusOption';
    const error = thrownOptionError(() => parse(withOption(path, 1)));
    expect(error).toBeInstanceOf(OptionError);
    expect(error.path).toBe(path);
    expect(error.message).toMatch(/is not an option\. Known options: /);
  });

  it.each([
    ['round-robin', { prefixAware: { blockChars: 0 } }, 'prefixAware.blockChars'],
    ['least-outstanding', { prefixAware: { maxBlocksPerEndpoint: 0 } }, 'prefixAware.maxBlocksPerEndpoint'],
    ['prefix-aware', { affinity: { maxSessions: 0 } }, 'affinity.maxSessions'],
  ])('checks the policy settings whatever the policy (%s)', (policy, extra, path) => {
    const error = thrownOptionError(() => parse({ upstreams: [{ url }], policy, ...extra }));
    expect(error).toBeInstanceOf(OptionError);
    expect(error.path).toBe(path);
    expect(error.message).toMatch(new RegExp(`^express-dp-router: \`${path.replace('.', '\\.')}\` must be an integer from 1 to `));
  });
});

describe('dpRank options', () => {
  it.each([
    ['xfwd', true],
    ['retries', false],
    ['outlierDetection', { consecutiveFailures: 3 }],
    ['healthCheck', true],
    ['timeouts.connectMs', 5_000],
    ['timeouts.firstByteMs', 60_000],
  ])('refuses the proxy-only `%s`, naming dpRouter()', (path, value) => {
    const error = thrownOptionError(() => parseOptions(withOption(path, value) as unknown as Options, 'dpRank'));
    expect(error).toBeInstanceOf(OptionError);
    expect(error.path).toBe(path);
    expect(error.message).toMatch(/is an option of dpRouter\(\), which proxies; dpRank\(\) leaves the proxying to you\. Remove it .* or use dpRouter\(\)\.$/);
    // The same options are fine for the router.
    expect(() => parse(withOption(path, value))).not.toThrow();
  });

  it('refuses them through dpRank() itself', () => {
    expect(() => dpRank({ upstreams: [{ url }], metrics: false, retries: { attempts: 3 } } as Options)).toThrow(
      new OptionError('retries', "is an option of dpRouter(), which proxies; dpRank() leaves the proxying to you", "Remove it from dpRank()'s options and set the equivalent on your own proxy, or use dpRouter()."),
    );
  });

  it('takes the body timeout, which it uses, and leaves the proxy parts off', () => {
    const config = parseOptions({ upstreams: [{ url }], timeouts: { bodyMs: 5_000 } }, 'dpRank');
    expect(config).toMatchObject({ timeouts: { bodyMs: 5_000 }, outlierDetection: undefined, healthCheck: undefined, retries: { attempts: 1, maxBodyBytes: 0 }, requestBuffering: { maxBytes: 0 }, xfwd: false });
    const misspelt = thrownOptionError(() => parseOptions({ upstreams: [{ url }], timeouts: { bodyMS: 5_000 } } as Options, 'dpRank'));
    expect(misspelt.message).toMatch(/`timeouts\.bodyMS` is not an option\. Did you mean `bodyMs`\?/);
  });
});

describe('header options', () => {
  it('turns the affinity header off with false, and refuses false for the rank headers', () => {
    expect(parse({ upstreams: [{ url }], affinity: { header: false } }).affinity.header).toBeUndefined();
    expect(() => parse({ upstreams: [{ url }], hints: { header: false } })).toThrow(/`hints\.header` must be a header name, got false\. Use e\.g\. `hints\.header: 'x-data-parallel-rank'`/);
    expect(() => parse({ upstreams: [{ url }], header: false })).toThrow(/`header` must be a header name, got false/);
  });
});

describe('verdicts', () => {
  it('needs 3 distinct sources by default, and takes 1 to 64', () => {
    expect(parseOptions({ upstreams: [{ url: 'http://127.0.0.1:8000' }] }).verdicts).toEqual({ minSources: 3 });
    expect(parseOptions({ upstreams: [{ url: 'http://127.0.0.1:8000' }], verdicts: { minSources: 1 } }).verdicts).toEqual({ minSources: 1 });
    expect(thrownOptionError(() => parseOptions({ upstreams: [{ url: 'http://127.0.0.1:8000' }], verdicts: { minSources: 65 } })).message).toMatch(/`verdicts\.minSources` must be an integer from 1 to 64, got 65/);
    expect(thrownOptionError(() => parseOptions({ upstreams: [{ url: 'http://127.0.0.1:8000' }], verdicts: { minSource: 2 } as never })).message).toMatch(/`verdicts\.minSource` is not an option\. Did you mean `minSources`\?/);
  });
});
