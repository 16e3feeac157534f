/**
 * The rule of issue 46 as a property (fast-check, seeded): any sequence of requests from one
 * source (one API key, one address), with bodies, fields and prompts the generator chooses (the
 * issue's reproductions among them: an echoed out-of-range sentence in `max_tokens`,
 * `truncate_prompt_tokens`, `cache_salt`, large template arguments, and requests that make the
 * engine fail), sent through the router to a healthy mock vLLM, leaves every upstream's
 * fleet-wide state as it was: the rank header claimed, the exact index trusted, every endpoint
 * healthy, no verdict taken. The same evidence from `verdicts.minSources` sources does take the
 * verdict (the failing requests replayed by three API keys eject their endpoint), so the
 * property can fail both ways.
 */
import { request } from 'node:http';
import { describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import { startMockVllm, type MockVllm } from '../../example-server/mock-vllm';
import { closedAfterEach, exchange, keptIn, metricValue, serve, startGateway, type TestGateway } from '../helpers';
import { untilJoined } from '../exact-prefix/helpers';

const started = closedAfterEach();
const RANKS = 2;
/** What makes the engine fail this request (a 500, as vLLM answers an input its engine fails on). */
const POISON = 'poison-pill';

/** The mock vLLM behind a front that answers 500 to a poisoned body and passes the rest through. */
async function upstream(): Promise<{ mock: MockVllm; url: string }> {
  const mock = await keptIn(started, startMockVllm({ dataParallelSize: RANKS, kvEvents: {} }));
  const { hostname, port } = new URL(mock.url);
  const front = await keptIn(
    started,
    serve((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (chunk: Buffer) => chunks.push(chunk));
      req.on('end', () => {
        const body = Buffer.concat(chunks);
        if (body.includes(POISON)) {
          res.writeHead(500, { 'content-type': 'application/json' });
          res.end('{"error":{"message":"EngineCore encountered an issue.","type":"InternalServerError","param":null,"code":500}}');
          return;
        }
        const out = request({ host: hostname, port, method: req.method, path: req.url, headers: req.headers }, (answer) => {
          res.writeHead(answer.statusCode ?? 502, answer.headers);
          answer.pipe(res);
        });
        out.on('error', () => res.destroy());
        out.end(body);
      });
    }),
  );
  return { mock, url: front.url };
}

async function gatewayFor(mock: MockVllm, url: string): Promise<TestGateway> {
  const kv = mock.kvEvents!;
  const gw = await keptIn(
    started,
    startGateway({
      upstreams: [{ url, name: 'mock', dataParallelSize: RANKS, kvEvents: { endpoint: kv.endpoints, replayEndpoint: kv.replayEndpoints } }],
      policy: 'prefix-aware',
      prefixAware: { tokenizer: kv.tokenizer },
      receipts: { usageEvery: 1, minReceipts: 4, window: 8 },
      outlierDetection: { consecutiveFailures: 2, baseEjectionMs: 60_000 },
      retries: false,
      exposeDecision: true,
      logger: false,
    }),
  );
  for (let rank = 0; rank < RANKS; rank++) {
    let joined = false;
    await untilJoined(
      async () => {
        await exchange(mock.url, { headers: { 'x-data-parallel-rank': String(rank) }, body: JSON.stringify({ prompt: `join ${rank} ${Math.random()} ${'lorem ipsum '.repeat(8)}`, max_tokens: 1 }) });
        joined = (await metricValue(gw.registry, 'dp_router_kv_stream_fresh', { rank: String(rank) })) === 1;
      },
      () => joined,
    );
  }
  return gw;
}

const TOOLS: Record<string, unknown[]> = {
  'one tool': [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }],
  '3,000 tools': Array.from({ length: 3000 }, (_, i) => ({ type: 'function', function: { name: `t${i}` } })),
};
const DOCUMENTS = Array.from({ length: 4000 }, (_, i) => ({ title: `d${i}`, text: 'x' }));

/** The body as sent: the generator's short names of large arguments expanded. */
function bodyOf(sent: Sent): string {
  const { tools, documents, ...rest } = sent.body;
  return JSON.stringify({ ...rest, ...(typeof tools === 'string' && { tools: TOOLS[tools] }), ...(documents !== undefined && { documents: DOCUMENTS }) });
}

interface Sent {
  path: string;
  body: Record<string, unknown>;
  headers: Record<string, string>;
}

