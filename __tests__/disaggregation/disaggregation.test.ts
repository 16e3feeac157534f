import { describe, expect, it } from '@jest/globals';
import { request as httpRequest } from 'node:http';
import OpenAI from 'openai';
import { startMockVllm, type MockVllm, type MockVllmOptions } from '../../example-server/mock-vllm';
import { dpRouter, OptionError, type Options } from '../../lib';
import { allIdle, closedAfterEach, exchange, freePort, metricValue, rawRequest, serve, startDnsmasq, startGateway, waitFor, type TestGateway } from '../helpers';

const started = closedAfterEach();
const COMPLETION = '{"model":"mock-model","prompt":"The quick brown fox jumps over the lazy dog, again and again.","max_tokens":3,"min_tokens":2}';

async function mock(options: MockVllmOptions): Promise<MockVllm> {
  const server = await startMockVllm({ recordBodies: true, dataParallelSize: 2, ...options });
  started.push(server);
  return server;
}

/** A prefill mock (ranks 0-1) and a decode mock (ranks 4-5), and a gateway splitting requests between them. */
async function pd(connector: 'nixl' | 'mooncake' = 'nixl', extra: Partial<Options> = {}, prefillOptions: MockVllmOptions = {}) {
  const prefill = await mock({ role: 'prefill', connector, ...prefillOptions });
  const decode = await mock({ role: 'decode', connector, startRank: 4 });
  const gateway = await startGateway({
    upstreams: [
      { url: prefill.url, name: 'p', dataParallelSize: 2, role: 'prefill', ...(connector === 'mooncake' && { bootstrapPort: prefill.bootstrapPort }) },
      { url: decode.url, name: 'd', dataParallelSize: 2, startRank: 4, role: 'decode' },
    ],
    exposeDecision: true,
    disaggregation: { connector },
    ...extra,
  });
  started.push(gateway);
  return { prefill, decode, gateway };
}

const generations = (server: MockVllm) => server.stats().requests.filter((record) => record.path.startsWith('/v1/'));
const outcome = (gateway: TestGateway, name: string) => metricValue(gateway.registry, 'dp_router_disaggregated_requests_total', { outcome: name });
const idle = (gateway: TestGateway) => waitFor(() => allIdle(gateway) && gateway.router.endpoints().length === 4, 2000, 'in-flight counts back to 0 on both pools');

