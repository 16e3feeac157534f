/**
 * A server that contradicts how the router reaches its ranks: vLLM 52a31cc answers `400
 * data_parallel_rank N is out of range [0, M).` (a stream: 200, then that error event) to a
 * header past its engines, and its `/metrics` name those engines by global rank. The router
 * says so once at error level with the fix, counts it, and stops claiming ranks there (vLLM
 * balances that upstream's requests) instead of answering 400 again and again. Real sockets:
 * mock vLLM nodes that read the header as vLLM does.
 */
import { describe, expect, it } from '@jest/globals';
import { startMockVllm, type MockVllm, type MockVllmOptions } from '../../example-server/mock-vllm';
import type { Options, UpstreamOptions } from '../../lib';
import { enginesProblem, outOfRangeProblem, parseOutOfRange } from '../../lib/upstreams/rank-header-check';
import { parseUpstreams } from '../../lib/upstreams/upstream-options';
import { EndpointTable } from '../../lib/upstreams/endpoints';
import { RankHeaderGuard } from '../../lib/upstreams/rank-header-guard';
import { quietVerdicts } from '../../lib/verdicts/verdicts';
import { closedAfterEach, keptIn, exchange, metricValue, serve, sleep, startGateway, waitFor, type TestGateway } from '../helpers';
import OUT_OF_RANGE_FIXTURE from '../example-server/fixtures/vllm-rank-out-of-range.json';

const started = closedAfterEach();

const mock = (options: MockVllmOptions): Promise<MockVllm> => keptIn(started, startMockVllm(options));

/** A logger that keeps every line, by level. */
function recordingLogger() {
  const lines: Array<{ level: string; message: string }> = [];
  return {
    lines,
    errors: () => lines.filter((line) => line.level === 'error').map((line) => line.message),
    warn: (message: string) => lines.push({ level: 'warn', message }),
    info: (_fields: object, message: string) => lines.push({ level: 'info', message }),
    error: (_fields: object, message: string) => lines.push({ level: 'error', message }),
  };
}

const gateway = (options: Options): Promise<TestGateway> => keptIn(started, startGateway(options));

