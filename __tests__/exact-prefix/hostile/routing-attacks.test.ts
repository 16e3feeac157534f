import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from '@jest/globals';
import { MOCK_TOKENIZER_DIR } from '../../../example-server/mock-vllm/tokenize';
import { createExactRouting, type ExactRouting } from '../../../lib/exact-prefix/exact-routing';
import { PromptTokenizer } from '../../../lib/exact-prefix/tokenizer/tokenizer';
import { fakeEndpoints } from '../../policies/fake-endpoints';
import { RawEngine, batch, storedEvent } from './raw-engine';

const closers: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (closers.length > 0) await (closers.pop() as () => Promise<void>)();
});
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const tokenizer = PromptTokenizer.load(MOCK_TOKENIZER_DIR);

async function setup(now: () => number): Promise<{ one: RawEngine; routing: ExactRouting }> {
  const one = await new RawEngine(0).start();
  closers.push(() => one.close());
  // The upstream's /tokenize fails: agreement checks are then counted neither way.
  const http: Server = createServer((_req, res) => res.writeHead(500).end());
  await new Promise<void>((resolve) => http.listen(0, '127.0.0.1', resolve));
  closers.push(() => new Promise((resolve) => http.close(() => resolve())));
  const url = `http://127.0.0.1:${(http.address() as AddressInfo).port}`;
  const routing = createExactRouting({
    upstreams: [{ name: 'u', url, ranks: [0], kvEvents: { endpoint: [one.endpoint], replayEndpoint: [one.replayEndpoint] } }],
    tokenizer,
    confirmAfterMs: 1_000,
    now,
  });
  closers.push(() => routing.close());
  return { one, routing };
}

async function until(condition: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 400 && !condition(); i++) await sleep(10);
  if (!condition()) throw new Error(`never: ${what}`);
}

const prompt = 'The router sends each request to the data-parallel rank whose cache holds its prefix. '.repeat(4);
const tokensOf = (text: string) => {
  const outcome = tokenizer.tokenize('completions', { prompt: text });
  if (!('prompts' in outcome)) throw new Error('refused');
  return outcome.prompts[0];
};

describe('exact routing under a hostile publisher', () => {
  it('undecodable batches do not keep a rank fresh once a routed request waits for its blocks (item 22.10)', async () => {
    let clock = 1_000_000;
    const { one, routing } = await setup(() => clock);
    await one.publish(batch([storedEvent([1], null, [1, 2, 3, 4], 4)], 0));
    await until(() => routing.serves('u', 0), 'fresh');
    const pick = routing.lookup('completions', { prompt }, fakeEndpoints(1));
    expect(pick).toBeDefined();
    pick!.chose(0);
    // The engine answers with garbage only, step after step.
    for (let i = 0; i < 5; i++) {
      await one.publish(Buffer.from('not msgpack at all'));
      clock += 500;
      await sleep(20);
    }
    expect(routing.serves('u', 0)).toBe(false);
  });

  it('scores a LoRA request under its adapter, as the index stores its blocks (item 22.13)', async () => {
    const { one, routing } = await setup(Date.now);
    const tokens = tokensOf(prompt);
    const blocks = Math.floor(tokens.length / 4);
    const hashes = Array.from({ length: blocks }, (_, i) => 100 + i);
    await one.publish(batch([['BlockStored', hashes, null, tokens.slice(0, blocks * 4), 4, 7, 'GPU', 'adapter-a']], 0));
    await until(() => routing.serves('u', 0) && routing.lookup('completions', { model: 'adapter-a', prompt }, fakeEndpoints(1))?.matched[0] === blocks, 'the adapter blocks');
    // The base model does not hold them.
    expect(routing.lookup('completions', { model: 'base', prompt }, fakeEndpoints(1))?.matched[0]).toBe(0);
  });
});