describe('NIXL', () => {
  it('sends the prefill leg one unstreamed token with the null params, and the decode leg the client body plus the answer’s params', async () => {
    const { prefill, decode, gateway } = await pd();
    const answer = await exchange(gateway.url, { body: COMPLETION, headers: { 'x-request-id': 'client-id', 'x-data-parallel-rank': '5' } });
    expect(answer.status).toBe(200);
    expect(JSON.parse(answer.body).choices[0].text).toMatch(/^rank [45]:/);
    const [p] = generations(prefill);
    const [d] = generations(decode);
    const prefillBody = JSON.parse(p.body!);
    expect(prefillBody).toMatchObject({ stream: false, max_tokens: 1, min_tokens: 1, prompt: JSON.parse(COMPLETION).prompt });
    expect(prefillBody.kv_transfer_params).toEqual({ do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null });
    // The decode body is the client's bytes with the prefill's params appended.
    expect(d.body!.startsWith(COMPLETION.slice(0, -1))).toBe(true);
    const params = JSON.parse(d.body!).kv_transfer_params;
    expect(params).toMatchObject({ do_remote_prefill: true, remote_engine_id: prefill.engineIds!.get(p.rank) });
    expect(d.leg).toBe('decode');
    // One clean rank header per leg, each its own; one request id, the gateway's (the caller is untrusted).
    // Each the index vLLM reads: rank − the upstream's start rank (decode starts at 4).
    expect(p.rankHeaders).toEqual([String(p.rank)]);
    expect(d.rankHeaders).toEqual([String(d.rank - 4)]);
    expect(p.headers!['x-request-id']).toBe(d.headers!['x-request-id']);
    expect(p.headers!['x-request-id']).not.toBe('client-id');
    expect(answer.headers['x-dp-router-decision']).toBe(`upstream=d; rank=${d.rank}; source=assigned; prefill=p@${p.rank}`);
    expect(await outcome(gateway, 'disaggregated')).toBe(1);
    expect(await observations(gateway, 'dp_router_prefill_duration_seconds', { upstream: 'p', rank: String(p.rank) })).toBe(1);
    expect(await metricValue(gateway.registry, 'dp_router_requests_total', { upstream: 'p' })).toBe(1);
    expect(await metricValue(gateway.registry, 'dp_router_requests_total', { upstream: 'd' })).toBe(1);
    await idle(gateway);
  });

  it('with xfwd: true, both legs carry the gateway\'s X-Forwarded-* and never the client\'s', async () => {
    const { prefill, decode, gateway } = await pd('nixl', { xfwd: true });
    const forged = { 'x-forwarded-for': '6.6.6.6', 'x-forwarded-host': 'evil.example', 'x-forwarded-proto': 'https', forwarded: 'for=6.6.6.6' };
    expect((await exchange(gateway.url, { body: COMPLETION, headers: forged })).status).toBe(200);
    const host = new URL(gateway.url).host;
    const expected = { 'x-forwarded-for': '127.0.0.1', 'x-forwarded-host': host, 'x-forwarded-proto': 'http', 'x-forwarded-port': host.split(':')[1] };
    for (const leg of [generations(prefill)[0], generations(decode)[0]]) {
      expect(leg.headers).toMatchObject(expected);
      expect(leg.headers!.forwarded).toBeUndefined();
    }
    await idle(gateway);
  });

  it('streams a chat from the decode rank, with max_completion_tokens capped on the prefill leg only', async () => {
    const { prefill, decode, gateway } = await pd();
    const client = new OpenAI({ baseURL: `${gateway.url}/v1`, apiKey: 'none', maxRetries: 0 });
    const stream = await client.chat.completions.create({
      model: 'mock-model',
      messages: [{ role: 'user', content: 'Say something long enough to fill a block or two.' }],
      max_completion_tokens: 4,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text).toMatch(/^rank [45]: lorem ipsum dolor$/);
    const p = JSON.parse(generations(prefill)[0].body!);
    expect(p).toMatchObject({ stream: false, max_tokens: 1, max_completion_tokens: 1 });
    expect('stream_options' in p).toBe(false);
    const d = JSON.parse(generations(decode)[0].body!);
    expect(d).toMatchObject({ stream: true, max_completion_tokens: 4, stream_options: { include_usage: true } });
    expect(await observations(gateway, 'dp_router_time_to_first_token_seconds', { upstream: 'd' })).toBe(1);
    await idle(gateway);
  });

  it('relays the decode answer byte for byte', async () => {
    const prefill = await mock({ role: 'prefill' });
    const bytes = Buffer.from('data: {"x":"caf\u00e9"}\n\n: comment\r\n\r\ndata: [DONE]\n\n');
    const decode = await serve((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(bytes.subarray(0, 7));
        setImmediate(() => res.end(bytes.subarray(7)));
      });
    });
    started.push(decode);
    const gateway = await startGateway({
      upstreams: [
        { url: prefill.url, dataParallelSize: 2, role: 'prefill' },
        { url: decode.url, role: 'decode' },
      ],
      disaggregation: {},
    });
    started.push(gateway);
    const received = await new Promise<Buffer>((resolve) => {
      const outgoing = httpRequest(`${gateway.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' } }, (response) => {
        const chunks: Buffer[] = [];
        response.on('data', (chunk: Buffer) => chunks.push(chunk));
        response.on('end', () => resolve(Buffer.concat(chunks)));
      });
      outgoing.end('{"prompt":"x","stream":true}');
    });
    expect(received.equals(bytes)).toBe(true);
  });

  it('takes a trusted prefill hint in its own header, and never forwards an untrusted one', async () => {
    const trustedPd = await pd('nixl', { hints: { trust: true } });
    await exchange(trustedPd.gateway.url, { body: COMPLETION, headers: { 'x-data-parallel-prefill-rank': '1', 'x-data-parallel-rank': '4' } });
    expect(generations(trustedPd.prefill)[0].rank).toBe(1);
    expect(generations(trustedPd.decode)[0].rank).toBe(4);
    const plain = await pd();
    await exchange(plain.gateway.url, { body: COMPLETION, headers: { 'x-data-parallel-prefill-rank': '1' } });
    for (const record of [...generations(plain.prefill), ...generations(plain.decode)]) expect(record.headers!['x-data-parallel-prefill-rank']).toBeUndefined();
    expect(await metricValue(plain.gateway.registry, 'dp_router_rank_hints_total', { outcome: 'untrusted' })).toBe(1);
  });

  it('strips hop-by-hop headers, and every header Connection names, from both legs alike', async () => {
    const { prefill, decode, gateway } = await pd();
    const answer = await rawRequest(
      gateway.url,
      'POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n' +
        'Connection: close, X-Secret, X-data-parallel-rank\r\nX-Secret: s\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\n' +
        `TE: trailers\r\nTrailer: x-t\r\nProxy-Authorization: Basic eDp5\r\nX-Kept: k\r\nContent-Length: ${COMPLETION.length}\r\n\r\n${COMPLETION}`,
    );
    expect(answer).toMatch(/^HTTP\/1\.1 200 /);
    // Each leg's header is its rank inside its server (rankHeader 'local'): decode starts at rank 4.
    const legs = [{ ...generations(prefill)[0], startRank: 0 }, { ...generations(decode)[0], startRank: 4 }];
    for (const leg of legs) {
      for (const name of ['x-secret', 'keep-alive', 'proxy-connection', 'te', 'trailer', 'proxy-authorization']) expect([leg.leg, name, leg.headers![name]]).toEqual([leg.leg, name, undefined]);
      expect(leg.headers!['x-kept']).toBe('k');
      // The router's own rank header survives the client's nomination, one per leg.
      expect(leg.rankHeaders).toEqual([String(leg.rank - leg.startRank)]);
    }
    await idle(gateway);
  });

  it('sends other requests whole to the decode pool', async () => {
    const { prefill, gateway } = await pd();
    const answer = await fetch(`${gateway.url}/v1/models`);
    expect(answer.status).toBe(200);
    expect(generations(prefill)).toHaveLength(0);
  });
});

describe('a prefill server that refuses the rank header', () => {
  // vLLM 52a31cc answers a header past its engines `400 data_parallel_rank N is out of range [0, M).`
  // (vllm/entrypoints/openai/server_utils.py:378); the mock reads the header as vLLM does.
  it('48.19: is told once at error level with the fix, counted, and gets prefill legs no more', async () => {
    // A node serving global ranks 2-3, configured to be sent the global rank.
    const wrong = await mock({ role: 'prefill', connector: 'nixl', startRank: 2 });
    const right = await mock({ role: 'prefill', connector: 'nixl' });
    const decode = await mock({ role: 'decode', connector: 'nixl', startRank: 4 });
    const errors: string[] = [];
    const gateway = await startGateway({
      upstreams: [
        { url: wrong.url, name: 'wrong', startRank: 2, dataParallelSize: 2, rankHeader: 'global', role: 'prefill' },
        { url: right.url, name: 'right', dataParallelSize: 2, role: 'prefill' },
        { url: decode.url, name: 'd', dataParallelSize: 2, startRank: 4, role: 'decode' },
      ],
      disaggregation: { connector: 'nixl', prefillPolicy: 'round-robin' },
      logger: { warn: () => undefined, error: (_fields, message) => errors.push(message) },
    });
    started.push(gateway);
    // One refusal (served decode-only); the router's own probe confirms it (a verdict for every
    // client is never taken on one client's answer: docs/security.md), then every prefill leg
    // goes to the server that takes the header.
    expect((await exchange(gateway.url, { body: COMPLETION })).status).toBe(200);
    await waitFor(() => errors.length === 1, 5000, 'the probe confirms the refusal');
    for (let i = 0; i < 7; i++) expect((await exchange(gateway.url, { body: COMPLETION })).status).toBe(200);
    const legs = (server: MockVllm) => generations(server).filter((record) => (record.body ?? '').includes('kv_transfer_params'));
    expect(legs(wrong)).toHaveLength(1);
    // The probe: a 1-token completion the router built, carrying the refused header value.
    expect(generations(wrong).filter((record) => !(record.body ?? '').includes('kv_transfer_params')).map((record) => record.rankHeaders)).toEqual([['2']]);
    expect(generations(right)).toHaveLength(7);
    expect(await outcome(gateway, 'disaggregated')).toBe(7);
    expect(errors).toHaveLength(1);
    expect(errors[0]).toMatch(/^express-dp-router: upstream 'wrong' does not take the rank header.*out of range \[0, 2\).*set rankHeader: 'local'/);
    expect(await metricValue(gateway.registry, 'dp_router_rank_header_rejections_total', { upstream: 'wrong', evidence: 'answer' })).toBe(1);
  });
});

describe('the prefill pool and LoRA adapters', () => {
  // vLLM keys an adapter's blocks with its name (#33304): the base model's blocks are no hit for
  // it. The model pools know an adapter from /v1/models before any KV event names it.
  it("48.19: scores a LoRA request's prefill under its adapter, as the model pools know it: never on the base model's blocks", async () => {
    const prefill = await mock({ role: 'prefill', connector: 'nixl', kvEvents: {}, loraModules: ['sql-lora'] });
    const decode = await mock({ role: 'decode', connector: 'nixl', startRank: 4, loraModules: ['sql-lora'] });
    const kv = prefill.kvEvents!;
    const notices: string[] = [];
    const gateway = await startGateway({
      upstreams: [
        { url: prefill.url, name: 'p', dataParallelSize: 2, role: 'prefill', kvEvents: { endpoint: kv.endpoints } },
        { url: decode.url, name: 'd', dataParallelSize: 2, startRank: 4, role: 'decode', discover: { intervalMs: 50 } },
      ],
      policy: 'prefix-aware',
      prefixAware: { tokenizer: kv.tokenizer },
      hints: { trust: true },
      disaggregation: { connector: 'nixl', prefillPolicy: 'prefix-aware' },
      logger: { warn: (message) => notices.push(message), info: (_fields, message) => notices.push(message) },
    });
    started.push(gateway);
    await waitFor(() => notices.some((line) => line.includes("'d' serves mock-model, sql-lora")), 5000, 'the adapter listed');
    for (const rank of [0, 1]) {
      let probe = 0;
      await waitFor(
        async () => {
          const sent = await fetch(`${prefill.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-data-parallel-rank': String(rank) }, body: JSON.stringify({ prompt: `probe ${rank} ${probe++} ${'lorem ipsum dolor '.repeat(8)}`, max_tokens: 1 }) });
          await sent.arrayBuffer();
          return (await metricValue(gateway.registry, 'dp_router_kv_stream_fresh', { upstream: 'p', rank: String(rank) })) === 1;
        },
        5000,
        `the prefill pool joined rank ${rank}'s KV events`,
      );
    }
    const messages = [
      { role: 'system', content: 'You answer questions about the warehouse schema, briefly and accurately. '.repeat(6) },
      { role: 'user', content: 'Which tables?' },
    ];
    // The base model's blocks on prefill rank 1 (a trusted prefill hint puts them there).
    const base = await exchange(gateway.url, { path: '/v1/chat/completions', body: JSON.stringify({ model: 'mock-model', messages, max_tokens: 2 }), headers: { 'x-data-parallel-prefill-rank': '1' } });
    expect(base.status).toBe(200);
    await waitFor(async () => (await metricValue(gateway.registry, 'dp_router_kv_index_blocks', { upstream: 'p', rank: '1' })) > 0, 5000, 'the base blocks indexed');
    const lora = await exchange(gateway.url, { path: '/v1/chat/completions', body: JSON.stringify({ model: 'sql-lora', messages, max_tokens: 2 }) });
    expect(lora.status).toBe(200);
    // No rank holds the adapter's blocks: the prefill goes by load (rank 0 first), not to rank 1.
    const legs = generations(prefill).filter((record) => record.leg === 'prefill');
    expect(legs.map((record) => record.rank)).toEqual([1, 0]);
  });
});

