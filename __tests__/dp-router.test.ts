import { afterEach, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { createServer, request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Registry } from 'prom-client';
import request from 'supertest';
import express from 'express';
import { dpRouter, type Options } from '../lib';
import { startEchoUpstream, type EchoUpstream } from './helpers/echo-upstream';
import { metricValue, parseExposition, serve, startGateway, sumSamples, type TestGateway } from './helpers/app';
import { rawRequest } from './helpers/raw-http';
import { seedScenario } from './helpers/fixtures';
import { waitFor } from './helpers/wait';
import { freePort } from './helpers/ports';

let upstream: EchoUpstream;
let gateway: TestGateway | undefined;

beforeEach(async () => {
  upstream = await startEchoUpstream();
});
afterEach(async () => {
  await gateway?.close();
  gateway = undefined;
  await upstream.close();
});

const seed = (extra: Partial<Options> = {}): Options => seedScenario(upstream.url, extra);

const post = (path = '/v1/completions') => request(gateway!.url).post(path).send({ model: 'm', prompt: 'hi' });

describe('the seed scenario', () => {
  it('spreads 100 round-robin requests 25 each over ranks 0, 2, 4, 6 and no other', async () => {
    gateway = await startGateway(seed({ policy: 'round-robin' }));
    const counts = new Map<string, number>();
    for (let index = 0; index < 100; index++) {
      const response = await post();
      expect(response.status).toBe(200);
      const [rank] = response.body.rankHeaders as string[];
      counts.set(rank, (counts.get(rank) ?? 0) + 1);
    }
    expect(Object.fromEntries(counts)).toEqual({ '0': 25, '2': 25, '4': 25, '6': 25 });
    expect(upstream.seen.every((seen) => seen.url === '/v1/completions' && seen.rankHeaders.length === 1)).toBe(true);

    const samples = parseExposition((await request(gateway.url).get('/metrics')).text);
    for (const rank of ['0', '2', '4', '6']) {
      expect(sumSamples(samples, 'dp_router_requests_total', { upstream: 'node-a', rank, source: 'assigned' })).toBe(25);
    }
    expect(samples.some((sample) => sample.labels.rank === '1')).toBe(false);
  });

  it('keeps the mount path: app.use("/v1", router) forwards /v1/...', async () => {
    gateway = await startGateway(seed(), '/v1');
    const response = await request(gateway.url).post('/v1/chat/completions?x=1').send({ messages: [] });
    expect(response.status).toBe(200);
    expect(upstream.seen[0].url).toBe('/v1/chat/completions?x=1');
    expect((await request(gateway.url).get('/other')).status).toBe(404);
    expect(upstream.seen).toHaveLength(1);
  });
});

describe('client hints', () => {
  const trusted = (onInvalid: 'reassign' | 'reject' = 'reassign') => seed({ hints: { trust: true, onInvalid } });

  it('removes an untrusted hint, assigns a rank, and counts it untrusted', async () => {
    gateway = await startGateway(seed());
    for (let index = 0; index < 8; index++) {
      const response = await post().set('X-Data-Parallel-Rank', '2');
      expect(response.status).toBe(200);
    }
    const ranks = upstream.seen.map((seen) => seen.rankHeaders);
    expect(ranks.every((lines) => lines.length === 1)).toBe(true);
    expect(new Set(ranks.map(([rank]) => rank))).toEqual(new Set(['0', '2', '4', '6']));
    expect(await metricValue(gateway.registry, 'dp_router_rank_hints_total', { outcome: 'untrusted' })).toBe(8);
    expect(await metricValue(gateway.registry, 'dp_router_requests_total', { source: 'hint' })).toBe(0);
  });

  it('does not parse an untrusted hint: even garbage counts only as untrusted', async () => {
    gateway = await startGateway(seed({ hints: { onInvalid: 'reject' } }));
    expect((await post().set('x-data-parallel-rank', '+3')).status).toBe(200);
    expect(await metricValue(gateway.registry, 'dp_router_rank_hints_total', { outcome: 'untrusted' })).toBe(1);
    expect(await metricValue(gateway.registry, 'dp_router_rank_hints_total', { outcome: 'malformed' })).toBe(0);
  });

  it('honours a valid trusted hint with exactly one clean header', async () => {
    gateway = await startGateway(trusted());
    for (const rank of ['6', '0', '4']) {
      const response = await post().set('x-data-parallel-rank', rank);
      expect(response.body.rankHeaders).toEqual([rank]);
    }
    expect(await metricValue(gateway.registry, 'dp_router_rank_hints_total', { outcome: 'accepted' })).toBe(3);
    expect(await metricValue(gateway.registry, 'dp_router_requests_total', { rank: '6', source: 'hint' })).toBe(1);
  });

  it('decides trust per request with a function', async () => {
    gateway = await startGateway(seed({ hints: { trust: (req) => req.headers.authorization === 'Bearer internal' } }));
    for (let index = 0; index < 4; index++) {
      expect((await post().set('x-data-parallel-rank', '4').set('authorization', 'Bearer internal')).body.rankHeaders).toEqual(['4']);
    }
    const outsider = await Promise.all([0, 1, 2, 3].map(() => post().set('x-data-parallel-rank', '4')));
    expect(new Set(outsider.map((response) => response.body.rankHeaders[0])).size).toBeGreaterThan(1);
  });

  const invalid: Array<[string, string, 'malformed' | 'out_of_range']> = [
    ['plus sign', '+3', 'malformed'],
    ['underscore', '1_0', 'malformed'],
    ['decimal', '3.0', 'malformed'],
    ['hex', '0x1', 'malformed'],
    ['leading zero', '04', 'malformed'],
    ['negative', '-1', 'malformed'],
    ['empty', '', 'malformed'],
    ['too long', '99999999999', 'malformed'],
    ['served but not routed', '3', 'out_of_range'],
    ['beyond the server', '8', 'out_of_range'],
    ['huge', '4294967296', 'out_of_range'],
  ];

  it.each(invalid)('reassigns a trusted %s hint (%j) and counts it %s', async (_label, value, outcome) => {
    gateway = await startGateway(trusted('reassign'));
    const response = await post().set('x-data-parallel-rank', value);
    expect(response.status).toBe(200);
    expect(response.body.rankHeaders).toHaveLength(1);
    expect(['0', '2', '4', '6']).toContain(response.body.rankHeaders[0]);
    expect(await metricValue(gateway.registry, 'dp_router_rank_hints_total', { outcome })).toBe(1);
    expect(await metricValue(gateway.registry, 'dp_router_requests_total', { source: 'assigned' })).toBe(1);
  });

  it.each(invalid)('rejects a trusted %s hint (%j) with a vLLM 400, forwarding nothing', async (_label, value, outcome) => {
    gateway = await startGateway(trusted('reject'));
    const response = await post().set('x-data-parallel-rank', value);
    expect(response.status).toBe(400);
    expect(response.headers['content-type']).toMatch(/^application\/json/);
    expect(response.body).toEqual({
      error: { message: expect.any(String), type: 'BadRequestError', param: 'x-data-parallel-rank', code: 400 },
    });
    if (outcome === 'malformed' && value !== '') expect(response.body.error.message).not.toContain(value);
    expect(upstream.seen).toHaveLength(0);
    expect(await metricValue(gateway.registry, 'dp_router_rank_hints_total', { outcome })).toBe(1);
  });

  it('treats two header lines as malformed, even when equal or differing in case', async () => {
    gateway = await startGateway(trusted('reject'));
    for (const [first, second] of [['x-data-parallel-rank', 'x-data-parallel-rank'], ['X-Data-Parallel-Rank', 'x-data-parallel-rank']]) {
      const answer = await rawRequest(
        gateway.url,
        `GET /v1/models HTTP/1.1\r\nHost: x\r\n${first}: 2\r\n${second}: 2\r\nConnection: close\r\n\r\n`,
      );
      expect(answer).toMatch(/^HTTP\/1\.1 400 /);
      expect(answer).toContain('"type":"BadRequestError"');
    }
    const joined = await post().set('x-data-parallel-rank', '1, 2');
    expect(joined.status).toBe(400);
    expect(upstream.seen).toHaveLength(0);
    expect(await metricValue(gateway.registry, 'dp_router_rank_hints_total', { outcome: 'malformed' })).toBe(3);
  });

  it('replaces duplicated client copies with one clean header when reassigning', async () => {
    gateway = await startGateway(trusted('reassign'));
    const answer = await rawRequest(
      gateway.url,
      `GET /v1/models HTTP/1.1\r\nHost: x\r\nx-data-parallel-rank: 2\r\nX-DATA-PARALLEL-RANK: 9\r\nConnection: close\r\n\r\n`,
    );
    expect(answer).toMatch(/^HTTP\/1\.1 200 /);
    expect(upstream.seen[0].rankHeaders).toHaveLength(1);
    expect(['0', '2', '4', '6']).toContain(upstream.seen[0].rankHeaders[0]);
  });

  it('reads a JSON body field hint (SGLang style) and rejects non-integers', async () => {
    gateway = await startGateway(seed({ hints: { trust: true, onInvalid: 'reject', bodyField: 'routed_dp_rank' } }));
    const accepted = await request(gateway.url).post('/v1/completions').send({ prompt: 'x', routed_dp_rank: 4 });
    expect(accepted.body.rankHeaders).toEqual(['4']);
    expect(JSON.parse(upstream.seen[0].body.toString())).toEqual({ prompt: 'x', routed_dp_rank: 4 });
    for (const bad of ['4', -1, 4.5, null]) {
      const rejected = await request(gateway.url).post('/v1/completions').send({ prompt: 'x', routed_dp_rank: bad });
      expect(rejected.status).toBe(400);
      expect(rejected.body.error.param).toBe('routed_dp_rank');
    }
    const outOfRange = await request(gateway.url).post('/v1/completions').send({ prompt: 'x', routed_dp_rank: 5 });
    expect(outOfRange.status).toBe(400);
    expect(await metricValue(gateway.registry, 'dp_router_rank_hints_total', { outcome: 'out_of_range' })).toBe(1);
    const malformedJson = await request(gateway.url).post('/v1/completions').set('content-type', 'application/json').send('{"prompt":');
    expect(malformedJson.status).toBe(400);
    expect(malformedJson.body.error.type).toBe('BadRequestError');
    expect(upstream.seen).toHaveLength(1);
  });

  it('answers 413 for a body over maxBodyBytes when the body must be read', async () => {
    gateway = await startGateway(seed({ maxBodyBytes: 1024, hints: { trust: true, bodyField: 'routed_dp_rank' } }));
    const response = await request(gateway.url).post('/v1/completions').send({ prompt: 'x'.repeat(4096) });
    expect(response.status).toBe(413);
    expect(response.body.error.code).toBe(413);
    expect(upstream.seen).toHaveLength(0);
  });
});

describe('body-field hints (SGLang)', () => {
  const sglang = (extra: Partial<Options> = {}, hints: Options['hints'] = {}) =>
    seed({ hints: { trust: true, onInvalid: 'reject', bodyField: 'routed_dp_rank', ...hints }, ...extra });
  /** What the upstream received, decoded, with its Content-Length checked against the bytes. */
  const forwarded = (index: number) => {
    const seen = upstream.seen[index];
    expect(Number(seen.headers['content-length'])).toBe(seen.body.length);
    return JSON.parse(seen.body.toString('utf8')) as Record<string, unknown>;
  };
  const postRaw = (body: string, contentType = 'application/json') => request(gateway!.url).post('/v1/completions').set('content-type', contentType).send(body);

  it('reads the field whatever the letter case of the media type', async () => {
    gateway = await startGateway(sglang());
    for (const type of ['Application/JSON', 'APPLICATION/JSON; charset=UTF-8', 'application/vnd.sglang+json']) {
      const response = await postRaw('{"prompt":"x","routed_dp_rank":4}', type);
      expect(response.body.rankHeaders).toEqual(['4']);
    }
    expect(await metricValue(gateway.registry, 'dp_router_rank_hints_total', { outcome: 'accepted' })).toBe(3);
  });

  it('counts an untrusted body hint untrusted and forwards the router\'s rank in its place', async () => {
    gateway = await startGateway(sglang({}, { trust: false }));
    const response = await postRaw('{"prompt":"x", "routed_dp_rank" : 99 ,"max_tokens":3}');
    expect(response.status).toBe(200);
    const [rank] = response.body.rankHeaders as string[];
    expect(forwarded(0)).toEqual({ prompt: 'x', routed_dp_rank: Number(rank), max_tokens: 3 });
    expect(upstream.seen[0].body.toString()).toBe(`{"prompt":"x", "routed_dp_rank" : ${rank} ,"max_tokens":3}`);
    expect(await metricValue(gateway.registry, 'dp_router_rank_hints_total', { outcome: 'untrusted' })).toBe(1);
    // A key spelled with an escape is the same field to the upstream's decoder.
    await postRaw('{"routed\\u005fdp_rank":99}');
    expect(forwarded(1).routed_dp_rank).not.toBe(99);
    expect(await metricValue(gateway.registry, 'dp_router_rank_hints_total', { outcome: 'untrusted' })).toBe(2);
  });

  it('accepts only an integer literal: 2.0, 2e0, -0, "2" and repeated fields are malformed', async () => {
    gateway = await startGateway(sglang());
    for (const token of ['2.0', '2e0', '-0', '"2"', '2, "routed_dp_rank": 2']) {
      const rejected = await postRaw(`{"prompt":"x","routed_dp_rank":${token}}`);
      expect(rejected.status).toBe(400);
      expect(rejected.body.error).toMatchObject({ type: 'BadRequestError', param: 'routed_dp_rank', code: 400 });
    }
    expect(await metricValue(gateway.registry, 'dp_router_rank_hints_total', { outcome: 'malformed' })).toBe(5);
    expect(upstream.seen).toHaveLength(0);
  });

  it('rewrites every copy to the rank chosen when reassigning, and to the header\'s rank when the header wins', async () => {
    gateway = await startGateway(sglang({}, { onInvalid: 'reassign' }));
    const reassigned = await postRaw('{"routed_dp_rank":2.0,"prompt":"x","routed_dp_rank":99}');
    const [rank] = reassigned.body.rankHeaders as string[];
    expect(upstream.seen[0].body.toString()).toBe(`{"routed_dp_rank":${rank},"prompt":"x","routed_dp_rank":${rank}}`);
    const headerWins = await request(gateway.url).post('/v1/completions').set('x-data-parallel-rank', '2').send({ prompt: 'x', routed_dp_rank: 6 });
    expect(headerWins.body.rankHeaders).toEqual(['2']);
    expect(forwarded(1)).toEqual({ prompt: 'x', routed_dp_rank: 2 });
  });

  it('inserts the field with the router\'s rank into a body without it, the rest of the bytes as they came (item 41.17)', async () => {
    gateway = await startGateway(sglang({}, { trust: false }));
    const body = '{ "prompt" : "x",\n "max_tokens":3 }';
    const first = await postRaw(body);
    const [rank] = first.body.rankHeaders as string[];
    expect(upstream.seen[0].body.toString()).toBe(`{"routed_dp_rank":${rank}, "prompt" : "x",\n "max_tokens":3 }`);
    expect(forwarded(0)).toEqual({ routed_dp_rank: Number(rank), prompt: 'x', max_tokens: 3 });
    const empty = await postRaw(' { } ');
    expect(upstream.seen[1].body.toString()).toBe(` {"routed_dp_rank":${(empty.body.rankHeaders as string[])[0]} } `);
    // Not an object: there is no member to add.
    await postRaw('[1,2]');
    expect(upstream.seen[2].body.toString()).toBe('[1,2]');
    expect(await metricValue(gateway.registry, 'dp_router_rank_hints_total')).toBe(0);
  });

  it('moves an inserted field to the rank a retry goes to', async () => {
    // Nothing listens there, and no other test's listen(0) takes it meanwhile (below the ephemeral range).
    const deadUrl = `http://127.0.0.1:${await freePort()}`;
    gateway = await startGateway({
      upstreams: [
        { url: deadUrl, name: 'dead', dataParallelSize: 2 },
        { url: upstream.url, name: 'live', startRank: 2, dataParallelSize: 2 },
      ],
      policy: 'round-robin',
      hints: { bodyField: 'routed_dp_rank' },
    });
    for (let i = 0; i < 4; i++) expect((await postRaw('{"prompt":"x"}')).status).toBe(200);
    expect(await metricValue(gateway.registry, 'dp_router_retries_total')).toBeGreaterThan(0);
    for (const [index, seen] of upstream.seen.entries()) {
      expect(seen.body.toString()).toBe(`{"routed_dp_rank":${seen.rankHeaders[0]},"prompt":"x"}`);
      expect(forwarded(index).routed_dp_rank).toBe(Number(seen.rankHeaders[0]));
    }
  });

  it("writes the rank as the upstream reads it: rank − startRank for 'local', null for 'none'", async () => {
    gateway = await startGateway({
      upstreams: [
        { url: upstream.url, name: 'hybrid', dataParallelSize: 4, startRank: 4, rankHeader: 'local' },
        { url: upstream.url, name: 'external', startRank: 8, rankHeader: 'none' },
      ],
      hints: { trust: true, bodyField: 'routed_dp_rank' },
    });
    await postRaw('{"prompt":"x","routed_dp_rank":6}');
    expect(upstream.seen[0].rankHeaders).toEqual(['2']);
    expect(forwarded(0).routed_dp_rank).toBe(2);
    await postRaw('{"prompt":"x","routed_dp_rank":8}');
    expect(upstream.seen[1].rankHeaders).toEqual([]);
    expect(forwarded(1).routed_dp_rank).toBeNull();
  });

  it('rewrites the field in a body express.json() parsed first, with a matching Content-Length', async () => {
    const registry = new Registry();
    const router = dpRouter({ upstreams: [{ url: upstream.url, dataParallelSize: 4 }], metrics: { registry }, hints: { bodyField: 'routed_dp_rank' }, logger: false });
    const parsedFirst = await serve(express().use(express.json(), router));
    try {
      const response = await request(parsedFirst.url).post('/v1/completions').send({ prompt: 'x', routed_dp_rank: 99 });
      const [rank] = response.body.rankHeaders as string[];
      expect(forwarded(0)).toEqual({ prompt: 'x', routed_dp_rank: Number(rank) });
      expect(await metricValue(registry, 'dp_router_rank_hints_total', { outcome: 'untrusted' })).toBe(1);
    } finally {
      await parsedFirst.close();
      await router.close();
    }
  });

  it('forwards a multipart body whose boundary spells "json" untouched, without judging it as JSON', async () => {
    gateway = await startGateway(sglang({ policy: 'prefix-aware' }));
    const boundary = '----jsonBoundary';
    const body = `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF\r\n--${boundary}--\r\n`;
    const response = await postRaw(body, `multipart/form-data; boundary=${boundary}`);
    expect(response.status).toBe(200);
    expect(upstream.seen[0].body.toString()).toBe(body);
  });
});

describe("Node's header line limit", () => {
  /** A request whose second hint line lies past the ~1000 lines Node keeps. */
  const padded = (lines: number) =>
    `GET /v1/models HTTP/1.1\r\nHost: x\r\nx-data-parallel-rank: 2\r\n${'x-pad: 1\r\n'.repeat(lines)}x-data-parallel-rank: 4\r\nConnection: close\r\n\r\n`;
  const single = `GET /v1/models HTTP/1.1\r\nHost: x\r\nx-data-parallel-rank: 2\r\n${'x-pad: 1\r\n'.repeat(1100)}Connection: close\r\n\r\n`;

  /**
   * What this Node does with lines past `maxHeadersCount`: Node 20 drops them unseen (the case
   * the rule is for), Node 22 and later refuse the request with a 431 before any middleware runs.
   * Asked of a bare server, so each test below asserts the one outcome this runtime must give.
   */
  let nodeRefusesExtraLines: boolean;
  beforeAll(async () => {
    const bare = createServer((_req, res) => res.end());
    const url = await new Promise<string>((resolve) => bare.listen(0, '127.0.0.1', () => resolve(`http://127.0.0.1:${(bare.address() as AddressInfo).port}`)));
    nodeRefusesExtraLines = (await rawRequest(url, padded(1100))).startsWith('HTTP/1.1 431 ');
    await new Promise((resolve) => bare.close(resolve));
  });

  it('judges a trusted hint malformed when the request reaches the limit, since a copy may be hidden', async () => {
    gateway = await startGateway(seed({ hints: { trust: true, onInvalid: 'reject' } }));
    const answer = await rawRequest(gateway.url, padded(1100));
    if (nodeRefusesExtraLines) {
      // Node answered before the router ran: no hint was judged, nothing was forwarded.
      expect(answer).toMatch(/^HTTP\/1\.1 431 /);
      expect(await metricValue(gateway.registry, 'dp_router_rank_hints_total', { outcome: 'malformed' })).toBe(0);
    } else {
      expect(answer).toMatch(/^HTTP\/1\.1 400 /);
      expect(answer).toContain('"param":"x-data-parallel-rank"');
      expect(await metricValue(gateway.registry, 'dp_router_rank_hints_total', { outcome: 'malformed' })).toBe(1);
    }
    expect(await metricValue(gateway.registry, 'dp_router_rank_hints_total', { outcome: 'accepted' })).toBe(0);
    expect(upstream.seen).toHaveLength(0);
  });

  it("follows the server's own maxHeadersCount", async () => {
    gateway = await startGateway(seed({ hints: { trust: true, onInvalid: 'reject' } }));
    gateway.server.maxHeadersCount = 2000;
    expect(await rawRequest(gateway.url, single)).toMatch(/^HTTP\/1\.1 200 /);
    expect(await rawRequest(gateway.url, padded(1100))).toMatch(/^HTTP\/1\.1 400 /);
    gateway.server.maxHeadersCount = 100;
    expect(await rawRequest(gateway.url, single)).toMatch(nodeRefusesExtraLines ? /^HTTP\/1\.1 431 / : /^HTTP\/1\.1 400 /);
    // Exactly at the limit nothing was dropped, yet the router cannot know that on Node 20: malformed on every version.
    const atLimit = `GET /v1/models HTTP/1.1\r\nHost: x\r\nx-data-parallel-rank: 2\r\n${'x-pad: 1\r\n'.repeat(97)}Connection: close\r\n\r\n`;
    expect(await rawRequest(gateway.url, atLimit)).toMatch(/^HTTP\/1\.1 400 /);
  });
});

describe('behind a body parser', () => {
  it('forwards the body express.json() consumed, re-encoded, whatever the policy', async () => {
    const registry = new Registry();
    const notices: string[] = [];
    const router = dpRouter({ upstreams: [{ url: upstream.url }], metrics: { registry }, logger: { warn: (message) => notices.push(message) } });
    const app = express();
    app.use(express.json());
    app.use(router);
    const server = app.listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    try {
      const response = await request(server).post('/v1/completions').send({ prompt: 'héllo', max_tokens: 3 });
      expect(response.status).toBe(200);
      expect(JSON.parse(upstream.seen[0].body.toString())).toEqual({ prompt: 'héllo', max_tokens: 3 });
      expect(Number(upstream.seen[0].headers['content-length'])).toBe(upstream.seen[0].body.length);
      await request(server).post('/v1/completions').send({ prompt: 'again' });
      expect(notices).toHaveLength(1);
      expect(notices[0]).toMatch(/already parsed .* Mount the router before body parsers/);
    } finally {
      server.close();
      await router.close();
    }
  });
});

describe('rank header modes', () => {
  it("sends rank − startRank for rankHeader 'local' (hybrid load balancing)", async () => {
    gateway = await startGateway({
      upstreams: [{ url: upstream.url, dataParallelSize: 4, startRank: 4, rankHeader: 'local' }],
      policy: 'round-robin',
      hints: { trust: true },
    });
    const values = [];
    for (let index = 0; index < 4; index++) values.push((await post()).body.rankHeaders[0]);
    expect(values.sort()).toEqual(['0', '1', '2', '3']);
    expect((await post().set('x-data-parallel-rank', '6')).body.rankHeaders).toEqual(['2']);
    expect(await metricValue(gateway.registry, 'dp_router_requests_total', { rank: '6', source: 'hint' })).toBe(1);
  });

  it("sends no header for rankHeader 'none' (external load balancing), stripping the client's", async () => {
    const second = await startEchoUpstream();
    try {
      gateway = await startGateway({
        upstreams: [
          { url: upstream.url, name: 'rank-0', startRank: 0, rankHeader: 'none' },
          { url: second.url, name: 'rank-1', startRank: 1, rankHeader: 'none' },
        ],
        policy: 'round-robin',
        hints: { trust: true },
      });
      for (let index = 0; index < 4; index++) expect((await post().set('x-data-parallel-rank', '1')).body.rankHeaders).toEqual([]);
      expect(second.seen).toHaveLength(4);
      expect(upstream.seen).toHaveLength(0);
      await post();
      await post();
      expect(upstream.seen.length + second.seen.length).toBe(6);
    } finally {
      await second.close();
    }
  });

  it('spreads a hinted rank over two replicas serving it', async () => {
    const replica = await startEchoUpstream();
    try {
      gateway = await startGateway({
        upstreams: [
          { url: upstream.url, name: 'a', dataParallelSize: 2 },
          { url: replica.url, name: 'b', dataParallelSize: 2 },
        ],
        hints: { trust: true },
      });
      upstream.respond = (_req, res) => setTimeout(() => res.end('{}'), 50);
      replica.respond = (_req, res) => setTimeout(() => res.end('{}'), 50);
      await Promise.all([0, 1, 2, 3].map(() => post().set('x-data-parallel-rank', '1')));
      expect(upstream.seen.map((seen) => seen.rankHeaders)).toEqual([['1'], ['1']]);
      expect(replica.seen.map((seen) => seen.rankHeaders)).toEqual([['1'], ['1']]);
    } finally {
      await replica.close();
    }
  });
});

describe('proxying', () => {
  it('forwards a large body sent with Expect: 100-continue, with the header set', async () => {
    gateway = await startGateway(seed({ policy: 'round-robin' }));
    const body = Buffer.alloc(2 * 1024 * 1024, 'a');
    const status = await new Promise<number>((resolve, reject) => {
      const outgoing = httpRequest(`${gateway!.url}/v1/completions`, {
        method: 'POST',
        headers: { expect: '100-continue', 'content-length': body.length, 'x-data-parallel-rank': '9' },
      });
      outgoing.on('continue', () => outgoing.end(body));
      outgoing.on('response', (response) => {
        response.resume();
        response.on('end', () => resolve(response.statusCode!));
      });
      outgoing.on('error', reject);
    });
    expect(status).toBe(200);
    expect(upstream.seen[0].body.equals(body)).toBe(true);
    expect(upstream.seen[0].rankHeaders).toEqual(['0']);
  });

  it("adds no X-Forwarded-* by default, and appends them with xfwd: 'append'", async () => {
    gateway = await startGateway(seed());
    await request(gateway.url).post('/v1/completions').set('x-forwarded-for', '10.0.0.1').send({});
    expect(upstream.seen[0].headers['x-forwarded-for']).toBe('10.0.0.1');
    expect(upstream.seen[0].headers['x-forwarded-proto']).toBeUndefined();
    await gateway.close();

    gateway = await startGateway(seed({ xfwd: 'append' }));
    await request(gateway.url).post('/v1/completions').set('x-forwarded-for', '10.0.0.1').send({});
    const host = new URL(gateway.url).host;
    expect(upstream.seen[1].headers).toMatchObject({
      'x-forwarded-for': '10.0.0.1,127.0.0.1',
      'x-forwarded-proto': 'http',
      'x-forwarded-port': host.split(':')[1],
      'x-forwarded-host': host,
    });
  });

  it('streams SSE chunk by chunk: the first event arrives before the upstream ends', async () => {
    gateway = await startGateway(seed());
    let finishUpstream: () => void = () => undefined;
    upstream.respond = (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"n":1}\n\n');
      finishUpstream = () => res.end('data: [DONE]\n\n');
    };
    const firstChunk = await new Promise<string>((resolve, reject) => {
      const outgoing = httpRequest(`${gateway!.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' } });
      outgoing.on('response', (response) => {
        response.setEncoding('utf8');
        response.once('data', (chunk: string) => resolve(chunk));
      });
      outgoing.on('error', reject);
      outgoing.end('{"stream":true}');
    });
    expect(firstChunk).toBe('data: {"n":1}\n\n');
    expect(await metricValue(gateway.registry, 'dp_router_inflight_requests')).toBe(1);
    finishUpstream();
    await waitFor(async () => (await metricValue(gateway!.registry, 'dp_router_inflight_requests')) === 0);
  });

  it('passes an upstream 4xx and 5xx through unchanged, counting only the 5xx', async () => {
    gateway = await startGateway(seed({ policy: 'round-robin' }));
    upstream.respond = (req, res) => {
      const status = req.url === '/bad' ? 400 : 500;
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { message: 'upstream says', type: 'X', param: null, code: status } }));
    };
    const bad = await request(gateway.url).get('/bad');
    expect(bad.status).toBe(400);
    expect(bad.body.error.message).toBe('upstream says');
    const broken = await request(gateway.url).get('/broken');
    expect(broken.status).toBe(500);
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total', { kind: 'status_5xx' })).toBe(1);
  });

  it('answers 502 when the upstream refuses the connection', async () => {
    await upstream.close();
    gateway = await startGateway(seed());
    const response = await post();
    expect(response.status).toBe(502);
    expect(response.body.error).toMatchObject({ type: 'BadGatewayError', code: 502, param: null });
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total', { kind: 'connect' })).toBe(1);
    expect(await metricValue(gateway.registry, 'dp_router_inflight_requests')).toBe(0);
    upstream = await startEchoUpstream();
  });

  it('answers 504 when the upstream sends no first byte in time', async () => {
    gateway = await startGateway(seed({ timeouts: { firstByteMs: 100 } }));
    upstream.respond = () => undefined;
    const response = await post();
    expect(response.status).toBe(504);
    expect(response.body.error).toMatchObject({ type: 'GatewayTimeoutError', code: 504 });
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total', { kind: 'timeout' })).toBe(1);
  });

  it('answers 502 when the upstream resets the connection before answering', async () => {
    gateway = await startGateway(seed());
    upstream.respond = (req) => req.socket.destroy();
    const response = await post();
    expect(response.status).toBe(502);
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total', { kind: 'reset' })).toBe(1);
  });
});

describe('in-flight accounting', () => {
  it('returns every in-flight gauge to 0 after 200 concurrent streams, some aborted mid-stream', async () => {
    gateway = await startGateway(seed());
    const open = new Set<() => void>();
    upstream.respond = (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: 1\n\n');
      const timer = setTimeout(() => res.end('data: [DONE]\n\n'), 200);
      open.add(() => clearTimeout(timer));
      res.on('close', () => clearTimeout(timer));
    };
    const outcomes = await Promise.all(
      Array.from({ length: 200 }, (_, index) =>
        new Promise<string>((resolve) => {
          const outgoing = httpRequest(`${gateway!.url}/v1/completions`, { method: 'POST', agent: false });
          outgoing.on('response', (response) => {
            response.once('data', () => {
              if (index % 3 === 0) {
                outgoing.destroy();
                resolve('aborted');
              }
            });
            response.on('end', () => resolve('done'));
            response.on('error', () => resolve('aborted'));
          });
          outgoing.on('error', () => resolve('aborted'));
          outgoing.end('{}');
        }),
      ),
    );
    expect(outcomes.filter((outcome) => outcome === 'aborted')).toHaveLength(67);
    await waitFor(async () => (await metricValue(gateway!.registry, 'dp_router_inflight_requests')) === 0);
    expect(gateway.router.endpoints().every((endpoint) => endpoint.inflight === 0)).toBe(true);
    expect(await metricValue(gateway.registry, 'dp_router_requests_total')).toBe(200);
    const samples = parseExposition((await request(gateway.url).get('/metrics')).text);
    expect(sumSamples(samples, 'dp_router_request_duration_seconds_count')).toBe(200);
  });
});

describe('metrics', () => {
  it('exports every configured series at 0 before traffic', async () => {
    gateway = await startGateway(seed());
    const response = await request(gateway.url).get('/metrics');
    expect(response.headers['content-type']).toBe(gateway.registry.contentType);
    const samples = parseExposition(response.text);
    for (const rank of ['0', '2', '4', '6']) {
      for (const source of ['hint', 'assigned']) {
        expect(samples).toContainEqual({ name: 'dp_router_requests_total', labels: { upstream: 'node-a', rank, source }, value: 0 });
      }
      expect(samples).toContainEqual({ name: 'dp_router_inflight_requests', labels: { upstream: 'node-a', rank }, value: 0 });
      expect(samples).toContainEqual({ name: 'dp_router_endpoint_healthy', labels: { upstream: 'node-a', rank }, value: 1 });
    }
    for (const outcome of ['accepted', 'untrusted', 'malformed', 'out_of_range', 'unavailable']) {
      expect(samples).toContainEqual({ name: 'dp_router_rank_hints_total', labels: { outcome }, value: 0 });
    }
  });

  it('never takes a label value from the client', async () => {
    gateway = await startGateway(seed({ hints: { trust: true } }));
    await post().set('x-data-parallel-rank', '77');
    await post().set('x-data-parallel-rank', 'node-b');
    await request(gateway.url).post('/v1/<script>').set('x-session-id', 'evil').send({});
    const samples = parseExposition((await request(gateway.url).get('/metrics')).text);
    const allowed: Record<string, string[]> = {
      upstream: ['node-a'],
      // 'vllm': the fixed label of requests vLLM balances itself (paths it does not route by header).
      rank: ['0', '2', '4', '6', 'vllm'],
      // Each closed set: decisions and hints, then route receipts' (cached tokens by source, receipts by outcome).
      source: ['hint', 'assigned', 'predicted', 'reported'],
      outcome: ['accepted', 'untrusted', 'malformed', 'out_of_range', 'unavailable', 'confirmed', 'elsewhere', 'unseen', 'cached', 'met', 'missed_ttft', 'missed_tpot', 'shed', 'taken', 'refused_single_source'],
      // Upstream errors, then the SLO prediction error's (docs/slo-routing.md).
      kind: ['connect', 'timeout', 'reset', 'status_5xx', 'ttft', 'tpot'],
      // Verdicts that change routing for everyone (lib/verdicts).
      verdict: ['rank_header', 'elsewhere', 'misses', 'tokens', 'tokenizer', 'ejection'],
      evidence: ['answer', 'metrics'],
    };
    for (const sample of samples) {
      for (const [label, value] of Object.entries(sample.labels)) {
        if (label === 'le') continue;
        expect(allowed[label]).toContain(value);
      }
    }
  });

  it('runs two routers on two registries in one process, each counting its own', async () => {
    gateway = await startGateway(seed());
    const other = await startGateway({ upstreams: [{ url: upstream.url, name: 'node-b', dataParallelSize: 2 }] });
    try {
      await post();
      await request(other.url).post('/v1/completions').send({});
      await request(other.url).post('/v1/completions').send({});
      expect(await metricValue(gateway.registry, 'dp_router_requests_total')).toBe(1);
      expect(await metricValue(other.registry, 'dp_router_requests_total')).toBe(2);
      expect(await metricValue(other.registry, 'dp_router_requests_total', { upstream: 'node-a' })).toBe(0);
    } finally {
      await other.close();
    }
  });

  it('lets a second router join a registry and prefix without throwing, and sum in-flight', async () => {
    const registry = new Registry();
    gateway = await startGateway(seed({ metrics: { registry, prefix: 'edge_' } }));
    const second = await startGateway(seed({ metrics: { registry, prefix: 'edge_' } }));
    try {
      upstream.respond = (_req, res) => setTimeout(() => res.end('{}'), 300);
      // supertest sends on then(): Promise.all starts both requests now.
      const pending = Promise.all([post(), request(second.url).post('/v1/completions').send({})]);
      await waitFor(async () => (await metricValue(registry, 'edge_inflight_requests')) === 2);
      await pending;
      expect(await metricValue(registry, 'edge_requests_total')).toBe(2);
    } finally {
      await second.close();
    }
  });
});
