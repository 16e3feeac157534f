import { createServer, request, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from '@jest/globals';
import { KvExactIndex } from '../../../lib/exact-prefix/index/exact-index';
import { createKvEventSubscriber, type KvEventSubscriber, type KvSubscriberOptions } from '../../../lib/exact-prefix/events/subscriber';
import { WORK_SLICE, DECODED_VALUES_PER_UNIT, yieldCount } from '../../../lib/exact-prefix/events/cooperative';
import { DEFAULT_KV_LIMITS } from '../../../lib/exact-prefix/events/decode';
import { Recorder } from '../helpers';
import { RawEngine, batch, honestReplay, seqFrame, storedEvent } from './raw-engine';

const closers: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (closers.length > 0) await (closers.pop() as () => Promise<void>)();
});

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function engine(rank = 0): Promise<RawEngine> {
  const one = await new RawEngine(rank).start();
  closers.push(() => one.close());
  return one;
}

function subscribe(one: RawEngine, extra: Partial<KvSubscriberOptions> = {}): { index: KvExactIndex; recorder: Recorder; sub: KvEventSubscriber } {
  const index = new KvExactIndex({ ranks: [one.rank] });
  const recorder = new Recorder();
  const sub = createKvEventSubscriber({ upstream: 'raw', ranks: [one.rank], endpoint: [one.endpoint], replayEndpoint: [one.replayEndpoint], sink: index, listener: recorder, ...extra });
  closers.push(() => sub.close());
  return { index, recorder, sub };
}

/** A chain of blocks of size 2: block i holds tokens [i, i] under block i − 1. */
function chainBlock(i: number, rank = 0): Buffer {
  return batch([storedEvent([1000 + i], i === 0 ? null : 999 + i, [i, i], 2)], rank);
}
const chainPrompt = (blocks: number) => Array.from({ length: blocks * 2 }, (_, t) => Math.floor(t / 2));

/** Publishes empty batches until `condition` holds: what a quiet engine's next steps would be. */
async function nudge(one: RawEngine, condition: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 400 && !condition(); i++) {
    await one.publish(batch([], one.rank));
    await sleep(25);
  }
  if (!condition()) throw new Error(`never: ${what}`);
}

async function healthz(): Promise<{ server: Server; worst: () => number; answers: () => number; stop: () => void }> {
  const server = createServer((_req, res) => res.end('ok'));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  closers.push(() => new Promise((resolve) => server.close(() => resolve())));
  const { port } = server.address() as AddressInfo;
  let worst = 0;
  let answers = 0;
  let running = true;
  void (async () => {
    while (running) {
      const started = Date.now();
      await new Promise<void>((resolve) => request({ port, host: '127.0.0.1', path: '/healthz', agent: false }, (res) => res.resume().on('end', resolve)).on('error', () => resolve()).end());
      worst = Math.max(worst, Date.now() - started);
      answers++;
      await sleep(5);
    }
  })();
  return { server, worst: () => worst, answers: () => answers, stop: () => (running = false) };
}