describe('prefill upstreams found by DNS', () => {
  it('48.19: are the prefill pool\'s, resolved by a discovery of its own: never decode upstreams, never the entry itself', async () => {
    const prefill = await mock({ role: 'prefill', connector: 'nixl' });
    const decode = await mock({ role: 'decode', connector: 'nixl', startRank: 4 });
    const dns = await startDnsmasq([['127.0.0.1', 'prefill.test']]);
    started.push(dns);
    const gateway = await startGateway({
      upstreams: [
        { dns: { name: 'prefill.test', port: Number(new URL(prefill.url).port), intervalMs: 50, servers: [dns.server] }, name: 'p', dataParallelSize: 2, role: 'prefill' },
        { url: decode.url, name: 'd', dataParallelSize: 2, startRank: 4, role: 'decode' },
      ],
      disaggregation: { connector: 'nixl', onPrefillFailure: 'fail' },
    });
    started.push(gateway);
    await waitFor(() => gateway.router.endpoints().length === 4, 5000, 'the prefill address resolved');
    expect(gateway.router.endpoints().map(({ upstream, rank, leg }) => `${leg ?? 'decode'} ${upstream}#${rank}`)).toEqual(['decode d#4', 'decode d#5', 'prefill p/127.0.0.1#0', 'prefill p/127.0.0.1#1']);
    for (let i = 0; i < 4; i++) expect((await exchange(gateway.url, { body: COMPLETION })).status).toBe(200);
    expect(generations(prefill).map((record) => record.leg)).toEqual(['prefill', 'prefill', 'prefill', 'prefill']);
    expect(generations(decode).map((record) => record.leg)).toEqual(['decode', 'decode', 'decode', 'decode']);
    expect(await outcome(gateway, 'disaggregated')).toBe(4);
  });
});

