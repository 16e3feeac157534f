/**
 * A replay request to one rank's replay ROUTER over a DEALER (vLLM's ROUTER answers only a
 * request framed `[empty, seq8]` and sends many messages back for one, so a REQ does not fit).
 *
 * Answers come in two framings (vLLM changed it): `[empty, seq, payload]`, and with the topic
 * `[empty, topic, seq, payload]`; the end is sequence −1 with an empty payload. Both are read
 * as "the last two frames are the sequence and the payload". The deadline is per replay, not
 * per frame: a ROUTER that keeps sending frames (stale ones, or never the end) cannot hold a
 * rank past it.
 */
import type * as Zeromq from 'zeromq';

/** One replayed batch. */
export interface ReplayedBatch {
  seq: number;
  payload: Buffer;
}

/** The reason a replay stopped short of its end marker. */
export class ReplayTimeout extends Error {
  constructor() {
    super('replay deadline passed');
  }
}

const END_SEQ = -1;

/** The batches the ROUTER holds from `from` on, oldest first, until the end marker; throws ReplayTimeout at `deadline` (ms, Date.now()). */
export async function* replayFrom(dealer: Zeromq.Dealer, from: number, deadline: number): AsyncGenerator<ReplayedBatch> {
  const request = Buffer.alloc(8);
  request.writeBigInt64BE(BigInt(from));
  // A DEALER with no peer yet blocks a send: the deadline covers that too.
  dealer.sendTimeout = remaining(deadline);
  await guard(dealer.send([Buffer.alloc(0), request]));
  for (;;) {
    dealer.receiveTimeout = remaining(deadline);
    const frames = await guard(dealer.receive());
    if (frames.length < 3) continue;
    const seq = readSeq(frames[frames.length - 2]);
    const payload = frames[frames.length - 1];
    if (seq === END_SEQ || (seq !== null && payload.length === 0)) return;
    if (seq === null) continue;
    yield { seq, payload };
  }
}

function remaining(deadline: number): number {
  const left = deadline - Date.now();
  if (left <= 0) throw new ReplayTimeout();
  return Math.max(1, Math.ceil(left));
}

async function guard<T>(work: Promise<T>): Promise<T> {
  try {
    return await work;
  } catch (error) {
    // EAGAIN is how zeromq reports a send or receive timeout.
    if ((error as { code?: string }).code === 'EAGAIN') throw new ReplayTimeout();
    throw error;
  }
}

/** The sequence number frame: a big-endian int64 (−1 ends a replay); null when malformed. */
export function readSeq(frame: Buffer): number | null {
  if (frame.length !== 8) return null;
  const value = frame.readBigInt64BE(0);
  if (value > BigInt(Number.MAX_SAFE_INTEGER) || value < -1n) return null;
  return Number(value);
}