describe('the KV-event subscriber under a hostile or broken engine', () => {
  it('a warm engine rebuilds a new subscriber from its buffer before it is fresh (issue 27.5)', async () => {
    const one = await engine();
    // 50 blocks stored before this gateway started (published to nobody).
    for (let i = 0; i < 50; i++) await one.publish(chainBlock(i));
    const { index, recorder, sub } = subscribe(one);
    // Nothing is published after the gateway starts: the replay from sequence 0 on connect does it.
    await recorder.until(() => sub.isFresh(0) && index.blockCount(0) === 50, 'the rank rebuilt from the buffer');
    expect(index.blockCount(0)).toBe(50);
    expect(index.match(chainPrompt(50)).matchedBlocks[0]).toBe(50);
  });

  it('a hole inside a replay clears the rank there: an evicted block is not left indexed (item 22.7)', async () => {
    const one = await engine();
    await one.publish(batch([storedEvent([1], null, [5, 5], 2)], 0)); // seq 0: A stored
    await one.publish(batch([['BlockRemoved', [1], 'GPU']], 0)); // seq 1: A evicted
    await one.publish(batch([storedEvent([2], null, [6, 6], 2)], 0)); // seq 2: B stored
    // The ROUTER leaves out the removal.
    one.replay = async (router, identity, from, buffer) => {
      for (const [seq, payload] of buffer) if (seq >= from && seq !== 1) await router.send([identity, Buffer.alloc(0), seqFrame(seq), payload]);
      await router.send([identity, Buffer.alloc(0), seqFrame(-1), Buffer.alloc(0)]);
    };
    const { index, sub } = subscribe(one);
    await nudge(one, () => sub.isFresh(0) && index.match([6, 6]).matchedBlocks[0] === 1, 'B indexed');
    expect(index.match([5, 5]).matchedBlocks[0]).toBe(0);
  });

  it('a ROUTER trickling stale frames holds a rank no longer than one replay deadline (item 22.11)', async () => {
    const one = await engine();
    for (let i = 0; i < 3; i++) await one.publish(chainBlock(i));
    let trickling = true;
    one.replay = async (router, identity) => {
      // Frames forever, never the end marker.
      while (trickling) {
        await router.send([identity, Buffer.alloc(0), seqFrame(0), chainBlock(0)]);
        await sleep(50);
      }
    };
    closers.push(async () => {
      trickling = false;
    });
    const started = Date.now();
    const { index, sub } = subscribe(one, { replayTimeoutMs: 400 });
    await nudge(one, () => sub.isFresh(0), 'fresh');
    // A per-frame timeout never ran out here.
    expect(Date.now() - started).toBeLessThan(3_000);
    trickling = false;
    one.replay = (await import('./raw-engine')).honestReplay;
    await one.publish(chainBlock(3));
    // The rank is rebuilt from the buffer once a replay answers: all four blocks.
    await nudge(one, () => index.blockCount(0) === 4, 'the rank rebuilt after the stuck replay');
  });

  it('a replay that never ends: the rank follows the live stream from a cleared index, and no retry clears it again (item 41.15)', async () => {
    const one = await engine();
    for (let i = 0; i < 3; i++) await one.publish(chainBlock(i));
    let replays = 0;
    let flooding = true;
    one.replay = async (router, identity) => {
      replays++;
      // A stale frame every 100 ms, never the end marker; every request gets its own flood.
      void (async () => {
        while (flooding) {
          await router.send([identity, Buffer.alloc(0), seqFrame(0), chainBlock(0)]).catch(() => undefined);
          await sleep(100);
        }
      })();
    };
    closers.push(async () => {
      flooding = false;
    });
    const { index, sub } = subscribe(one, { replayTimeoutMs: 400 });
    await nudge(one, () => replays === 1, 'the sync asked');
    // Stored live while the sync is under way.
    await one.publish(batch([storedEvent([2000], null, [7, 7], 2)], 0));
    await nudge(one, () => sub.isFresh(0), 'fresh once the sync failed');
    expect(index.match([7, 7]).matchedBlocks[0]).toBe(1);
    // Live traffic until the rank has asked again and that replay has met its flood past its
    // deadline: the block stored live stays indexed throughout.
    let askedAgain = -1;
    for (let i = 0; i < 400 && (askedAgain === -1 || i < askedAgain + 30); i++) {
      await one.publish(batch([], 0));
      await sleep(25);
      expect(index.match([7, 7]).matchedBlocks[0]).toBe(1);
      if (askedAgain === -1 && replays > 1) askedAgain = i;
    }
    expect(replays).toBeGreaterThan(1);
    await one.publish(batch([storedEvent([2001], 2000, [8, 8], 2)], 0));
    await nudge(one, () => index.match([7, 7, 8, 8]).matchedBlocks[0] === 2, 'a block chained onto the live one');
    expect(sub.isFresh(0)).toBe(true);
  });

  it('replayable gaps, a replay that never answers, then traffic: the index equals the engine (items 22.17, 21.4)', async () => {
    const one = await engine();
    const { index, recorder, sub } = subscribe(one, { replayTimeoutMs: 300 });
    await nudge(one, () => sub.isFresh(0), 'fresh');
    let blocks = 0;
    const store = (drop = false) => one.publish(chainBlock(blocks++), drop);
    for (let i = 0; i < 5; i++) await store();
    // Twice: the next 3 batches dropped from PUB but kept for replay, then one live.
    for (let round = 0; round < 2; round++) {
      for (let i = 0; i < 3; i++) await store(true);
      await store();
      await nudge(one, () => index.blockCount(0) === blocks, `round ${round} repaired`);
    }
    // A gap whose replay is never answered: the rank is cleared, and then rebuilt.
    const honest = one.replay;
    one.replay = async () => {
      one.replay = honest;
    };
    for (let i = 0; i < 3; i++) await store(true);
    await store();
    await recorder.until(() => recorder.gaps.some(([, outcome]) => outcome === 'lost'), 'the lost gap');
    for (let i = 0; i < 4; i++) await store();
    await nudge(one, () => index.blockCount(0) === blocks && sub.isFresh(0), 'the index following the engine again');
    expect(index.match(chainPrompt(blocks)).matchedBlocks[0]).toBe(blocks);
  });

  it('a batch of the largest size the decoder takes, and one past it, leave /healthz answering (item 22.3)', async () => {
    const one = await engine();
    const { recorder, sub } = subscribe(one);
    await nudge(one, () => sub.isFresh(0), 'fresh');
    // Packed before the probe starts: packing runs in this process too.
    const payload = (count: number, from: number) => {
      const hashes = Array.from({ length: count }, (_, i) => from + i + 1);
      return batch([storedEvent(hashes, null, hashes.map((h) => h % 100), 1)], 0);
    };
    // Past the values bound (2.1M values) within the bytes one (so the decoder, not the socket,
    // refuses it), then 120k blocks (240k values, within the bounds).
    const payloads = [payload(1_050_000, 0), payload(120_000, 2_000_000)];
    expect(payloads[0].length).toBeLessThan(DEFAULT_KV_LIMITS.maxBytes);
    const probe = await healthz();
    await sleep(50);
    for (const one_ of payloads) await one.publish(one_);
    await recorder.until(() => recorder.count(0, 'stored') + recorder.count(0, 'invalid') === 2, 'both batches handled', 60_000);
    expect(recorder.count(0, 'invalid')).toBe(1);
    probe.stop();
    // Decoded and applied whole, these held the event loop for seconds; now the worst pause
    // is one payload's decode (a few ms idle, ~100 ms with 9 processes a core).
    expect(probe.worst()).toBeLessThan(1_000);
  }, 90_000);

  it('48.25: a batch refused whole leaves the rank\'s index as it was, and the stream goes on', async () => {
    const one = await engine();
    const { index, recorder, sub } = subscribe(one);
    await nudge(one, () => sub.isFresh(0), 'fresh');
    for (let i = 0; i < 10; i++) await one.publish(chainBlock(i));
    await recorder.until(() => index.blockCount(0) === 10, 'ten blocks indexed');
    // Past the decoder's bounds (here: nesting deeper than 16), in sequence: refused whole.
    await one.publish(Buffer.from('91'.repeat(40) + 'c0', 'hex'));
    await recorder.until(() => recorder.count(0, 'invalid') === 1, 'the batch refused');
    expect(index.blockCount(0)).toBe(10);
    expect(index.match(chainPrompt(10)).matchedBlocks[0]).toBe(10);
    expect(sub.isFresh(0)).toBe(true);
    // The next batch chains onto what the index kept.
    await one.publish(chainBlock(10));
    await recorder.until(() => index.blockCount(0) === 11, 'the next block indexed');
    expect(index.match(chainPrompt(11)).matchedBlocks[0]).toBe(11);
  });

  it('bound payloads back to back: each one is decoded in slices, with I/O between them (item 22.3)', async () => {
    const one = await engine();
    const { recorder, sub } = subscribe(one);
    await nudge(one, () => sub.isFresh(0), 'fresh');
    // Batches naming rank 1 on rank 0's connection: decoded whole, then refused without being
    // applied, so every yield counted here is the decoder's.
    const blocks = 120_000;
    const hashes = Array.from({ length: blocks }, (_, i) => 2 ** 40 + i);
    const payload = batch([storedEvent(hashes, null, hashes.map((h) => h % 100), 1)], 1);
    const payloads = 4;
    const probe = await healthz();
    await sleep(20);
    const before = yieldCount();
    const answered = probe.answers();
    for (let i = 0; i < payloads; i++) await one.publish(payload);
    await recorder.until(() => recorder.mismatches.length === payloads, 'every batch decoded', 60_000);
    const yields = yieldCount() - before;
    probe.stop();
    // ~4 values per block read or checked: the decode of one payload is many slices. Decoded
    // whole (msgpackr), a payload yielded twice: once in its slice's charge, once after it.
    expect(yields).toBeGreaterThanOrEqual(payloads * Math.floor((4 * blocks) / DECODED_VALUES_PER_UNIT / WORK_SLICE - 1));
    expect(probe.answers()).toBeGreaterThan(answered);
    expect(probe.worst()).toBeLessThan(1_000);
  }, 90_000);

  it('three gateway replicas over 8 ranks: replayable gaps twice leave no rank wedged or stale (item 22.17)', async () => {
    const RANKS = [0, 1, 2, 3, 4, 5, 6, 7];
    const engines = await Promise.all(RANKS.map((rank) => engine(rank)));
    // A ROUTER answers one request at a time, and slowly (a large buffer): with three replicas
    // asking at once, the last one's replay passes its deadline and its answer comes late, on
    // the DEALER the next replay would use.
    for (const one of engines) {
      one.replay = async (router, identity, from, buffer) => {
        await sleep(120);
        await honestReplay(router, identity, from, buffer);
      };
    }
    const replicas = [0, 1, 2].map(() => {
      const index = new KvExactIndex({ ranks: RANKS });
      const recorder = new Recorder();
      const sub = createKvEventSubscriber({
        upstream: 'raw',
        ranks: RANKS,
        endpoint: engines.map((one) => one.endpoint),
        replayEndpoint: engines.map((one) => one.replayEndpoint),
        sink: index,
        listener: recorder,
        replayTimeoutMs: 300,
      });
      closers.push(() => sub.close());
      return { index, recorder, sub };
    });
    const blocks = RANKS.map(() => 0);
    const store = (rank: number, drop = false) => engines[rank].publish(chainBlock(blocks[rank]++, rank), drop);
    const everywhere = (check: (replica: (typeof replicas)[number], rank: number) => boolean) => replicas.every((replica) => RANKS.every((rank) => check(replica, rank)));
    /** Empty batches on every rank until `condition` holds: the engines' next steps. */
    const settle = async (condition: () => boolean, what: string) => {
      for (let i = 0; i < 400 && !condition(); i++) {
        await Promise.all(engines.map((one) => one.publish(batch([], one.rank))));
        await sleep(25);
      }
      if (!condition()) throw new Error(`never: ${what}`);
    };
    const following = () => everywhere((replica, rank) => replica.sub.isFresh(rank) && replica.index.blockCount(rank) === blocks[rank]);
    await settle(() => everywhere((replica, rank) => replica.sub.isFresh(rank)), 'every rank fresh on every replica');
    for (const rank of RANKS) for (let i = 0; i < 5; i++) await store(rank);
    await settle(following, 'the first blocks indexed');
    for (let round = 0; round < 2; round++) {
      // Every rank: 3 batches dropped from PUB (kept for replay), then one live.
      for (const rank of RANKS) {
        for (let i = 0; i < 3; i++) await store(rank, true);
        await store(rank);
      }
      await settle(following, `round ${round} repaired`);
    }
    // The ranks publish again: every replica's index follows every engine.
    for (const rank of RANKS) for (let i = 0; i < 2; i++) await store(rank);
    await settle(following, 'the index following every engine again');
    for (const replica of replicas) {
      const matched = Array.from(replica.index.match(chainPrompt(blocks[0])).matchedBlocks);
      expect(matched).toEqual(RANKS.map((rank) => Math.min(blocks[rank], blocks[0])));
    }
  }, 60_000);
});