const ECHOED = ['data_parallel_rank 0 is out of range [0, 1).', 'data_parallel_rank 999 is out of range [0, 1000).', 'data_parallel_rank 1 is out of range [0, 2).'];
const text = fc.oneof(fc.constantFrom('Tell me about the router.', 'lorem ipsum dolor sit amet '.repeat(6), POISON, ...ECHOED), fc.string({ maxLength: 40 }));
const field = fc.record(
  {
    max_tokens: fc.oneof(fc.integer({ min: 1, max: 3 }), fc.constantFrom(...ECHOED), fc.constant(-1)),
    truncate_prompt_tokens: fc.integer({ min: 1, max: 12 }),
    cache_salt: fc.oneof(fc.constantFrom('tenant-a', 'tenant-b'), fc.string({ minLength: 1, maxLength: 8 })),
    add_special_tokens: fc.boolean(),
    stream: fc.boolean(),
    data_parallel_rank: fc.integer({ min: -1, max: 3 }),
    // Expanded when sent (see `bodyOf`): a counterexample prints short.
    tools: fc.constantFrom('one tool', '3,000 tools'),
    documents: fc.constant('4,000 documents'),
  },
  { requiredKeys: [] },
);
const oneRequest: fc.Arbitrary<Sent> = fc.record({ chat: fc.boolean(), prompt: text, extra: field, hint: fc.option(fc.constantFrom('0', '1', '7', ' 1'), { nil: undefined }) }).map(
  ({ chat, prompt, extra, hint }): Sent => ({
    path: chat ? '/v1/chat/completions' : '/v1/completions',
    body: chat ? { model: 'mock-model', messages: [{ role: 'user', content: prompt }], ...extra } : { model: 'mock-model', prompt, ...extra },
    headers: hint === undefined ? {} : { 'x-data-parallel-rank': hint },
  }),
);
/**
 * A sequence, each request sent one to three times in a row (a run of failures is what ejects),
 * ending with a run of requests that make the engine fail (the evidence replayed from several
 * sources below).
 */
const sequence = fc.tuple(fc.array(fc.tuple(oneRequest, fc.integer({ min: 1, max: 3 })), { minLength: 2, maxLength: 10 }), fc.boolean()).map(([runs, chat]) => [
  ...runs.flatMap(([sent, times]) => Array<Sent>(times).fill(sent)),
  // Three failures per endpoint, the ranks taking turns: as many as minimumClients distinct sources would need.
  ...Array<Sent>(3 * RANKS).fill({ path: chat ? '/v1/chat/completions' : '/v1/completions', body: chat ? { model: 'mock-model', messages: [{ role: 'user', content: POISON }] } : { model: 'mock-model', prompt: POISON }, headers: {} }),
]);

const taken = async (gw: TestGateway) => metricValue(gw.registry, 'dp_router_verdicts_total', { outcome: 'taken' });

/** The fleet-wide state no single source may change. */
async function unchanged(gw: TestGateway): Promise<void> {
  expect(await taken(gw)).toBe(0);
  expect(gw.router.endpoints().every((endpoint) => endpoint.healthy)).toBe(true);
  expect(await metricValue(gw.registry, 'dp_router_upstream_rank_honoured', { upstream: 'mock' })).toBe(1);
  const probe = await exchange(gw.url, { path: '/v1/chat/completions', headers: { authorization: 'Bearer someone-else' }, body: JSON.stringify({ model: 'mock-model', messages: [{ role: 'user', content: `A fresh question ${Math.random()}, long enough for whole blocks: ${'what does the router do with it? '.repeat(6)}` }], max_tokens: 1 }) });
  expect(probe.status).toBe(200);
  // Rank claimed (not vllm), on the exact index.
  expect(probe.headers['x-dp-router-decision']).toMatch(/^upstream=mock; rank=\d; source=assigned; index=exact$/);
}

describe('verdicts: one source cannot change routing for everyone (issue 46)', () => {
  it('any sequence from one source leaves every upstream as it was; its evidence from minSources sources takes the verdict', async () => {
    const { mock, url } = await upstream();
    await fc.assert(
      fc.asyncProperty(sequence, async (requests) => {
        const gw = await gatewayFor(mock, url);
        try {
          for (const sent of requests) await exchange(gw.url, { path: sent.path, headers: { authorization: 'Bearer the-one-key', ...sent.headers }, body: bodyOf(sent) });
          await unchanged(gw);
          // The same failing requests, from three keys: the verdict (an ejection) is taken.
          const poisoned = requests.filter((sent) => JSON.stringify(sent.body).includes(POISON));
          for (let at = 0; at < 3 * RANKS * 2 && (await taken(gw)) === 0; at++) {
            const sent = poisoned[at % poisoned.length];
            await exchange(gw.url, { path: sent.path, headers: { authorization: `Bearer key-${at % 3}` }, body: bodyOf(sent) });
          }
          expect(await taken(gw)).toBe(1);
          expect(gw.router.endpoints().some((endpoint) => !endpoint.healthy)).toBe(true);
        } finally {
          await gw.close();
        }
      }),
      { seed: 46, numRuns: 6, endOnFailure: true },
    );
  });
});
