import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import { parsePythonInt, startMockVllm, type MockVllm, type MockVllmOptions } from '../../example-server/mock-vllm';
import { RequestLog } from '../../example-server/mock-vllm/request-log';
import { SELF_BALANCED_PATHS } from '../../example-server/mock-vllm/self-balanced';
import OUT_OF_RANGE_FIXTURE from './fixtures/vllm-rank-out-of-range.json';
import { rawRefusal, sleep, waitFor } from '../helpers';

const PROMTOOL = '/usr/bin/promtool';
/** vLLM's own bytes for an out-of-range rank (see the fixture's `_source`). */
const OUT_OF_RANGE = OUT_OF_RANGE_FIXTURE.cases;

/** Every mock a test starts, closed in afterAll even when the test fails. */
const started: MockVllm[] = [];
async function mock(options?: MockVllmOptions): Promise<MockVllm> {
  const server = await startMockVllm(options);
  started.push(server);
  return server;
}
afterAll(async () => {
  await Promise.all(started.map((server) => server.close()));
});

function post(server: MockVllm, path: string, body: unknown, headers: Record<string, string> = {}, signal?: AbortSignal) {
  return fetch(server.url + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
    signal,
  });
}

const chat = (content: unknown, extra: object = {}) => ({ model: 'mock-model', messages: [{ role: 'user', content }], ...extra });

/** The `data:` payloads of an SSE body, JSON-decoded except `[DONE]`; fails on any other framing. */
function sseEvents(text: string): unknown[] {
  expect(text.endsWith('\n\n')).toBe(true);
  return text
    .slice(0, -2)
    .split('\n\n')
    .map((event) => {
      expect(event.startsWith('data: ')).toBe(true);
      const data = event.slice('data: '.length);
      return data === '[DONE]' ? data : JSON.parse(data);
    });
}

/** Sends bytes as they are (duplicate or odd header lines) and returns the raw answer. */
function rawExchange(server: MockVllm, request: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(server.port, '127.0.0.1', () => socket.end(request));
    let answer = '';
    socket.setEncoding('latin1');
    socket.on('data', (chunk) => (answer += chunk));
    socket.on('end', () => resolve(answer));
    socket.on('error', reject);
  });
}

function rawPost(path: string, body: string, headerLines: string[]): string {
  return [
    `POST ${path} HTTP/1.1`,
    'Host: 127.0.0.1',
    'Content-Type: application/json',
    `Content-Length: ${Buffer.byteLength(body)}`,
    'Connection: close',
    ...headerLines,
    '',
    body,
  ].join('\r\n');
}

const totalRunning = (server: MockVllm) =>
  Object.values(server.stats().perRank).reduce((sum, rank) => sum + rank.running, 0);

