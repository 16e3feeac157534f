/**
 * Route receipts through real sockets: the mock vLLM (its KV events on ZeroMQ, its usage), the
 * router in front of it, and between them, where a test needs one, a relay that changes what
 * passes (a proxy stripping the rank header, a template that drifts).
 */
import { describe, expect, it } from '@jest/globals';
import { startMockVllm, type MockVllm, type MockVllmOptions } from '../../example-server/mock-vllm';
import type { ReceiptsOptions, UpstreamOptions } from '../../lib';
import { closedAfterEach, drifting, metricValue, startGateway, startRelay, stripping, waitFor, type Rewrite, type TestGateway } from '../helpers';
import { untilJoined } from '../exact-prefix/helpers';

const started = closedAfterEach();
const RANKS = 4;
const BLOCK = 16;

interface Setup {
  mock: MockVllm;
  gw: TestGateway;
  errors: string[];
  warnings: string[];
}

async function setup(options: { relay?: Rewrite; receipts?: ReceiptsOptions | false; mock?: MockVllmOptions; upstream?: Partial<UpstreamOptions> } = {}): Promise<Setup> {
  const mock = await startMockVllm({ dataParallelSize: RANKS, kvEvents: {}, ...options.mock });
  started.push(mock);
  const relay = options.relay === undefined ? undefined : await startRelay(mock.url, options.relay);
  if (relay !== undefined) started.push(relay);
  const kv = mock.kvEvents!;
  const errors: string[] = [];
  const warnings: string[] = [];
  const gw = await startGateway({
    upstreams: [{ url: relay?.url ?? mock.url, name: 'mock', dataParallelSize: RANKS, kvEvents: { endpoint: kv.endpoints, replayEndpoint: kv.replayEndpoints.length > 0 ? kv.replayEndpoints : undefined }, ...options.upstream }],
    policy: 'prefix-aware',
    prefixAware: { tokenizer: kv.tokenizer },
    exposeDecision: true,
    ...(options.receipts !== undefined && { receipts: options.receipts }),
    logger: { warn: (message) => warnings.push(message), error: (_fields, message) => errors.push(message) },
  });
  started.push(gw);
  await join(mock, gw);
  return { mock, gw, errors, warnings };
}

let probes = 0;

