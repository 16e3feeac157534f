import { getHeapStatistics } from 'node:v8';
import { describe, expect, it } from '@jest/globals';
import { Registry } from 'prom-client';
import { parseOptions } from '../lib/options';
import type { Options } from '../lib';

const url = 'http://127.0.0.1:8000';
const parse = (options: unknown) => parseOptions(options as Options);

describe('parseOptions', () => {
  it('resolves every default', () => {
    const config = parse({ upstreams: [{ url }] });
    expect(config).toMatchObject({
      upstreams: [{ name: 'http://127.0.0.1:8000', url, startRank: 0, dataParallelSize: 1, ranks: [0], rankHeader: 'global', discoverIntervalMs: undefined }],
      trust: false,
      onInvalid: 'reassign',
      hintHeader: 'x-data-parallel-rank',
      hintBodyField: undefined,
      header: 'x-data-parallel-rank',
      affinityHeader: 'x-session-id',
      affinityBodyField: 'user',
      connectTimeoutMs: 10_000,
      firstByteTimeoutMs: 600_000,
      maxBodyBytes: 16 * 1024 * 1024,
      bodyTimeoutMs: 60_000,
      exposeDecision: false,
      xfwd: false,
    });
    expect(config.policy.name).toBe('least-outstanding');
    expect(config.metrics?.prefix).toBe('dp_router_');
    expect(config.bodyBudget.limit).toBe(Math.min(512 * 1024 * 1024, Math.floor(getHeapStatistics().heap_size_limit / 4)));
    expect(parse({ upstreams: [{ url }], maxBufferedBytes: 1024 }).bodyBudget.limit).toBe(1024);
  });

  it('resolves the failure-handling defaults: ejection and retries on, health checks off', () => {
    expect(parse({ upstreams: [{ url }] })).toMatchObject({
      outlierDetection: { consecutiveFailures: 5, baseEjectionMs: 10_000, maxEjectionMs: 300_000, maxEjectionPercent: 50 },
      healthCheck: undefined,
      retryAttempts: 2,
      retryMaxBodyBytes: 1024 * 1024,
    });
    const off = parse({ upstreams: [{ url }], outlierDetection: false, retries: false, healthCheck: false });
    expect(off).toMatchObject({ outlierDetection: undefined, healthCheck: undefined, retryAttempts: 1 });
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