describe('mock vLLM: answers', () => {
  let server: MockVllm;
  beforeAll(async () => {
    server = await mock();
  });

  it('answers chat completions as JSON, naming the rank', async () => {
    const res = await post(server, '/v1/chat/completions', chat([{ type: 'text', text: 'hello' }], { max_tokens: 3 }), {
      'X-data-parallel-rank': '2',
    });
    expect(res.status).toBe(200);
    expect(res.headers.get('x-mock-rank')).toBe('2');
    expect(res.headers.get('content-type')).toBe('application/json');
    const body = (await res.json()) as any;
    expect(body).toMatchObject({ object: 'chat.completion', model: 'mock-model' });
    expect(body.id).toMatch(/^chatcmpl-/);
    expect(typeof body.created).toBe('number');
    expect(body.choices[0].message.role).toBe('assistant');
    expect(body.choices[0].message.content).toBe('rank 2: lorem ipsum');
    expect(body.choices[0].finish_reason).toBe('length');
    expect(body.usage).toMatchObject({ completion_tokens: 3 });
    expect(body.usage.total_tokens).toBe(body.usage.prompt_tokens + 3);
  });

  it('answers text completions as JSON, one choice per prompt', async () => {
    const res = await post(server, '/v1/completions', { prompt: ['one', 'two'], max_tokens: 2 }, { 'x-data-parallel-rank': '1' });
    const body = (await res.json()) as any;
    expect(body).toMatchObject({ object: 'text_completion' });
    expect(body.id).toMatch(/^cmpl-/);
    expect(body.choices.map((choice: any) => [choice.index, choice.text])).toEqual([
      [0, 'rank 1: lorem'],
      [1, 'rank 1: lorem'],
    ]);
    expect(body.usage).toMatchObject({ prompt_tokens: 2, completion_tokens: 4 });
  });

  it('uses max_completion_tokens for chat and defaults to 16 tokens', async () => {
    const limited = (await (await post(server, '/v1/chat/completions', chat('x', { max_completion_tokens: 1 }))).json()) as any;
    expect(limited.choices[0].message.content).toMatch(/^rank \d:$/);
    const defaulted = (await (await post(server, '/v1/completions', { prompt: 'x' })).json()) as any;
    expect(defaulted.usage.completion_tokens).toBe(16);
  });

  it('streams chat completions in vLLM chunk format, with usage on request', async () => {
    const res = await post(
      server,
      '/v1/chat/completions',
      chat('hi', { max_tokens: 3, stream: true, stream_options: { include_usage: true } }),
      { 'x-data-parallel-rank': '3' },
    );
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
    expect(res.headers.get('x-mock-rank')).toBe('3');
    const events = sseEvents(await res.text()) as any[];
    expect(events.at(-1)).toBe('[DONE]');
    const chunks = events.slice(0, -1);
    expect(chunks.every((chunk) => chunk.object === 'chat.completion.chunk' && chunk.id === chunks[0].id)).toBe(true);
    expect(chunks[0].choices[0].delta).toEqual({ role: 'assistant', content: '' });
    const tokens = chunks.slice(1, 4);
    expect(tokens.map((chunk) => chunk.choices[0].delta.content).join('')).toBe('rank 3: lorem ipsum');
    expect(tokens.map((chunk) => chunk.choices[0].finish_reason)).toEqual([null, null, 'length']);
    expect(chunks[4].choices).toEqual([]);
    expect(chunks[4].usage).toMatchObject({ completion_tokens: 3 });
    expect(chunks).toHaveLength(5);
  });

  it('streams text completions and ends with [DONE]', async () => {
    const res = await post(server, '/v1/completions', { prompt: 'hi', max_tokens: 2, stream: true }, { 'x-data-parallel-rank': '0' });
    const events = sseEvents(await res.text()) as any[];
    expect(events).toHaveLength(3);
    expect(events[0]).toMatchObject({ object: 'text_completion', choices: [{ index: 0, text: 'rank 0:', finish_reason: null }] });
    expect(events[1].choices[0]).toMatchObject({ text: ' lorem', finish_reason: 'length' });
    expect(events[2]).toBe('[DONE]');
  });

  it('serves /health, /v1/models and vLLM-shaped errors', async () => {
    const health = await fetch(server.url + '/health');
    expect(health.status).toBe(200);
    expect(await health.text()).toBe('');

    const models = (await (await fetch(server.url + '/v1/models')).json()) as any;
    expect(models).toMatchObject({ object: 'list', data: [{ id: 'mock-model', object: 'model', owned_by: 'vllm' }] });

    const badJson = await post(server, '/v1/chat/completions', '{"messages": [');
    expect(badJson.status).toBe(400);
    expect(((await badJson.json()) as any).error).toMatchObject({ type: 'BadRequestError', param: null, code: 400 });

    const badTokens = await post(server, '/v1/completions', { prompt: 'x', max_tokens: 0 });
    expect(badTokens.status).toBe(400);
    expect(((await badTokens.json()) as any).error.param).toBe('max_tokens');

    const unknown = await fetch(server.url + '/v1/nothing');
    expect(unknown.status).toBe(404);
    expect(((await unknown.json()) as any).error).toMatchObject({ type: 'NotFoundError', code: 404, param: null });

    expect((await fetch(server.url + '/v1/completions')).status).toBe(405);
  });

  it.each([
    ['/v1/chat/completions', { model: 'llama-3', messages: [{ role: 'user', content: 'hi' }], stream: true }],
    ['/v1/completions', { model: 'gpt-4o', prompt: 'hi' }],
    ['/tokenize', { model: 'gpt-4o', prompt: 'hi' }],
  ])('answers %s for a model it does not serve with 404 NotFoundError, as vLLM does', async (path, body) => {
    const res = await post(server, path, body);
    expect(res.status).toBe(404);
    expect(await res.json()).toEqual({ error: { message: `The model \`${body.model}\` does not exist.`, type: 'NotFoundError', param: 'model', code: 404 } });
    // Absent or null, the model is the served one.
    const { model: _asked, ...rest } = body;
    expect((await post(server, path, { ...rest, model: null, stream: false })).status).toBe(200);
    expect((await post(server, path, { ...rest, stream: false })).status).toBe(200);
  });

  it('survives hostile input: huge headers and a body cut short', async () => {
    // 100 kB: more than Node's 16 KiB header limit and more than its first 64 KiB read, so
    // unread bytes remain when the server closes (see rawRefusal).
    const huge = await rawRefusal(server.url, `GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(100_000)}\r\n\r\n`);
    expect(huge.answer).toBe('HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n\r\n');
    await new Promise<void>((resolve) => {
      const socket = net.connect(server.port, '127.0.0.1', () => {
        socket.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"prompt":');
        setTimeout(() => socket.destroy(), 20);
      });
      socket.on('close', () => resolve());
    });
    expect((await fetch(server.url + '/health')).status).toBe(200);
  });
});