/** One-block requests straight to each rank until the gateway's stream of it arrived (a SUB joins asynchronously). */
async function join(mock: MockVllm, gw: TestGateway): Promise<void> {
  for (let rank = 0; rank < RANKS; rank++) {
    let joined = false;
    await untilJoined(
      async () => {
        await (await fetch(`${mock.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-data-parallel-rank': String(rank) }, body: JSON.stringify({ prompt: `probe ${probes++} ${'lorem ipsum dolor '.repeat(8)}`, max_tokens: 1 }) })).text();
        joined = (await metricValue(gw.registry, 'dp_router_kv_stream_fresh', { rank: String(rank) })) === 1;
      },
      () => joined,
    );
  }
}

const chat = (i: number, extra: object = {}) => ({
  model: 'mock-model',
  messages: [
    { role: 'system', content: `Session ${i}. You are a helpful assistant who answers briefly and accurately, in plain words. `.repeat(3) },
    { role: 'user', content: `Question ${i}: what does the router do?` },
  ],
  max_tokens: 2,
  ...extra,
});
const completion = (i: number, extra: object = {}) => ({ model: 'mock-model', prompt: `Document ${i}. ${'The quick brown fox jumps over the lazy dog. '.repeat(6)}`, max_tokens: 2, ...extra });

interface Answer {
  status: number;
  decision: string | null;
  text: string;
}

/** Four clients take turns (their API keys tell them apart; four, so that no test's own pattern of requests falls to fewer): a verdict needs `verdicts.minSources` (3) distinct sources. */
let turn = 0;

async function send(gw: TestGateway, body: object, path = '/v1/chat/completions', client = `client-${turn++ % 4}`): Promise<Answer> {
  const res = await fetch(gw.url + path, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${client}` }, body: JSON.stringify(body) });
  return { status: res.status, decision: res.headers.get('x-dp-router-decision'), text: await res.text() };
}

const receipts = (gw: TestGateway, labels: Record<string, string>) => metricValue(gw.registry, 'dp_router_route_receipts_total', labels);
const honoured = (gw: TestGateway) => metricValue(gw.registry, 'dp_router_upstream_rank_honoured', { upstream: 'mock' });

/** Sends `body(i)` for i = 0, 1, … until `done()` or `limit` requests; returns how many were sent. */
async function sendUntil(gw: TestGateway, body: (i: number) => [object, string?], done: () => boolean, limit: number): Promise<number> {
  let sent = 0;
  while (sent < limit && !done()) {
    const [payload, path] = body(sent);
    expect((await send(gw, payload, path)).status).toBe(200);
    sent++;
  }
  return sent;
}

describe('route receipts: a rank header that is not honoured', () => {
  it('finds the path vLLM does not route by header, says so at error level, and lets vLLM balance it', async () => {
    const { mock, gw, errors } = await setup();
    mock.ignoreRankHeader = { paths: ['/v1/chat/completions'] };
    // Two chats to each completion, every prompt new: the mock places the chats itself.
    const sent = await sendUntil(gw, (i) => (i % 3 === 2 ? [completion(i), '/v1/completions'] : [chat(i)]), () => errors.length > 0, 200);
    expect(errors).toEqual([
      expect.stringMatching(
        /^express-dp-router: upstream 'mock' does not honour the rank header: \d+ of its last \d+ route receipts found the prompt's new blocks on another rank .* Likely cause: vLLM does not route \/v1\/chat\/completions by the header here \(it is honoured on \/v1\/completions\)/,
      ),
    ]);
    expect(sent).toBeLessThanOrEqual(50);
    expect(await receipts(gw, { outcome: 'elsewhere' })).toBeGreaterThan(0);
    expect(await honoured(gw)).toBe(0);
    // From now on the requests go without a rank header, and say so; one in 10 (`probeEvery`) is
    // a probe sent pinned as before (where the count starts depends on when the verdict came:
    // the receipt that tipped it may have come with a later request's events).
    mock.resetStats();
    const answers: Answer[] = [];
    for (let i = 0; i < 30; i++) answers.push(await send(gw, completion(1000 + i), '/v1/completions'));
    const headers = mock.stats().requests.filter((record) => record.path === '/v1/completions').map((record) => record.rankHeaders.length);
    const probes = headers.flatMap((count, at) => (count === 1 ? [at] : []));
    expect(probes.length).toBeGreaterThanOrEqual(2);
    expect(probes[0]).toBeLessThanOrEqual(10);
    expect(probes.slice(1).map((at, i) => at - probes[i])).toEqual(probes.slice(1).map(() => 10));
    expect(headers.every((count) => count <= 1)).toBe(true);
    expect(answers.map((answer) => answer.decision!.endsWith('; rank_claimed=false'))).toEqual(headers.map((count) => count === 0));
  });

  it('detects a relay that strips the header within 50 requests, naming it as the likely cause', async () => {
    const { gw, errors } = await setup({ relay: stripping('x-data-parallel-rank') });
    const sent = await sendUntil(gw, (i) => [chat(i)], () => errors.length > 0, 200);
    expect(sent).toBeLessThanOrEqual(50);
    expect(errors).toEqual([expect.stringMatching(/Likely cause: a proxy between the gateway and vLLM strips `x-data-parallel-rank`/)]);
    expect(await honoured(gw)).toBe(0);
    expect((await send(gw, chat(999))).decision).toMatch(/; index=approximate; rank_claimed=false$/);
  });

  it("names `rankHeader: 'none'` when that is what sends no header", async () => {
    const { gw, errors } = await setup({ upstream: { rankHeader: 'none' } });
    await sendUntil(gw, (i) => [chat(i)], () => errors.length > 0, 200);
    expect(errors).toEqual([expect.stringMatching(/Likely cause: `rankHeader: 'none'` sends no rank header/)]);
  });

  it('recovers once the probes are honoured again', async () => {
    const { mock, gw, errors, warnings } = await setup({ receipts: { probeEvery: 2 } });
    mock.ignoreRankHeader = { paths: ['/v1/chat/completions'] };
    await sendUntil(gw, (i) => [chat(i)], () => errors.length > 0, 200);
    mock.ignoreRankHeader = undefined;
    await sendUntil(gw, (i) => [chat(500 + i)], () => warnings.some((line) => line.includes('honours the rank header again')), 400);
    expect(await honoured(gw)).toBe(1);
    expect((await send(gw, chat(2000))).decision).not.toMatch(/rank_claimed/);
  });
});

describe('route receipts: a healthy upstream', () => {
  it('confirms each new prompt on the rank chosen and counts a repeated one cached', async () => {
    const { gw, errors } = await setup();
    for (let i = 0; i < 6; i++) await send(gw, chat(i));
    await send(gw, chat(0));
    // Receipts are taken as the engine's event batches arrive, over ZeroMQ: wait for the last.
    await waitFor(async () => (await receipts(gw, { outcome: 'confirmed' })) + (await receipts(gw, { outcome: 'cached' })) >= 7, 5000, 'every request judged');
    expect(await receipts(gw, { outcome: 'confirmed' })).toBe(6);
    expect(await receipts(gw, { outcome: 'cached' })).toBe(1);
    expect(await receipts(gw, { outcome: 'elsewhere' })).toBe(0);
    expect(errors).toEqual([]);
  });

  it('raises no alarm when events are dropped: replayed ones still confirm, lost ones count unseen', async () => {
    const { mock, gw, errors, warnings } = await setup({ mock: { kvEvents: { replayPort: null } }, receipts: { unseenAfterMs: 100 } });
    for (let i = 0; i < 40; i++) {
      // One batch in ten lost on the wire, with no replay to repair it.
      if (i % 10 === 3) mock.kvEvents!.drop(i % RANKS);
      expect((await send(gw, chat(i))).status).toBe(200);
    }
    await waitFor(async () => (await receipts(gw, { outcome: 'unseen' })) > 0, 5000, 'the lost batches counted unseen');
    expect(await receipts(gw, { outcome: 'elsewhere' })).toBe(0);
    expect(await honoured(gw)).toBe(1);
    expect(errors).toEqual([]);
    expect(warnings).toEqual([]);
  });
});

describe('route receipts: an index that misses', () => {
  it('falls back to the approximate index when the engine reports far fewer cached tokens than predicted, and recovers when they agree', async () => {
    const { mock, gw, warnings } = await setup({ receipts: { probeEvery: 2, usageEvery: 1 } });
    // Each prompt twice: cached the second time, so the engine is seen to report cached tokens.
    for (let i = 0; i < 12; i++) for (let twice = 0; twice < 2; twice++) await send(gw, chat(i));
    expect(await metricValue(gw.registry, 'dp_router_prompt_cached_tokens_total', { source: 'reported' })).toBe(await metricValue(gw.registry, 'dp_router_prompt_cached_tokens_total', { source: 'predicted' }));
    // The engine loses every block and tells no one; the index still holds them all.
    mock.dropBlocksSilently();
    await sendUntil(gw, (i) => [chat(i % 12)], () => warnings.length > 0, 24);
    expect(warnings).toEqual([expect.stringMatching(/^express-dp-router: upstream 'mock' is routed on the approximate prefix index: \d+ of its last \d+ exact predictions were more than a block above the cached tokens the engine reported/)]);
    expect((await send(gw, chat(0))).decision).toMatch(/; index=approximate$/);
    // Sent again, the prompts are cached again: the probes' predictions come true.
    await sendUntil(gw, (i) => [chat(i % 12)], () => warnings.length > 1, 200);
    expect(warnings[1]).toMatch(/exact prefix index agrees with the engine again/);
  });

  it('falls back when the prompts the engine sees drift from what the router tokenizes', async () => {
    let drifts = false;
    // A template that changed on the engine's side: every chat gains a line before its first message.
    const drift = drifting(() => drifts);
    const { gw, warnings } = await setup({ relay: drift, receipts: { usageEvery: 1 } });
    for (let i = 0; i < 5; i++) expect((await send(gw, chat(i))).decision).toMatch(/; index=exact$/);
    drifts = true;
    const sent = await sendUntil(gw, (i) => [chat(100 + i)], () => warnings.length > 0, 100);
    expect(sent).toBeLessThanOrEqual(20);
    expect(warnings).toEqual([expect.stringMatching(/counted other prompt tokens than the router's tokenizer: the tokenizer or chat template differs/)]);
    expect((await send(gw, chat(999))).decision).toMatch(/; index=approximate$/);
  });
});

const cached = (gw: TestGateway, source: string) => metricValue(gw.registry, 'dp_router_prompt_cached_tokens_total', { source });

describe('route receipts: usage', () => {
  it('compares predicted and reported cached tokens of non-streamed and streamed answers alike', async () => {
    const { gw } = await setup({ receipts: { usageEvery: 1 } });
    await send(gw, completion(1), '/v1/completions');
    // Cached now: the router predicts, the engine reports (whole blocks, never the last token).
    const answer = JSON.parse((await send(gw, completion(1), '/v1/completions')).text) as { usage: { prompt_tokens: number; prompt_tokens_details: { cached_tokens: number } } };
    const reported = answer.usage.prompt_tokens_details.cached_tokens;
    expect(reported).toBe(Math.floor((answer.usage.prompt_tokens - 1) / BLOCK) * BLOCK);
    expect(await cached(gw, 'reported')).toBe(reported);
    expect(await cached(gw, 'predicted')).toBe(reported);
    await send(gw, completion(1, { stream: true }), '/v1/completions');
    expect(await cached(gw, 'reported')).toBe(2 * reported);
    expect(await cached(gw, 'predicted')).toBe(2 * reported);
  });

  it('asks a stream for its usage and gives the client who did not ask no usage chunk', async () => {
    const { mock, gw } = await setup({ mock: { recordBodies: true }, receipts: { usageEvery: 1 } });
    await send(gw, chat(1));
    mock.resetStats();
    const { text } = await send(gw, chat(1, { stream: true, max_tokens: 4 }));
    const events = text.split('\n\n').filter((event) => event !== '');
    expect(events.every((event) => !event.includes('"usage"'))).toBe(true);
    // The role, four tokens, [DONE]: every event the stream would have had without the question.
    expect(events).toHaveLength(6);
    expect(events[events.length - 1]).toBe('data: [DONE]');
    const [record] = mock.stats().requests.filter((one) => one.path === '/v1/chat/completions');
    expect((JSON.parse(record.body!) as Record<string, unknown>).stream_options).toEqual({ include_usage: true });
    expect(record.headers!['content-length']).toBe(String(Buffer.byteLength(record.body!)));
    // And the receipt came of it.
    expect(await cached(gw, 'reported')).toBeGreaterThan(0);
  });

  it("leaves a client's own stream_options as they are, and its usage chunk in its stream", async () => {
    const { mock, gw } = await setup({ mock: { recordBodies: true }, receipts: { usageEvery: 1 } });
    const asked = await send(gw, chat(2, { stream: true, stream_options: { include_usage: true } }));
    expect(asked.text).toMatch(/"choices":\[\],"usage":\{"prompt_tokens":\d+/);
    const refused = await send(gw, chat(3, { stream: true, stream_options: { include_usage: false } }));
    expect(refused.text).not.toMatch(/"usage"/);
    const chats = mock.stats().requests.filter((record) => record.path === '/v1/chat/completions');
    expect(chats.map((record) => JSON.parse(record.body!).stream_options)).toEqual([{ include_usage: true }, { include_usage: false }]);
  });
});

/**
 * A relay that makes the mock a server started with `--enable-force-include-usage`: every stream
 * sends its usage, on every event too (`should_include_usage` returns `(True, True)`, vLLM 52a31cc
 * vllm/entrypoints/utils.py:281-285). `bodies` gets what the router sent.
 */
function forcingUsage(bodies: string[]): Rewrite {
  return (_path, _headers, body) => {
    bodies.push(body.toString());
    const parsed = JSON.parse(body.toString() || '{}') as Record<string, unknown>;
    if (parsed.stream !== true) return body;
    parsed.stream_options = { include_usage: true, continuous_usage_stats: true };
    return Buffer.from(JSON.stringify(parsed));
  };
}

describe('route receipts: an upstream that forces usage', () => {
  it('48.5: leaves its streams as it sends them (usage chunk kept), reads their usage, and asks it no more', async () => {
    const bodies: string[] = [];
    const { gw } = await setup({ relay: forcingUsage(bodies), receipts: { usageEvery: 1 } });
    bodies.length = 0;
    await send(gw, chat(1));
    for (let i = 0; i < 3; i++) {
      const { text } = await send(gw, chat(1, { stream: true, max_tokens: 4 }));
      const events = text.split('\n\n').filter((event) => event !== '');
      // The role and four tokens, each with its usage so far, then the usage chunk and [DONE]: as the server sends it to anyone.
      expect(events).toHaveLength(7);
      expect(events.slice(0, 5).every((event) => /\],"usage":\{"prompt_tokens":\d+/.test(event))).toBe(true);
      expect(events[5]).toMatch(/"choices":\[\],"usage":\{"prompt_tokens":\d+/);
    }
    // Asked once: the usage on its events said the server forces it.
    expect(bodies.filter((body) => body.includes('"stream":true')).map((body) => body.includes('stream_options'))).toEqual([true, false, false]);
    // Every stream's usage read all the same: three receipts of the cached prompt, on top of the first answer's.
    const reported = await cached(gw, 'reported');
    expect(reported).toBeGreaterThan(0);
    expect(reported % 3).toBe(0);
  });
});

describe('route receipts: a sample of the usage', () => {
  it('reads the usage of one answer in usageEvery, and asks only those streams', async () => {
    const { mock, gw } = await setup({ mock: { recordBodies: true }, receipts: { usageEvery: 4 } });
    for (let i = 0; i < 8; i++) await send(gw, chat(i, { stream: true }));
    const asked = mock.stats().requests.filter((record) => record.path === '/v1/chat/completions').map((record) => JSON.parse(record.body!).stream_options !== undefined);
    expect(asked).toEqual([false, false, false, true, false, false, false, true]);
    // The last request's blocks come in the engine's next event batch, over ZeroMQ: wait for it.
    await waitFor(async () => (await receipts(gw, { outcome: 'confirmed' })) >= 8, 5000, 'every request confirmed');
    expect(await receipts(gw, { outcome: 'confirmed' })).toBe(8);
  });
});

describe('route receipts: off', () => {
  it('with receipts: false, exports none of their metrics and always sends the rank header', async () => {
    const { mock, gw, errors } = await setup({ receipts: false, relay: stripping('x-data-parallel-rank'), mock: { recordBodies: true } });
    for (let i = 0; i < 30; i++) await send(gw, chat(i, { stream: i % 2 === 0 }));
    expect(gw.registry.getSingleMetric('dp_router_route_receipts_total')).toBeUndefined();
    expect(errors).toEqual([]);
    const chats = mock.stats().requests.filter((record) => record.path === '/v1/chat/completions');
    expect(chats).toHaveLength(30);
    expect(chats.every((record) => JSON.parse(record.body!).stream_options === undefined && record.rankHeaders.length === 0)).toBe(true);
  });
});

describe('route receipts: requests the router does not model exactly (issue 46)', () => {
  const taken = (gw: TestGateway, verdict: string) => metricValue(gw.registry, 'dp_router_verdicts_total', { upstream: 'mock', verdict, outcome: 'taken' });

  it('reproduction 2: truncate_prompt_tokens requests, however many and from however many clients, leave the exact index trusted', async () => {
    const { gw, warnings, errors } = await setup({ receipts: { usageEvery: 1 } });
    for (let i = 0; i < 40; i++) {
      const answer = await send(gw, i % 2 === 0 ? chat(i, { truncate_prompt_tokens: 8 }) : completion(i, { truncate_prompt_tokens: 8 }), i % 2 === 0 ? undefined : '/v1/completions');
      expect(answer.status).toBe(200);
      // vLLM cut the prompt: its usage counts 8 tokens, not the router's.
      expect((JSON.parse(answer.text) as { usage: { prompt_tokens: number } }).usage.prompt_tokens).toBe(8);
    }
    expect((await send(gw, chat(999))).decision).toMatch(/; index=exact$/);
    expect(warnings).toEqual([]);
    expect(errors).toEqual([]);
    expect(await taken(gw, 'tokens')).toBe(0);
  });

  it('reproduction 3: cache_salt requests find only their own salt\'s blocks, predicted as the engine reports them, and leave the index trusted', async () => {
    const { gw, warnings } = await setup({ receipts: { usageEvery: 1 } });
    // Cached unsalted, and seen to report cached tokens.
    for (let i = 0; i < 12; i++) for (let twice = 0; twice < 2; twice++) await send(gw, chat(i));
    for (let i = 0; i < 24; i++) expect((await send(gw, chat(i % 12, { cache_salt: `tenant-${i}` }))).status).toBe(200);
    expect(warnings).toEqual([]);
    expect(await taken(gw, 'misses')).toBe(0);
    expect((await send(gw, chat(0))).decision).toMatch(/; index=exact$/);
    // A salted prompt sent again finds its own salt's blocks, as predicted.
    const cached = (source: string) => metricValue(gw.registry, 'dp_router_prompt_cached_tokens_total', { source });
    await send(gw, chat(100, { cache_salt: 'tenant-x' }));
    const [predicted, reported] = [await cached('predicted'), await cached('reported')];
    const again = await send(gw, chat(100, { cache_salt: 'tenant-x' }));
    expect(again.decision).toMatch(/; index=exact$/);
    const hit = (JSON.parse(again.text) as { usage: { prompt_tokens_details: { cached_tokens: number } } }).usage.prompt_tokens_details.cached_tokens;
    expect(hit).toBeGreaterThan(0);
    expect([(await cached('predicted')) - predicted, (await cached('reported')) - reported]).toEqual([hit, hit]);
  });
});
