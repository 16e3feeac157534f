/**
 * The mock's timed engine (`scheduler`) and CPU tier (`cpuBlocksPerRank`), over real HTTP and
 * ZeroMQ. Timing is checked by orderings and generous ratios between requests that run at the
 * same time, never against absolute times, so that a loaded machine cannot fail them.
 */
import { describe, expect, it } from '@jest/globals';
import { request } from 'node:http';
import { startMockVllm, type MockVllm, type MockVllmOptions } from '../../example-server/mock-vllm';
import { decodeKvEventBatch, type KvEvent } from '../../lib/exact-prefix/events/decode';
import { loadZeromq } from '../../lib/exact-prefix/optional-deps';
import { closedAfterEach } from '../helpers';

const started = closedAfterEach();

async function startMock(options: MockVllmOptions): Promise<MockVllm> {
  const mock = await startMockVllm(options);
  started.push(mock);
  return mock;
}

/** What a client saw of one stream: when each token chunk came (ms after `origin`), and the usage. */
interface Seen {
  tokens: number[];
  usage: { prompt_tokens: number; prompt_tokens_details?: { cached_tokens: number } } | undefined;
}

/** Streams a completion from `rank` and records when each token event arrived. */
function stream(mock: MockVllm, rank: number, prompt: string, maxTokens: number, origin: number): Promise<Seen> {
  return new Promise((resolve, reject) => {
    const body = JSON.stringify({ model: 'mock-model', prompt, max_tokens: maxTokens, stream: true, stream_options: { include_usage: true } });
    const { port } = new URL(mock.url);
    const req = request({ host: '127.0.0.1', port, path: '/v1/completions', method: 'POST', headers: { 'content-type': 'application/json', 'x-data-parallel-rank': String(rank) } }, (res) => {
      const seen: Seen = { tokens: [], usage: undefined };
      let buffered = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        buffered += chunk;
        let end = buffered.indexOf('\n\n');
        while (end >= 0) {
          const event = buffered.slice(0, end);
          buffered = buffered.slice(end + 2);
          end = buffered.indexOf('\n\n');
          if (event === 'data: [DONE]') continue;
          const parsed = JSON.parse(event.slice('data: '.length)) as { choices: unknown[]; usage?: Seen['usage'] };
          if (parsed.usage) seen.usage = parsed.usage;
          if (parsed.choices.length > 0) seen.tokens.push(performance.now() - origin);
        }
      });
      res.on('end', () => resolve(seen));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

const words = (tag: string, count: number) => Array.from({ length: count }, (_, i) => `${tag}${i % 97}`).join(' ');
/** A prompt of about `tokens` tokens without `kvEvents` (4 characters a token). */
const promptOf = (tag: string, tokens: number) => `${tag} `.padEnd(tokens * 4, `${tag.slice(0, 1)}x `);

describe('the timed engine (scheduler)', () => {
  it('runs a half-speed rank at about half the pace of a full-speed one, side by side', async () => {
    // Steps long enough that a loaded machine's late timers (tens of ms a step, added to both ranks
    // alike) cannot close the gap: 60 ms against 120 ms, still 1.46× with 70 ms added to every step.
    const mock = await startMock({ dataParallelSize: 2, scheduler: { speeds: [1, 0.5], stepMs: 60, stepMsPerSeq: 0 } });
    const origin = performance.now();
    const [fast, slow] = await Promise.all([stream(mock, 0, 'same prompt', 12, origin), stream(mock, 1, 'same prompt', 12, origin)]);
    expect(fast.tokens).toHaveLength(12);
    expect(slow.tokens).toHaveLength(12);
    // 12 steps of 60 ms against 12 of 120 ms: the slow rank's stream ends last, taking well over 1.3× as long.
    expect(slow.tokens[11]).toBeGreaterThan(fast.tokens[11]);
    expect(slow.tokens[11]).toBeGreaterThan(1.3 * fast.tokens[11]);
  });

  it('sends one chunk per token, step by step: two streams on one rank interleave their tokens', async () => {
    const mock = await startMock({ dataParallelSize: 1, scheduler: { stepMs: 10 } });
    const origin = performance.now();
    const [a, b] = await Promise.all([stream(mock, 0, 'first', 8, origin), stream(mock, 0, 'second', 8, origin)]);
    expect(a.tokens).toHaveLength(8);
    expect(b.tokens).toHaveLength(8);
    // Both run in the same batch: each gets its first token before the other's last.
    expect(a.tokens[0]).toBeLessThan(b.tokens[7]);
    expect(b.tokens[0]).toBeLessThan(a.tokens[7]);
  });

  it('slows every decode as the running batch grows', async () => {
    // The per-sequence cost dominates so that late timers on a loaded machine (CI's Node 26 run
    // saw a lone stream's 20 ms steps take 92 ms) cannot close the gap: 22 ms against 182 ms a
    // step is still 2.7× with 70 ms added to every step.
    const mock = await startMock({ dataParallelSize: 2, scheduler: { stepMs: 2, stepMsPerSeq: 20 } });
    const origin = performance.now();
    // Rank 0 runs one stream, rank 1 nine at once.
    const [alone, ...crowd] = await Promise.all([stream(mock, 0, 'alone', 8, origin), ...Array.from({ length: 9 }, (_, i) => stream(mock, 1, `crowd ${i}`, 8, origin))]);
    const pace = (seen: Seen) => (seen.tokens[7] - seen.tokens[0]) / 7;
    expect(pace(crowd[0])).toBeGreaterThan(2 * pace(alone));
  });

  it("skips the cached prefix's compute: the same long prompt's second first token comes far sooner", async () => {
    const mock = await startMock({ dataParallelSize: 1, scheduler: { stepMs: 5, prefillMsPerToken: 0.2 } });
    const prompt = promptOf('long', 3000);
    let origin = performance.now();
    const cold = await stream(mock, 0, prompt, 2, origin);
    origin = performance.now();
    const warm = await stream(mock, 0, prompt, 2, origin);
    expect(cold.usage?.prompt_tokens_details).toBeUndefined();
    expect(warm.usage?.prompt_tokens_details?.cached_tokens).toBeGreaterThan(2900);
    // 3000 tokens at 0.2 ms (two steps of the 2048-token budget) against one block's worth.
    expect(warm.tokens[0]).toBeLessThan(cold.tokens[0] / 2);
  });

  it('chunks a long prefill by the token budget, decoding the running requests in the same steps', async () => {
    const mock = await startMock({ dataParallelSize: 1, scheduler: { stepMs: 5, maxNumBatchedTokens: 256 } });
    const origin = performance.now();
    const running = stream(mock, 0, 'short', 40, origin);
    await new Promise((resolve) => setTimeout(resolve, 30));
    const sentLong = performance.now() - origin;
    // 2400 tokens at 255 a step (the running request takes one of the 256): ten steps to its first token.
    const long = await stream(mock, 0, promptOf('chunked', 2400), 1, origin);
    const decoding = await running;
    expect(decoding.tokens).toHaveLength(40);
    // The running stream got a token in (nearly) each of those steps.
    expect(decoding.tokens.filter((at) => at > sentLong && at < long.tokens[0]).length).toBeGreaterThanOrEqual(8);
  });

  it('keeps requests past maxNumSeqs waiting, in vllm:num_requests_waiting', async () => {
    const mock = await startMock({ dataParallelSize: 1, maxNumSeqs: 2, scheduler: { stepMs: 20 } });
    const origin = performance.now();
    const streams = [0, 1, 2].map((i) => stream(mock, 0, `seat ${i}`, 20, origin));
    await new Promise((resolve) => setTimeout(resolve, 100));
    const metrics = await (await fetch(`${mock.url}/metrics`)).text();
    expect(metrics).toContain('vllm:num_requests_running{engine="0",model_name="mock-model"} 2');
    expect(metrics).toContain('vllm:num_requests_waiting{engine="0",model_name="mock-model"} 1');
    expect(mock.stats().perRank[0].waiting).toBe(1);
    const seen = await Promise.all(streams);
    // The third starts only when a seat frees: after the first two's last tokens.
    expect(seen[2].tokens[0]).toBeGreaterThan(Math.min(seen[0].tokens[19], seen[1].tokens[19]));
  });

  it('shows what a rank holds (schedulerState): the running with their tokens sampled, the waiting, then nothing', async () => {
    const mock = await startMock({ dataParallelSize: 2, maxNumSeqs: 2, scheduler: { stepMs: 20 } });
    const origin = performance.now();
    const streams = [stream(mock, 1, `state 0`, 20, origin), stream(mock, 1, `state 1`, 12, origin), stream(mock, 1, `state 2`, 7, origin)];
    // Read once both running requests have sampled a token: the third waits for a seat until one ends (12 steps on).
    let state = mock.schedulerState(1)!;
    for (const until = performance.now() + 5000; !(state.running.length === 2 && state.running.every((one) => one.emitted > 0)) && performance.now() < until; state = mock.schedulerState(1)!) {
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    expect(state.running.map((one) => one.outputTokens).sort((a, b) => a - b)).toEqual([12, 20]);
    for (const one of state.running) {
      expect(one.prefillLeft).toBe(0);
      expect(one.emitted).toBeGreaterThan(0);
      expect(one.emitted).toBeLessThan(one.outputTokens);
    }
    expect(state.waiting).toEqual([{ outputTokens: 7 }]);
    expect(mock.schedulerState(0)).toEqual({ running: [], waiting: [] });
    // A rank the mock does not serve, and a mock without the timed engine, have no state.
    expect(mock.schedulerState(5)).toBeUndefined();
    await Promise.all(streams);
    expect(mock.schedulerState(1)).toEqual({ running: [], waiting: [] });
    const untimed = await startMock({ dataParallelSize: 1 });
    expect(untimed.schedulerState(0)).toBeUndefined();
  });

  it('refuses what it cannot honour, naming the option and the fix', async () => {
    await expect(startMockVllm({ dataParallelSize: 3, scheduler: { speeds: [1, 0.5] } })).rejects.toThrow(/scheduler\.speeds must be a number > 0 or one per engine \(3\)/);
    await expect(startMockVllm({ scheduler: {}, decodeMsPerToken: 5 })).rejects.toThrow(/decodeMsPerToken .* drop decodeMsPerToken/);
    await expect(startMockVllm({ scheduler: { stepMs: 0, stepMsPerSeq: 0 } })).rejects.toThrow(/cannot both be 0/);
    await expect(startMockVllm({ scheduler: { budget: 1 } as never })).rejects.toThrow(/scheduler\.budget is not an option/);
    await expect(startMockVllm({ cpuBlocksPerRank: 10 })).rejects.toThrow(/cpuBlocksPerRank needs kvEvents/);
    await expect(startMockVllm({ cpuBlocksPerRank: 10, kvEvents: { offload: true } })).rejects.toThrow(/drop offload/);
  });
});

describe('the CPU tier (cpuBlocksPerRank)', () => {
  /** Every event the mock publishes for rank 0, decoded by the router's decoder. */
  async function subscribe(mock: MockVllm): Promise<{ events: KvEvent[]; invalid: () => number; close: () => void }> {
    const zmq = loadZeromq();
    const sub = new zmq.Subscriber({ linger: 0 });
    sub.connect(mock.kvEvents!.endpoints[0]);
    sub.subscribe();
    const events: KvEvent[] = [];
    let invalid = 0;
    void (async () => {
      try {
        for await (const [, , payload] of sub) {
          const decoded = decodeKvEventBatch(payload);
          if (!decoded.ok) invalid++;
          else {
            invalid += decoded.batch.invalidEvents;
            events.push(...decoded.batch.events);
          }
        }
      } catch {
        // Closed.
      }
    })();
    // A SUB joins asynchronously: probe until an event arrives.
    for (let i = 0; events.length === 0; i++) {
      if (i > 200) throw new Error('no KV events arrived');
      await fetch(`${mock.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt: words(`probe${i}`, 40), max_tokens: 1 }) }).then((res) => res.arrayBuffer());
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    return { events, invalid: () => invalid, close: () => sub.close() };
  }

  const complete = async (mock: MockVllm, prompt: string) => {
    const res = await fetch(`${mock.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-data-parallel-rank': '0' }, body: JSON.stringify({ prompt, max_tokens: 1 }) });
    return ((await res.json()) as { usage: Seen['usage'] }).usage!;
  };

  it.each([
    ['current', 'vLLM 52a31cc: one event per batch, the 32-byte hashes'],
    ['array-batch', 'newer vLLM: map events, one per block, the int hashes'],
  ] as const)("loads a prompt evicted from the GPU back from the CPU tier, publishing the tier's stores and evictions (%s layout: %s)", async (layout, _form) => {
    const mock = await startMock({ dataParallelSize: 1, cacheBlocksPerRank: 40, cpuBlocksPerRank: 200, kvEvents: { layout } });
    const feed = await subscribe(mock);
    try {
      const first = words('alpha', 60);
      const firstUsage = await complete(mock, first);
      // About 22 blocks each: the others push the first out of the 40-block GPU cache, not out of the CPU tier.
      for (let i = 0; i < 4; i++) await complete(mock, words(`other${i}`, 60));
      const again = await complete(mock, first);
      const stats = mock.stats().perRank[0];
      expect(again.prompt_tokens_details?.cached_tokens).toBeGreaterThanOrEqual(firstUsage.prompt_tokens - 16);
      expect(stats.cpuCachedTokens).toBeGreaterThanOrEqual(firstUsage.prompt_tokens - 16);
      await new Promise((resolve) => setTimeout(resolve, 100));
      const cpuStored = feed.events.filter((event) => event.type === 'stored' && event.medium === 'CPU');
      const gpuStored = new Set(feed.events.flatMap((event) => (event.type === 'stored' && event.medium === 'GPU' ? event.blockHashes : [])));
      expect(cpuStored.length).toBeGreaterThan(0);
      for (const event of cpuStored) {
        if (event.type !== 'stored') continue;
        expect({ parent: event.parentBlockHash, tokens: event.tokenIds, blockSize: event.blockSize }).toEqual({ parent: null, tokens: [], blockSize: 0 });
        if (layout === 'array-batch') {
          expect(event.blockHashes).toHaveLength(1);
          expect(gpuStored.has(event.blockHashes[0])).toBe(true);
        } else {
          // 32 bytes (the router reads bytes as a latin1 string) whose low 64 bits are a GPU block's int.
          for (const hash of event.blockHashes) {
            expect(typeof hash === 'string' && hash.length === 32).toBe(true);
            const low = Buffer.from(hash as string, 'latin1').readBigUInt64BE(24);
            expect(gpuStored.has(Number(low))).toBe(true);
          }
        }
      }
      expect(feed.invalid()).toBe(0);
    } finally {
      feed.close();
    }
  });

  it('publishes the LRU eviction of a full CPU tier as a BlockRemoved of medium CPU', async () => {
    const mock = await startMock({ dataParallelSize: 1, cacheBlocksPerRank: 40, cpuBlocksPerRank: 60, kvEvents: {} });
    const feed = await subscribe(mock);
    try {
      for (let i = 0; i < 4; i++) await complete(mock, words(`fill${i}`, 60));
      await new Promise((resolve) => setTimeout(resolve, 100));
      expect(feed.events.some((event) => event.type === 'removed' && event.medium === 'CPU')).toBe(true);
      expect(feed.invalid()).toBe(0);
    } finally {
      feed.close();
    }
  });

  it('loads from the CPU tier faster than it recomputes', async () => {
    const mock = await startMock({ dataParallelSize: 1, cacheBlocksPerRank: 100, cpuBlocksPerRank: 2000, kvEvents: {}, scheduler: { stepMs: 5, prefillMsPerToken: 0.2 } });
    const prompt = words('reload', 150);
    let origin = performance.now();
    const cold = await stream(mock, 0, prompt, 2, origin);
    for (let i = 0; i < 4; i++) await stream(mock, 0, words(`evict${i}`, 150), 1, performance.now());
    origin = performance.now();
    const loaded = await stream(mock, 0, prompt, 2, origin);
    expect(mock.stats().perRank[0].cpuCachedTokens).toBeGreaterThan(0);
    // Loading costs a sixth of computing: the reloaded prompt's first token comes well before half the cold one's time.
    expect(loaded.tokens[0]).toBeLessThan(cold.tokens[0] / 2);
  });
});