describe('mock vLLM: the rank header', () => {
  it('parses values with Python int() semantics', () => {
    expect(parsePythonInt('3')).toBe(3n);
    expect(parsePythonInt(' 3')).toBe(3n);
    expect(parsePythonInt('\t7\n')).toBe(7n);
    expect(parsePythonInt('\u00a03\x1c')).toBe(3n);
    expect(parsePythonInt('+3')).toBe(3n);
    expect(parsePythonInt('-1')).toBe(-1n);
    expect(parsePythonInt('1_0')).toBe(10n);
    expect(parsePythonInt('007')).toBe(7n);
    expect(parsePythonInt('\u0663')).toBe(3n); // ARABIC-INDIC DIGIT THREE
    expect(parsePythonInt('\u{1D7D3}')).toBe(5n); // MATHEMATICAL BOLD DIGIT FIVE
    expect(parsePythonInt('9'.repeat(4300))).toBe(BigInt('9'.repeat(4300)));
    for (const rejected of ['', ' ', 'abc', '3.0', '0x3', '1__0', '_1', '1_', '- 1', '+-1', '\ufeff3', '\u00b2', '9'.repeat(4301)]) {
      expect(parsePythonInt(rejected)).toBeNull();
    }
  });

  describe('on a 4-rank server', () => {
    let server: MockVllm;
    beforeAll(async () => {
      server = await mock();
    });
    const rankOf = async (header: string) => {
      const res = await post(server, '/v1/completions', { prompt: 'x', max_tokens: 1 }, { 'x-data-parallel-rank': header });
      return [res.status, res.headers.get('x-mock-rank')];
    };

    it('accepts what int() accepts', async () => {
      expect(await rankOf('+3')).toEqual([200, '3']);
      expect(await rankOf('0_1')).toEqual([200, '1']);
      const spaced = await rawExchange(server, rawPost('/v1/completions', '{"prompt":"x"}', ['X-data-parallel-rank:  3 ']));
      expect(spaced).toMatch(/^HTTP\/1\.1 200[^]*\r\nx-mock-rank: 3\r\n/i);
    });

    it('ignores what int() rejects and picks a rank itself', async () => {
      expect(await rankOf('abc')).toEqual([200, '0']);
      expect(await rankOf('2.0')).toEqual([200, '0']);
    });

    it('answers 400 to an out-of-range rank ("1_0" is 10)', async () => {
      for (const header of ['1_0', '-1', '4']) {
        const res = await post(server, '/v1/completions', { prompt: 'x' }, { 'x-data-parallel-rank': header });
        expect(res.status).toBe(400);
        expect(await res.json()).toEqual({
          error: {
            message: `data_parallel_rank ${Number(parsePythonInt(header))} is out of range [0, 4).`,
            type: 'BadRequestError',
            param: null,
            code: 400,
          },
        });
      }
    });

    it('answers a streaming out-of-range request with HTTP 200 and an SSE error event', async () => {
      const res = await post(server, '/v1/chat/completions', chat('x', { stream: true }), { 'x-data-parallel-rank': '1_0' });
      expect(res.status).toBe(200);
      expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/);
      const events = sseEvents(await res.text());
      expect(events).toEqual([
        {
          error: { message: 'data_parallel_rank 10 is out of range [0, 4).', type: 'BadRequestError', param: null, code: 400 },
        },
        '[DONE]',
      ]);
    });

    it('records every raw copy of the header, and serves the first like Starlette', async () => {
      server.resetStats();
      const answer = await rawExchange(
        server,
        rawPost('/v1/completions', '{"prompt":"x","max_tokens":1}', ['X-Data-Parallel-Rank: 1', 'x-data-parallel-RANK: 2']),
      );
      expect(answer).toMatch(/\r\nx-mock-rank: 1\r\n/i);
      expect(server.stats().requests).toEqual([
        { method: 'POST', path: '/v1/completions', rankHeaders: ['1', '2'], rank: 1 },
      ]);
    });
  });

  // vLLM 52a31cc reads the header as an index from 0 into the engines a server manages, in every
  // mode (vllm/v1/engine/input_processor.py:252-259, core_client.py:596-606): a node serving
  // global ranks 4-7 takes 0-3, and its /metrics still label the engines 4-7.
  it('reads the header as an index from 0 into its engines on a node past start rank 0 (hybrid LB)', async () => {
    const server = await mock({ startRank: 4, dataParallelSize: 4 });
    const served = await post(server, '/v1/completions', { prompt: 'x', max_tokens: 1 }, { 'x-data-parallel-rank': '1' });
    expect(served.headers.get('x-mock-rank')).toBe('5');
    expect(((await served.json()) as any).choices[0].text).toBe('rank 5:');
    const rejected = await post(server, '/v1/completions', { prompt: 'x' }, { 'x-data-parallel-rank': '6' });
    expect(rejected.status).toBe(400);
    expect(await rejected.text()).toBe(OUT_OF_RANGE.find((known) => known.rank === 6 && known.numRanks === 4)!.json);
    expect(Object.keys(server.stats().perRank)).toEqual(['4', '5', '6', '7']);
    expect(server.stats().perRank[5].requests).toBe(1);
    expect(await (await fetch(`${server.url}/metrics`)).text()).toContain('vllm:num_requests_running{engine="7",model_name="mock-model"}');
  });

  it('takes only 0 as a single-rank (external LB) server, with vLLM\'s bytes on a stream', async () => {
    const server = await mock({ startRank: 3, dataParallelSize: 1 });
    expect((await post(server, '/v1/completions', { prompt: 'x', max_tokens: 1 }, { 'x-data-parallel-rank': '0' })).headers.get('x-mock-rank')).toBe('3');
    const streamed = await post(server, '/v1/chat/completions', chat('x', { stream: true }), { 'x-data-parallel-rank': '1' });
    expect(streamed.status).toBe(200);
    expect(streamed.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
    expect(await streamed.text()).toBe(OUT_OF_RANGE.find((known) => known.rank === 1 && known.numRanks === 1)!.sse);
  });

  it('refuses the headerMode option it used to have', async () => {
    await expect(startMockVllm({ headerMode: 'global' } as MockVllmOptions)).rejects.toThrow(/headerMode is gone/);
  });

  it.each([...SELF_BALANCED_PATHS.keys()])('ignores the header on %s, which vLLM balances itself', async (path) => {
    const server = await mock({ decodeMsPerToken: 20 });
    const abort = new AbortController();
    // Engines 0 and 1 busy: vLLM's own pick is engine 2, whatever the header names.
    const held = [
      await post(server, '/v1/chat/completions', chat('x', { stream: true, max_tokens: 100 }), { 'x-data-parallel-rank': '0' }, abort.signal),
      await post(server, '/v1/chat/completions', chat('x', { stream: true, max_tokens: 100 }), { 'x-data-parallel-rank': '1' }, abort.signal),
    ];
    const body = { model: 'mock-model', input: 'x', text_1: 'q', text_2: 'd', query: 'q', documents: ['d'] };
    for (const header of ['0', '9']) {
      const res = await post(server, path, body, { 'x-data-parallel-rank': header });
      expect([res.status, res.headers.get('x-mock-rank')]).toEqual([200, '2']);
      await res.text();
    }
    abort.abort();
    await Promise.allSettled(held.map((res) => res.text()));
  });
});

