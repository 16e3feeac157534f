import { describe, expect, it } from '@jest/globals';
import { MOCK_TOKENIZER_DIR, startMockVllm, type MockVllm, type MockVllmOptions } from '../../example-server/mock-vllm';
import type { KvLayout } from '../../example-server/mock-vllm/kv-events';
import type { KvEvent, KvBlockStored } from '../../lib/exact-prefix/events/decode';
import { KvExactIndex, type KvEventSink } from '../../lib/exact-prefix/index/exact-index';
import { createKvEventSubscriber, type KvEventSubscriber } from '../../lib/exact-prefix/events/subscriber';
import { PromptTokenizer } from '../../lib/exact-prefix/tokenizer/tokenizer';
import { closedAfterEach } from '../helpers';
import { Recorder, freePortRun, untilJoined } from '../exact-prefix/helpers';
import { payloadOf, vllmRecording } from '../exact-prefix/vllm-recordings';
import { loadZeromq } from '../../lib/exact-prefix/optional-deps';
import { Unpackr } from 'msgpackr';

const BLOCK = 16;
const started = closedAfterEach();

/** The router's side: its own tokenizer, loaded from the directory the mock reports. */
let routerTokenizer: PromptTokenizer | undefined;
function router(mock: MockVllm): PromptTokenizer {
  routerTokenizer ??= PromptTokenizer.load((mock.kvEvents as { tokenizer: string }).tokenizer);
  return routerTokenizer;
}

async function startMock(options: MockVllmOptions = {}): Promise<MockVllm> {
  const mock = await startMockVllm({ dataParallelSize: 2, kvEvents: {}, ...options });
  started.push(mock);
  return mock;
}

/** Feeds every event into the index and keeps them, per rank, in arrival order. */
class RecordingSink implements KvEventSink {
  readonly events: Array<[number, KvEvent]> = [];
  readonly cleared: number[] = [];
  constructor(readonly index: KvExactIndex) {}
  applyEvent(rank: number, event: KvEvent): boolean {
    this.events.push([rank, event]);
    return this.index.applyEvent(rank, event);
  }
  clearRank(rank: number): void {
    this.cleared.push(rank);
    this.index.clearRank(rank);
  }
  stored(rank: number, from = 0): KvBlockStored[] {
    return this.events.slice(from).flatMap(([r, event]) => (r === rank && event.type === 'stored' ? [event] : []));
  }
}

interface Feed {
  index: KvExactIndex;
  sink: RecordingSink;
  recorder: Recorder;
  sub: KvEventSubscriber;
}

let probes = 0;

/** A subscriber and index fed from the mock's per-rank endpoints, joined on every rank. */
async function feed(mock: MockVllm, endpoint?: string): Promise<Feed> {
  const kv = mock.kvEvents!;
  const index = new KvExactIndex({ ranks: kv.ranks });
  const sink = new RecordingSink(index);
  const recorder = new Recorder();
  const sub = createKvEventSubscriber({
    upstream: 'mock',
    ranks: kv.ranks,
    endpoint: endpoint ?? kv.endpoints,
    replayEndpoint: kv.replayEndpoints.length > 0 ? kv.replayEndpoints : undefined,
    sink,
    listener: recorder,
  });
  started.push(sub);
  // A SUB joins asynchronously: requests of one block each until the rank's stream arrives
  // (a missed first batch is replayed when the next one shows the sequence past 0).
  for (const rank of kv.ranks) {
    await untilJoined(() => complete(mock, rank, `probe ${probes++} ${'lorem ipsum dolor '.repeat(8)}`), () => sub.isFresh(rank));
  }
  return { index, sink, recorder, sub };
}

async function post(mock: MockVllm, path: string, body: object, rank?: number): Promise<any> {
  const res = await fetch(mock.url + path, {
    method: 'POST',
    // The header is an index from 0 into the mock's engines, as vLLM reads it: global rank − start rank.
    headers: { 'content-type': 'application/json', ...(rank !== undefined && { 'x-data-parallel-rank': String(rank - (mock.kvEvents?.ranks[0] ?? 0)) }) },
    body: JSON.stringify(body),
  });
  return { status: res.status, body: await res.json() };
}

