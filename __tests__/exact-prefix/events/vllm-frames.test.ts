/**
 * The subscriber on real ZeroMQ sockets, fed the very frames vLLM 52a31cc's `ZmqEventPublisher`
 * sent (fixtures/vllm-52a31cc): an XPUB stands in for vLLM's PUB (it says when the subscription
 * arrived, so nothing is sent to a SUB that has not joined), a ROUTER for its replay socket.
 */
import { afterEach, describe, expect, it } from '@jest/globals';
import { KvExactIndex } from '../../../lib/exact-prefix/index/exact-index';
import { createKvEventSubscriber } from '../../../lib/exact-prefix/events/subscriber';
import { loadZeromq } from '../../../lib/exact-prefix/optional-deps';
import { Recorder } from '../helpers';
import { vllmRecording, type RECORDINGS, type VllmRecording } from '../vllm-recordings';

const zmq = loadZeromq();
const closers: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  while (closers.length > 0) await (closers.pop() as () => Promise<void> | void)();
});

const hex = (frames: string[]) => frames.map((frame) => Buffer.from(frame, 'hex'));
const upTo = (last: number, first = 1) => Array.from({ length: last - first + 1 }, (_, i) => first + i);

/** A PUB that sends recorded frames as they are, and resolves `joined` once a SUB subscribed. */
async function recordedPublisher(): Promise<{ endpoint: string; joined: Promise<unknown>; send: (frames: string[]) => Promise<void> }> {
  const pub = new zmq.XPublisher({ linger: 0 });
  closers.push(() => pub.close());
  await pub.bind('tcp://127.0.0.1:*');
  return { endpoint: pub.lastEndpoint as string, joined: pub.receive(), send: (frames) => pub.send(hex(frames)) };
}

/**
 * A ROUTER that answers as vLLM's `_service_replay` (kv_events.py:444-465) would with nothing
 * buffered yet, except for the request the recording made, which gets the recorded answer.
 */
async function recordedRouter(recording: VllmRecording, requests: Buffer[][]): Promise<string> {
  const router = new zmq.Router({ linger: 0 });
  closers.push(() => router.close());
  await router.bind('tcp://127.0.0.1:*');
  void (async () => {
    for (;;) {
      let frames: Buffer[];
      try {
        frames = await router.receive();
      } catch {
        return;
      }
      const [identity, ...request] = frames;
      requests.push(request);
      // vLLM answers only [identity, empty, start]: anything else is logged and dropped.
      if (frames.length !== 3) continue;
      const recorded = hex(recording.replay.request);
      const answer = request[1].equals(recorded[1]) ? recording.replay.answer : [['', 'ffffffffffffffff', '']];
      for (const frame of answer) await router.send([identity, ...hex(frame)]);
    }
  })();
  return router.lastEndpoint as string;
}

async function subscribed(recording: VllmRecording, replay?: Buffer[][]) {
  const rank = recording.dataParallelRank;
  const publisher = await recordedPublisher();
  const index = new KvExactIndex({ ranks: [rank] });
  const recorder = new Recorder();
  const sub = createKvEventSubscriber({
    upstream: 'vllm',
    ranks: [rank],
    endpoint: [publisher.endpoint],
    replayEndpoint: replay === undefined ? undefined : [await recordedRouter(recording, replay)],
    sink: index,
    listener: recorder,
  });
  closers.push(() => sub.close());
  await publisher.joined;
  await recorder.until(() => sub.isFresh(rank), 'the rank synced');
  return { rank, publisher, index, recorder };
}

describe("the subscriber on vLLM 52a31cc's own frames", () => {
  it.each<[(typeof RECORDINGS)[number], { stored: number; removed: number; cleared: number }]>([
    ['plain', { stored: 3, removed: 4, cleared: 1 }],
    ['lora', { stored: 3, removed: 0, cleared: 0 }],
    ['hybrid-window', { stored: 4, removed: 3, cleared: 0 }],
    // The GPU's store, and the offloading connector's two CPU stores and one CPU removal.
    ['offload', { stored: 3, removed: 1, cleared: 0 }],
  ])('counts %s as vLLM sent it, no event invalid (offload-tier events counted as the GPU’s)', async (name, counts) => {
    const recording = vllmRecording(name);
    const { rank, publisher, recorder } = await subscribed(recording);
    for (const frames of recording.frames) await publisher.send(frames);
    const total = counts.stored + counts.removed + counts.cleared;
    await recorder.until(() => ['stored', 'removed', 'cleared', 'invalid'].reduce((sum, type) => sum + recorder.count(rank, type as 'stored'), 0) >= total, `${total} events`);
    expect({ stored: recorder.count(rank, 'stored'), removed: recorder.count(rank, 'removed'), cleared: recorder.count(rank, 'cleared'), invalid: recorder.count(rank, 'invalid') }).toEqual({ ...counts, invalid: 0 });
  });

  it("indexes a hybrid model's full-attention group and an adapter's blocks from the wire", async () => {
    const hybrid = vllmRecording('hybrid-window');
    const one = await subscribed(hybrid);
    for (const frames of hybrid.frames) await one.publisher.send(frames);
    await one.recorder.until(() => one.recorder.count(one.rank, 'removed') === 3, 'the sliding group evicting');
    expect(one.index.match(upTo(17)).matchedBlocks[0]).toBe(4);

    const lora = vllmRecording('lora');
    const two = await subscribed(lora);
    await two.publisher.send(lora.frames[0]);
    await two.recorder.until(() => two.recorder.count(two.rank, 'stored') === 3, 'three stores');
    expect(two.index.match(upTo(9), { loraName: 'sql-lora' }).matchedBlocks[0]).toBe(2);
  });

  it("repairs a gap with vLLM's replay answer, asking as vLLM's ROUTER expects: [empty, 8-byte start]", async () => {
    const recording = vllmRecording('plain');
    const requests: Buffer[][] = [];
    const { rank, publisher, index, recorder } = await subscribed(recording, requests);
    await publisher.send(recording.frames[0]);
    await recorder.until(() => recorder.count(rank, 'stored') === 1, 'the first store');
    expect(index.blockCount(rank)).toBe(2);
    // Message 1 is lost on the way; message 2 shows the gap, and the replay from 1 brings 1 to 3.
    await publisher.send(recording.frames[2]);
    await recorder.until(() => recorder.gaps.length === 1, 'the gap repaired');
    expect(recorder.gaps).toEqual([[rank, 'replayed']]);
    expect(requests.at(-1)!.map((frame) => frame.toString('hex'))).toEqual(recording.replay.request);
    expect({ stored: recorder.count(rank, 'stored'), removed: recorder.count(rank, 'removed'), cleared: recorder.count(rank, 'cleared'), invalid: recorder.count(rank, 'invalid') }).toEqual({ stored: 3, removed: 4, cleared: 1, invalid: 0 });
    expect(index.blockCount(rank)).toBe(0);
  });
});