describe('mock vLLM: load and cache', () => {
  it('picks the least-running rank without a header, ties to the lowest', async () => {
    const server = await mock({ decodeMsPerToken: 20 });
    const abort = new AbortController();
    const hold = (headers: Record<string, string>) =>
      post(server, '/v1/chat/completions', chat('x', { stream: true, max_tokens: 100 }), headers, abort.signal);
    const held = [await hold({ 'x-data-parallel-rank': '0' }), await hold({ 'x-data-parallel-rank': '2' })];
    const firstPick = await hold({});
    const secondPick = await hold({});
    expect(firstPick.headers.get('x-mock-rank')).toBe('1');
    expect(secondPick.headers.get('x-mock-rank')).toBe('3');
    expect(totalRunning(server)).toBe(4);
    const quick = await post(server, '/v1/completions', { prompt: 'x', max_tokens: 1 });
    expect(quick.headers.get('x-mock-rank')).toBe('0');
    await quick.text();
    abort.abort();
    await Promise.allSettled([...held, firstPick, secondPick].map((res) => res.text()));
    await waitFor(() => totalRunning(server) === 0);
  });

  it('counts cached prefix tokens per rank', async () => {
    const server = await mock();
    const prompt = 'The quick brown fox jumps over the lazy dog. '.repeat(20).slice(0, 645); // 10 full blocks + 5 chars
    const cachedOf = async (rank: string) => {
      const res = await post(server, '/v1/completions', { prompt, max_tokens: 1 }, { 'x-data-parallel-rank': rank });
      // vLLM leaves prompt_tokens_details out when nothing was cached (chat_completion/serving.py:1384 at 52a31cc).
      return ((await res.json()) as any).usage.prompt_tokens_details?.cached_tokens ?? 0;
    };
    expect(await cachedOf('0')).toBe(0);
    expect(await cachedOf('0')).toBe(160);
    expect(await cachedOf('1')).toBe(0);
    expect(server.stats().perRank[0]).toEqual({ requests: 2, running: 0, promptTokens: 2 * 162, cachedTokens: 160 });
    expect(server.stats().perRank[1]).toMatchObject({ promptTokens: 162, cachedTokens: 0 });
  });

  it('has no tokenizer and no KV events without the kvEvents option', async () => {
    const server = await mock();
    expect(server.kvEvents).toBeUndefined();
    const res = await post(server, '/v1/chat/completions', chat('x'.repeat(37)));
    // 4 characters a token, of the stand-in rendering `<|user|>\n…\n` (47 characters).
    expect(((await res.json()) as any).usage.prompt_tokens).toBe(12);
  });

  it('never serves the last prompt token from cache, like vLLM', async () => {
    const server = await mock();
    const prompt = 'x'.repeat(640); // exactly 10 blocks
    const cached = [];
    for (let i = 0; i < 2; i++) {
      const res = await post(server, '/v1/completions', { prompt, max_tokens: 1 }, { 'x-data-parallel-rank': '0' });
      cached.push(((await res.json()) as any).usage.prompt_tokens_details?.cached_tokens ?? 0);
    }
    expect(cached).toEqual([0, 144]);
  });

  it('evicts least recently used blocks beyond the capacity', async () => {
    const server = await mock({ cacheBlocksPerRank: 4 });
    const long = 'a'.repeat(64 * 6 + 1);
    for (let i = 0; i < 2; i++) await (await post(server, '/v1/completions', { prompt: long }, { 'x-data-parallel-rank': '0' })).text();
    expect(server.stats().perRank[0].cachedTokens).toBe(0); // its leading blocks were evicted by its own tail
  });

  it('delays the answer by prefillMsPerToken per uncached token', async () => {
    const server = await mock({ prefillMsPerToken: 2 });
    const prompt = 'p'.repeat(401); // 101 tokens, 96 of them cacheable
    const timeOne = async () => {
      const start = performance.now();
      await (await post(server, '/v1/completions', { prompt, max_tokens: 1 }, { 'x-data-parallel-rank': '0' })).text();
      return performance.now() - start;
    };
    expect(await timeOne()).toBeGreaterThanOrEqual(195);
    expect(await timeOne()).toBeLessThan(100);
  });
});