describe('Mooncake', () => {
  it('sends both legs with one transfer_id, the decode leg naming the prefill rank’s engine from /query', async () => {
    const { prefill, decode, gateway } = await pd('mooncake');
    const answer = await exchange(gateway.url, { path: '/v1/chat/completions', body: '{"model":"mock-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true}' });
    expect(answer.status).toBe(200);
    expect(answer.body).toContain('data: [DONE]');
    const p = generations(prefill)[0];
    const d = generations(decode)[0];
    const prefillParams = JSON.parse(p.body!).kv_transfer_params;
    const decodeParams = JSON.parse(d.body!).kv_transfer_params;
    expect(prefillParams).toEqual({ do_remote_decode: true, do_remote_prefill: false, transfer_id: `xfer-${String(p.headers!['x-request-id'])}` });
    expect(decodeParams).toMatchObject({
      do_remote_prefill: true,
      transfer_id: prefillParams.transfer_id,
      remote_engine_id: prefill.engineIds!.get(p.rank),
      remote_bootstrap_addr: `http://127.0.0.1:${prefill.bootstrapPort}`,
    });
    expect(d.leg).toBe('decode');
    expect(await outcome(gateway, 'disaggregated')).toBe(1);
    await idle(gateway);
  });

  // vLLM 52a31cc files each engine under its position among the server's engines, rank −
  // start rank (mooncake_utils.py:20-25, mooncake_connector.py:790): on a node at start rank 2
  // with 4 engines, "2" is global rank 4's engine and global rank 2's is "0".
  it('names the engine of a node whose start rank is below its size by rank − start rank', async () => {
    const prefill = await mock({ role: 'prefill', connector: 'mooncake', startRank: 2, dataParallelSize: 4 });
    const decode = await mock({ role: 'decode', connector: 'mooncake' });
    const gateway = await startGateway({
      upstreams: [
        { url: prefill.url, name: 'p', startRank: 2, dataParallelSize: 4, ranks: [2], role: 'prefill', bootstrapPort: prefill.bootstrapPort },
        { url: decode.url, name: 'd', dataParallelSize: 2, role: 'decode' },
      ],
      disaggregation: { connector: 'mooncake', onPrefillFailure: 'fail' },
    });
    started.push(gateway);
    const answer = await exchange(gateway.url, { body: COMPLETION });
    expect(answer.status).toBe(200);
    const [p] = generations(prefill);
    expect(p.rank).toBe(2);
    expect(p.rankHeaders).toEqual(['0']);
    expect(JSON.parse(generations(decode)[0].body!).kv_transfer_params.remote_engine_id).toBe(prefill.engineIds!.get(2));
    expect(await outcome(gateway, 'disaggregated')).toBe(1);
  });

  it('48.19: names the prefill engine by its id alone, as vLLM\'s own Mooncake proxy does: no global rank in `remote_dp_rank`', async () => {
    const prefill = await mock({ role: 'prefill', connector: 'mooncake', startRank: 2, dataParallelSize: 4 });
    const decode = await mock({ role: 'decode', connector: 'mooncake' });
    const gateway = await startGateway({
      upstreams: [
        { url: prefill.url, name: 'p', startRank: 2, dataParallelSize: 4, ranks: [3], role: 'prefill', bootstrapPort: prefill.bootstrapPort },
        { url: decode.url, name: 'd', dataParallelSize: 2, role: 'decode' },
      ],
      disaggregation: { connector: 'mooncake', onPrefillFailure: 'fail' },
    });
    started.push(gateway);
    expect((await exchange(gateway.url, { body: COMPLETION })).status).toBe(200);
    // vLLM 52a31cc's connector reads these members only (mooncake_connector.py:323-334, 605-608).
    expect(Object.keys(JSON.parse(generations(decode)[0].body!).kv_transfer_params).sort()).toEqual(['do_remote_decode', 'do_remote_prefill', 'remote_bootstrap_addr', 'remote_engine_id', 'transfer_id']);
  });

  it('serves decode-only when the bootstrap server cannot name the engine', async () => {
    const prefill = await mock({ role: 'prefill', connector: 'mooncake' });
    const decode = await mock({ role: 'decode', connector: 'mooncake' });
    const closedPort = await freePort();
    const gateway = await startGateway({
      upstreams: [
        { url: prefill.url, dataParallelSize: 2, role: 'prefill', bootstrapPort: closedPort },
        { url: decode.url, dataParallelSize: 2, role: 'decode' },
      ],
      disaggregation: { connector: 'mooncake' },
    });
    started.push(gateway);
    expect((await exchange(gateway.url, { body: COMPLETION })).status).toBe(200);
    expect(generations(prefill)).toHaveLength(0);
    expect(await outcome(gateway, 'decode_only')).toBe(1);
  });

  it('gives up on a bootstrap server trickling its /query answer at timeouts.connectMs, whatever it sends (item 41.11)', async () => {
    const prefill = await mock({ role: 'prefill', connector: 'mooncake' });
    const decode = await mock({ role: 'decode', connector: 'mooncake' });
    // One byte of a valid answer every 100 ms: never idle, never done (until the test ends).
    let queries = 0;
    const trickler = await serve((req, res) => {
      queries++;
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{');
      const timer = setInterval(() => res.write(' '), 100);
      res.on('close', () => clearInterval(timer));
    });
    started.push(trickler);
    const gateway = await startGateway({
      upstreams: [
        { url: prefill.url, dataParallelSize: 2, role: 'prefill', bootstrapPort: Number(new URL(trickler.url).port) },
        { url: decode.url, dataParallelSize: 2, role: 'decode' },
      ],
      timeouts: { connectMs: 500 },
      disaggregation: { connector: 'mooncake', onPrefillFailure: 'fail' },
    });
    started.push(gateway);
    // Two requests for the same prefill server share the one query, and its failure.
    const answers = await Promise.all([exchange(gateway.url, { body: COMPLETION }), exchange(gateway.url, { body: COMPLETION })]);
    for (const answer of answers) {
      expect(answer.status).toBe(502);
      expect(JSON.parse(answer.body).error).toMatchObject({ type: 'BadGatewayError', message: "The prefill rank's Mooncake bootstrap server did not name its engine." });
    }
    expect(queries).toBe(1);
    expect(generations(prefill)).toHaveLength(0);
    expect(generations(decode)).toHaveLength(0);
    expect(await outcome(gateway, 'failed')).toBe(2);
  });
});

describe('a failed prefill leg', () => {
  it.each([
    ['answers 500', { kind: 'status', status: 500 } as const, 'status_5xx'],
    ['resets', { kind: 'reset' } as const, 'reset'],
    ['stops at end-of-sequence, keeping no blocks', { kind: 'eos' } as const, undefined],
  ])('is served by decode alone when it %s', async (_label, fault, kind) => {
    const { prefill, decode, gateway } = await pd('nixl', { retries: false });
    prefill.fault = fault;
    const answer = await exchange(gateway.url, { body: COMPLETION });
    expect(answer.status).toBe(200);
    const d = generations(decode)[0];
    expect(d.body).toBe(COMPLETION);
    expect(d.leg).toBe('whole');
    expect(await outcome(gateway, 'decode_only')).toBe(1);
    if (kind) expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total', { upstream: 'p', kind })).toBe(1);
    await idle(gateway);
  });

  it('says so in the log once per cause of going decode-only, and once when a prefill leg succeeds again (item 41.16)', async () => {
    const warnings: string[] = [];
    const infos: Array<{ fields: object; message: string }> = [];
    const logger = { warn: (message: string) => warnings.push(message), info: (fields: object, message: string) => infos.push({ fields, message }) };
    const { prefill, gateway } = await pd('nixl', { retries: false, logger });
    const send = async (times: number) => {
      for (let i = 0; i < times; i++) expect((await exchange(gateway.url, { body: COMPLETION })).status).toBe(200);
    };
    await send(1);
    expect([warnings, infos]).toEqual([[], []]);
    prefill.fault = { kind: 'status', status: 500 };
    await send(2);
    prefill.fault = { kind: 'eos' };
    await send(2);
    expect(warnings).toEqual([
      "express-dp-router: prefill leg failed (upstream 'p': The prefill upstream answered with an error.): requests are served decode-only (onPrefillFailure: 'decode-only') until a prefill leg succeeds",
      "express-dp-router: prefill leg failed (upstream 'p': The prefill upstream answered without kv_transfer_params: it kept no KV cache for a remote decode.): requests are served decode-only (onPrefillFailure: 'decode-only') until a prefill leg succeeds",
    ]);
    expect(infos).toEqual([]);
    prefill.fault = undefined;
    await send(2);
    expect(infos).toEqual([{ fields: { decodeOnly: 4 }, message: 'express-dp-router: prefill legs succeed again; 4 requests were served decode-only meanwhile' }]);
    // A cause told before is told again after a recovery.
    prefill.fault = { kind: 'status', status: 500 };
    await send(1);
    expect(warnings).toHaveLength(3);
    expect(warnings[2]).toBe(warnings[0]);
    expect(await outcome(gateway, 'decode_only')).toBe(5);
  });

  it('is retried on another prefill server when its connection is refused', async () => {
    const prefill = await mock({ role: 'prefill' });
    const decode = await mock({ role: 'decode' });
    const gateway = await startGateway({
      upstreams: [
        { url: `http://127.0.0.1:${await freePort()}`, name: 'gone', dataParallelSize: 2, role: 'prefill' },
        { url: prefill.url, name: 'p', dataParallelSize: 2, role: 'prefill' },
        { url: decode.url, dataParallelSize: 2, role: 'decode' },
      ],
      disaggregation: { prefillPolicy: 'round-robin' },
    });
    started.push(gateway);
    for (let i = 0; i < 2; i++) expect((await exchange(gateway.url, { body: COMPLETION })).status).toBe(200);
    expect(await outcome(gateway, 'disaggregated')).toBe(2);
    expect(await metricValue(gateway.registry, 'dp_router_retries_total', { upstream: 'gone' })).toBeGreaterThanOrEqual(1);
  });

  it.each([
    ['502 when refused', async (p: MockVllm) => p.close(), 502, 'BadGatewayError'],
    ['504 when it does not answer in time', async (p: MockVllm) => void (p.fault = { kind: 'stall' }), 504, 'GatewayTimeoutError'],
    ['502 when it answers without kv_transfer_params', async (p: MockVllm) => void (p.fault = { kind: 'eos' }), 502, 'BadGatewayError'],
  ])("answers %s with onPrefillFailure: 'fail'", async (_label, breakIt, status, type) => {
    const { prefill, decode, gateway } = await pd('nixl', { disaggregation: { onPrefillFailure: 'fail' }, timeouts: { firstByteMs: 200 }, retries: false });
    await breakIt(prefill);
    const answer = await exchange(gateway.url, { body: COMPLETION });
    expect(answer.status).toBe(status);
    expect(JSON.parse(answer.body).error).toMatchObject({ type, code: status });
    expect(generations(decode)).toHaveLength(0);
    expect(await outcome(gateway, 'failed')).toBe(1);
    await idle(gateway);
  });
});

describe('cancellation', () => {
  it('closes the prefill leg and never starts decode when the client leaves during prefill', async () => {
    const { prefill, decode, gateway } = await pd('nixl', {}, { prefillMsPerToken: 200 });
    await leaveAfter(gateway.url, COMPLETION, () => prefill.stats().perRank[0].running + prefill.stats().perRank[1].running === 1);
    await waitFor(() => prefill.stats().perRank[0].running + prefill.stats().perRank[1].running === 0, 2000, 'the prefill engine saw the leg close');
    await idle(gateway);
    expect(generations(decode)).toHaveLength(0);
    expect(await metricValue(gateway.registry, 'dp_router_disaggregated_cancellations_total', { leg: 'prefill' })).toBe(1);
  });

  it('closes the decode leg when the client leaves during decode', async () => {
    const prefill = await mock({ role: 'prefill' });
    const decode = await mock({ role: 'decode', decodeMsPerToken: 200 });
    const gateway = await startGateway({
      upstreams: [
        { url: prefill.url, dataParallelSize: 2, role: 'prefill' },
        { url: decode.url, dataParallelSize: 2, role: 'decode' },
      ],
      disaggregation: {},
    });
    started.push(gateway);
    const running = () => decode.stats().perRank[0].running + decode.stats().perRank[1].running;
    await leaveAfter(gateway.url, '{"prompt":"x","max_tokens":50,"stream":true}', () => running() === 1);
    await waitFor(() => running() === 0, 2000, 'the decode engine saw the leg close');
    await waitFor(() => allIdle(gateway), 2000);
    expect(await metricValue(gateway.registry, 'dp_router_disaggregated_cancellations_total', { leg: 'decode' })).toBe(1);
  });
});

describe('setUpstreams', () => {
  it('replaces both pools, and refuses a list that leaves one empty', async () => {
    const { prefill, decode, gateway } = await pd();
    const other = await mock({ role: 'prefill' });
    expect(() => gateway.router.setUpstreams([{ url: decode.url, role: 'decode' }])).toThrow(OptionError);
    gateway.router.setUpstreams([
      { url: other.url, name: 'p2', dataParallelSize: 2, role: 'prefill' },
      { url: decode.url, name: 'd', dataParallelSize: 2, startRank: 4, role: 'decode' },
    ]);
    expect(gateway.router.endpoints().filter((endpoint) => endpoint.leg === 'prefill').map((endpoint) => endpoint.upstream)).toEqual(['p2', 'p2']);
    expect((await exchange(gateway.url, { body: COMPLETION })).status).toBe(200);
    expect(generations(other)).toHaveLength(1);
    expect(generations(prefill)).toHaveLength(0);
  });
});

describe('the mock roles', () => {
  it('decode refuses params no prefill made, and params read already', async () => {
    const prefill = await mock({ role: 'prefill' });
    const decode = await mock({ role: 'decode' });
    const forged = '{"prompt":"x","kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1],"remote_engine_id":"e","remote_request_id":"r","remote_host":"h","remote_port":1}}';
    expect((await exchange(decode.url, { body: forged })).status).toBe(400);
    const answer = await exchange(prefill.url, { body: '{"prompt":"x","max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}' });
    const params = JSON.parse(answer.body).kv_transfer_params;
    expect(params).toMatchObject({ do_remote_prefill: true, remote_port: 5600 + generations(prefill)[0].rank });
    const body = JSON.stringify({ prompt: 'x', kv_transfer_params: params });
    expect((await exchange(decode.url, { body })).status).toBe(200);
    const again = await exchange(decode.url, { body });
    expect(again.status).toBe(400);
    expect(JSON.parse(again.body).error.message).toMatch(/already read/);
    // A prefill server does not decode; a decode server does not prefill.
    expect((await exchange(prefill.url, { body })).status).toBe(400);
    expect((await exchange(decode.url, { body: '{"prompt":"x","kv_transfer_params":{"do_remote_decode":true}}' })).status).toBe(400);
  });

  it('serves the Mooncake bootstrap /query', async () => {
    const prefill = await mock({ role: 'prefill', connector: 'mooncake', startRank: 2 });
    const query = (await (await fetch(`http://127.0.0.1:${prefill.bootstrapPort}/query`)).json()) as Record<string, { engine_id: string }>;
    // Keyed as vLLM keys them: the engines' positions on this server, 0 and 1 for global 2 and 3.
    expect(Object.keys(query)).toEqual(['0', '1']);
    expect(query['1'].engine_id).toBe(prefill.engineIds!.get(3));
  });
});

describe('options', () => {
  const url = 'http://127.0.0.1:8000';
  it.each([
    ['a role without disaggregation', { upstreams: [{ url, role: 'prefill' }] }, 'upstreams[0].role'],
    ['no decode upstream', { upstreams: [{ url, role: 'prefill' }], disaggregation: {} }, 'disaggregation'],
    ['no prefill upstream', { upstreams: [{ url, role: 'decode' }], disaggregation: {} }, 'disaggregation'],
    ['a bootstrap port with NIXL', { upstreams: [{ url, bootstrapPort: 8998 }], disaggregation: {} }, 'upstreams[0].bootstrapPort'],
  ])('refuses %s', (_label, options, path) => {
    let error: unknown;
    try {
      dpRouter({ metrics: false, ...(options as Options) });
    } catch (thrown) {
      error = thrown;
    }
    expect(error).toBeInstanceOf(OptionError);
    expect((error as OptionError).path).toBe(path);
  });
});

/** How many observations a histogram holds for the series matching `labels`. */
async function observations(gateway: TestGateway, name: string, labels: Record<string, string>): Promise<number> {
  const { values } = await gateway.registry.getSingleMetric(name)!.get();
  return values
    .filter((sample) => (sample as { metricName?: string }).metricName === `${name}_count` && Object.entries(labels).every(([key, value]) => String(sample.labels[key]) === value))
    .reduce((sum, sample) => sum + sample.value, 0);
}

/** Sends a request and destroys the connection once `when()` holds. */
async function leaveAfter(url: string, body: string, when: () => boolean): Promise<void> {
  const outgoing = httpRequest(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' } });
  outgoing.on('error', () => undefined);
  outgoing.end(body);
  await waitFor(when, 2000, 'the leg to start');
  outgoing.destroy();
}
