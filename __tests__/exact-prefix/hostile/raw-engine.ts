/**
 * A raw vLLM-like KV-event engine for attack tests: a ZeroMQ PUB and a replay ROUTER on
 * 127.0.0.1, payloads packed with msgpackr as vLLM's msgspec lays them out (array batches,
 * tagged array events). The replay handler is the test's to replace.
 */
import { Packr } from 'msgpackr';
import * as zmq from 'zeromq';

const packr = new Packr({ useRecords: false, variableMapSize: true });

/** `seq.to_bytes(8, "big")`, −1 signed for the replay's end. */
export function seqFrame(seq: number): Buffer {
  const frame = Buffer.alloc(8);
  frame.writeBigInt64BE(BigInt(seq));
  return frame;
}

/** A BlockStored event (array layout, GPU). */
export function storedEvent(hashes: number[], parent: number | null, tokens: number[], blockSize: number): unknown[] {
  return ['BlockStored', hashes, parent, tokens, blockSize, null, 'GPU'];
}

/** An EventBatch payload. */
export function batch(events: unknown[], rank: number): Buffer {
  return packr.pack([Date.now() / 1000, events, rank]);
}

export type ReplayHandler = (router: zmq.Router, identity: Buffer, from: number, buffer: ReadonlyArray<[number, Buffer]>) => Promise<void>;

/** vLLM's answer: every buffered batch from `from`, then the end marker (the older framing). */
export const honestReplay: ReplayHandler = async (router, identity, from, buffer) => {
  for (const [seq, payload] of buffer) if (seq >= from) await router.send([identity, Buffer.alloc(0), seqFrame(seq), payload]);
  await router.send([identity, Buffer.alloc(0), seqFrame(-1), Buffer.alloc(0)]);
};

export class RawEngine {
  readonly pub = new zmq.Publisher({ linger: 0, sendHighWaterMark: 100_000 });
  readonly router = new zmq.Router({ linger: 0 });
  readonly buffer: Array<[number, Buffer]> = [];
  replay: ReplayHandler = honestReplay;
  seq = 0;
  private closed = false;

  constructor(readonly rank: number) {}

  async start(): Promise<this> {
    await this.pub.bind('tcp://127.0.0.1:*');
    await this.router.bind('tcp://127.0.0.1:*');
    void this.serve();
    return this;
  }

  get endpoint(): string {
    return this.pub.lastEndpoint as string;
  }

  get replayEndpoint(): string {
    return this.router.lastEndpoint as string;
  }

  /** Publishes (or, with `drop`, only buffers) the next batch; returns its sequence. */
  async publish(payload: Buffer, drop = false): Promise<number> {
    const seq = this.seq++;
    this.buffer.push([seq, payload]);
    if (!drop) await this.pub.send(['', seqFrame(seq), payload]);
    return seq;
  }

  async close(): Promise<void> {
    this.closed = true;
    this.pub.close();
    this.router.close();
  }

  private async serve(): Promise<void> {
    while (!this.closed) {
      let frames: Buffer[];
      try {
        frames = await this.router.receive();
      } catch {
        return;
      }
      if (frames.length !== 3) continue;
      try {
        await this.replay(this.router, frames[0], Number(frames[2].readBigInt64BE(0)), this.buffer);
      } catch {
        // The test closed the engine mid-answer.
      }
    }
  }
}