describe('mock vLLM: what route receipts read', () => {
  const prompt = 'The quick brown fox jumps over the lazy dog. '.repeat(20).slice(0, 645); // 10 full blocks + 5 chars
  const usageOf = async (server: MockVllm, rank: string) => ((await (await post(server, '/v1/completions', { prompt, max_tokens: 1 }, { 'x-data-parallel-rank': rank })).json()) as any).usage;

  it('reports prompt_tokens_details only when tokens were cached, as vLLM with --enable-prompt-tokens-details', async () => {
    const server = await mock();
    // vllm/entrypoints/openai/completion/serving.py:584-590 at 52a31cc: set only `if … num_cached_tokens`.
    expect(await usageOf(server, '0')).toEqual({ prompt_tokens: 162, total_tokens: 163, completion_tokens: 1 });
    expect((await usageOf(server, '0')).prompt_tokens_details).toEqual({ cached_tokens: 160 });
  });

  it('reports no prompt_tokens_details with promptTokensDetails: false (vLLM without the flag)', async () => {
    const server = await mock({ promptTokensDetails: false });
    await usageOf(server, '0');
    expect(await usageOf(server, '0')).toEqual({ prompt_tokens: 162, total_tokens: 163, completion_tokens: 1 });
    expect(server.stats().perRank[0].cachedTokens).toBe(160);
  });

  it('places requests as without a header on the paths and ranks ignoreRankHeader names', async () => {
    const server = await mock();
    const rankOf = async (path: string, rank: string) => (await post(server, path, path === '/v1/completions' ? { prompt: 'x', max_tokens: 1 } : chat('x', { max_tokens: 1 }), { 'x-data-parallel-rank': rank })).headers.get('x-mock-rank');
    server.ignoreRankHeader = { paths: ['/v1/chat/completions'], ranks: [3] };
    expect(await rankOf('/v1/chat/completions', '2')).toBe('0');
    expect(await rankOf('/v1/completions', '2')).toBe('2');
    expect(await rankOf('/v1/completions', '3')).toBe('0');
    expect(server.stats().requests.map((record) => record.rankHeaders)).toEqual([['2'], ['2'], ['3']]);
    server.ignoreRankHeader = undefined;
    expect(await rankOf('/v1/chat/completions', '2')).toBe('2');
  });
});

