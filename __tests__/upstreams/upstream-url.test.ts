import { describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { Registry } from 'prom-client';
import { dpRouter, OptionError } from '../../lib';
import { redactUrl } from '../../lib/upstreams/upstream-url';
import { parseCommandLine, UsageError } from '../../example-server/cli';
import { closedAfterEach, echoUpstreams, startGateway, waitFor } from '../helpers';

const echo = echoUpstreams();
const started = closedAfterEach();

const create = (url: string) => dpRouter({ upstreams: [{ url }], metrics: { registry: new Registry() } });

describe('upstream URLs', () => {
  it.each([
    ['an OpenAI base URL', 'http://10.0.0.5:8000/v1', /`upstreams\[0\]\.url` ends in \/v1, an OpenAI base URL.*\/v1\/v1\/….*`url: 'http:\/\/10\.0\.0\.5:8000'`/],
    ['an OpenAI base URL with a slash', 'http://10.0.0.5:8000/v1/', /ends in \/v1.*`url: 'http:\/\/10\.0\.0\.5:8000'`/],
    ['a prefixed OpenAI base URL', 'http://ingress/vllm-a/v1', /ends in \/v1.*`url: 'http:\/\/ingress\/vllm-a'`/],
    ['a query', 'http://10.0.0.5:8000/?x=1', /`upstreams\[0\]\.url` has a query \("\?x=1"\), which cannot be joined.*`url: 'http:\/\/10\.0\.0\.5:8000'`/],
    ['a fragment', 'http://10.0.0.5:8000#top', /has a fragment \("#top"\)/],
    ['credentials', 'http://user:s3cret@10.0.0.5:8000', /`upstreams\[0\]\.url` carries credentials.*`url: 'http:\/\/10\.0\.0\.5:8000'`.*Authorization: Bearer/],
    ['a user name alone', 'https://user@10.0.0.5', /carries credentials/],
  ])('refuses %s, naming upstreams[i].url and the fix', (_, url, message) => {
    expect(() => create(url)).toThrow(OptionError);
    expect(() => create(url)).toThrow(message);
  });

  it('never prints a password, in any message about a URL', () => {
    for (const url of ['http://user:s3cret@10.0.0.5:8000', 'ftp://user:s3cret@10.0.0.5', 'http://user:s3cret@10.0.0.5:8000/v1?x=1']) {
      let message = '';
      try {
        create(url);
      } catch (error) {
        message = (error as Error).message;
      }
      expect(message).toMatch(/upstreams\[0\]\.url/);
      expect(message).not.toContain('s3cret');
    }
  });

  it('refuses them in setUpstreams too', async () => {
    const upstream = await echo();
    const gateway = await startGateway({ upstreams: [{ url: upstream.url }] });
    started.push(gateway);
    expect(() => gateway.router.setUpstreams([{ url: `${upstream.url}/v1` }])).toThrow(/`upstreams\[0\]\.url` ends in \/v1/);
  });

  it('joins a path prefix once, for proxied requests and health checks', async () => {
    const upstream = await echo();
    const gateway = await startGateway({ upstreams: [{ url: `${upstream.url}/vllm-a/`, name: 'a' }], healthCheck: { intervalMs: 20 } });
    started.push(gateway);
    const response = await request(gateway.url).get('/v1/models?limit=2');
    expect(response.status).toBe(200);
    await waitFor(() => upstream.seen.some((seen) => seen.url === '/vllm-a/health'));
    expect(new Set(upstream.seen.map((seen) => seen.url))).toEqual(new Set(['/vllm-a/v1/models?limit=2', '/vllm-a/health']));
  });
});

describe('the example server\'s --upstream', () => {
  it.each([
    ['http://user:s3cret@10.0.0.5:8000@0-3', /--upstream "http:\/\/\*\*\*@10\.0\.0\.5:8000@0-3" carries credentials/],
    ['http://user:s3cret@10.0.0.5:8000', /--upstream "http:\/\/\*\*\*@10\.0\.0\.5:8000" carries credentials/],
    ['ftp://user:s3cret@10.0.0.5', /--upstream "ftp:\/\/\*\*\*@10\.0\.0\.5" is not an http\(s\) URL/],
    ['http://10.0.0.5:8000/v1@0,1', /--upstream "http:\/\/10\.0\.0\.5:8000\/v1@0,1" ends in \/v1/],
    ['http://10.0.0.5:8000/?x=1', /has a query/],
  ])('refuses %s without printing a password', (spec, message) => {
    expect(() => parseCommandLine(['--upstream', spec])).toThrow(UsageError);
    expect(() => parseCommandLine(['--upstream', spec])).toThrow(message);
    expect(() => parseCommandLine(['--upstream', spec])).not.toThrow(/s3cret/);
  });
});

describe('redactUrl, for every URL the gateway prints (item 41.13)', () => {
  it.each([
    ['redis://:secret@10.0.0.5:6379/0', 'redis://***@10.0.0.5:6379/0'],
    ['http://user:secret@10.0.0.5:4318/v1/traces', 'http://***@10.0.0.5:4318/v1/traces'],
    ['http://user@10.0.0.5', 'http://***@10.0.0.5'],
    // Not URLs as written: a password with `#` or `/`, a mistyped scheme.
    ['redis://:se#cr/et@10.0.0.5:6379', 'redis://***@10.0.0.5:6379'],
    ['rediss//:secret@10.0.0.5', '***@10.0.0.5'],
    // Nothing to hide: an `@` in a path is not user information.
    ['http://10.0.0.5:8000/a@b', 'http://10.0.0.5:8000/a@b'],
    ['tcp://10.0.0.5:5557', 'tcp://10.0.0.5:5557'],
  ])('%s → %s', (raw, shown) => {
    expect(redactUrl(raw)).toBe(shown);
  });
});