const COMPLETION = '{"model":"mock-model","prompt":"hi","max_tokens":1}';
const CHAT_STREAM = JSON.stringify({ model: 'mock-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: 1, stream: true });
const config = (upstream: UpstreamOptions) => parseUpstreams('upstreams', [upstream])[0];
const rejections = (front: TestGateway, evidence: string) => metricValue(front.registry, 'dp_router_rank_header_rejections_total', { upstream: 'node-b', evidence });

describe("vLLM's words", () => {
  it.each(OUT_OF_RANGE_FIXTURE.cases)('reads rank $rank of [0, $numRanks) from the 400 body and the stream event vLLM sends', ({ rank, numRanks, json, sse }) => {
    expect(parseOutOfRange(json)).toEqual({ rank, numRanks });
    expect(parseOutOfRange(sse)).toEqual({ rank, numRanks });
  });

  it('finds a contradiction between /metrics engines and the configuration, and names the fix', () => {
    const hybrid = [4, 5, 6, 7];
    expect(enginesProblem(config({ url: 'http://b:8000', startRank: 4, dataParallelSize: 4 }), hybrid)).toBeUndefined();
    expect(enginesProblem(config({ url: 'http://b:8000', startRank: 4, dataParallelSize: 4, rankHeader: 'global' }), hybrid)).toMatch(/rank 4 is sent as 4, which is engine 8: set rankHeader: 'local'$/);
    // vllm-router's URL@RANK against an internal-LB server: the start rank taken from the ranks listed.
    expect(enginesProblem(config({ url: 'http://a:8000', startRank: 5, dataParallelSize: 1 }), [0, 1, 2, 3, 4, 5, 6, 7])).toMatch(/rank 5 is sent as 0, which is engine 0: set startRank: 0$/);
    expect(enginesProblem(config({ url: 'http://a:8000', dataParallelSize: 8 }), [0, 1, 2, 3])).toMatch(/ranks 4, 5, 6, 7 are configured: set startRank: 0 and dataParallelSize: 4/);
    expect(enginesProblem(config({ url: 'http://a:8000', startRank: 2, rankHeader: 'none' }), [0, 1])).toBeUndefined();
    expect(outOfRangeProblem(config({ url: 'http://b:8000', startRank: 4, dataParallelSize: 4, rankHeader: 'global' }), 6, 6, 4)).toMatch(/"data_parallel_rank 6 is out of range \[0, 4\)\." for rank 6.*set rankHeader: 'local'/);
  });
});

describe('a server that refuses the rank header', () => {
  it('is said once at error level with the fix, counted, and then balanced by vLLM instead of answered 400 again', async () => {
    const node = await mock({ startRank: 4, dataParallelSize: 4 });
    const logger = recordingLogger();
    const front = await gateway({ upstreams: [{ url: node.url, name: 'node-b', startRank: 4, dataParallelSize: 4, rankHeader: 'global' }], exposeDecision: true, logger });
    const first = await exchange(front.url, { body: COMPLETION });
    // vLLM's own answer is passed through.
    expect(first.status).toBe(400);
    const firstRank = Number(/rank=(\d+)/.exec(String(first.headers['x-dp-router-decision']))![1]);
    expect(parseOutOfRange(first.body)).toEqual({ rank: firstRank, numRanks: 4 });
    await waitFor(() => logger.errors().length === 1);
    expect(logger.errors()[0]).toMatch(/^express-dp-router: upstream 'node-b' does not take the rank header.*out of range \[0, 4\).*set rankHeader: 'local'.*its requests go without one, as vLLM balances them\.$/);
    expect(await rejections(front, 'answer')).toBe(1);
    for (let request = 0; request < 4; request++) {
      const next = await exchange(front.url, { body: COMPLETION });
      expect(next.status).toBe(200);
      expect(next.headers['x-dp-router-decision']).toBe('upstream=node-b; rank=vllm; source=assigned');
    }
    // The second is the router's own probe (the same header value on a 1-token completion it
    // builds), which confirms the refusal before anything changes for other clients.
    expect(node.stats().requests.map((record) => record.rankHeaders)).toEqual([[String(firstRank)], [String(firstRank)], [], [], [], []]);
    expect(logger.errors()).toHaveLength(1);
    expect(await rejections(front, 'answer')).toBe(1);
    // A new configuration is honoured again, and sends what the node takes.
    front.router.setUpstreams([{ url: node.url, name: 'node-b', startRank: 4, dataParallelSize: 4 }]);
    const fixed = await exchange(front.url, { body: COMPLETION });
    expect(fixed.status).toBe(200);
    const rank = Number(/^upstream=node-b; rank=([4-7]); source=assigned$/.exec(String(fixed.headers['x-dp-router-decision']))![1]);
    expect(node.stats().requests.at(-1)!.rankHeaders).toEqual([String(rank - 4)]);
  });

  it('is found in the first event of a stream (HTTP 200, then the error)', async () => {
    const node = await mock({ startRank: 1, dataParallelSize: 1 });
    const logger = recordingLogger();
    const front = await gateway({ upstreams: [{ url: node.url, name: 'node-b', startRank: 1, rankHeader: 'global' }], logger });
    const first = await exchange(front.url, { path: '/v1/chat/completions', body: CHAT_STREAM });
    expect(first.status).toBe(200);
    expect(first.body).toBe(OUT_OF_RANGE_FIXTURE.cases.find((known) => known.rank === 1 && known.numRanks === 1)!.sse);
    await waitFor(() => logger.errors().length === 1);
    expect(await rejections(front, 'answer')).toBe(1);
    const next = await exchange(front.url, { path: '/v1/chat/completions', body: CHAT_STREAM });
    expect(next.status).toBe(200);
    expect(next.body).not.toContain('"error"');
    expect(next.body.endsWith('data: [DONE]\n\n')).toBe(true);
  });
});

describe('/metrics that contradict the configuration', () => {
  it('turn the upstream over to vLLM before any request fails, naming the start rank, and hand it back once they agree', async () => {
    const node = await mock({ startRank: 4, dataParallelSize: 4 });
    const logger = recordingLogger();
    // Ranks 4-7 taken for part of an internal-LB server (start rank 0): the node reads 4-7 as past its engines.
    const wrong: UpstreamOptions = { url: node.url, name: 'node-b', startRank: 0, dataParallelSize: 8, ranks: [4, 5, 6, 7] };
    const front = await gateway({ upstreams: [wrong], loadFeedback: { intervalMs: 50 }, exposeDecision: true, logger });
    await waitFor(() => logger.errors().length === 1);
    expect(logger.errors()[0]).toMatch(/its \/metrics name engines 4–7, and vLLM reads X-data-parallel-rank as an index from 0 into those: rank 4 is sent as 4, which is engine 8: set startRank: 4/);
    expect(await rejections(front, 'metrics')).toBeGreaterThanOrEqual(1);
    const answer = await exchange(front.url, { body: COMPLETION });
    expect([answer.status, answer.headers['x-dp-router-decision']]).toEqual([200, 'upstream=node-b; rank=vllm; source=assigned']);
    expect(node.stats().requests.filter((record) => record.path === '/v1/completions').map((record) => record.rankHeaders)).toEqual([[]]);
    // Logged once, though every poll finds it.
    const polls = await rejections(front, 'metrics');
    await waitFor(async () => (await rejections(front, 'metrics')) > polls);
    expect(logger.errors()).toHaveLength(1);
    front.router.setUpstreams([{ ...wrong, startRank: 4, dataParallelSize: 4 }]);
    const fixed = await exchange(front.url, { body: COMPLETION });
    expect(fixed.status).toBe(200);
    expect(fixed.headers['x-dp-router-decision']).toMatch(/^upstream=node-b; rank=[4-7]; source=assigned$/);
    expect(logger.errors()).toHaveLength(1);
  });

  it('agree with a hybrid node discovered with the default rank header: its ranks get the header it takes', async () => {
    const node = await mock({ startRank: 4, dataParallelSize: 4 });
    const logger = recordingLogger();
    const front = await gateway({ upstreams: [{ url: node.url, name: 'node-b', discover: { intervalMs: 50 } }], logger, exposeDecision: true });
    await waitFor(() => front.router.endpoints().length === 4);
    for (let request = 0; request < 4; request++) expect((await exchange(front.url, { body: COMPLETION })).status).toBe(200);
    const sent = node.stats().requests.filter((record) => record.path === '/v1/completions');
    expect(sent.map((record) => record.rankHeaders)).toEqual(sent.map((record) => [String(record.rank - 4)]));
    expect(logger.errors()).toEqual([]);
    expect(await rejections(front, 'metrics')).toBe(0);
  });

  it("after discovery, name rankHeader: 'local' for a hybrid node reached with 'global'", async () => {
    const node = await mock({ startRank: 4, dataParallelSize: 4 });
    const logger = recordingLogger();
    const front = await gateway({ upstreams: [{ url: node.url, name: 'node-b', rankHeader: 'global', discover: { intervalMs: 50 } }], logger });
    await waitFor(() => logger.errors().length === 1);
    expect(logger.errors()[0]).toMatch(/rank 4 is sent as 4, which is engine 8: set rankHeader: 'local'\./);
    expect(front.router.endpoints().map((endpoint) => endpoint.rank)).toEqual([4, 5, 6, 7]);
    const answer = await exchange(front.url, { body: COMPLETION });
    expect(answer.status).toBe(200);
  });
});

/** A node honest about the rank header that answers vLLM's out-of-range sentence to requests marked `refuse`, and the probe as `probe` says. */
async function crafted(probe: 'honoured' | 'unreachable'): Promise<{ url: string; headers: string[][] }> {
  const headers: string[][] = [];
  const node = await keptIn(
    started,
    serve((req, res) => {
      let body = '';
      req.on('data', (chunk: Buffer) => (body += chunk));
      req.on('end', () => {
        const value = String(req.headers['x-data-parallel-rank'] ?? '');
        headers.push([value]);
        const isProbe = body === '{"prompt":"0","max_tokens":1}';
        res.setHeader('content-type', 'application/json');
        if (isProbe && probe === 'unreachable') {
          res.statusCode = 503;
          res.end('{"error":{"message":"busy","type":"ServiceUnavailableError","param":null,"code":503}}');
        } else if (!isProbe && body.includes('refuse')) {
          res.statusCode = 400;
          res.end(JSON.stringify({ error: { message: `data_parallel_rank ${value} is out of range [0, 1).`, type: 'BadRequestError', param: null, code: 400 } }));
        } else {
          res.end('{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"x","finish_reason":"length"}]}');
        }
      });
    }),
  );
  return { url: node.url, headers };
}

const verdicts = (front: TestGateway, outcome: string) => metricValue(front.registry, 'dp_router_verdicts_total', { upstream: 'node-b', verdict: 'rank_header', outcome });

describe('an answer one client can make the server give (issue 46, reproduction 1)', () => {
  it.each([
    ['a validation error that echoes the sentence for a rank the router sent', 'data_parallel_rank 0 is out of range [0, 1).'],
    ['a validation error that echoes the sentence for a rank never sent', 'data_parallel_rank 999 is out of range [0, 1000).'],
  ])('%s leaves the rank header on for everyone', async (_title, echoed) => {
    const node = await mock({ dataParallelSize: 1 });
    const logger = recordingLogger();
    const front = await gateway({ upstreams: [{ url: node.url, name: 'node-b' }], exposeDecision: true, logger });
    for (let attempt = 0; attempt < 3; attempt++) {
      const forged = await exchange(front.url, { body: JSON.stringify({ model: 'mock-model', prompt: 'hi', max_tokens: echoed }) });
      expect(forged.status).toBe(400);
      expect(forged.body).toContain(echoed);
    }
    const next = await exchange(front.url, { body: COMPLETION });
    expect([next.status, next.headers['x-dp-router-decision']]).toEqual([200, 'upstream=node-b; rank=0; source=assigned']);
    expect(node.stats().requests.at(-1)!.rankHeaders).toEqual(['0']);
    expect(logger.errors()).toEqual([]);
    expect(await rejections(front, 'answer')).toBe(0);
    expect(await verdicts(front, 'taken')).toBe(0);
  });

  it("vLLM's very sentence for the value sent, which the router's own probe contradicts, is refused: one source cannot take it", async () => {
    const node = await crafted('honoured');
    const logger = recordingLogger();
    const front = await gateway({ upstreams: [{ url: node.url, name: 'node-b' }], exposeDecision: true, logger });
    const refused = await exchange(front.url, { body: '{"prompt":"refuse","max_tokens":1}', headers: { authorization: 'Bearer one-key' } });
    expect(refused.status).toBe(400);
    await waitFor(async () => (await verdicts(front, 'refused_single_source')) === 1);
    const next = await exchange(front.url, { body: COMPLETION });
    expect(next.headers['x-dp-router-decision']).toBe('upstream=node-b; rank=0; source=assigned');
    // The client's request, the router's probe (the same value), the next request.
    expect(node.headers).toEqual([['0'], ['0'], ['0']]);
    expect(await verdicts(front, 'taken')).toBe(0);
    expect(logger.lines.filter((line) => line.level === 'warn').map((line) => line.message)).toEqual([expect.stringMatching(/verdict 'rank_header' from 1 source was not taken.*verdicts\.minSources/)]);
    // No secret anywhere in what the router says.
    expect(JSON.stringify(logger.lines)).not.toContain('one-key');
  });

  it('where no probe can decide, agreeing answers to minSources distinct sources take the verdict, and fewer do not', async () => {
    const node = await crafted('unreachable');
    const logger = recordingLogger();
    const front = await gateway({ upstreams: [{ url: node.url, name: 'node-b' }], exposeDecision: true, logger, verdicts: { minSources: 3 } });
    const refuse = (key: string) => exchange(front.url, { body: '{"prompt":"refuse","max_tokens":1}', headers: { 'x-api-key': key } });
    for (const key of ['a', 'b', 'a', 'b', 'a']) {
      await refuse(key);
      await waitFor(() => node.headers.length % 2 === 0);
    }
    await waitFor(async () => (await verdicts(front, 'refused_single_source')) === 5);
    expect((await exchange(front.url, { body: COMPLETION })).headers['x-dp-router-decision']).toBe('upstream=node-b; rank=0; source=assigned');
    await refuse('c');
    await waitFor(() => logger.errors().length === 1);
    expect(await verdicts(front, 'taken')).toBe(1);
    expect((await exchange(front.url, { body: COMPLETION })).headers['x-dp-router-decision']).toBe('upstream=node-b; rank=vllm; source=assigned');
  });
});

describe('a verdict the probes no longer bear out', () => {
  it('lifts once a probe is honoured again (not at reconfiguration only)', async () => {
    let refusing = true;
    const node = await keptIn(
      started,
      serve((req, res) => {
        req.resume();
        req.on('end', () => {
          res.setHeader('content-type', 'application/json');
          if (refusing && req.headers['x-data-parallel-rank'] !== undefined) {
            res.statusCode = 400;
            res.end(OUT_OF_RANGE_FIXTURE.cases[1].json);
          } else res.end('{"id":"cmpl-1","object":"text_completion","choices":[]}');
        });
      }),
    );
    const logger = recordingLogger();
    const table = new EndpointTable(parseUpstreams('upstreams', [{ url: node.url, name: 'node-b', startRank: 1, rankHeader: 'global' }]));
    const guard = new RankHeaderGuard({ table, metrics: { rankHeaderRejected: () => undefined }, logger: { ...logger, perRequest: false } as never, verdicts: quietVerdicts(), header: 'x-data-parallel-rank', liftEveryMs: 0 });
    started.push(guard);
    const endpoint = table.all.find((one) => one.rank === 1)!;
    const req = { headers: {}, socket: { remoteAddress: '127.0.0.1' } } as never;
    guard.refused(endpoint, 1, 1, req, {}, undefined);
    await waitFor(() => table.unhonouredBalanced().length === 1);
    expect(logger.errors()).toHaveLength(1);
    // Still refused: a probe changes nothing.
    guard.answered(table.unhonouredBalanced()[0], {});
    await sleep(50);
    expect(table.unhonouredBalanced()).toHaveLength(1);
    refusing = false;
    await waitFor(() => {
      guard.answered(table.unhonouredBalanced()[0] ?? endpoint, {});
      return table.unhonouredBalanced().length === 0;
    });
    expect(logger.lines.at(-1)!.message).toMatch(/takes the rank header again/);
  });
});
