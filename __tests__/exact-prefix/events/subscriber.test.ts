import { afterEach, describe, expect, it, jest } from '@jest/globals';
import fc from 'fast-check';
import { KvExactIndex } from '../../../lib/exact-prefix/index/exact-index';
import { createKvEventSubscriber, type KvEventSubscriber, type KvSubscriberOptions } from '../../../lib/exact-prefix/events/subscriber';
import { seqBytes, startMockKvPublisher, type KvLayout, type MockKvEvent, type MockKvPublisher } from '../../../example-server/mock-vllm/kv-events';
import { Recorder, freePortRun, untilJoined } from '../helpers';

const closers: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (closers.length > 0) await (closers.pop() as () => Promise<void>)();
});

interface Harness {
  pub: MockKvPublisher;
  index: KvExactIndex;
  recorder: Recorder;
  sub: KvEventSubscriber;
}

async function harness(options: { ranks?: number[]; layout?: KvLayout; replay?: boolean; subscriber?: Partial<KvSubscriberOptions> } = {}): Promise<Harness> {
  const ranks = options.ranks ?? [0];
  const pub = await startMockKvPublisher({ ranks, layout: options.layout, replay: options.replay });
  closers.push(() => pub.close());
  const pair = await subscribe(pub, ranks, options.subscriber);
  return { pub, ...pair };
}

async function subscribe(pub: MockKvPublisher, ranks: number[], extra: Partial<KvSubscriberOptions> = {}): Promise<Omit<Harness, 'pub'>> {
  const index = new KvExactIndex({ ranks });
  const recorder = new Recorder();
  const sub = createKvEventSubscriber({
    upstream: 'test',
    ranks,
    endpoint: pub.endpoints,
    replayEndpoint: pub.replayEndpoints.length > 0 ? pub.replayEndpoints : undefined,
    sink: index,
    listener: recorder,
    ...extra,
  });
  closers.push(() => sub.close());
  for (const rank of ranks) await untilJoined(() => pub.publish(rank, []), () => sub.isFresh(rank));
  return { index, recorder, sub };
}

function stored(hashes: number[], parent: number | null, tokens: number[]): MockKvEvent {
  return { type: 'BlockStored', blockHashes: hashes, parentBlockHash: parent, tokenIds: tokens, blockSize: 2, medium: 'GPU' };
}

const prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];