async function complete(mock: MockVllm, rank: number, prompt: string): Promise<any> {
  const res = await post(mock, '/v1/completions', { prompt, max_tokens: 1 }, rank);
  expect(res.status).toBe(200);
  return res.body;
}

/** Resolves once `rank` received `count` more stored events than `from`. */
function storedOn(recorder: Recorder, rank: number, atLeast: number): Promise<void> {
  return recorder.until(() => recorder.count(rank, 'stored') >= atLeast, `${atLeast} stored events on rank ${rank}`);
}

/** A completions prompt of `blocks` full blocks and a few tokens more (BOS included), distinct per `seed`. */
function promptOfBlocks(tokenizer: PromptTokenizer, blocks: number, seed: string): { prompt: string; tokens: number[] } {
  let prompt = seed;
  for (let i = 0; ; i++) {
    const tokens = tokenizer.encodeWhole(prompt, true);
    if (tokens.length > blocks * BLOCK) {
      expect(tokens.length).toBeLessThan((blocks + 1) * BLOCK);
      return { prompt, tokens };
    }
    prompt += ` ${seed}${i}`;
  }
}

const fullBlocksOf = (tokens: number[]) => tokens.slice(0, Math.floor(tokens.length / BLOCK) * BLOCK);

const SYSTEM = 'You are a helpful assistant. Answer the user\'s questions briefly and accurately. '.repeat(6);