describe('mock vLLM: /metrics', () => {
  let server: MockVllm;
  let text: string;
  beforeAll(async () => {
    server = await mock({ cacheBlocksPerRank: 4, dataParallelSize: 2, model: 'org/model "q"' });
    const prompt = 'b'.repeat(64 * 3 + 1);
    for (let i = 0; i < 2; i++) await (await post(server, '/v1/completions', { prompt }, { 'x-data-parallel-rank': '1' })).text();
    const res = await fetch(server.url + '/metrics');
    expect(res.headers.get('content-type')).toBe('text/plain; version=0.0.4; charset=utf-8');
    text = await res.text();
  });

  it('exports vLLM engine metrics labelled by engine and model', () => {
    const labels = (engine: number) => `{engine="${engine}",model_name="org/model \\"q\\""}`;
    expect(text).toContain(`# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running${labels(0)} 0\n`);
    expect(text).toContain(`vllm:num_requests_waiting${labels(1)} 0\n`);
    expect(text).toContain(`vllm:kv_cache_usage_perc${labels(1)} 0.75\n`);
    expect(text).toContain(`vllm:kv_cache_usage_perc${labels(0)} 0\n`);
    expect(text).toContain(`# TYPE vllm:prefix_cache_queries_total counter\n`);
    expect(text).toContain(`vllm:prefix_cache_queries_total${labels(1)} ${2 * 49}\n`);
    expect(text).toContain(`vllm:prefix_cache_hits_total${labels(1)} 48\n`);
    expect(text).toMatch(/# HELP vllm:prefix_cache_hits_total \S/);
  });

  it('passes promtool check metrics (vLLM\'s colon names are the only lint)', () => {
    if (!existsSync(PROMTOOL)) {
      console.warn(`${PROMTOOL} not found: skipping the promtool check`);
      return;
    }
    const result = spawnSync(PROMTOOL, ['check', 'metrics'], { input: text, encoding: 'utf8' });
    const problems = (result.stdout + result.stderr).split('\n').filter(Boolean);
    // promtool lints ':' in names (reserved for recording rules) with exit code 3, but these names are vLLM's own.
    expect(problems.filter((line) => !line.endsWith("metric names should not contain ':'"))).toEqual([]);
    expect([0, 3]).toContain(result.status);
  });
});

describe('mock vLLM: faults and disconnects', () => {
  let server: MockVllm;
  beforeAll(async () => {
    server = await mock({ decodeMsPerToken: 5 });
  });

  it('answers every request with an injected status', async () => {
    server.fault = { kind: 'status', status: 503 };
    try {
      const health = await fetch(server.url + '/health');
      expect(health.status).toBe(503);
      expect(((await health.json()) as any).error).toMatchObject({ type: 'ServiceUnavailableError', code: 503 });
      expect((await post(server, '/v1/completions', { prompt: 'x' })).status).toBe(503);
    } finally {
      server.fault = undefined;
    }
    expect((await fetch(server.url + '/health')).status).toBe(200);
  });

  it('resets the connection without answering', async () => {
    server.fault = { kind: 'reset' };
    try {
      await expect(fetch(server.url + '/health')).rejects.toThrow();
    } finally {
      server.fault = undefined;
    }
  });

  it('stalls requests until close() and close() still returns promptly', async () => {
    const stalling = await mock();
    stalling.fault = { kind: 'stall' };
    await expect(fetch(stalling.url + '/health', { signal: AbortSignal.timeout(100) })).rejects.toThrow();
    const pending = fetch(stalling.url + '/v1/completions', { method: 'POST', body: '{"prompt":"x"}' });
    await waitFor(() => stalling.stats().requests.length === 2);
    const start = performance.now();
    await stalling.close();
    expect(performance.now() - start).toBeLessThan(500);
    await expect(pending).rejects.toThrow();
  });

  it('dies mid-stream after the given number of SSE events', async () => {
    server.fault = { kind: 'die-mid-stream', afterChunks: 2 };
    let received = '';
    try {
      const res = await post(server, '/v1/chat/completions', chat('x', { stream: true, max_tokens: 10 }));
      expect(res.status).toBe(200);
      const reader = res.body!.getReader();
      const decoder = new TextDecoder();
      await expect(
        (async () => {
          for (;;) {
            const { done, value } = await reader.read();
            if (done) return;
            received += decoder.decode(value, { stream: true });
          }
        })(),
      ).rejects.toThrow();
    } finally {
      server.fault = undefined;
    }
    expect(received.match(/^data: /gm)).toHaveLength(2);
    await waitFor(() => totalRunning(server) === 0);
  });

  it('returns running to 0 after streaming clients abort', async () => {
    server.resetStats();
    const clients = await Promise.all(
      [0, 1, 1, 3].map(async (rank) => {
        const abort = new AbortController();
        const res = await post(server, '/v1/completions', { prompt: 'x', stream: true, max_tokens: 1000 }, { 'x-data-parallel-rank': String(rank) }, abort.signal);
        await res.body!.getReader().read(); // the stream is flowing
        return abort;
      }),
    );
    expect(totalRunning(server)).toBe(4);
    expect(server.stats().perRank[1].running).toBe(2);
    for (const client of clients) client.abort();
    await waitFor(() => totalRunning(server) === 0);
    await sleep(30); // no late double release
    expect(Object.values(server.stats().perRank).map((rank) => rank.running)).toEqual([0, 0, 0, 0]);
  });

  it('close() destroys idle keep-alive sockets', async () => {
    const closing = await mock();
    const agent = new http.Agent({ keepAlive: true });
    await new Promise<void>((resolve, reject) => {
      http.get(closing.url + '/health', { agent }, (res) => res.resume().on('end', resolve)).on('error', reject);
    });
    const start = performance.now();
    await closing.close();
    expect(performance.now() - start).toBeLessThan(500);
    agent.destroy();
  });
});

describe('mock vLLM: request log', () => {
  it('keeps only the most recent records, oldest first', () => {
    const log = new RequestLog(3);
    for (const path of ['/a', '/b', '/c', '/d', '/e']) log.add('GET', path, []);
    expect(log.snapshot().map((record) => record.path)).toEqual(['/c', '/d', '/e']);
  });
});