describe('createKvEventSubscriber', () => {
  it.each<KvLayout>(['v0.9', 'v0.10', 'array-batch', 'map'])('feeds the index from a %s publisher', async (layout) => {
    const { pub, index, recorder } = await harness({ layout });
    await pub.publish(0, [stored([10, 11], null, [1, 2, 3, 4]), { type: 'BlockRemoved', blockHashes: [11] }, stored([11], 10, [3, 4])]);
    await recorder.until(() => recorder.count(0, 'stored') === 2 && recorder.count(0, 'removed') === 1, 'two stores and a removal');
    expect(index.match(prompt).matchedBlocks[0]).toBe(2);
  });

  it('repairs a sequence gap through the replay endpoint with a DEALER', async () => {
    const { pub, index, recorder } = await harness();
    await pub.publish(0, [stored([10, 11], null, [1, 2, 3, 4])]);
    await pub.publish(0, [stored([12], 11, [5, 6])], { drop: true });
    await pub.publish(0, [stored([13], 12, [7, 8])]);
    await recorder.until(() => recorder.gaps.length === 1, 'the gap');
    expect(recorder.gaps).toEqual([[0, 'replayed']]);
    expect(recorder.count(0, 'stored')).toBe(3);
    expect(index.match(prompt).matchedBlocks[0]).toBe(4);
  });

  it('counts a gap lost and clears the rank without a replay endpoint', async () => {
    const { pub, index, recorder } = await harness({ replay: false });
    await pub.publish(0, [stored([10, 11], null, [1, 2, 3, 4])]);
    await recorder.until(() => recorder.count(0, 'stored') === 1, 'the first store');
    expect(index.blockCount(0)).toBe(2);
    await pub.publish(0, [{ type: 'BlockRemoved', blockHashes: [10] }], { drop: true });
    await pub.publish(0, [stored([20], null, [9, 9])]);
    // Events are applied between yields to I/O: wait for the store after the gap too.
    await recorder.until(() => recorder.gaps.length === 1 && recorder.count(0, 'stored') === 2, 'the gap and the store after it');
    expect(recorder.gaps).toEqual([[0, 'lost']]);
    // The missed removal cannot leave block 10 claimed: the rank starts over.
    expect(index.match(prompt).matchedBlocks[0]).toBe(0);
    expect(index.blockCount(0)).toBe(1);
  });

  it('counts a gap lost when the replay buffer no longer reaches back', async () => {
    const { pub, index, recorder } = await harness();
    await pub.publish(0, [stored([10, 11], null, [1, 2, 3, 4])]);
    await recorder.until(() => recorder.count(0, 'stored') === 1, 'the first store');
    const dropped = await pub.publish(0, [{ type: 'BlockRemoved', blockHashes: [10] }], { drop: true });
    pub.trimReplay(0, dropped + 1);
    await pub.publish(0, [stored([20], null, [9, 9])]);
    await recorder.until(() => recorder.gaps.length === 1, 'the gap');
    expect(recorder.gaps).toEqual([[0, 'lost']]);
    expect(index.match(prompt).matchedBlocks[0]).toBe(0);
    expect(index.match([9, 9]).matchedBlocks[0]).toBe(1);
  });

  it('clears a rank whose sequence goes backwards (engine restart)', async () => {
    const { pub, index, recorder } = await harness({ ranks: [0, 1] });
    await pub.publish(0, [stored([10, 11], null, [1, 2, 3, 4])]);
    await pub.publish(1, [stored([10], null, [1, 2])]);
    await recorder.until(() => recorder.count(0, 'stored') === 1 && recorder.count(1, 'stored') === 1, 'both stores');
    pub.restart(0);
    await pub.publish(0, [stored([30], null, [5, 5])]);
    // The restart clears the rank and syncs it from the new engine's buffer, then applies the store.
    await recorder.until(() => recorder.restarts.length === 1 && recorder.count(0, 'stored') >= 2, 'the restart and the store after it');
    expect(recorder.restarts).toEqual([0]);
    expect(Array.from(index.match(prompt).matchedBlocks)).toEqual([0, 1]);
    expect(index.match([5, 5]).matchedBlocks[0]).toBe(1);
    expect(recorder.gaps).toEqual([]);
  });

  it('is fresh while connected, idle or not, and stale at once when the publisher goes away (item 21.4)', async () => {
    const { pub, recorder, sub } = await harness({ ranks: [0, 1] });
    // Idle: nothing is published, the connection stays up, the ranks stay fresh.
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(sub.isFresh(0) && sub.isFresh(1)).toBe(true);
    await pub.close();
    await recorder.until(() => !sub.isFresh(0) && !sub.isFresh(1), 'both ranks stale');
    const rank0 = recorder.freshness.filter(([rank]) => rank === 0).map(([, fresh]) => fresh);
    expect(rank0).toEqual([true, false]);
  });

  it("refuses and counts a batch whose data_parallel_rank is not its connection's (item 22.9)", async () => {
    const { pub, index, recorder } = await harness({ ranks: [2, 3] });
    await pub.publish(2, [stored([10], null, [1, 2])], { dataParallelRank: 3 });
    await pub.publish(2, [stored([11], null, [1, 2])], { dataParallelRank: 7 });
    await pub.publish(2, [stored([12], null, [3, 4])], { dataParallelRank: 2 });
    await recorder.until(() => recorder.count(2, 'stored') === 1 && recorder.count(2, 'invalid') === 2, 'the own store and two refused batches');
    expect(recorder.mismatches).toEqual([[2, 3], [2, 7]]);
    // Neither rank got the foreign batch.
    expect(Array.from(index.match(prompt).matchedBlocks)).toEqual([0, 0]);
    expect(Array.from(index.match([3, 4]).matchedBlocks)).toEqual([1, 0]);
  });

  it('counts hostile frames invalid and keeps serving', async () => {
    const { pub, index, recorder } = await harness();
    await pub.publishRaw(0, ['', seqBytes(1)]); // two frames
    await pub.publishRaw(0, ['', Buffer.from([1, 2, 3]), Buffer.from([0x90])]); // a short sequence frame
    await pub.publishPayload(0, Buffer.from('ddffffffff0000000000', 'hex')); // a 2^32-element array
    await pub.publishPayload(0, Buffer.from('not msgpack at all'));
    await pub.publish(0, [stored([10], null, [1, 2])]);
    await recorder.until(() => recorder.count(0, 'stored') === 1, 'the valid store');
    expect(recorder.count(0, 'invalid')).toBe(4);
    expect(index.match(prompt).matchedBlocks[0]).toBe(1);
    expect(recorder.gaps).toEqual([]);
  });

  it('survives a stream of random payloads with bounded memory', async () => {
    const { pub, index, recorder } = await harness();
    const payloads = fc.sample(fc.oneof(fc.uint8Array({ maxLength: 512 }), fc.constant(new Uint8Array([0xdd, 0xff, 0xff, 0xff, 0xff]))), { numRuns: 300, seed: 7 });
    const before = process.memoryUsage().heapUsed;
    for (const payload of payloads) await pub.publishPayload(0, Buffer.from(payload));
    await pub.publish(0, [stored([10], null, [1, 2])]);
    await recorder.until(() => recorder.count(0, 'stored') === 1, 'the valid store after the noise');
    expect(recorder.count(0, 'invalid')).toBeGreaterThan(250);
    expect(recorder.gaps).toEqual([]);
    expect(index.match(prompt).matchedBlocks[0]).toBe(1);
    expect(process.memoryUsage().heapUsed - before).toBeLessThan(128 * 1024 * 1024);
  });

  it('a payload past the size bound is never received: the connection is dropped, replaced and synced (item 22.5)', async () => {
    const { pub, index, recorder, sub } = await harness({ subscriber: { limits: { maxBytes: 4096 }, replayTimeoutMs: 300 } });
    await pub.publish(0, [stored([9], null, [7, 7])]);
    await recorder.until(() => recorder.count(0, 'stored') === 1, 'the first store');
    await pub.publishPayload(0, Buffer.alloc(100_000, 0xc0));
    await recorder.until(() => recorder.disconnects.length === 1, 'the dropped connection');
    // The new socket joins (slow joiner) and syncs; the buffer's oversized batch ends that
    // replay's connection too, so the sync runs out its deadline and the rank follows on.
    for (let i = 0; i < 400 && index.match(prompt).matchedBlocks[0] !== 1; i++) {
      await pub.publish(0, [stored([10 + i], null, [1, 2])]);
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
    expect(index.match(prompt).matchedBlocks[0]).toBe(1);
    expect(sub.isFresh(0)).toBe(true);
  });

  it('a sink that throws is reported and the stream goes on', async () => {
    const pub = await startMockKvPublisher({ ranks: [0] });
    closers.push(() => pub.close());
    const index = new KvExactIndex({ ranks: [0] });
    const errors: unknown[] = [];
    const recorder = new Recorder();
    const sink = {
      applyEvent: (rank: number, event: Parameters<KvExactIndex['applyEvent']>[1]) => {
        if (event.type === 'cleared') throw new Error('sink bug');
        return index.applyEvent(rank, event);
      },
      clearRank: (rank: number) => index.clearRank(rank),
    };
    const sub = createKvEventSubscriber({ upstream: 'test', ranks: [0], endpoint: pub.endpoints, sink, listener: Object.assign(recorder, { error: (_rank: number, error: unknown) => errors.push(error) }) });
    closers.push(() => sub.close());
    await untilJoined(() => pub.publish(0, []), () => sub.isFresh(0));
    await pub.publish(0, [{ type: 'AllBlocksCleared' }]);
    await pub.publish(0, [stored([10], null, [1, 2])]);
    await recorder.until(() => recorder.count(0, 'stored') === 1, 'the store after the throw');
    expect(errors).toEqual([new Error('sink bug')]);
    expect(index.match(prompt).matchedBlocks[0]).toBe(1);
  });

  it("reaches each rank at vLLM's offset ports from rank 0's endpoint, by global rank", async () => {
    let started: { pub: MockKvPublisher; base: number } | undefined;
    for (let attempt = 0; attempt < 5 && started === undefined; attempt++) {
      const base = await freePortRun(8);
      try {
        started = { pub: await startMockKvPublisher({ ranks: [2, 3], ports: { base, replayBase: base + 4 } }), base };
      } catch {
        // Another process took a port between the probe and the bind: probe again.
      }
    }
    if (started === undefined) throw new Error('could not bind a run of free ports');
    const { pub, base } = started;
    closers.push(() => pub.close());
    const { index, recorder } = await subscribe(pub, [2, 3], { endpoint: `tcp://127.0.0.1:${base}`, replayEndpoint: `tcp://127.0.0.1:${base + 4}` });
    await pub.publish(3, [stored([10], null, [1, 2])]);
    await pub.publish(3, [stored([11], 10, [3, 4])], { drop: true });
    await pub.publish(3, [stored([12], 11, [5, 6])]);
    await recorder.until(() => recorder.gaps.length === 1, 'the gap on rank 3');
    expect(recorder.gaps).toEqual([[3, 'replayed']]);
    expect(Array.from(index.match(prompt).matchedBlocks)).toEqual([0, 3]);
  });

  it('catches up from the replay buffer on its first message', async () => {
    const pub = await startMockKvPublisher({ ranks: [0] });
    closers.push(() => pub.close());
    // Published before anyone listened: only the replay buffer has these.
    await pub.publish(0, [stored([10], null, [1, 2])]);
    await pub.publish(0, [stored([11], 10, [3, 4])]);
    const { index, recorder } = await subscribe(pub, [0]);
    await recorder.until(() => recorder.count(0, 'stored') === 2, 'the replayed stores');
    expect(index.match(prompt).matchedBlocks[0]).toBe(2);
    expect(recorder.gaps).toEqual([]);
  });

  it('three subscriber+index pairs fed by one publisher agree on every lookup', async () => {
    const ranks = [0, 1];
    const pub = await startMockKvPublisher({ ranks, layout: 'v0.10' });
    closers.push(() => pub.close());
    const pairs = [await subscribe(pub, ranks), await subscribe(pub, ranks), await subscribe(pub, ranks)];
    const reference = new KvExactIndex({ ranks });
    // A seeded walk: chains that branch, removals, a clear; the same events go to the reference.
    let seed = 12345;
    const random = (n: number): number => {
      seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
      return (seed >>> 16) % n;
    };
    const chains: Array<{ rank: number; hashes: number[]; tokens: number[] }> = [];
    let nextHash = 1;
    const expected = new Map<number, number>(ranks.map((rank) => [rank, 0]));
    for (let step = 0; step < 300; step++) {
      const rank = ranks[random(2)];
      const roll = random(50);
      let event: MockKvEvent;
      if (roll < 30 || chains.length === 0) {
        const base = chains.length > 0 && random(2) === 0 ? chains[random(chains.length)] : null;
        const usable = base !== null && base.rank === rank ? base : null;
        const tokens = [random(50), random(50), random(50), random(50)];
        const hashes = [nextHash++, nextHash++];
        event = stored(hashes, usable === null ? null : usable.hashes[usable.hashes.length - 1], tokens);
        chains.push({ rank, hashes: usable === null ? hashes : [...usable.hashes, ...hashes], tokens: usable === null ? tokens : [...usable.tokens, ...tokens] });
      } else if (roll < 49) {
        const chain = chains[random(chains.length)];
        event = { type: 'BlockRemoved', blockHashes: [chain.hashes[random(chain.hashes.length)]] };
      } else {
        event = { type: 'AllBlocksCleared' };
      }
      await pub.publish(rank, [event]);
      expected.set(rank, (expected.get(rank) ?? 0) + 1);
      const decoded = event.type === 'BlockStored'
        ? { type: 'stored' as const, blockHashes: event.blockHashes as number[], parentBlockHash: event.parentBlockHash as number | null, tokenIds: event.tokenIds, blockSize: 2, loraId: null, loraName: null, medium: 'GPU', extraKeyed: null, groupIdx: null }
        : event.type === 'BlockRemoved'
          ? { type: 'removed' as const, blockHashes: event.blockHashes as number[], medium: null, groupIdx: null }
          : { type: 'cleared' as const };
      reference.applyEvent(rank, decoded);
    }
    const applied = (recorder: Recorder, rank: number): number => recorder.count(rank, 'stored') + recorder.count(rank, 'removed') + recorder.count(rank, 'cleared');
    for (const { recorder } of pairs) {
      await recorder.until(() => ranks.every((rank) => applied(recorder, rank) === expected.get(rank)), 'every event');
    }
    const prompts = [...chains.map((chain) => chain.tokens), prompt, [1, 2]];
    for (const tokens of prompts) {
      const want = Array.from(reference.match(tokens).matchedBlocks);
      for (const { index } of pairs) expect(Array.from(index.match(tokens).matchedBlocks)).toEqual(want);
    }
    for (const { index } of pairs) expect(index.totalBlocks).toBe(reference.totalBlocks);
    expect(reference.totalBlocks).toBeGreaterThan(50);
    expect(prompts.filter((tokens) => Math.max(...reference.match(tokens).matchedBlocks) > 2).length).toBeGreaterThan(10);
  });

  it('close() stops every socket and timer and may be called twice', async () => {
    const { sub } = await harness({ ranks: [0, 1] });
    await sub.close();
    await sub.close();
    expect(sub.isFresh(0)).toBe(true); // the last state stays readable
  });
});

describe('loading zeromq', () => {
  it('is lazy, and a missing package names the install command', () => {
    jest.isolateModules(() => {
      let loaded = false;
      jest.doMock('zeromq', () => {
        loaded = true;
        throw new Error("Cannot find module 'zeromq'");
      });
      const { createKvEventSubscriber: create } = require('../../../lib/exact-prefix/events/subscriber') as typeof import('../../../lib/exact-prefix/events/subscriber');
      expect(loaded).toBe(false);
      expect(() => create({ upstream: 'u', ranks: [0], endpoint: 'tcp://127.0.0.1:5557', sink: new KvExactIndex({ ranks: [0] }) })).toThrow(
        /could not be loaded .*Install it with: npm install zeromq$/,
      );
    });
  });
});