describe('mock vLLM with kvEvents', () => {
  it('reports where it publishes and which tokenizer it uses', async () => {
    const mock = await startMock({ startRank: 4 });
    expect(mock.kvEvents).toMatchObject({ ranks: [4, 5], topic: '', blockTokens: 16, tokenizer: MOCK_TOKENIZER_DIR });
    expect(mock.kvEvents!.endpoints).toEqual([expect.stringMatching(/^tcp:\/\/127\.0\.0\.1:\d+$/), expect.stringMatching(/^tcp:\/\/127\.0\.0\.1:\d+$/)]);
    expect(mock.kvEvents!.replayEndpoints).toHaveLength(2);
  });

  it("publishes BlockStored on the rank's socket with the router tokenizer's tokens for the same chat request", async () => {
    const mock = await startMock();
    const { index, sink, recorder } = await feed(mock);
    const before = sink.events.length;
    const storedBefore = recorder.count(1, 'stored');
    const request = { model: 'mock-model', messages: [{ role: 'system', content: SYSTEM }, { role: 'user', content: 'What is the capital of France?' }], max_tokens: 2 };
    const answer = await post(mock, '/v1/chat/completions', request, 1);
    expect(answer.status).toBe(200);
    await storedOn(recorder, 1, storedBefore + 1);

    const outcome = router(mock).tokenize('chat', request);
    if (!('prompts' in outcome)) throw new Error('the router refused the request');
    const tokens = outcome.prompts[0];
    expect(answer.body.usage.prompt_tokens).toBe(tokens.length);
    const events = sink.stored(1, before);
    expect(events).toHaveLength(1);
    const [event] = events;
    expect(event.tokenIds).toEqual(fullBlocksOf(tokens));
    expect(event).toMatchObject({ parentBlockHash: null, blockSize: BLOCK, medium: 'GPU', loraId: null });
    expect(event.blockHashes).toHaveLength(Math.floor(tokens.length / BLOCK));
    expect(sink.stored(0, before)).toEqual([]);
    // The index, fed by the mock alone, places the prompt on rank 1.
    expect(Array.from(index.match(tokens).matchedBlocks)).toEqual([0, Math.floor(tokens.length / BLOCK)]);

    // The same request again hits every block but the one holding its last token, and stores nothing new.
    const again = await post(mock, '/v1/chat/completions', request, 1);
    expect(again.body.usage.prompt_tokens_details.cached_tokens).toBe(Math.floor((tokens.length - 1) / BLOCK) * BLOCK);
    const metrics = await (await fetch(`${mock.url}/metrics`)).text();
    const queries = /vllm:prefix_cache_queries_total\{engine="1",[^}]*\} (\d+)/.exec(metrics)![1];
    expect(Number(queries)).toBe(mock.stats().perRank[1].promptTokens);
    expect(mock.stats().perRank[1].cachedTokens).toBe(Math.floor((tokens.length - 1) / BLOCK) * BLOCK);
  });

  it('tokenizes completions with the special tokens, as the router does', async () => {
    const mock = await startMock({ dataParallelSize: 1 });
    const { sink, recorder } = await feed(mock);
    const before = sink.events.length;
    const stored = recorder.count(0, 'stored');
    const { prompt, tokens } = promptOfBlocks(router(mock), 3, 'completion');
    const answer = await complete(mock, 0, prompt);
    expect(answer.usage.prompt_tokens).toBe(tokens.length);
    await storedOn(recorder, 0, stored + 1);
    expect(sink.stored(0, before).map((event) => event.tokenIds)).toEqual([fullBlocksOf(tokens)]);
    expect(tokens[0]).toBe(router(mock).encodeWhole('', true)[0]);
  });

  it.each<KvLayout>(['current', 'v0.9', 'v0.10', 'array-batch', 'map'])('feeds the index in the %s layout', async (layout) => {
    const mock = await startMock({ dataParallelSize: 1, kvEvents: { layout } });
    const { index, recorder } = await feed(mock);
    const stored = recorder.count(0, 'stored');
    const { prompt, tokens } = promptOfBlocks(router(mock), 2, layout.replace(/\W/g, ''));
    await complete(mock, 0, prompt);
    await storedOn(recorder, 0, stored + 1);
    expect(index.match(tokens).matchedBlocks[0]).toBe(2);
  });

  it('evicts the oldest blocks with BlockRemoved, tail blocks first, and the index drops them', async () => {
    const mock = await startMock({ dataParallelSize: 1, cacheBlocksPerRank: 8 });
    const { index, recorder } = await feed(mock);
    const tokenizer = router(mock);
    const a = promptOfBlocks(tokenizer, 4, 'alpha');
    const b = promptOfBlocks(tokenizer, 6, 'beta');
    let stored = recorder.count(0, 'stored');
    await complete(mock, 0, a.prompt);
    await storedOn(recorder, 0, ++stored);
    expect(index.match(a.tokens).matchedBlocks[0]).toBe(4);
    const removed = recorder.count(0, 'removed');
    await complete(mock, 0, b.prompt);
    await storedOn(recorder, 0, ++stored);
    expect(recorder.count(0, 'removed')).toBeGreaterThan(removed);
    // Eight blocks: B's six and A's first two (a prompt's tail is evicted before its head).
    expect(index.match(b.tokens).matchedBlocks[0]).toBe(6);
    expect(index.match(a.tokens).matchedBlocks[0]).toBe(2);
    expect(index.blockCount(0)).toBe(8);
    // What the index predicts is what the engine then finds cached.
    const hit = await complete(mock, 0, a.prompt);
    expect(hit.usage.prompt_tokens_details.cached_tokens).toBe(2 * BLOCK);
  });

  it('drops blocks silently on dropBlocksSilently(): the index still holds them, the engine computes them again', async () => {
    const mock = await startMock();
    const { index, recorder } = await feed(mock);
    const a = promptOfBlocks(router(mock), 4, 'gamma');
    let stored = recorder.count(0, 'stored');
    await complete(mock, 0, a.prompt);
    await storedOn(recorder, 0, ++stored);
    const removed = recorder.count(0, 'removed');
    mock.dropBlocksSilently(0);
    const again = await complete(mock, 0, a.prompt);
    expect(again.usage.prompt_tokens_details).toBeUndefined();
    await storedOn(recorder, 0, ++stored);
    // Stored again, and no removal ever said they were gone.
    expect(recorder.count(0, 'removed')).toBe(removed);
    expect(recorder.count(0, 'cleared')).toBe(0);
    expect(index.match(a.tokens).matchedBlocks[0]).toBe(4);
  });

  it("repairs a missed batch through the rank's replay socket", async () => {
    const mock = await startMock({ dataParallelSize: 1 });
    const { index, recorder } = await feed(mock);
    const tokenizer = router(mock);
    const first = promptOfBlocks(tokenizer, 2, 'dropped');
    const second = promptOfBlocks(tokenizer, 2, 'after');
    mock.kvEvents!.drop(0);
    await complete(mock, 0, first.prompt);
    await complete(mock, 0, second.prompt);
    await recorder.until(() => recorder.gaps.length === 1, 'the gap');
    expect(recorder.gaps).toEqual([[0, 'replayed']]);
    expect(index.match(first.tokens).matchedBlocks[0]).toBe(2);
    expect(index.match(second.tokens).matchedBlocks[0]).toBe(2);
  });

  it('publishes concurrent admissions in sequence, none lost', async () => {
    const mock = await startMock({ dataParallelSize: 1 });
    const { index, recorder } = await feed(mock);
    const prompts = Array.from({ length: 12 }, (_, i) => promptOfBlocks(router(mock), 1 + (i % 3), `together${i}x`));
    const stored = recorder.count(0, 'stored');
    await Promise.all(prompts.map(({ prompt }) => complete(mock, 0, prompt)));
    await storedOn(recorder, 0, stored + prompts.length);
    expect(recorder.gaps).toEqual([]);
    for (const { tokens } of prompts) expect(index.match(tokens).matchedBlocks[0]).toBe(Math.floor(tokens.length / BLOCK));
  });

  it("binds vLLM's offset ports: a subscriber given rank 0's endpoint finds every global rank", async () => {
    const base = await freePortRun(8);
    const mock = await startMock({ startRank: 2, kvEvents: { port: base, replayPort: base + 4 } });
    expect(mock.kvEvents!.endpoints).toEqual([`tcp://127.0.0.1:${base + 2}`, `tcp://127.0.0.1:${base + 3}`]);
    expect(mock.kvEvents!.replayEndpoints).toEqual([`tcp://127.0.0.1:${base + 6}`, `tcp://127.0.0.1:${base + 7}`]);
    const { index, recorder } = await feed(mock, `tcp://127.0.0.1:${base}`);
    const { prompt, tokens } = promptOfBlocks(router(mock), 2, 'offset');
    const stored = recorder.count(3, 'stored');
    await complete(mock, 3, prompt);
    await storedOn(recorder, 3, stored + 1);
    expect(Array.from(index.match(tokens).matchedBlocks)).toEqual([0, 2]);
  });

  it('end to end: two chats sharing a long system prompt on two ranks both hold the shared blocks', async () => {
    const mock = await startMock();
    const { index, recorder } = await feed(mock);
    const chatOf = (question: string) => ({ messages: [{ role: 'system', content: SYSTEM }, { role: 'user', content: question }], max_tokens: 1 });
    const one = chatOf('What is the capital of France?');
    const two = chatOf('Please summarize the following document.');
    const stored = [recorder.count(0, 'stored'), recorder.count(1, 'stored')];
    expect((await post(mock, '/v1/chat/completions', one, 0)).status).toBe(200);
    expect((await post(mock, '/v1/chat/completions', two, 1)).status).toBe(200);
    await storedOn(recorder, 0, stored[0] + 1);
    await storedOn(recorder, 1, stored[1] + 1);

    const tokensOf = (body: object) => (router(mock).tokenize('chat', body) as { prompts: number[][] }).prompts[0];
    const [t1, t2] = [tokensOf(one), tokensOf(two)];
    let common = 0;
    while (t1[common] === t2[common]) common++;
    const shared = Math.floor(common / BLOCK);
    expect(shared).toBeGreaterThanOrEqual(4);
    expect(Array.from(index.match(t1).matchedBlocks)).toEqual([Math.floor(t1.length / BLOCK), shared]);
    expect(Array.from(index.match(t2).matchedBlocks)).toEqual([shared, Math.floor(t2.length / BLOCK)]);
    expect(Array.from(index.match(t1.slice(0, shared * BLOCK)).matchedBlocks)).toEqual([shared, shared]);
  });

  it('answers 400 for a chat its tokenizer cannot render, as vLLM does', async () => {
    const mock = await startMock({ dataParallelSize: 1 });
    const res = await post(mock, '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], continue_final_message: true });
    expect(res.status).toBe(400);
    expect(res.body.error).toMatchObject({ type: 'BadRequestError', param: 'messages' });
    expect(mock.stats().perRank[0].requests).toBe(0);
  });

  it("publishes vLLM 52a31cc's layout by default: the shape its own publisher sent (fixtures/vllm-52a31cc)", async () => {
    const mock = await startMock({ dataParallelSize: 1 });
    const sub = new (loadZeromq().Subscriber)({ linger: 0, receiveTimeout: 200 });
    started.push({ close: async () => sub.close() });
    sub.connect(mock.kvEvents!.endpoints[0]);
    sub.subscribe();
    let frames: Buffer[] | undefined;
    for (let attempt = 0; attempt < 100 && frames === undefined; attempt++) {
      await complete(mock, 0, promptOfBlocks(router(mock), 2, `shape${attempt}x`).prompt);
      frames = await sub.receive().catch(() => undefined);
    }
    const unpack = (payload: Buffer) => new Unpackr({ useRecords: false, int64AsType: 'bigint' }).unpack(payload) as unknown;
    // Field by field: ints, floats, strings, nils and arrays where vLLM has them.
    const shape = (value: unknown): unknown => {
      if (Array.isArray(value)) return value.length > 0 && typeof value[0] !== 'object' ? ['array of', shape(value[0])] : value.map(shape);
      if (typeof value === 'bigint' || (typeof value === 'number' && Number.isInteger(value))) return 'int';
      return typeof value === 'number' ? 'float' : value === null ? 'nil' : value;
    };
    const vllm = vllmRecording('plain');
    expect(frames).toHaveLength(3);
    expect(shape(unpack(frames![2]))).toEqual(shape(unpack(payloadOf(vllm, 0))));
  });

  it("serves LoRA adapters as vLLM does: listed under the base model, cached apart from it, their blocks keyed [lora_name] (#33304)", async () => {
    const mock = await startMock({ loraModules: ['sql-lora'] });
    const models = (await (await fetch(`${mock.url}/v1/models`)).json()) as { data: Array<{ id: string; parent: string | null }> };
    expect(models.data.map((card) => [card.id, card.parent])).toEqual([['mock-model', null], ['sql-lora', 'mock-model']]);
    const { index, sink, recorder } = await feed(mock);
    const chat = { messages: [{ role: 'system', content: SYSTEM }, { role: 'user', content: 'Which tables are there?' }], max_tokens: 1 };
    const before = sink.events.length;
    const stored = [recorder.count(0, 'stored'), recorder.count(1, 'stored')];
    const lora = await post(mock, '/v1/chat/completions', { ...chat, model: 'sql-lora' }, 1);
    expect(lora.status).toBe(200);
    expect(lora.body.model).toBe('sql-lora');
    expect((await post(mock, '/v1/chat/completions', { ...chat, model: 'mock-model' }, 0)).status).toBe(200);
    await storedOn(recorder, 0, stored[0] + 1);
    await storedOn(recorder, 1, stored[1] + 1);
    const tokens = (router(mock).tokenize('chat', chat) as { prompts: number[][] }).prompts[0];
    const blocks = Math.floor(tokens.length / BLOCK);
    const [event] = sink.stored(1, before);
    expect(event).toMatchObject({ loraId: 1, loraName: 'sql-lora', extraKeyed: Array(blocks).fill(false), groupIdx: 0, kvCacheSpecKind: 'full_attention' });
    expect(Array.from(index.match(tokens, { loraName: 'sql-lora' }).matchedBlocks)).toEqual([0, blocks]);
    expect(Array.from(index.match(tokens).matchedBlocks)).toEqual([blocks, 0]);
    // The engine agrees: the adapter's request finds nothing of the base model's blocks.
    const again = await post(mock, '/v1/chat/completions', { ...chat, model: 'sql-lora' }, 0);
    // Nothing cached: vLLM leaves prompt_tokens_details out (chat_completion/serving.py:1384 at 52a31cc).
    expect(again.body.usage.prompt_tokens_details).toBeUndefined();
    expect((await post(mock, '/v1/chat/completions', { ...chat, model: 'other-lora' }, 0)).status).toBe(404);
  });

  it("salts a request's first block with its cache_salt as vLLM does (fixtures/vllm-52a31cc/salt.json): its extra keys name the salt, and only that salt finds the blocks again", async () => {
    const mock = await startMock();
    const { index, sink, recorder } = await feed(mock);
    const chat = { messages: [{ role: 'system', content: SYSTEM }, { role: 'user', content: 'Salted?' }], max_tokens: 1 };
    const before = sink.events.length;
    const stored = recorder.count(1, 'stored');
    expect((await post(mock, '/v1/chat/completions', { ...chat, cache_salt: 'tenant-a' }, 1)).status).toBe(200);
    await storedOn(recorder, 1, stored + 1);
    const tokens = (router(mock).tokenize('chat', chat) as { prompts: number[][] }).prompts[0];
    const blocks = Math.floor(tokens.length / BLOCK);
    const [event] = sink.stored(1, before);
    // vLLM: [["tenant-a"], null, …]; decoded, the salt keys the first block and nothing is extra.
    expect(event).toMatchObject({ cacheSalt: 'tenant-a', extraKeyed: Array(blocks).fill(false) });
    expect(Array.from(index.match(tokens, { salt: 'tenant-a' }).matchedBlocks)).toEqual([0, blocks]);
    expect(Array.from(index.match(tokens).matchedBlocks)).toEqual([0, 0]);
    const same = await post(mock, '/v1/chat/completions', { ...chat, cache_salt: 'tenant-a' }, 1);
    expect(same.body.usage.prompt_tokens_details.cached_tokens).toBe(Math.min(blocks, Math.floor((tokens.length - 1) / BLOCK)) * BLOCK);
    const other = await post(mock, '/v1/chat/completions', { ...chat, cache_salt: 'tenant-b' }, 1);
    expect(other.body.usage.prompt_tokens_details).toBeUndefined();
  });

  it('publishes as a hybrid-attention model with hybrid: the index follows the full-attention group through the sliding group\'s evictions', async () => {
    const mock = await startMock({ dataParallelSize: 1, kvEvents: { hybrid: true } });
    const { index, sink, recorder } = await feed(mock);
    const before = sink.events.length;
    const stored = recorder.count(0, 'stored');
    const { prompt, tokens } = promptOfBlocks(router(mock), 3, 'hybrid');
    await complete(mock, 0, prompt);
    await storedOn(recorder, 0, stored + 2);
    expect(sink.stored(0, before).map((event) => [event.groupIdx, event.kvCacheSpecKind])).toEqual([[0, 'sliding_window'], [1, 'full_attention']]);
    expect(recorder.count(0, 'removed')).toBeGreaterThanOrEqual(2);
    expect(index.match(tokens).matchedBlocks[0]).toBe(3);
  });

  it("publishes an offloading connector's CPU stores with offload: the GPU's blocks indexed, the CPU's kept as their tier, none invalid", async () => {
    const mock = await startMock({ dataParallelSize: 1, kvEvents: { offload: true } });
    const { index, recorder } = await feed(mock);
    const stored = recorder.count(0, 'stored');
    const { prompt, tokens } = promptOfBlocks(router(mock), 2, 'offload');
    await complete(mock, 0, prompt);
    // The GPU's store and the connector's CPU store of the same two blocks.
    await storedOn(recorder, 0, stored + 2);
    expect(index.match(tokens).matchedBlocks[0]).toBe(2);
    expect(recorder.count(0, 'invalid')).toBe(0);
    expect(recorder.count(0, 'stored')).toBe(stored + 2);
    // The connector copied every block the GPU stored: the tier holds as many, resolved to the GPU's keys.
    expect(index.tiers.counts(0)).toEqual([['CPU', index.blockCount(0)]]);
  });

  it.each<[string, object, RegExp]>([
    ['an unknown key', { ports: 5557 }, /kvEvents\.ports is not an option/],
    ['a port past 65535 once offset', { port: 65535 }, /kvEvents\.port must be 0 .* global rank 1/],
    ['a negative replay port', { replayPort: -1 }, /kvEvents\.replayPort/],
    ['an unknown layout', { layout: 'v1' }, /kvEvents\.layout must be one of/],
    ['a zero buffer', { bufferSteps: 0 }, /kvEvents\.bufferSteps must be an integer >= 1/],
    ['a hybrid flag that is not a boolean', { hybrid: 'yes' }, /kvEvents\.hybrid must be true or false/],
  ])('refuses %s with a TypeError naming the option', async (_name, kvEvents, message) => {
    await expect(startMockVllm({ dataParallelSize: 2, kvEvents: kvEvents as MockVllmOptions['kvEvents'] })).rejects.toThrow(message);
  });
});
